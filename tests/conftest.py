"""Every tier. Under pytest-xdist (`make test`: two workers, whole files each) a worker takes the next file
when it is done with one: handing out the longest files first leaves no worker alone with a long file at the
end (longest processing time first). The order within a file stays as it is."""

import pytest

# Seconds per file (tests/integration/), summed over its tests from pytest's junit report of `make test` on an
# idle 2-core machine, 2026-12-07 (759 s in all, 400 s of wall); every other file after.
SLOWEST_FIRST = [
    "test_cli.py",  # 110
    "multiprocess/test_sharded.py",  # 88
    "test_own_model.py",  # 80
    "test_field.py",  # 74
    "multiprocess/test_data_parallel.py",  # 61
    "test_convergence.py",  # 60
    "multiprocess/test_three_ranks.py",  # the legs' (make test leaves it out): about 45 there
    "test_oracle_cases.py",  # 43
    "test_bench.py",  # 37
    "test_release.py",  # 37
    "multiprocess/test_multi_node.py",  # the legs' (make test leaves it out): 31
    "test_fuzz.py",  # 29
    "test_doctor.py",  # 26
    "test_noise.py",  # 23
    "test_evaluation.py",  # 15
    "multiprocess/test_gathered.py",  # 13
]


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture (kept within each file)
def pytest_collection_modifyitems(config, items):
    rank = {f"tests/integration/{path}": i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable

"""Every tier. Under pytest-xdist (`make test`: two workers, whole files each) a worker takes the next file
when it is done with one: handing out the longest files first leaves no worker alone with a long file at the
end (longest processing time first). The order within a file stays as it is."""

import pytest

# Seconds per file (tests/integration/), summed over its tests from pytest's junit report of `make test` on an
# idle 2-core machine, 2026-12-06 (771 s in all, 405 s of wall); every other file after.
SLOWEST_FIRST = [
    "test_cli.py",  # 123
    "test_own_model.py",  # 120
    "multiprocess/test_data_parallel.py",  # 81
    "multiprocess/test_sharded.py",  # 74
    "multiprocess/test_three_ranks.py",  # (the legs': split from test_data_parallel.py's 81)
    "test_field.py",  # 68
    "test_convergence.py",  # 56
    "test_oracle_cases.py",  # 41
    "test_release.py",  # 34
    "test_fuzz.py",  # 32
    "test_bench.py",  # 30
    "multiprocess/test_multi_node.py",  # 28
    "test_doctor.py",  # 21
    "test_noise.py",  # 20
    "multiprocess/test_gathered.py",  # 14 (added since: measured on its own)
    "test_evaluation.py",  # 13
]


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture (kept within each file)
def pytest_collection_modifyitems(config, items):
    rank = {f"tests/integration/{path}": i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable

"""Every tier. Under pytest-xdist (`make test`: two workers, whole files each) a worker takes the next file
when it is done with one: handing out the longest files first leaves no worker alone with a long file at the
end (longest processing time first). The order within a file stays as it is."""

import pytest

# Seconds per file (tests/integration/), summed over its tests from pytest's junit report of `make test` on an
# idle 2-core machine, 2026-12-06 (995 s in all, 517 s of wall); every other file after.
SLOWEST_FIRST = [
    "multiprocess/test_sharded.py",  # 129
    "test_cli.py",  # 123
    "test_oracle_cases.py",  # 104
    "multiprocess/test_data_parallel.py",  # 103
    "test_own_model.py",  # 91
    "test_field.py",  # 86
    "test_convergence.py",  # 59
    "test_release.py",  # 53
    "test_fuzz.py",  # 52
    "multiprocess/test_multi_node.py",  # 34
    "test_noise.py",  # 34
    "test_bench.py",  # 32
    "test_doctor.py",  # 24
    "test_evaluation.py",  # 21
]


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture (kept within each file)
def pytest_collection_modifyitems(config, items):
    rank = {f"tests/integration/{path}": i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable

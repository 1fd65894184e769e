"""Every tier. Under pytest-xdist (`make test`: two workers, whole files each) a worker takes the next file
when it is done with one: handing out the longest files first leaves no worker alone with a long file at the
end (longest processing time first). The order within a file stays as it is."""

import pytest

# Seconds per file (tests/integration/), summed over its tests, measured 2026-12-06 with pytest's junit report on
# 2 cores that other work shared (an unshared run takes about half; the order is what counts); every other file
# after.
SLOWEST_FIRST = [
    "test_cli.py",  # 315
    "test_field.py",  # 262
    "test_own_model.py",  # 227
    "test_convergence.py",  # 172
    "test_oracle_cases.py",  # 156
    "multiprocess/test_sharded.py",  # 110
    "multiprocess/test_data_parallel.py",  # 93
    "test_release.py",  # 84
    "test_fuzz.py",  # 76
    "test_doctor.py",  # 53
    "test_evaluation.py",  # 46
    "test_bench.py",  # 42
    "test_noise.py",  # 39
    "multiprocess/test_multi_node.py",  # 39
    "test_rooms.py",  # 31
    "test_lower_variance.py",  # 26
]


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture (kept within each file)
def pytest_collection_modifyitems(config, items):
    rank = {f"tests/integration/{path}": i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable

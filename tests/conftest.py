"""Every tier. Under pytest-xdist (`make test`: two workers, whole files each) a worker takes the next file
when it is done with one: handing out the longest files first leaves no worker alone with a long file at the
end (longest processing time first). The order within a file stays as it is."""

import pytest

# Seconds per file on 2 cores, two workers (tests/integration/; measured 2026-12-02, make test 465 s); every
# other file after.
SLOWEST_FIRST = [
    "test_cli.py",  # 183
    "multiprocess/test_sharded.py",  # 148
    "test_field.py",  # 146
    "multiprocess/test_data_parallel.py",  # 93
    "test_oracle_cases.py",  # 80
    "test_own_model.py",  # 56
    "multiprocess/test_multi_node.py",  # 39
    "test_release.py",  # 36
    "test_bench.py",  # 28
    "test_noise.py",  # 24
    "test_rooms.py",  # 18
    "test_doctor.py",  # 17
]


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture (kept within each file)
def pytest_collection_modifyitems(config, items):
    rank = {f"tests/integration/{path}": i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable

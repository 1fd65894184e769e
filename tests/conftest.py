"""Every tier. Under pytest-xdist (`make test`: two workers, whole files each) a worker takes the next file
when it is done with one: handing out the longest files first leaves no worker alone with a long file at the
end (longest processing time first). The order within a file stays as it is."""

import pytest

# Seconds per file on 2 cores, two workers (tests/integration/; measured 2026-12-02 on a machine where `import
# unsloth` took 16 s, make test 570 s); every other file after.
SLOWEST_FIRST = [
    "test_cli.py",  # 241
    "multiprocess/test_sharded.py",  # 178
    "test_field.py",  # 149
    "multiprocess/test_data_parallel.py",  # 105
    "test_own_model.py",  # 104
    "multiprocess/test_multi_node.py",  # 56
    "test_oracle_cases.py",  # 55
    "test_release.py",  # 54
    "test_bench.py",  # 39
    "test_evaluation.py",  # 30
    "test_convergence.py",  # 30
    "test_noise.py",  # 24
    "test_rooms.py",  # 20
    "test_doctor.py",  # 17
]


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture (kept within each file)
def pytest_collection_modifyitems(config, items):
    rank = {f"tests/integration/{path}": i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable

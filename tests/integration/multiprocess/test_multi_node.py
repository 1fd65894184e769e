"""Multi-node layouts on one machine: two torchrun agents (--nnodes 2, static rendezvous at 127.0.0.1), one
process each, so LOCAL_RANK is 0 on both while RANK is 0 and 1 - as on the second node of a real job.
Anything keyed on the local rank instead of the global one (per-sample keys, the count gather, the data
order) passes every one-node test and fails here."""

import pytest

from unsloth_diffusion_norm import registry
from unsloth_diffusion_norm.proof import data_parallel, fixtures
from unsloth_diffusion_norm.proof.dp_cases import CASES

NATIVE_RELEASE = fixtures.expected_mode() == registry.NATIVE

pytestmark = [pytest.mark.multiprocess, pytest.mark.multi_node]

# What a rank key could break: the count gathered over the nodes, the data order of a partial last window,
# the per-sample keys, and both resumes.
MULTI_NODE = [
    "unequal-counts",
    "ga3-partial-last-window",
    "per-sample-noise",
    "resume-mid-epoch",
    "per-sample-resume",
]


@pytest.fixture(scope="module")
def two_nodes():
    found = data_parallel.launch(2, MULTI_NODE, nodes=2)
    print("\n" + data_parallel.render(found))
    return data_parallel.by_case(found)


def test_each_node_has_local_rank_0_and_its_own_global_rank(two_nodes):
    for case in MULTI_NODE:
        assert [(row["rank"], row["local_rank"]) for row in two_nodes[case]] == [(0, 0), (1, 0)], case
        assert all(row["model_wrapped"] == "DistributedDataParallel" for row in two_nodes[case])


@pytest.mark.parametrize("case", MULTI_NODE)
def test_every_rank_matches_the_oracle(two_nodes, case):
    for row in two_nodes[case]:
        assert row["ok"], f"{case} rank {row['rank']}: worst error {row['worst']:.3g} tolerances"


def test_one_count_collective_per_optimizer_step_over_every_node(two_nodes):
    for case in MULTI_NODE:
        expected = CASES[case].collectives(NATIVE_RELEASE)
        assert all(row["collectives"] == [expected] * len(row["counts"]) for row in two_nodes[case]), case


def test_per_sample_noise_gives_every_example_the_masks_of_the_one_process_layouts(two_nodes, one_process_masks):
    launched = {}
    for row in two_nodes["per-sample-noise"]:
        launched.update({int(key): value for key, value in row["sample_masks"].items()})
    assert len(launched) == len(CASES["per-sample-noise"].examples())
    for layout, found in one_process_masks("per-sample-noise").items():
        assert found == launched, layout


def test_per_sample_noise_levels_differ_between_the_nodes(two_nodes):
    levels = [t for row in two_nodes["per-sample-noise"] for batch in row["noise_levels"][0] for t in batch]
    assert len(set(levels)) == len(levels) == 4  # every example of the global batch has its own


def test_a_resumed_run_is_bitwise_the_uninterrupted_one_on_every_node(two_nodes):
    for case in ("resume-mid-epoch", "per-sample-resume"):
        assert [row["resume_difference"] for row in two_nodes[case]] == [0.0, 0.0], case

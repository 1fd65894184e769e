"""Three ranks under `accelerate launch` (Gloo on CPU): an odd number of ranks, the rank-local count among them, an
evaluation over three, and accelerate's DDP launcher. The counting rule is the same code on every loss shape, so
`make test` (the chunked shape) leaves this launch to the dense and native legs (marker three_ranks); the two-rank
cases are test_data_parallel.py's."""

import pytest

import unsloth_diffusion_norm
from unsloth_diffusion_norm import registry
from unsloth_diffusion_norm.proof import data_parallel, oracle
from unsloth_diffusion_norm.proof.data_parallel import PLAN
from unsloth_diffusion_norm.proof.dp_cases import CASES

pytestmark = [pytest.mark.multiprocess, pytest.mark.three_ranks]
NATIVE_RELEASE = unsloth_diffusion_norm.apply().mode == registry.NATIVE


@pytest.fixture(scope="module")
def rows():
    launcher, names = PLAN[3]
    found = data_parallel.launch(3, names, launcher)
    print("\n" + data_parallel.render(found))
    by_case = data_parallel.by_case(found)
    assert {case: len(ranks) for case, ranks in by_case.items()} == dict.fromkeys(PLAN[3][1], 3)
    return by_case


def test_every_rank_matches_the_oracle_with_one_count_collective_per_step(rows):
    for case, ranks in rows.items():
        spec = CASES[case]
        for row in ranks:
            assert row["model_wrapped"] == "DistributedDataParallel"  # really DDP, not N lone processes
            assert row["ok"], f"{case} rank {row['rank']}: worst error {row['worst']:.3g} tolerances"
            assert row["collectives"] == [spec.collectives(NATIVE_RELEASE)] * len(row["counts"]), case
            assert row["metrics_error"] is not None  # the window metrics judged too (within `worst`)


def test_the_rank_local_count_is_its_own_formula(rows):
    local, summed = rows["three-ranks-rank-local"][0], rows["three-ranks"][0]
    assert local["counts"] == summed["counts"] and len({sum(rank) for rank in summed["counts"][0]}) > 1
    assert abs(local["reference_loss"][0] - summed["reference_loss"][0]) > 1e-3


def test_evaluation_over_three_ranks_keeps_the_batch_denominator(rows):
    for row in rows["three-ranks"]:
        assert row["eval_loss"] == row["eval_unpatched"]  # the release's own evaluation, bitwise
        assert abs(row["eval_loss"] - row["eval_reference"]) <= oracle.tolerance(row["eval_reference"])


def test_the_global_rng_note_names_three_ranks_on_rank_0_only(rows):
    first, *others = rows["three-ranks"]
    assert first["notes"] == [
        "unsloth_diffusion_norm: the noise comes from the global RNG, seeded alike on all 3 data-parallel "
        "ranks, so every rank draws the same noise levels; diffusion_noise='per_sample' gives each example its own."
    ]
    assert all(row["notes"] == [] for row in others)


def test_on_a_natively_fixed_release_the_default_is_bitwise_unsloths_own_on_every_rank(rows):
    differences = {row["upstream_difference"] for ranks in rows.values() for row in ranks}
    assert differences == ({0.0} if NATIVE_RELEASE else {None})  # (None: the release's own path is the bug)

"""Real multi-process data parallel: 2 ranks under torchrun, 3 under `accelerate launch` (Gloo on CPU).
Two launches run every case (a launch costs far more than a case); each rank judges itself against the
oracle over all ranks' data with the same masks."""

import pytest

from unsloth_diffusion_norm.verify import data_parallel, oracle
from unsloth_diffusion_norm.verify.data_parallel import CASES, PLAN

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def results():
    found = []
    for ranks, (launcher, names) in PLAN.items():
        found += data_parallel.launch(ranks, names, launcher)
    print("\n" + data_parallel.render(found))
    return {(r["case"], r["rank"]): r for r in found}


def ranks_of(results, case):
    rows = [row for (name, _), row in results.items() if name == case]
    assert len(rows) == CASES[case].ranks, f"{case}: results from {len(rows)} ranks"
    return rows


@pytest.mark.parametrize("case", [n for n, c in CASES.items() if c.patched])
def test_every_rank_matches_the_oracle(results, case):
    for row in ranks_of(results, case):
        assert row["model_wrapped"] == "DistributedDataParallel"  # really DDP, not N lone processes
        assert row["ok"], f"{case} rank {row['rank']}: worst error {row['worst']:.3g} tolerances"


def test_counts_differ_between_ranks_and_micro_batches(results):
    counts = ranks_of(results, "unequal-counts")[0]["counts"][0]
    assert len({sum(rank) for rank in counts}) > 1 and all(len(set(rank)) > 1 for rank in counts)


def test_unpatched_control_misses(results):
    for row in ranks_of(results, "unequal-counts-unpatched"):
        assert row["worst"] > oracle.CONTROL_FACTORS["fp32"]


def test_one_count_collective_per_optimizer_step(results):
    for (case, _), row in results.items():
        spec = CASES[case]
        if not spec.patched:
            continue
        expected = 1 if spec.average_tokens_across_devices else 0  # rank-local: nothing to exchange
        assert row["collectives"] == [expected] * len(row["counts"]), case


def test_partial_last_window(results):
    row = ranks_of(results, "ga3-partial-last-window")[0]
    assert [len(window[0]) for window in row["counts"]] == [3, 1]


def test_all_ranks_empty_gives_zero_loss_and_zero_gradients(results):
    for row in ranks_of(results, "all-ranks-empty"):
        assert row["logged_loss"] == [0.0] and row["reference_loss"] == [0.0]
        assert row["grad_error"] == 0.0 and row["param_error"] == 0.0  # the oracle's gradient is 0


def test_rank_local_normalization_is_its_own_formula(results):
    local = ranks_of(results, "rank-local-counts")[0]
    summed = ranks_of(results, "unequal-counts")[0]
    assert local["counts"] == summed["counts"]  # same data, same masks
    assert abs(local["reference_loss"][0] - summed["reference_loss"][0]) > 1e-3


@pytest.mark.parametrize("case", [n for n, c in CASES.items() if c.evaluate])
def test_evaluation_keeps_the_batch_denominator_and_is_not_scaled_by_ranks(results, case):
    for row in ranks_of(results, case):
        assert row["eval_loss"] == row["eval_unpatched"]  # the release's own evaluation, bitwise
        assert abs(row["eval_loss"] - row["eval_reference"]) <= oracle.tolerance(row["eval_reference"])


def test_the_table_has_a_row_per_case(results):
    table = data_parallel.render(list(results.values()))
    assert all(f"| {name} |" in table for name in CASES)


def test_a_resumed_run_is_bitwise_the_uninterrupted_one_on_every_rank(results):
    # (on 2026.10.7+ through the diffusion_noise="global" opt-in)
    assert all(row["resume_difference"] == 0.0 for row in ranks_of(results, "resume-mid-epoch"))


def test_per_sample_noise_is_the_same_in_every_layout(results):
    """1 rank x GA 4, 1 rank x batch 4 (here), 2 ranks x GA 2 (launched): same seed, same global batch,
    so every example gets the same masks on its own tokens - and every window matches the oracle."""
    from unsloth_diffusion_norm.verify import experiment, judging

    case = CASES["per-sample-noise"]
    launched = {}
    for row in ranks_of(results, "per-sample-noise"):
        launched.update({int(key): value for key, value in row["sample_masks"].items()})
    layouts = {"2 ranks x GA 2": launched}
    for name, shape in {
        "1 rank x GA 4": dict(gradient_accumulation_steps=4),
        "1 rank x batch 4": dict(gradient_accumulation_steps=1, batch_size=4),
    }.items():
        run = experiment.train(case.examples(), seed=case.seed, diffusion_noise="per_sample", **shape)
        assert all(judging.judge(run, window).ok for window in run.windows), name
        found = judging.masks_by_sample([(w.batches, w.rng_state) for w in run.windows])
        layouts[name] = {key: [list(tokens), list(masked)] for key, (tokens, masked) in found.items()}
    reference = layouts.pop("2 ranks x GA 2")
    assert len(reference) == len(case.examples())
    for name, found in layouts.items():
        assert found == reference, name


def test_noise_levels_per_rank_identical_with_global_noise_distinct_with_per_sample(results):
    # Every rank is seeded alike, so the global RNG hands each rank's first micro-batch the same level.
    same = [row["noise_levels"][0][0] for row in ranks_of(results, "unequal-counts")]
    assert same[0] == same[1]
    levels = [t for row in ranks_of(results, "per-sample-noise") for batch in row["noise_levels"][0] for t in batch]
    assert len(set(levels)) == len(levels) == 4  # every example of the global batch has its own


def test_per_sample_resume_is_bitwise_on_every_rank_in_every_mode(results):
    assert all(row["resume_difference"] == 0.0 for row in ranks_of(results, "per-sample-resume"))

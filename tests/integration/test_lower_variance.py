"""Stratified noise levels and complementary mask pairs (opt-in), through the real DiffusionTrainer: every window
against the oracle, which replays the strata and builds the pairs from its own reading of the rule; the same
levels whatever the layout; the fields unset leave a run bitwise as it was; what cannot hold is refused at
construction. Their unbiasedness is tests/unit/test_unbiased.py's."""

import dataclasses
import gc

import pytest
import torch

import unsloth_diffusion_norm
from unsloth_diffusion_norm.proof import experiment, judging, oracle
from unsloth_diffusion_norm.proof.fixtures import Example, equal_answers
from unsloth_diffusion_norm.proof.judging import EOS_ID, EPS, OracleSettings, judge

STRATIFIED = dict(diffusion_noise="per_sample", diffusion_t_sampler="stratified")
PAIRS = dict(diffusion_complementary_masks=True)
CASES = {
    "stratified": dict(examples=equal_answers(4), seed=0, **STRATIFIED),
    # (held-out examples, never evaluated in training: the evaluation afterwards keeps one mask per example)
    "complementary": dict(examples=equal_answers(4), seed=1, eval_examples=equal_answers(2), **PAIRS),
    # A floor of the run's own: levels above 1 - eps (here 0.75) keep their mask, which the default floor reflects.
    "complementary, eps 0.25": dict(examples=equal_answers(8), seed=0, diffusion_eps=0.25, **PAIRS),
    # Under 'microbatch' the plugin still draws per-sample noise, so it pairs each keyed micro-batch itself. A pair
    # masks its answer once: unequal answers make each micro-batch's count differ from the window's mean.
    "complementary, per-sample noise, microbatch": dict(
        examples=[Example([10, 11], list(range(30, 30 + n))) for n in (3, 9, 5, 7)],
        seed=1,
        diffusion_noise="per_sample",
        diffusion_loss_normalization="microbatch",
        gradient_accumulation_steps=2,
        **PAIRS,
    ),
    "both, batch 2 with padding, GA 3 over 5": dict(
        examples=[Example([10, 11], list(range(30, 30 + n))) for n in (3, 9, 5, 7, 4)],
        batch_size=2,
        gradient_accumulation_steps=3,
        seed=0,
        **STRATIFIED,
        **PAIRS,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_window_matches_the_oracle(case, plugin):
    lower_variance_matches_oracle(case)


def lower_variance_matches_oracle(case, device="cpu"):
    """Every window of CASES[case] (trained on `device`) against the oracle, and the oracle with the feature's
    defect planted missing it (the cuda tier runs the same)."""
    spec = CASES[case]
    run = experiment.train(**spec, device=device)
    pairs = spec.get("diffusion_complementary_masks", False)
    microbatch = spec.get("diffusion_loss_normalization") == "microbatch"
    settings = OracleSettings(
        complementary=pairs,
        eps=spec.get("diffusion_eps", EPS),
        normalization=oracle.MASKED_TOKENS if microbatch else oracle.WINDOW,
    )
    for i, window in enumerate(run.windows):
        verdict = judge(run, window, settings)
        assert verdict.ok, f"{case}, window {i}: {verdict}"
    # The same judge with the feature's defect planted in the reference - no pairs, or no strata - must fail.
    window = run.windows[0]
    if pairs:
        assert not judge(run, window, dataclasses.replace(settings, complementary=False)).ok
    if microbatch:  # each micro-batch by its own count, as asked: the window's count misses
        assert not judge(run, window, dataclasses.replace(settings, normalization=oracle.WINDOW)).ok
    if "eval_examples" in spec:  # the pairs are training's: an evaluation keeps one mask per example
        loss, seen = experiment.evaluate(run.trainer)
        run.reference_model.load_state_dict(run.trainer.model.state_dict())
        expected = judging.expected_evaluation_loss(run.reference_model, seen, settings.eps)
        assert abs(loss - expected) <= oracle.tolerance(expected), (case, loss, expected)
    if "diffusion_t_sampler" in spec:
        window.batches = [{k: v for k, v in batch.items() if k != "strata"} for batch in window.batches]
        assert not judge(run, window, settings).ok


def levels(run):
    """Each example's noise level, by its position in the data order, as the oracle replays them."""
    found = []
    for window in run.windows:
        for masks in oracle.replay_noise(window.batches, window.rng_state, EPS, EOS_ID):
            found += masks.p_mask[:, 0].tolist()
    return found


def test_stratified_levels_do_not_depend_on_the_layout_and_fill_every_stratum(plugin):
    examples = equal_answers(8)
    by_accumulation = levels(experiment.train(examples, batch_size=1, gradient_accumulation_steps=4, **STRATIFIED))
    by_batch = levels(experiment.train(examples, batch_size=4, gradient_accumulation_steps=1, **STRATIFIED))
    assert by_accumulation == pytest.approx(by_batch, abs=1e-7)
    for window in (by_batch[:4], by_batch[4:]):  # one level in each quarter of [eps, 1]
        t = sorted((p - EPS) / (1 - EPS) for p in window)
        assert [int(4 * level) for level in t] == [0, 1, 2, 3]


def test_the_fields_unset_leave_the_run_bitwise_as_it_was(plugin):
    examples = equal_answers(4)
    plain = experiment.train(examples, seed=0, diffusion_noise="per_sample")
    unset = experiment.train(
        examples, seed=0, diffusion_noise="per_sample", diffusion_t_sampler=None, diffusion_complementary_masks=False
    )
    for a, b in zip(plain.windows, unset.windows):
        assert a.logged_loss == b.logged_loss
        assert all(torch.equal(a.grads[name], b.grads[name]) for name in a.grads)


@pytest.mark.parametrize(
    "settings, words",
    [
        (dict(diffusion_t_sampler="stratified"), "set diffusion_noise='per_sample'"),
        (dict(diffusion_t_sampler="stratified", diffusion_noise="global"), "diffusion_noise='per_sample'"),
        (dict(diffusion_t_sampler="uniform"), "diffusion_t_sampler must be 'stratified' or None"),
        (dict(diffusion_complementary_masks="maybe"), "must be True or False"),
        (
            dict(diffusion_complementary_masks=True, diffusion_loss_normalization="microbatch"),
            "at diffusion_loss_normalization='microbatch' draws its own",
        ),
    ],
)
def test_what_cannot_hold_is_refused_in_one_line(settings, words, plugin):
    unsloth_diffusion_norm.apply()
    with pytest.raises(ValueError) as error:
        experiment.build(equal_answers(2), experiment.Setup.of(**settings))
    assert words in str(error.value) and "\n" not in str(error.value)


def test_a_run_that_asks_for_them_says_so_once_at_construction_and_status_names_them(plugin, caplog):
    unsloth_diffusion_norm.apply()
    gc.collect()  # earlier tests' trainers, if any, no longer alive
    assert unsloth_diffusion_norm.status().asked == ()
    with caplog.at_level("WARNING", logger="unsloth_diffusion_norm"):
        built = experiment.build(equal_answers(2), experiment.Setup.of(**STRATIFIED, **PAIRS), record=False)
    status = unsloth_diffusion_norm.status()
    assert status.asked == ("diffusion_complementary_masks=True", "diffusion_t_sampler='stratified'")
    assert "a trainer in this process asked for: diffusion_complementary_masks=True, diffusion_t_sampler=" in str(
        status
    )
    assert built.trainer.args.diffusion_t_sampler == "stratified"
    said = [r.getMessage() for r in caplog.records if "lower-variance" in r.getMessage()]
    assert said == [
        "unsloth_diffusion_norm: lower-variance noise: diffusion_t_sampler='stratified' (one noise level per stratum "
        "across each step's 2 examples); diffusion_complementary_masks=True (every training micro-batch doubled: "
        "about twice the step time)."
    ]

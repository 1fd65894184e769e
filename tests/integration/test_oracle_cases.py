"""Every case: Trainer.train() through the real DiffusionTrainer, each window judged by the oracle
(logged loss, every gradient, every parameter after the SGD step). Unpatched controls must miss."""

import pytest
import torch

import unsloth_diffusion_norm
from unsloth_diffusion_norm import detect
from unsloth_diffusion_norm.proof import experiment, fixtures, judging, oracle
from unsloth_diffusion_norm.proof.fixtures import Example, equal_answers
from unsloth_diffusion_norm.proof.judging import OracleSettings, judge
from unsloth_diffusion_norm.registry import NATIVE

MODE = unsloth_diffusion_norm.apply().mode


def padded_batch_examples():
    lengths = [3, 9, 5, 7]  # batch 2, right padding: the EOS tail of the shorter row is maskable
    return [Example([10, 11], list(range(30, 30 + n))) for n in lengths]


CASES = {
    "seed-0": dict(examples=equal_answers(4), seed=0),
    "seed-1": dict(examples=equal_answers(4), seed=1),
    "seed-2": dict(examples=equal_answers(4), seed=2),
    "partial-last-window-ga3-over-5": dict(examples=equal_answers(5), gradient_accumulation_steps=3),
    "micro-batch-without-supervised-tokens": dict(
        examples=[Example([10, 11, 12], [], eos=False), *equal_answers(3)], seed=0
    ),
    "batch-2-right-padding": dict(examples=padded_batch_examples(), batch_size=2, seed=0),
    "time-weighting-none": dict(examples=equal_answers(4), seed=0, diffusion_time_weighting="none", inverse_t=False),
    "lora-frozen-head-fused-path": dict(examples=equal_answers(4), seed=0, lora="frozen-head"),
    "lora-saved-head-dense-path": dict(examples=equal_answers(4), seed=0, lora="saved-head"),
    "llada-opted-into-window": dict(examples=equal_answers(4), seed=0, profile="llada"),
}


def run_case(examples, inverse_t=True, profile=None, control=False, **kwargs):
    if profile is not None:
        from unsloth.models.diffusion_profiles import diffusion_profiles

        kwargs["diffusion_profile"] = next(p for p in diffusion_profiles() if p.name == profile)
        kwargs["diffusion_loss_normalization"] = "window"
    run = (experiment.train_per_micro_batch if control else experiment.train)(examples, **kwargs)
    return [judge(run, window, OracleSettings(inverse_t=inverse_t)) for window in run.windows]


@pytest.mark.parametrize("case", list(CASES))
def test_plugin_matches_oracle_and_unpatched_misses(case, trainer_stack):
    plugin_matches_oracle_and_unpatched_misses(case)


def plugin_matches_oracle_and_unpatched_misses(case, device="cpu"):
    """The case trained on `device`, every window against the oracle, then its control's; returns the verdicts."""
    spec = dict(CASES[case])
    unsloth_diffusion_norm.apply()
    verdicts = run_case(device=device, **spec)
    for i, verdict in enumerate(verdicts):
        assert verdict.ok, f"{case} on {device}, window {i}: {verdict}"
    if spec.pop("profile", None) is not None:
        return verdicts  # the unpatched LLaDA objective is another formula (answer length), not a bug
    controls = run_case(control=True, device=device, **spec)
    for verdict, control in zip(verdicts, controls):
        assert control.counts == verdict.counts  # same seed, same masks
        if len(verdict.counts) > 1 and len(set(verdict.counts)) > 1:
            assert control.worst > oracle.CONTROL_FACTORS["fp32"], f"{case}: the control could not fail: {control}"
    return verdicts


@pytest.mark.skipif(MODE != NATIVE, reason="a natively fixed release")
@pytest.mark.parametrize("case", [name for name, spec in CASES.items() if "profile" not in spec])
def test_on_a_natively_fixed_release_the_default_is_bitwise_unsloths_own(case, trainer_stack):
    """The default's draws, made at each window's first step, against Unsloth's own path (unpatched()): the
    same logged losses and parameters in every window, with and without Unsloth's Trainer rewrite."""
    spec = {key: value for key, value in CASES[case].items() if key != "inverse_t"}
    unsloth_diffusion_norm.apply()
    ours = experiment.train(**spec)
    with unsloth_diffusion_norm.unpatched():
        own = experiment.train(**spec)
    assert experiment.divergence(ours, own) == 0.0


@pytest.mark.parametrize(
    "case",
    [
        "seed-0",
        "partial-last-window-ga3-over-5",
        "batch-2-right-padding",
        "lora-frozen-head-fused-path",
        "micro-batch-without-supervised-tokens",
    ],
)
def test_per_sample_noise_matches_oracle(case, plugin):
    per_sample_noise_matches_oracle(case)


def per_sample_noise_matches_oracle(case, device="cpu"):
    """The oracle draws each row from its own generator too (on the CPU); the trainer must agree with it."""
    spec = dict(CASES[case])
    run = experiment.train(diffusion_noise="per_sample", device=device, **spec)
    assert all(batch.get("keys") is not None for w in run.windows for batch in w.batches)  # really per sample
    for i, window in enumerate(run.windows):
        verdict = judge(run, window)
        assert verdict.ok, f"{case} window {i}: {verdict}"


def _find_seed(examples, predicate, **kwargs):
    for seed in range(40):
        run = experiment.train(examples, seed=seed, **kwargs)
        if predicate([judge(run, w).counts for w in run.windows]):
            return seed, run
    raise AssertionError("no seed in range(40) gives the wanted mask counts")


def test_micro_batch_with_zero_masked_tokens(plugin, trainer_stack):
    short = [Example([10 + i, 11], [20]) for i in range(4)]  # 2 maskable tokens per micro-batch
    seed, run = _find_seed(short, lambda counts: any(0 in c and sum(c) > 0 for c in counts))
    for window in run.windows:
        assert judge(run, window).ok


def test_all_empty_window_gives_zero_loss_and_zero_gradients(plugin, trainer_stack):
    returned = []  # what each micro-batch's loss computation gave Trainer, before any logging filter

    def record_losses(trainer):
        compute_loss = trainer.compute_loss

        def view(*pos, **kw):
            loss = compute_loss(*pos, **kw)
            returned.append((loss[0] if isinstance(loss, tuple) else loss).detach().clone())
            return loss

        trainer.compute_loss = view

    run = experiment.train(fixtures.unsupervised(4), seed=0, before_train=record_losses)
    for window in run.windows:
        verdict = judge(run, window)
        assert verdict.ok and verdict.counts == [0, 0]
        assert window.logged_loss == 0.0
        assert all(torch.count_nonzero(g) == 0 and torch.isfinite(g).all() for g in window.grads.values())
    # Exactly 0, not NaN: Trainer's logging_nan_inf_filter would hide a 0/0 from the logged loss.
    assert len(returned) == 4 and all(loss.item() == 0.0 for loss in returned), returned


def test_ga1_control_old_and_new_agree_bitwise(plugin, trainer_stack):
    patched = experiment.train(equal_answers(2), gradient_accumulation_steps=1, seed=0)
    stock = experiment.train_per_micro_batch(equal_answers(2), gradient_accumulation_steps=1, seed=0)
    for ours, theirs in zip(patched.windows, stock.windows):
        assert ours.logged_loss == theirs.logged_loss
        for name in ours.grads:
            assert torch.equal(ours.grads[name], theirs.grads[name]), name
            assert torch.equal(ours.params_after[name], theirs.params_after[name]), name
        assert judge(patched, ours).ok


@pytest.mark.skipif(
    MODE == NATIVE,
    reason="a natively fixed release has no unfixed run to compare with; there the flag is every oracle case's control",
)
def test_microbatch_flag_reproduces_the_old_run_bitwise(trainer_stack):
    unsloth_diffusion_norm.apply()
    old_way = experiment.train(equal_answers(4), seed=1, diffusion_loss_normalization="microbatch")
    with unsloth_diffusion_norm.unpatched():
        stock = experiment.train(equal_answers(4), seed=1)
    for ours, theirs in zip(old_way.windows, stock.windows):
        assert ours.logged_loss == theirs.logged_loss
        assert all(torch.equal(ours.params_after[n], theirs.params_after[n]) for n in ours.params_after)


@pytest.mark.parametrize("name", ["dream", "llada"])  # masked tokens / answer length, per micro-batch
def test_dream_profile_keeps_its_own_normalization_by_default(trainer_stack, name):
    """Bitwise the release's own run; and its metrics logged from the draws the release's loss makes (observed
    under a forked RNG), each step's the oracle's from the replayed masks (a partial last window of one
    micro-batch of three); none with diffusion_metrics=False, which changes nothing."""
    from unsloth.models.diffusion_profiles import diffusion_profiles

    dream = next(p for p in diffusion_profiles() if p.name == name)
    spec = dict(examples=fixtures.mixed_answers(14), batch_size=2, gradient_accumulation_steps=3, seed=3)
    unsloth_diffusion_norm.apply()
    ours = experiment.train(**spec, diffusion_profile=dream)
    quiet = experiment.train(**spec, diffusion_profile=dream, diffusion_metrics=False)
    if MODE == NATIVE:  # the release's own path at its own settings: patched only to observe its draws
        from unsloth_diffusion_norm import registry

        assert [p.name for p in registry.per_trainer(ours.trainer).patches] == ["compute_loss", "log"]
        assert registry.per_trainer(quiet.trainer).patches == []
    with unsloth_diffusion_norm.unpatched():
        theirs = experiment.train(**spec, diffusion_profile=dream)
    unsloth_diffusion_norm.apply()
    for run in (quiet, theirs):
        for a, b in zip(ours.windows, run.windows, strict=True):
            assert a.logged_loss == b.logged_loss
            assert all(torch.equal(a.params_after[n], b.params_after[n]) for n in a.params_after)
    assert not any(name in window.logs for window in quiet.windows for name in oracle.METRIC_NAMES)
    eps = oracle.OBJECTIVES[name].eps
    for window in ours.windows:
        expected = oracle.window_metrics([judging.realized(window.batches, window.rng_state, eps)])
        assert all(abs(window.logs[k] - v) <= oracle.tolerance(v) for k, v in expected.items()), window.logs
    assert ours.windows[-1].logs["moved_weight_share"] == 0.0  # one micro-batch: nothing can move


def test_full_training_windows_2_2_1_with_evaluation_parity(plugin, trainer_stack):
    full_training_windows_2_2_1_with_evaluation_parity()


def full_training_windows_2_2_1_with_evaluation_parity(device="cpu"):
    examples = [Example([10 + i, 11, 12], list(range(20, 20 + 6 + i))) for i in range(5)]
    evals = [Example([14, 15], list(range(40, 47))), Example([16], list(range(50, 54)))]
    run = experiment.train(examples, gradient_accumulation_steps=2, seed=5, eval_examples=evals, device=device)
    assert [len(w.batches) for w in run.windows] == [2, 2, 1]
    verdicts = [judge(run, w) for w in run.windows]
    assert all(v.ok for v in verdicts), verdicts

    # The oracle's own trajectory: three SGD steps from the initial weights with the same masks.
    model = run.reference_model
    model.load_state_dict(run.windows[0].state_before)
    for window in run.windows:
        masks = oracle.replay_noise(window.batches, window.rng_state, fixtures.EPS, fixtures.EOS_ID)
        reference = oracle.window_reference(model, masks, fixtures.MASK_ID)
        with torch.no_grad():
            for name, param in model.named_parameters():
                param -= fixtures.LEARNING_RATE * reference.grads[name]
    final = dict(model.named_parameters())
    trajectory_error = max(oracle.max_error(run.windows[-1].params_after[n], final[n]) for n in final)
    print(f"parameter error after 3 updates vs the oracle trajectory: {trajectory_error:.3e}")
    assert all(oracle.max_error(run.windows[-1].params_after[n], final[n]) <= oracle.tolerance(final[n]) for n in final)

    # Evaluation keeps the single-batch denominator, and equals the unpatched release's bitwise.
    trainer = run.trainer
    ours, seen = experiment.evaluate(trainer)
    model.load_state_dict(trainer.model.state_dict())
    expected = judging.expected_evaluation_loss(model, seen)
    assert abs(ours - expected) <= oracle.tolerance(expected)
    with unsloth_diffusion_norm.unpatched():
        theirs, _ = experiment.evaluate(trainer)
    assert ours == theirs


def test_the_window_metrics_are_logged_as_the_oracle_computes_them_and_change_nothing(plugin, trainer_stack):
    """The window's masked tokens, its noise levels' mean and spread and the moved share, in the Trainer's log
    at every step (the last window partial: one micro-batch of three), each against the oracle's from the
    replayed masks; with diffusion_metrics=False none is logged and the run is bitwise the same."""
    spec = dict(examples=fixtures.mixed_answers(14), batch_size=2, gradient_accumulation_steps=3, seed=3)
    on = experiment.train(**spec)
    verdicts = [judge(on, window) for window in on.windows]
    assert len(verdicts) == 3 and all(v.ok and v.metrics_error is not None for v in verdicts), verdicts
    assert on.windows[-1].logs["moved_weight_share"] == 0.0  # one micro-batch: nothing can move
    # The training accuracy where the loss holds the logits (the dense shape), judged with the rest; elsewhere none
    holds_logits = unsloth_diffusion_norm.status().shape == detect.DENSE
    assert all((oracle.ACCURACY_NAME in window.logs) == holds_logits for window in on.windows), on.windows[0].logs
    off = experiment.train(**spec, diffusion_metrics=False)
    named = (*oracle.METRIC_NAMES, oracle.ACCURACY_NAME)
    assert not any(name in window.logs for window in off.windows for name in named)
    for ours, theirs in zip(on.windows, off.windows):
        assert ours.logged_loss == theirs.logged_loss
        assert {k: v for k, v in ours.logs.items() if k in theirs.logs} == theirs.logs  # (the release's own kept)
        for name in ours.params_after:
            assert torch.equal(ours.params_after[name], theirs.params_after[name]), name

"""Evaluation that holds still: with diffusion_eval_noise="fixed" the same weights give the same eval loss (the
oracle's, with the keyed masks realized), and evaluating never changes what a seeded run trains. Each property
is shown failing with the field unset (the release's own draws from the global RNG), so that it can fail."""

import copy
import os
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import unsloth_diffusion_norm
from unsloth_diffusion_norm import registry
from unsloth_diffusion_norm.proof import experiment, judging, oracle
from unsloth_diffusion_norm.proof.fixtures import MASK_ID, Example, equal_answers

MODE = unsloth_diffusion_norm.apply().mode
SEED = 42
TRAIN = equal_answers(8)  # batch 1, GA 2: 4 steps
HELD = [Example([60 + i, 61], list(range(40 + i, 47 + i))) for i in range(4)]  # held out, unequal prompts
FIXED = {"diffusion_eval_noise": "fixed"}
EVERY_STEP = {"eval_strategy": "steps", "eval_steps": 1}


def _train(eval_examples=HELD, **settings):
    return experiment.train(TRAIN, seed=SEED, eval_examples=eval_examples, **settings)


def _evaluate_twice(run):
    return [experiment.evaluate(run.trainer, seed=None)[0] for _ in range(2)]


@pytest.fixture(scope="module")
def arms():
    """Per arm (the field unset, "fixed"): the run without evaluation and the same run evaluating every step.
    Patched anew, as in a user's process: the patch sets, each wrapper's release included, are built here."""
    unsloth_diffusion_norm.unpatch()
    unsloth_diffusion_norm.apply()
    return {name: (_train(**flags), _train(**EVERY_STEP, **flags)) for name, flags in (("unset", {}), ("fixed", FIXED))}


def test_evaluating_never_changes_what_a_seeded_run_trains(arms):
    """The same training masks (the same logged losses and weights after every step) with and without an
    evaluation at every step; the release's own draws move every training draw after the first evaluation."""
    plain, evaluated = arms["fixed"]
    assert len(plain.windows) == len(evaluated.windows) == 4
    assert experiment.divergence(plain, evaluated) == 0.0
    plain, evaluated = arms["unset"]
    assert (
        experiment.divergence(plain, evaluated) == float("inf") and experiment.final_difference(plain, evaluated) > 1e-3
    )


@pytest.fixture(scope="module")
def per_micro_batch():
    """A per-micro-batch run ('microbatch': the release draws inside its loss) logging every 2 steps, and the same
    run evaluating at every step under the fixed evaluation noise that leaves training as it was: (their training
    logs, the first run's trainer)."""
    unsloth_diffusion_norm.apply()
    flags = dict(diffusion_loss_normalization="microbatch", logging_steps=2, **FIXED)
    runs = _train(**flags), _train(**EVERY_STEP, **flags)
    return [[window.logs for window in run.windows] for run in runs], runs[0].trainer


def test_an_evaluation_between_training_logs_leaves_a_per_micro_batch_runs_metrics_to_the_next_one(
    plugin, per_micro_batch
):
    """Each training log carries the metrics of both its steps, as the run that never evaluates logs them (the
    evaluation's log between them takes none of them)."""
    logs, _ = per_micro_batch
    assert logs[0][0] is None and set(oracle.METRIC_NAMES) <= set(logs[0][1]) and logs[0] == logs[1]


def test_a_per_micro_batch_runs_compute_loss_takes_its_arguments_by_keyword_too(plugin, per_micro_batch):
    """Trainer.compute_loss called as a user's subclass may call it, by keyword: the same loss, bit for bit, as the
    positional call Trainer makes (the patched class's wrapper reads both). The draws it observed wait for the
    next log (here called by keyword too), which takes them on the run's device whatever the default device (a GPU
    run's beside a CPU default: here the meta device)."""
    _, trainer = per_micro_batch
    batch = next(iter(trainer.get_train_dataloader()))
    losses = []
    for call in (
        lambda: trainer.compute_loss(trainer.model, dict(batch)),
        lambda: trainer.compute_loss(model=trainer.model, inputs=dict(batch)),
    ):
        torch.manual_seed(0)
        losses.append(call().detach())
    assert torch.equal(*losses) and losses[0] > 0
    with torch.device("meta"):
        trainer.log(logs={"loss": losses[0].item()})  # (log, by keyword too)
    logged = trainer.state.log_history[-1]
    assert all(type(logged[name]) is float for name in oracle.METRIC_NAMES), logged


def test_two_evaluations_of_the_same_weights_are_bitwise_equal(arms):
    first, second = _evaluate_twice(arms["fixed"][0])
    assert first == second
    first, second = _evaluate_twice(arms["unset"][0])
    assert first != second


def test_a_fixed_evaluation_is_the_oracles_loss_with_the_keyed_masks_realized(arms):
    for name in ("fixed", "unset"):
        run = arms[name][0]
        loss, seen = experiment.evaluate(run.trainer, seed=None)
        assert len(seen) == len(HELD)
        run.reference_model.load_state_dict(run.trainer.model.state_dict())
        expected = judging.expected_fixed_evaluation_loss(run.reference_model, judging.keyed_evaluation(seen, SEED))
        within = abs(loss - expected) <= oracle.tolerance(expected)
        assert within == (name == "fixed"), (name, loss, expected)


def test_k_draws_are_the_mean_of_k_keyed_draws_one_forward_each(arms):
    run = arms["fixed"][0]
    run.trainer.args.diffusion_eval_draws = 3
    forwards, metrics = [], {}
    handle = run.trainer.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        loss, seen = experiment.evaluate(run.trainer, seed=None, metrics=metrics)
    finally:
        handle.remove()
        run.trainer.args.diffusion_eval_draws = 1
    assert len(forwards) == 3 * len(HELD)
    run.reference_model.load_state_dict(run.trainer.model.state_dict())
    keyed = judging.keyed_evaluation(seen, SEED, draws=3)
    expected = judging.expected_fixed_evaluation_loss(run.reference_model, keyed)
    assert abs(loss - expected) <= oracle.tolerance(expected)
    single = judging.expected_fixed_evaluation_loss(run.reference_model, [draws[:1] for draws in keyed])
    assert abs(loss - single) > 100 * oracle.tolerance(single)  # three draws, not the first one thrice
    # How far the eval loss moves between the draws, and the standard error of their mean, logged with it
    spread, error = judging.expected_draw_spread(run.reference_model, keyed)
    assert spread > 0 and abs(metrics["eval_loss_draw_std"] - spread) <= oracle.tolerance(spread)
    assert abs(metrics["eval_loss_stderr"] - error) <= oracle.tolerance(error)
    # one draw: no spread to give
    assert "eval_loss_draw_std" not in run.trainer.evaluate()
    # the accuracy and the masked CE by noise level, over all three draws of every example (12 rows, 5 buckets)
    expected = judging.expected_evaluation_scores(run.reference_model, keyed)
    assert len(expected) > 3 and judging.scores_error(metrics, expected) <= 1, (metrics, expected)


def test_the_accuracy_and_loss_by_noise_level_are_the_oracles_and_hold_still(arms):
    """Each evaluation's masked-token accuracy and its masked CE per noise-level bucket are the oracle's over the keyed
    masks, the same at every evaluation (each bucket holds the same draws), B buckets as asked, none when the
    run's metrics are off; and the oracle's figures with other buckets miss them (the check can fail)."""
    run = arms["fixed"][0]
    trainer, first, again = run.trainer, {}, {}
    _, seen = experiment.evaluate(trainer, seed=None, metrics=first)
    experiment.evaluate(trainer, seed=7, metrics=again)  # another global RNG state
    run.reference_model.load_state_dict(trainer.model.state_dict())
    keyed = judging.keyed_evaluation(seen, SEED)
    expected = judging.expected_evaluation_scores(run.reference_model, keyed)
    assert judging.scores_error(first, expected) <= 1 and {n: again[n] for n in expected} == {
        n: first[n] for n in expected
    }
    assert "eval_masked_token_accuracy" in expected and 0 <= expected["eval_masked_token_accuracy"] <= 1
    assert judging.scores_error(first, judging.expected_evaluation_scores(run.reference_model, keyed, buckets=4)) > 1
    trainer.args.diffusion_eval_buckets, two = 2, {}
    try:
        experiment.evaluate(trainer, seed=None, metrics=two)
    finally:
        trainer.args.diffusion_eval_buckets = 5
    assert judging.scores_error(two, judging.expected_evaluation_scores(run.reference_model, keyed, buckets=2)) <= 1
    assert {n for n in two if "_masked_ce_noise_" in n} <= {"eval_masked_ce_noise_0-0.5", "eval_masked_ce_noise_0.5-1"}
    trainer.args.diffusion_metrics, off = False, {}
    try:
        loss, _ = experiment.evaluate(trainer, seed=None, metrics=off)
    finally:
        trainer.args.diffusion_metrics = True
    assert loss == first["eval_loss"] and not [n for n in off if "accuracy" in n or "_noise_" in n]


def test_the_evaluation_loop_called_without_a_prefix_names_its_scores_as_trainer_does(arms):
    """Trainer's evaluation_loop(dataloader, description) defaults its metric_key_prefix to "eval": the keyed
    evaluation's scores take the prefix the loop was given, its default included."""
    trainer = arms["fixed"][0].trainer
    found = trainer.evaluation_loop(trainer.get_eval_dataloader(), "Evaluation").metrics
    assert "eval_masked_token_accuracy" in found and "eval_loss" in found


def test_prediction_step_takes_its_inputs_by_position_or_by_name(arms):
    """Trainer passes prediction_step's inputs by position; another caller may name them. Keyed or not, the same
    step either way (outside an evaluation the keys number the batch's rows from 0)."""
    for name in ("fixed", "unset"):
        trainer = arms[name][0].trainer
        batch = next(iter(trainer.get_eval_dataloader()))
        losses = []
        for by_name in (False, True):
            torch.manual_seed(0)  # the release's own draws come from the global RNG: the same ones both times
            if by_name:
                found = trainer.prediction_step(model=trainer.model, inputs=batch, prediction_loss_only=True)
            else:
                found = trainer.prediction_step(trainer.model, batch, True)
            losses.append(found[0].item())
        assert losses[0] == losses[1], name


@pytest.mark.skipif(MODE != registry.NATIVE, reason="the trainer's profile copy is patched on 2026.10.7+ only")
def test_the_profiles_keyed_draw_and_loss_take_their_arguments_by_position_or_by_name(plugin):
    """The release calls its profile's prepare_batch and compute_loss by position; another caller may name them.
    A keyed training draw and a keyed evaluation loss are the same either way."""
    from unsloth_diffusion_norm import batch_keys, evaluation, per_sample

    trainer = _train(diffusion_noise="per_sample", **FIXED).trainer
    profile, model, args = trainer.diffusion_profile, trainer.model, trainer.args
    batch = next(iter(trainer.get_eval_dataloader()))
    rows = batch["input_ids"].shape[0]
    training = {**batch, batch_keys.ROWS: per_sample.Rows([7 + row for row in range(rows)])}
    drawn = [
        profile.prepare_batch(model, training, args),
        profile.prepare_batch(model=model, inputs=training, args=args),
    ]
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(*drawn, strict=True)), (
        "a keyed draw differs by how its arguments are passed"
    )
    keyed = evaluation.EvalOrder().tag(args, batch, 1)
    with torch.no_grad():
        losses = [
            profile.compute_loss(model, keyed, args)[0],
            profile.compute_loss(model=model, inputs=keyed, args=args)[0],
        ]
    assert torch.equal(*losses)
    assert not torch.equal(losses[0], profile.compute_loss(model, batch, args)[0])  # (keyed: not the global draw)


def test_a_familys_fixed_evaluation_normalizes_as_the_run_asks_at_the_runs_noise_floor(plugin):
    """LLaDA opted into window normalization, with a noise floor of the run's own: a fixed evaluation normalizes
    each batch by its masked tokens, not by LLaDA's answer lengths, and draws at the run's eps. The oracle with
    either one wrong misses it, so that the check can fail."""
    from unsloth.models.diffusion_profiles import diffusion_profiles

    llada = next(p for p in diffusion_profiles() if p.name == "llada")
    run = _train(diffusion_profile=llada, diffusion_loss_normalization="window", diffusion_eps=0.25, **FIXED)
    loss, seen = experiment.evaluate(run.trainer, seed=None)
    run.reference_model.load_state_dict(run.trainer.model.state_dict())
    keyed = judging.keyed_evaluation(seen, SEED)

    def oracle_loss(**settings):
        return judging.expected_fixed_evaluation_loss(run.reference_model, keyed, judging.OracleSettings(**settings))

    expected = oracle_loss(eps=0.25, normalization=oracle.MASKED_TOKENS)
    assert abs(loss - expected) <= oracle.tolerance(expected), (loss, expected)
    for wrong in (dict(eps=0.25, normalization=oracle.ANSWER_LENGTH), dict(normalization=oracle.MASKED_TOKENS)):
        assert abs(loss - oracle_loss(**wrong)) > 100 * oracle.tolerance(expected), wrong


def test_llada_opted_in_evaluates_its_unkeyed_draws_by_each_batchs_masked_tokens(plugin):
    """Opted into window normalization, LLaDA's evaluation with diffusion_eval_noise unset (the release's draws
    from the global RNG, replayed by the oracle from each step's RNG state) divides each batch by its masked
    tokens, as its fixed evaluation does; by LLaDA's answer lengths it misses."""
    from unsloth.models.diffusion_profiles import diffusion_profiles

    llada = next(p for p in diffusion_profiles() if p.name == "llada")
    run = _train(diffusion_profile=llada, diffusion_loss_normalization="window")
    loss, seen = experiment.evaluate(run.trainer)
    run.reference_model.load_state_dict(run.trainer.model.state_dict())
    settings = judging.OracleSettings()

    def oracle_loss(normalization):
        losses = []
        for state, batch in seen:
            masks = oracle.replay_noise([batch], state, settings.eps, settings.eos_id)
            with torch.no_grad():
                found, _ = oracle.window_loss(run.reference_model, masks, settings.mask_id, True, False, normalization)
            losses.append(found.item())
        return sum(losses) / len(losses)

    expected = oracle_loss(oracle.MASKED_TOKENS)
    assert abs(loss - expected) <= oracle.tolerance(expected), (loss, expected)
    assert abs(loss - oracle_loss(oracle.ANSWER_LENGTH)) > 100 * oracle.tolerance(expected)


# Two rows per batch, no padding, answers of 1 to 6 maskable tokens. The third row's answer is one token long,
# which its keyed draw at eps 0.25 masks: a row of one maskable token divides by 1.
UNEQUAL = [
    Example([67, 68], [46, 47, 48]),
    Example([69], [49, 50, 51, 52]),
    Example([60, 61, 62, 63, 64, 65], [40], eos=False),
    Example([66], [41, 42, 43, 44, 45]),
]


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_a_family_not_opted_in_keeps_its_own_normalization_under_a_fixed_evaluation(name, plugin):
    """Not opted in, a family's keyed evaluation normalizes each batch of two by its own rule: LLaDA each row by
    its answer length and the mean over the rows, Dream the batch's masked tokens (with its shifted logits). The
    other family's rule misses it, so that the check can fail."""
    from unsloth.models.diffusion_profiles import diffusion_profiles

    profile = next(p for p in diffusion_profiles() if p.name == name)
    run = _train(UNEQUAL, batch_size=2, diffusion_profile=profile, diffusion_eps=0.25, **FIXED)
    steps = registry.per_trainer(run.trainer).own_steps  # the run's training draws, kept for its metrics
    steps.take(run.trainer.args.device)  # (what training left for its next log)
    logged = {}
    loss, seen = experiment.evaluate(run.trainer, seed=None, metrics=logged)
    assert steps.take(run.trainer.args.device) == {}  # evaluating adds no draw to the training metrics
    run.reference_model.load_state_dict(run.trainer.model.state_dict())
    keyed = judging.keyed_evaluation(seen, SEED, batch_size=2)
    assert [draws[0]["input_ids"].shape for draws in keyed] == [torch.Size([2, 6]), torch.Size([2, 7])]
    own = oracle.OBJECTIVES[name].normalization
    (other,) = {oracle.ANSWER_LENGTH, oracle.MASKED_TOKENS} - {own}

    def oracle_loss(normalization):
        settings = judging.OracleSettings(eps=0.25, shift=profile.shift_logits, normalization=normalization)
        return judging.expected_fixed_evaluation_loss(run.reference_model, keyed, settings)

    expected = oracle_loss(own)
    assert abs(loss - expected) <= oracle.tolerance(expected), (loss, expected)
    assert abs(loss - oracle_loss(other)) > 100 * oracle.tolerance(expected)
    # its accuracy and masked CE by noise level: scored at the family's own shift (Dream's: shifted logits)
    settings = judging.OracleSettings(eps=0.25, shift=profile.shift_logits)
    assert judging.scores_error(logged, judging.expected_evaluation_scores(run.reference_model, keyed, settings)) <= 1
    unshifted = judging.expected_evaluation_scores(run.reference_model, keyed, judging.OracleSettings(eps=0.25))
    assert (judging.scores_error(logged, unshifted) > 1) == profile.shift_logits  # (the check can fail)


def test_a_fixed_evaluation_keeps_the_runs_time_weighting_and_refuses_what_the_release_refuses(plugin):
    """diffusion_time_weighting="none" (no 1/p): the keyed evaluation is the oracle's without the weight, which the
    weighted oracle misses; a weighting the release does not support is refused there with the release's words."""
    run = _train(diffusion_time_weighting="none", **FIXED)
    loss, seen = experiment.evaluate(run.trainer, seed=None)
    run.reference_model.load_state_dict(run.trainer.model.state_dict())
    keyed = judging.keyed_evaluation(seen, SEED)
    expected = judging.expected_fixed_evaluation_loss(
        run.reference_model, keyed, judging.OracleSettings(inverse_t=False)
    )
    assert abs(loss - expected) <= oracle.tolerance(expected), (loss, expected)
    weighted = judging.expected_fixed_evaluation_loss(run.reference_model, keyed)
    assert abs(loss - weighted) > 100 * oracle.tolerance(expected)
    run.trainer.args.diffusion_time_weighting = "sqrt_t"
    with pytest.raises(ValueError, match="does not support diffusion_time_weighting='sqrt_t'"):
        experiment.evaluate(run.trainer, seed=None)


def _evaluating(found):
    """before_train: record {step: eval_loss} of every evaluation this train() call runs."""
    from transformers import TrainerCallback

    class Evaluations(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kw):
            found[state.global_step] = metrics["eval_loss"]

    return lambda trainer: trainer.add_callback(Evaluations())


@pytest.mark.parametrize("arm", ["fixed", "unset"])
def test_an_evaluation_after_a_resume_is_the_uninterrupted_runs(arm, tmp_path):
    """A job restarted from checkpoint-2 evaluates at once (eval_on_start) and at every step after: with keyed
    noise each evaluation equals the uninterrupted run's at that step, and the training stays bitwise."""
    flags = FIXED if arm == "fixed" else {}
    full_dir, resumed_dir = str(tmp_path / "full"), str(tmp_path / "resumed")
    theirs, ours = {}, {}
    full = _train(
        output_dir=full_dir,
        save_strategy="steps",
        save_steps=2,
        before_train=_evaluating(theirs),
        **EVERY_STEP,
        **flags,
    )
    resumed = _train(
        output_dir=resumed_dir,
        before_train=_evaluating(ours),
        resume_from_checkpoint=os.path.join(full_dir, "checkpoint-2"),
        eval_on_start=True,
        **EVERY_STEP,
        **flags,
    )
    assert sorted(ours) == [2, 3, 4]
    if arm == "fixed":
        assert ours == {step: theirs[step] for step in ours}
        assert experiment.final_difference(full, resumed) == 0.0
    else:
        assert ours[2] != theirs[2]


def test_a_per_sample_run_evaluates_with_keys_and_without(tmp_path):
    """Per-sample training noise does not imply keyed evaluation noise (the release's draws stay the default),
    and takes it when asked: the training is the same either way."""
    keyed = _train(diffusion_noise="per_sample", **EVERY_STEP, **FIXED)
    own = _train(diffusion_noise="per_sample", **EVERY_STEP)
    assert experiment.divergence(keyed, own) == 0.0
    assert len(set(_evaluate_twice(keyed))) == 1 and len(set(_evaluate_twice(own))) == 2


def test_bad_values_are_refused_at_construction(plugin, tmp_path):
    from unsloth.models.diffusion_trainer import DiffusionConfig

    base = {"output_dir": str(tmp_path), "bf16": False, "use_cpu": True}
    for value, said in (
        (
            {"diffusion_eval_noise": "random"},
            "diffusion_eval_noise must be 'fixed' or None (the default), got 'random'",
        ),
        ({"diffusion_eval_draws": 0}, "diffusion_eval_draws must be a whole number of draws, 1 or more"),
        ({"diffusion_eval_draws": 2.5}, "diffusion_eval_draws must be a whole number of draws, 1 or more"),
        (
            {"diffusion_eval_draws": 4},
            "diffusion_eval_draws=4 averages keyed evaluation draws; set diffusion_eval_noise",
        ),
    ):
        with pytest.raises(ValueError, match=re.escape(said)):
            DiffusionConfig(**base, **value)
    args = DiffusionConfig(**base, diffusion_eval_noise="None", diffusion_eval_draws=None)
    assert (args.diffusion_eval_noise, args.diffusion_eval_draws) == (None, 1)
    args = DiffusionConfig(**base, diffusion_eval_noise="fixed", diffusion_eval_draws=4)
    assert args.to_dict()["diffusion_eval_noise"] == "fixed" and args.to_dict()["diffusion_eval_draws"] == 4


def test_draws_set_on_the_arguments_after_they_were_made_are_refused_at_the_trainer(plugin):
    """DiffusionConfig checks its fields when it is made; a field set afterwards is checked when a trainer is
    built on it, in the same words."""
    trainer = experiment.build(TRAIN[:2], experiment.Setup.of(), record=False).trainer
    args = trainer.args
    args.diffusion_eval_draws = 4
    try:
        with pytest.raises(ValueError, match=re.escape("diffusion_eval_draws=4 averages keyed evaluation draws")):
            type(trainer)(
                model=trainer.model,
                args=args,
                train_dataset=trainer.train_dataset,
                processing_class=trainer.processing_class,
            )
    finally:
        args.diffusion_eval_draws = 1


@pytest.mark.skipif(MODE != registry.NATIVE, reason="a natively fixed release")
def test_native_keyed_evaluation_is_per_trainer(plugin):
    """2026.10.7+: Unsloth's classes stay untouched; the trainer that asks carries its own evaluation patches, and
    its profile copy's compute_loss is wrapped once, for the keyed evaluation and the window's first-step draws."""
    run = experiment.build(TRAIN[:2], experiment.Setup.of(**FIXED), record=False)
    patches = run.trainer.__dict__[registry.PER_TRAINER].patches
    names = [patch.name for patch in patches]
    assert {"evaluation_loop", "prediction_step", "diffusion_profile.compute_loss"} <= set(names)
    assert len(names) == len(set(names)), names  # each target once
    (loss,) = [patch for patch in patches if patch.name == "diffusion_profile.compute_loss"]
    assert "keyed evaluation draw" in loss.why and "first training step" in loss.why


def test_samples_at_each_evaluation_are_the_oracles_decode_and_change_nothing(tmp_path):
    """diffusion_eval_samples=2: at each evaluation the first two eval examples' answers, decoded by greedy
    low-confidence remasking, are written to output_dir with the step - the last evaluation's the oracle's own
    decode with the final weights, token for token; the run trains and evaluates bitwise as without them; asked
    for with evaluation off, the trainer refuses at construction."""
    import json

    from unsloth_diffusion_norm import samples

    gentle = {**EVERY_STEP, "learning_rate": 1e-3}  # (the model's answers still vary with their context)
    sampled = _train(**gentle, output_dir=str(tmp_path), diffusion_eval_samples=2)
    plain = _train(**gentle)
    assert experiment.divergence(sampled, plain) == 0.0
    evaluations = lambda run: [e["eval_loss"] for e in run.trainer.state.log_history if "eval_loss" in e]  # noqa: E731
    assert evaluations(sampled) == evaluations(plain) and len(evaluations(plain)) == 4
    lines = [json.loads(line) for line in (tmp_path / samples.FILE).read_text().splitlines()]
    assert [(line["step"], line["index"]) for line in lines] == [(s, i) for s in (1, 2, 3, 4) for i in (0, 1)]
    decoded = sampled.trainer.processing_class.decode
    assert all(line["sample"] == decoded(line["tokens"]) and line["reference"] for line in lines)
    run = sampled
    run.reference_model.load_state_dict(run.trainer.model.state_dict())
    for line, example in zip(lines[-2:], HELD):
        answer = len(example.answer) + 1  # (the EOS that closes it)
        expected = oracle.low_confidence_decode(run.reference_model, example.prompt, answer, MASK_ID, samples.STEPS)
        assert line["tokens"] == expected and len(expected) == answer and len(set(expected)) > 2, (line, expected)
    # the batched form (Part 3 of the convergence study decodes its held-out rows so): each row on its own
    given = [HELD[0].prompt, HELD[0].prompt[::-1], [HELD[0].prompt[0]] * len(HELD[0].prompt)]
    batched = samples.decode_rows(run.reference_model, given, 9, MASK_ID)
    assert batched == [oracle.low_confidence_decode(run.reference_model, p, 9, MASK_ID, samples.STEPS) for p in given]
    with pytest.raises(ValueError, match="diffusion_eval_samples=2 decodes samples at each evaluation, and this run"):
        _train(diffusion_eval_samples=2, eval_strategy="no")
    # prompts of one's own: tokenized as text, as long an answer as fits (the tiny model's 64 positions)
    own = tmp_path / "own"
    run = _train(**gentle, output_dir=str(own), diffusion_eval_sample_prompts=["w56 w57"])
    (*_, line) = [json.loads(line) for line in (own / samples.FILE).read_text().splitlines()]
    prompt = run.trainer.processing_class("w56 w57")["input_ids"]
    run.reference_model.load_state_dict(run.trainer.model.state_dict())
    expected = oracle.low_confidence_decode(run.reference_model, prompt, 64 - len(prompt), MASK_ID, samples.STEPS)
    assert (line["step"], line["prompt"], line["reference"], line["tokens"]) == (4, "w56 w57", None, expected)
    # where the run's max_length binds first, the answer is what fits in it; a prompt that fills it gets none
    kept = run.trainer.args.max_length
    try:
        for max_length, answer in ((len(prompt) + 5, 5), (len(prompt), 0)):
            run.trainer.args.max_length = max_length
            (row,) = samples.samples_of(run.trainer)
            expected = oracle.low_confidence_decode(run.reference_model, prompt, answer, MASK_ID, samples.STEPS)
            assert row["tokens"] == (expected if answer else []), max_length
    finally:
        run.trainer.args.max_length = kept
    # the [MASK] id the run's arguments set, Dream's shifted logits, a processor's text tokenizer: the run's own
    trainer, tokenizer, profile = run.trainer, run.trainer.processing_class, run.trainer.diffusion_profile
    other, set_before = MASK_ID - 1, trainer.args.diffusion_mask_token_id
    shifted = copy.copy(profile)
    shifted.shift_logits = True
    trainer.args.diffusion_mask_token_id, trainer.diffusion_profile = other, shifted
    trainer.processing_class = SimpleNamespace(tokenizer=tokenizer)  # (what a processor holds its text tokenizer as)
    try:
        (row,) = samples.samples_of(trainer)
    finally:
        trainer.args.diffusion_mask_token_id, trainer.diffusion_profile = set_before, profile
        trainer.processing_class = tokenizer
    answer = 64 - len(prompt)
    expected = oracle.low_confidence_decode(run.reference_model, prompt, answer, other, samples.STEPS, shift=True)
    assert (row["prompt"], row["tokens"]) == ("w56 w57", expected)


def test_the_decoder_is_the_oracles_shifted_or_not_in_one_step_or_many_whatever_the_forward_returns(plugin):
    """samples.decode against the oracle's low-confidence remasking (written apart) on the tiny model's random
    weights: its defaults (unshifted), Dream's shifted logits, one step for many tokens, one token, a batch of
    rows, a forward that returns a plain tuple (as some remote code does), and block by block (NVIDIA's order:
    blocks shorter than the answer, fewer steps than blocks, one block, a block past the answer)."""
    from transformers.modeling_outputs import MaskedLMOutput

    from unsloth_diffusion_norm import samples
    from unsloth_diffusion_norm.proof.fixtures import load_model

    model, _ = load_model()
    prompt = HELD[0].prompt

    def expected(length, steps=samples.STEPS, shift=False, given=prompt):
        return oracle.low_confidence_decode(model, given, length, MASK_ID, steps, shift)

    class Plain(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            return (self.inner(input_ids=input_ids).logits,)

    class LossFirst(Plain):  # an output whose first field is a loss
        def forward(self, input_ids):
            return MaskedLMOutput(loss=torch.tensor(0.0), logits=self.inner(input_ids=input_ids).logits)

    with torch.no_grad():
        assert samples.decode(model, prompt, 9, MASK_ID) == expected(9)
        shifted = samples.decode(model, prompt, 9, MASK_ID, shift=True)
        assert shifted == expected(9, shift=True) != expected(9)
        given = [prompt, prompt[::-1]]
        rows = samples.decode_rows(model, given, 9, MASK_ID, samples.STEPS, True)
        assert rows == [expected(9, shift=True, given=p) for p in given]
        for length, steps in ((1, samples.STEPS), (6, 1), (9, 1), (9, 4)):
            assert samples.decode(model, prompt, length, MASK_ID, steps) == expected(length, steps), (length, steps)
        assert samples.decode(Plain(model), prompt, 9, MASK_ID) == expected(9)
        assert samples.decode(LossFirst(model), prompt, 9, MASK_ID) == expected(9)
        for length, steps, block in ((9, samples.STEPS, 4), (9, 2, 4), (9, 5, 2), (9, samples.STEPS, 9), (3, 8, 4)):
            found = samples.decode(model, prompt, length, MASK_ID, steps, block=block)
            assert found == oracle.low_confidence_decode(model, prompt, length, MASK_ID, steps, block=block), block
        assert samples.decode(model, prompt, 9, MASK_ID, block=4) != expected(9)  # (the later blocks unseen)
        blocked = samples.decode_rows(model, given, 9, MASK_ID, samples.STEPS, True, 4)
        assert blocked == [oracle.low_confidence_decode(model, p, 9, MASK_ID, samples.STEPS, True, 4) for p in given]
        with torch.device("meta"):  # a default device other than the model's, as on a GPU: nothing may land there
            assert samples.decode_rows(model, given, 9, MASK_ID, samples.STEPS, True) == rows
            assert samples.decode_rows(model, given, 9, MASK_ID, samples.STEPS, True, 4) == blocked


def test_the_samples_prompts_are_the_first_rows_cut_where_each_is_supervised(plugin):
    """A row's answer is where its labels are not -100, else where its completion_mask (TRL's) is set; a row
    with neither has no reference; a dict of splits gives its first."""
    from datasets import Dataset

    from unsloth_diffusion_norm import samples

    rows = [
        {"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4], "completion_mask": None},
        {"input_ids": [5, 6, 7, 8], "labels": None, "completion_mask": [0, 1, 1, 0]},
        {"input_ids": [9, 10], "labels": None, "completion_mask": None},
        {"input_ids": [11, 12, 13], "labels": [-100, 12, 13], "completion_mask": None},
        {"input_ids": [14, 15], "labels": [-100, 15], "completion_mask": None},
    ]
    found = [([1, 2], [3, 4]), ([5], [6, 7]), ([9, 10], []), ([11], [12, 13])]
    dataset = Dataset.from_list(rows)
    assert samples.prompts(dataset, 4) == found
    assert samples.prompts({"test": dataset, "other": Dataset.from_list(rows[3:])}, 4) == found


def test_the_scores_take_the_logits_whatever_the_forward_returns(plugin):
    """metrics.row_scores reads a forward's logits where its output keeps them: a ModelOutput whose first field is
    a loss, and a plain tuple (as some remote code returns); where the loss fused the head, the hidden states
    through it (its bias too), more than a chunk of tokens at a time. Per row: the masked tokens' cross-entropy
    sum (plain torch here), their hits and their count; under a default device other than the data's."""
    from transformers.modeling_outputs import MaskedLMOutput

    from unsloth_diffusion_norm import metrics
    from unsloth_diffusion_norm.noise import Noise

    generator = torch.Generator().manual_seed(0)
    length = metrics.CHUNK + 9  # (the first row masks every position: more than one chunk)
    logits = torch.randn(2, length, 7, generator=generator)
    tokens = torch.randint(0, 7, (2, length), generator=generator)
    masked = torch.rand(2, length, generator=generator) < 0.5
    masked[0] = True
    drawn = Noise(tokens, None, masked, masked, torch.full((2, length), 0.5))

    def expected(scores):
        ce = [float(F.cross_entropy(scores[r][masked[r]], tokens[r][masked[r]], reduction="sum")) for r in range(2)]
        hits = [int((scores[r][masked[r]].argmax(-1) == tokens[r][masked[r]]).sum()) for r in range(2)]
        return ce, hits

    with torch.random.fork_rng():  # (its initialization draws from the global RNG: left as it was)
        head = torch.nn.Linear(5, 7)  # (with a bias)
    hidden = torch.randn(2, length, 5, generator=generator)
    with torch.no_grad():
        fused = head(hidden)
    cases = [(MaskedLMOutput(loss=torch.tensor(3.0), logits=logits), None, logits), ((logits,), None, logits)]
    cases.append((MaskedLMOutput(logits=hidden), head, fused))
    for output, fused_head, scores in cases:
        with torch.device("meta"):  # as on a GPU: nothing may land on the default device
            got_ce, got_hits, got_masked = metrics.row_scores(output, fused_head, drawn, shift=False)
        ce, hits = expected(scores)
        assert got_ce.tolist() == pytest.approx(ce, abs=oracle.ATOL, rel=oracle.RTOL)
        assert got_hits.tolist() == hits and got_masked.tolist() == masked.sum(dim=1).tolist()

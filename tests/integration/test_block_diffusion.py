"""NVIDIA's block-diffusion mode (a checkpoint whose config says dlm_paradigm="block_diff"): Trainer.train()
through the real DiffusionTrainer, every window held to the oracle's block-diffusion objective (loss, every
gradient, the parameters after the step); the release alone misses it; a run that asks for what the mode does
not combine with, or a paradigm the plugin does not train, is refused in one line."""

import contextlib
import functools
import os
import sys

import pytest
import torch

import unsloth_diffusion_norm
from unsloth_diffusion_norm import block_attention
from unsloth_diffusion_norm.proof import experiment, fixtures, oracle
from unsloth_diffusion_norm.proof.fixtures import Example, equal_answers, mixed_answers
from unsloth_diffusion_norm.proof.judging import OracleSettings, judge
from unsloth_diffusion_norm.proof.tiny_model import write_tiny_checkpoint

unsloth_diffusion_norm.apply()
BLOCK = 4  # the tiny answers span two to four blocks
SETTINGS = OracleSettings(block=oracle.BlockDiffusion(BLOCK))


def checkpoint(paradigm="block_diff"):
    """The tiny checkpoint configured as NVIDIA's recipe configures the 8B (one per process and paradigm)."""
    if paradigm not in CHECKPOINTS:
        where = os.path.join(fixtures.scratch("udn-block-"), "tiny")
        CHECKPOINTS[paradigm] = write_tiny_checkpoint(where, dlm_paradigm=paradigm, block_size=BLOCK)
    return CHECKPOINTS[paradigm]


CHECKPOINTS = {}

CASES = {
    "ga-1": dict(examples=equal_answers(2), gradient_accumulation_steps=1),
    "ga-2": dict(examples=equal_answers(4), seed=1),
    "ga-4-mixed-lengths": dict(examples=mixed_answers(4), gradient_accumulation_steps=4),
    "batch-2-padded-rows": dict(examples=mixed_answers(4), batch_size=2),
    "partial-last-window-ga3-over-5": dict(examples=equal_answers(5), gradient_accumulation_steps=3),
    "micro-batch-without-supervised-tokens": dict(examples=[Example([10, 11, 12], [], eos=False), *equal_answers(3)]),
    "lora-frozen-head": dict(examples=equal_answers(4), lora="frozen-head"),
    "rows-clipped-at-max-length-get-no-fill": dict(examples=mixed_answers(4), batch_size=2, max_length=9),
    "gradient-checkpointing": dict(examples=mixed_answers(4), gradient_checkpointing=True),
    "bf16-autocast": dict(examples=mixed_answers(4), bf16=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_block_diff_checkpoint_trains_nvidias_objective_and_the_release_alone_misses_it(case, plugin):
    spec = dict(CASES[case])
    run = experiment.train(checkpoint=checkpoint(), **spec)
    settings = OracleSettings(
        block=oracle.BlockDiffusion(BLOCK, max_length=spec.get("max_length")),
        precision="bf16" if spec.get("bf16") else "fp32",
    )
    verdicts = [judge(run, window, settings) for window in run.windows]
    for i, verdict in enumerate(verdicts):
        assert verdict.ok, f"{case}, window {i}: {verdict}"
        logs = run.windows[i].logs
        # the two terms beside the total, each normalized as in the loss: total = alpha * diffusion + AR
        assert logs["loss"] == pytest.approx(SETTINGS.block.alpha * logs["loss_diffusion"] + logs["loss_ar"], rel=1e-5)
    if case == "ga-4-mixed-lengths":  # the release alone: the model called with the noisy row, no labels
        with unsloth_diffusion_norm.unpatched(), as_on_a_gpu():
            alone = experiment.train(checkpoint=checkpoint(), **spec)
        assert judge(alone, alone.windows[0], SETTINGS).worst > oracle.CONTROL_FACTORS["fp32"]


def test_a_window_with_nothing_masked_or_supervised_gives_a_loss_of_0_and_zero_gradients(plugin):
    run = experiment.train([Example([10, 11, 12], [], eos=False)] * 2, checkpoint=checkpoint())
    (window,) = run.windows
    assert window.logged_loss == 0.0 and judge(run, window, SETTINGS).ok
    assert all(float(g.abs().max()) == 0.0 for g in window.grads.values())


def test_per_sample_noise_four_rows_in_one_micro_batch_equal_four_micro_batches_of_one(plugin):
    """Each row's fill ends at its own block boundary and its padding sits in later blocks, which none of its
    tokens sees: the layout of the step does not change the objective (per-sample masks do not depend on it)."""
    examples = mixed_answers(4)  # answers of 3, 5, 7 and 9 tokens
    together = experiment.train(
        examples, checkpoint=checkpoint(), batch_size=4, gradient_accumulation_steps=1, diffusion_noise="per_sample"
    )
    apart = experiment.train(
        examples, checkpoint=checkpoint(), batch_size=1, gradient_accumulation_steps=4, diffusion_noise="per_sample"
    )
    for run in (together, apart):
        assert judge(run, run.windows[0], SETTINGS).ok
    assert together.windows[0].logged_loss == pytest.approx(apart.windows[0].logged_loss, rel=1e-6)
    after = together.windows[0].params_after
    for name, value in apart.windows[0].params_after.items():
        assert oracle.max_error(value, after[name]) <= oracle.tolerance(after[name]), name


def test_a_resumed_block_diffusion_run_is_bitwise_the_uninterrupted_one_and_the_oracles(plugin):
    runs = experiment.train_and_resume(mixed_answers(8), at=2, seed=0, checkpoint=checkpoint())
    assert (len(runs.full.windows), len(runs.resumed.windows)) == (4, 2) and runs.difference == 0.0
    assert all(judge(runs.resumed, window, SETTINGS).ok for window in runs.resumed.windows)


@contextlib.contextmanager
def as_on_a_gpu():
    """The model's FlexAttention differentiable, as on a GPU (the release alone on a CPU raises at its backward
    instead of training): the core's stand-in, proven equal below, put in every loaded copy's module."""
    modules = [m for m in list(sys.modules.values()) if block_attention.FLEX_CLASS in getattr(m, "__dict__", {})]
    kept = [getattr(m, block_attention.FLEX_FUNCTION) for m in modules]
    for module in modules:
        module.fused_flex_attention = block_attention.dense_flex_attention
    try:
        yield
    finally:
        for module, own in zip(modules, kept):
            module.fused_flex_attention = own


def test_the_flag_trains_a_checkpoint_shipped_bidirectional_in_nvidias_mode_where_unslothss_loader_cannot(plugin):
    """diffusion_paradigm="block_diff" gives the built model its class's own block-diffusion attention (NVIDIA's
    recipe overrides the config at load, which Unsloth's loader drops); diffusion_ar_loss_alpha weighs the terms;
    the switch is a patch of the trainer's, undone with the plugin."""
    from unsloth import FastModel

    loaded, _ = FastModel.from_pretrained(
        checkpoint("bidirectional"), trust_remote_code=True, dlm_paradigm="block_diff"
    )
    assert loaded.config.dlm_paradigm == "bidirectional"  # the keyword is dropped: the flag is the way
    settings = OracleSettings(block=oracle.BlockDiffusion(BLOCK, 0.5))
    asked = dict(diffusion_paradigm="block_diff", diffusion_ar_loss_alpha=0.5)
    evaluated = dict(eval_examples=mixed_answers(2), eval_strategy="steps", eval_steps=1)
    run = experiment.train(mixed_answers(4), checkpoint=checkpoint("bidirectional"), **asked, **evaluated)
    for i, window in enumerate(run.windows):
        assert judge(run, window, settings).ok, f"window {i}"
    logs = run.windows[0].logs
    assert logs["loss"] == pytest.approx(0.5 * logs["loss_diffusion"] + logs["loss_ar"], rel=1e-5)
    (evaluation, *_) = [h for h in run.trainer.state.log_history if "eval_loss" in h]  # the terms at evaluation too
    assert evaluation["eval_loss"] == pytest.approx(
        0.5 * evaluation["eval_loss_diffusion"] + evaluation["eval_loss_ar"], rel=1e-5
    )
    layers = [m for m in run.trainer.model.modules() if type(m).__name__.endswith("Attention")]
    assert {type(m).__name__ for m in layers} == {block_attention.FLEX_CLASS}
    with unsloth_diffusion_norm.unpatched():
        assert run.trainer.model.config.dlm_paradigm == "bidirectional"
        assert {type(m).__name__ for m in layers} == {"Attention"}


@pytest.mark.parametrize("how", ["block_diff checkpoint", "the flag"])
def test_a_block_diffusion_runs_samples_are_decoded_block_by_block_and_say_so(how, plugin, tmp_path):
    """The samples at each evaluation of a block_diff run (the checkpoint's mode, or the flag's on a checkpoint
    shipped bidirectional) are the oracle's block-by-block decode of the weights at that step, with bidirectional
    attention of the same weights (its class's generate runs it), not the whole canvas's; the run's attention is
    block diffusion's again after them, and the run evaluates as it does without samples."""
    import json

    from unsloth_diffusion_norm import samples

    spec = dict(
        checkpoint=checkpoint() if how == "block_diff checkpoint" else checkpoint("bidirectional"),
        **({} if how == "block_diff checkpoint" else dict(diffusion_paradigm="block_diff")),
        eval_examples=mixed_answers(4)[2:],  # answers of 8 and 10 tokens with their EOS: two and three blocks
        eval_strategy="steps",
        eval_steps=1,
        max_steps=1,
        learning_rate=1e-3,  # (the model's answers still vary with their context)
    )
    run = experiment.train(mixed_answers(4), **spec, diffusion_eval_samples=2, output_dir=str(tmp_path))
    plain = experiment.train(mixed_answers(4), **spec)
    evaluations = lambda r: [h["eval_loss"] for h in r.trainer.state.log_history if "eval_loss" in h]  # noqa: E731
    assert evaluations(run) == evaluations(plain) and experiment.divergence(run, plain) == 0.0
    lines = [json.loads(line) for line in (tmp_path / samples.FILE).read_text().splitlines()]
    run.reference_model.load_state_dict(run.trainer.model.state_dict())
    canvas = []
    for line, example in zip(lines, mixed_answers(4)[2:]):
        decode = functools.partial(
            oracle.low_confidence_decode, run.reference_model, example.prompt, len(example.answer) + 1
        )
        assert line["decoding"] == f"block by block ({BLOCK} tokens)"
        assert line["tokens"] == decode(fixtures.MASK_ID, samples.STEPS, block=BLOCK), line
        canvas.append(decode(fixtures.MASK_ID, samples.STEPS))
    assert [line["tokens"] for line in lines] != canvas  # (what decoding the whole canvas would have given)


def test_the_flag_trains_a_block_diff_checkpoint_bidirectionally_the_other_way_round(plugin):
    run = experiment.train(equal_answers(4), checkpoint=checkpoint(), diffusion_paradigm="bidirectional")
    assert run.trainer.model.config.dlm_paradigm == "bidirectional"
    assert {type(m).__name__ for m in run.trainer.model.modules() if type(m).__name__.endswith("Attention")} == {
        "Attention"
    }
    reference = run.reference_model  # (loaded apart, in the checkpoint's mode: given the same switch)
    for patch in block_attention.patches(reference, reference.config, "bidirectional", BLOCK):
        patch.apply()
    assert all(judge(run, window).ok for window in run.windows)  # the bidirectional oracle


def test_the_cpus_stand_in_for_flex_attention_is_the_models_flex_attention():
    """FlexAttention runs forward on a CPU (not backward): there the core's SDPA stand-in gives its output, layer
    by layer and through the whole block-diffusion forward, within the tolerance."""
    from torch.nn.attention.flex_attention import flex_attention
    from transformers import AutoModel

    model = AutoModel.from_pretrained(checkpoint(), trust_remote_code=True)
    module = sys.modules[type(model).__module__]
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 24, 8, generator=generator) for _ in range(3))
    block_mask = model.model.layers[0].self_attn.compute_block_mask(24, "cpu")
    flex = flex_attention(q, k, v, block_mask=block_mask)
    assert oracle.max_error(block_attention.dense_flex_attention(q, k, v, block_mask=block_mask), flex) <= (
        oracle.tolerance(flex)
    )
    tokens = torch.randint(4, 90, (2, 10), generator=generator)
    masked = torch.rand(2, 10, generator=generator) < 0.5
    inputs = dict(input_ids=tokens, labels=tokens, masked_indices=masked, p_mask=torch.full((2, 10), 0.5))
    with torch.no_grad():
        own = model(**inputs, skip_loss=True)
        with as_on_a_gpu():
            assert module.fused_flex_attention is block_attention.dense_flex_attention
            stand_in = model(**inputs, skip_loss=True)
    for name in ("logits", "causal_logits"):
        assert oracle.max_error(stand_in[name], own[name]) <= oracle.tolerance(own[name]), name


@pytest.mark.parametrize(
    "paradigm, asked, words",
    [
        ("block_diff", dict(diffusion_complementary_masks=True), "diffusion_complementary_masks=True"),
        ("block_diff", dict(diffusion_loss_normalization="microbatch"), "diffusion_loss_normalization='microbatch'"),
        ("autoregressive", {}, "dlm_paradigm='autoregressive'"),
        ("bidirectional", dict(diffusion_ar_loss_alpha=0.5), "diffusion_ar_loss_alpha=0.5"),
    ],
)
def test_what_the_mode_does_not_combine_with_and_a_paradigm_it_does_not_train_are_refused_in_one_line(
    plugin, paradigm, asked, words
):
    with pytest.raises(ValueError) as refused:
        experiment.build(equal_answers(2), experiment.Setup.of(checkpoint=checkpoint(paradigm), **asked))
    message = str(refused.value)
    assert "\n" not in message and words in message


def test_the_tiny_models_own_forward_is_nvidias_block_diffusion_forward():
    """The stand-in for NVIDIA's class: its [noisy; clean] forward equals the oracle's construction from the
    published description, and its own (sum, count) is NVIDIA's: diffusion sum + w * AR sum, masked + int(w * L)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(checkpoint(), trust_remote_code=True)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 90, (2, 10), generator=generator)
    masked = torch.rand(2, 10, generator=generator) < 0.5
    p_mask = torch.full((2, 10), 0.5)
    with torch.no_grad():
        output = model(input_ids=tokens, labels=tokens, masked_indices=masked, p_mask=p_mask)
        noisy, clean = oracle.block_diffusion_logits(model, tokens, masked, fixtures.MASK_ID, BLOCK)
    assert oracle.max_error(output.logits, noisy) <= oracle.tolerance(noisy)
    assert oracle.max_error(output.causal_logits, clean) <= oracle.tolerance(clean)
    ce = torch.nn.functional.cross_entropy
    diffusion = (ce(noisy[masked], tokens[masked], reduction="none") / p_mask[masked]).sum()
    ar = ce(clean[:, :-1].reshape(-1, clean.shape[-1]), tokens[:, 1:].reshape(-1), reduction="sum")
    total, count = output.loss
    assert float(total) == pytest.approx(float(diffusion + ar), rel=1e-5)
    assert int(count) == int(masked.sum()) + 10


def test_doctor_model_names_the_paradigm_and_what_unsloth_alone_and_the_plugin_do_with_it(plugin, capsys):
    from unsloth_diffusion_norm.tools import cli

    code = cli.main(["doctor", "--trust-remote-code", "--model", checkpoint()])
    lines = capsys.readouterr().out.splitlines()
    model = next(line for line in lines if line.startswith("Model:"))
    assert f"block_diff (block size {BLOCK}): AFFECTED in Unsloth alone" in model
    assert code == 0 and "trained by the plugin" in model  # the self-check judged by the oracle's objective
    assert any(line.startswith("Self-check") and ": PASS" in line for line in lines), lines
    assert cli.main(["doctor", "--trust-remote-code", "--model", checkpoint("autoregressive")]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "dlm_paradigm='autoregressive'" in error

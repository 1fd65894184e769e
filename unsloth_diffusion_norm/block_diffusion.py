"""NVIDIA's block-diffusion training mode for Nemotron-Labs-Diffusion (`dlm_paradigm="block_diff"`), as NeMo
Automodel's SFT recipe trains it: which runs have it, their rows filled, their noise, and their loss.

- The fill: each row's real tokens followed by EOS up to the next multiple of the block size, supervised where
  the row has an answer (the recipe's collator); the micro-batch padded to a multiple of the block size. The
  rest of the padding sits in whole blocks after a row's end, which the block-diffusion attention never shows
  to the row's tokens: a row's objective does not depend on the other rows of its micro-batch.
- The noise: the release's own draws (t per row, then one uniform per token) over the filled micro-batch; the
  maskable tokens are the answer and its fill.
- The loss: the model's own `[noisy; clean]` forward (`labels`, `masked_indices`, `skip_loss=True`, as the
  recipe calls it), then alpha * sum(CE/p_mask at masked tokens) / N_masked + sum(next-token CE of the clean
  half's causal logits at supervised tokens) / N_supervised, both counts the window's (`window.Window`).
"""

from dataclasses import dataclass

import torch

from . import block_attention, config, construction, registry
from .config import BIDIRECTIONAL, BLOCK_DIFF, PREFIX
from .config import PARADIGM_FIELD as PARADIGM
from .noise import Noise

ALPHA = config.AR_ALPHA.default  # NeMo Automodel's recipe: ar_loss_alpha, the diffusion term's weight (AR's is 1)


@dataclass(frozen=True)
class BlockDiffusion:
    """A run's block-diffusion settings: the block size (the model config's) and the diffusion term's weight."""

    block_size: int
    alpha: float = ALPHA
    max_length: int = None  # the run's max_length: a row that long (clipped) gets no fill, as the recipe's collator


def of_config(model_config, args=None):
    """The run's BlockDiffusion where it trains `block_diff` (the flag diffusion_paradigm, else the model's config),
    None where `bidirectional` (or nothing); ValueError, in one line naming it, for a paradigm the plugin does not
    train. `args`: the run's training arguments (the flags), or None for the model's config alone."""
    asked = config.PARADIGM.of(args) if args is not None else None
    paradigm = asked or getattr(model_config, PARADIGM, None)
    if paradigm in (None, BIDIRECTIONAL):
        return None
    if paradigm != BLOCK_DIFF:
        raise ValueError(
            f"{PREFIX}the model's config sets {PARADIGM}={paradigm!r}, which DiffusionTrainer does not train; "
            f"the plugin trains {BIDIRECTIONAL!r} and {BLOCK_DIFF!r}."
        )
    block_size = getattr(model_config, "block_size", None)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"{PREFIX}{PARADIGM}={BLOCK_DIFF!r} needs the model config's block_size, got {block_size!r}.")
    if args is None:
        return BlockDiffusion(block_size)
    return BlockDiffusion(block_size, config.AR_ALPHA.of(args), getattr(args, "max_length", None))


def filled(batch, block_size, eos_id, max_length=None):
    """(the micro-batch widened to a multiple of the block size, its padding marked unattended; which positions
    are each row's EOS fill, up to the next multiple of the block size after its real tokens, where the row has
    an answer and is shorter than `max_length`: a clipped row's answer does not end there)."""
    input_ids, labels = batch["input_ids"], batch["labels"]
    attention = batch.get("attention_mask")
    if attention is None:
        attention = torch.ones_like(input_ids)
    rows, length = input_ids.shape
    wide = -(-length // block_size) * block_size

    def widened(tensor, value):
        return torch.nn.functional.pad(tensor, (0, wide - length), value=value)

    real = attention.sum(dim=1, keepdim=True)
    position = torch.arange(wide, device=input_ids.device)[None, :]
    fill = (position >= real) & (position < -(-real // block_size) * block_size)
    fill = fill & (labels != -100).any(dim=1, keepdim=True)
    if max_length is not None:
        fill = fill & (real < max_length)
    batch = {
        **batch,
        "input_ids": widened(input_ids, eos_id),
        "labels": widened(labels, -100),
        "attention_mask": widened(attention, 0),
    }
    return batch, fill


def draw(release_draw, batch, block, eos_id):
    """The micro-batch's noise: `release_draw(batch)` (the release's own recipe, keyed where the run is) over the
    filled micro-batch, the maskable tokens cut to the answers and their fill (masked = draw < p_mask & maskable,
    so cutting after the draw is cutting before it). Every position is attended: the model sees no padding."""
    widened, fill = filled(batch, block.block_size, eos_id, block.max_length)
    drawn = release_draw(widened)
    answer = (widened["labels"] != -100) & widened["attention_mask"].bool()
    maskable = drawn.maskable & (answer | fill)
    return Noise(drawn.input_ids, None, maskable, drawn.masked & maskable, drawn.p_mask)


def counts(noise):
    """(masked, supervised) tokens of a micro-batch: the two terms' counts."""
    return noise.masked.sum(), noise.maskable.sum()


def loss(model, noise, settings, masked_count, supervised_count, share=1, score=None):
    """(loss, None, metrics) of one micro-batch: each term's sum divided by its count (the window's, or the
    micro-batch's own). `share`: what the logged terms are multiplied by so that the release's mean of its
    micro-batches' values is the window's; `score(logits, tokens, masked)`: the run's training accuracy."""
    F = torch.nn.functional
    input_ids, masked, p_mask = noise.input_ids, noise.masked, noise.p_mask
    output = model(input_ids=input_ids, labels=input_ids, masked_indices=masked, p_mask=p_mask, skip_loss=True)
    logits, causal_logits = output.logits, output.causal_logits
    if score is not None:
        score(logits, input_ids, masked)
    diffusion = (F.cross_entropy(logits[masked].float(), input_ids[masked], reduction="none") / p_mask[masked]).sum()
    supervised = noise.maskable[:, 1:]  # token j + 1 predicted from the clean half's position j
    ar = F.cross_entropy(causal_logits[:, :-1][supervised].float(), input_ids[:, 1:][supervised], reduction="sum")
    # A window with nothing masked (or supervised) gives that term 0: its sum is 0, its count 1.
    diffusion = diffusion / torch.as_tensor(masked_count, device=diffusion.device).clamp_min(1)
    ar = ar / torch.as_tensor(supervised_count, device=ar.device).clamp_min(1)
    total = settings.alpha * diffusion + ar
    metrics = {"loss_diffusion": (diffusion * share).detach(), "loss_ar": (ar * share).detach()}
    return total, None, metrics


def set_up(trainer):
    """At a trainer's construction: the run's BlockDiffusion (None for a bidirectional run), with what its model
    needs (block_attention: its attention switched where the flag asks the other mode, the CPU's stand-in for
    FlexAttention) applied on the trainer; ValueError in one line where the run cannot train as it asks."""
    model_config = construction.model_config(trainer.model)
    block = check_run(model_config, trainer.args)
    paradigm = BLOCK_DIFF if block is not None else config.PARADIGM.of(trainer.args)
    if paradigm is not None:
        size = getattr(model_config, "block_size", None)
        registry.apply_to_trainer(trainer, block_attention.patches(trainer.model, model_config, paradigm, size))
    return block


def check_run(model_config, args):
    """The run's BlockDiffusion (None for a bidirectional run), or ValueError in one line where the run asks for
    what block diffusion does not combine with - never a silently other objective."""
    block = of_config(model_config, args)
    if block is None:
        if config.AR_ALPHA.of(args) != config.AR_ALPHA.default:
            raise ValueError(
                f"{PREFIX}{config.AR_ALPHA.name}={config.AR_ALPHA.of(args)!r} weighs block diffusion's terms, and "
                f"this run is {BIDIRECTIONAL!r}; set {config.PARADIGM.name}={BLOCK_DIFF!r} or leave it at its default."
            )
        return None
    asked = (
        f"{config.PARADIGM.name}={BLOCK_DIFF!r}"
        if config.PARADIGM.of(args)
        else f"the model's config sets {PARADIGM}={BLOCK_DIFF!r}"
    )
    refused = (
        (config.NORMALIZATION, config.NORMALIZATION.given(args) == config.MICROBATCH, "its counts are the window's"),
        (config.COMPLEMENTARY, config.COMPLEMENTARY.of(args), "mask pairs are not part of it"),
        (config.EVAL_NOISE, config.EVAL_NOISE.of(args) == config.FIXED, "keyed evaluation is not part of it yet"),
        (config.T_SAMPLER, config.T_SAMPLER.of(args) == config.STRATIFIED, "stratified levels are not part of it yet"),
    )
    for flag, set_, why in refused:
        if set_:
            raise ValueError(f"{PREFIX}{asked}, and {flag.name}={flag.given(args)!r}: {why}; leave it at its default.")
    weighting = getattr(args, "diffusion_time_weighting", None)
    if weighting not in (None, "inverse_t"):
        raise ValueError(
            f"{PREFIX}{asked}, and diffusion_time_weighting={weighting!r}: NVIDIA's block-diffusion objective "
            "divides by p_mask; leave it at None or 'inverse_t'."
        )
    return block

"""The patch set of Unsloth 2026.10.4-.6 (the dense and chunked shapes), whose loss divides each micro-batch by
its own masked tokens: the window-normalized loss, the release's own noise and loss arithmetic (`loss`) with
the window's denominator (`window`), and keyed evaluation (`evaluation`). Class-level patches on Unsloth's own
diffusion classes; each target wrapped once."""

from . import (
    batch_keys,
    block_diffusion,
    config,
    construction,
    detect,
    evaluation,
    loss,
    metrics,
    noise,
    per_sample,
    samples,
    window,
)
from .registry import Patch
from .window import Window
from .wrappers import batch_samples_arguments, loss_arguments, prediction_arguments, replaced, wrap

LOSSES = {detect.DENSE: loss.dense_cross_entropy, detect.CHUNKED: loss.chunked_cross_entropy}


def _profile_compute_loss(release, wrapped, profile, pos, kwargs):
    """The loss by what the call is, each path the release's own arithmetic with its denominator."""
    model, inputs, args, num_items_in_batch = loss_arguments(*pos, **kwargs)
    if batch_keys.EVAL in inputs:  # diffusion_eval_noise="fixed": the release's evaluation loss, keyed draws
        return evaluation.patched_loss(release, profile, model, inputs, args, LOSSES[release.shape])
    if isinstance(num_items_in_batch, Window):
        return _window_loss(release, profile, model, inputs, args, num_items_in_batch)
    if batch_keys.ROWS in inputs or config.normalization_for(profile, args) == config.WINDOW:
        return _micro_batch_loss(release, profile, model, inputs, args)
    return wrapped(*pos, **kwargs)


def _window_loss(release, profile, model, inputs, args, this_window):
    """A training micro-batch of a window: the window's noise (drawn for all of its micro-batches at the first),
    divided by the window's masked tokens."""
    loss.check_weighting(profile, args)
    if batch_keys.SLOT not in inputs:
        raise RuntimeError(
            "unsloth_diffusion_norm: a training micro-batch arrived without its window slot; "
            "was get_batch_samples bypassed?"
        )

    block = this_window.block

    def draw(batch):
        if block is not None:
            return _block_draw(release, profile, model, batch, args, block)
        return noise.paired_if_asked(
            release.draw(profile, model, batch, args, batch.get(batch_keys.ROWS)), profile, args
        )

    slot = inputs[batch_keys.SLOT]
    drawn = this_window.noise(slot, draw)
    score = this_window.scorer()  # (a Window has a scorer only on the dense shape, whose loss holds the logits)

    def loss_of(count):
        if block is not None:  # the window's two counts; its logged terms scaled to the window's value
            share = len(this_window.batches)
            return block_diffusion.loss(model, drawn, block, count, this_window.supervised, share, score)
        return LOSSES[release.shape](profile, model, drawn, args, count, release.masked_module, score)

    return this_window.logged(slot, this_window.divide(loss_of))


def _block_draw(release, profile, model, batch, args, block):
    """A block-diffusion micro-batch's noise: the release's draw (keyed where the run is) over its filled rows."""
    _, eos_id = profile._token_ids(model, args)
    return block_diffusion.draw(
        lambda filled: release.draw(profile, model, filled, args, filled.get(batch_keys.ROWS)),
        batch,
        block,
        eos_id,
    )


def _micro_batch_loss(release, profile, model, inputs, args):
    """The micro-batch's own masked tokens, as the release computes it: evaluation and direct calls of a
    window-normalized run, and per-sample noise under 'microbatch' (its keyed draws are training draws: paired
    where asked)."""
    loss.check_weighting(profile, args)
    block = block_diffusion.of_config(construction.model_config(model), args)
    if block is not None:  # the micro-batch's own two counts
        drawn = _block_draw(release, profile, model, inputs, args, block)
        return block_diffusion.loss(model, drawn, block, *block_diffusion.counts(drawn))
    drawn = _micro_batch_draw(release, profile, model, inputs, args)
    return LOSSES[release.shape](profile, model, drawn, args, drawn.masked.sum(), release.masked_module)


def _micro_batch_draw(release, profile, model, inputs, args):
    """A micro-batch's own draw: the release's, or from its rows' keys (per-sample noise: paired where asked)."""
    rows = inputs.get(batch_keys.ROWS)
    drawn = release.draw(profile, model, inputs, args, rows)
    return drawn if rows is None else noise.paired_if_asked(drawn, profile, args)


def _get_batch_samples(release, wrapped, trainer, pos, kwargs):
    epoch_iterator, num_batches = batch_samples_arguments(*pos, **kwargs)
    if construction.noise_of(trainer) == config.PER_SAMPLE:
        epoch_iterator = per_sample.data_order(trainer).tag(trainer.args, epoch_iterator)
        pos, kwargs = replaced(pos, kwargs, 0, "epoch_iterator", epoch_iterator)
    if not window.uses_window(trainer):
        # Trainer's own, looked up now: Unsloth may have rewritten it since this patch was applied.
        return super(release.trainer_module.DiffusionTrainer, trainer).get_batch_samples(*pos, **kwargs)
    rule = window.data_parallel_rule(trainer)
    # Training accuracy where the loss holds the logits (the dense shape); the chunked loss fuses the head
    accuracy = metrics.training_accuracy(trainer) if release.shape == detect.DENSE else None
    # Read from the model's config once per window, not kept at construction: a trainer built unpatched has none.
    block = block_diffusion.of_config(construction.model_config(trainer.model), trainer.args)
    return window.collect(trainer, epoch_iterator, num_batches, rule, metrics.observer(trainer), accuracy, block)


def _trainer_compute_loss(release, wrapped, trainer, pos, kwargs):
    """A per-micro-batch run (not window-normalized): the micro-batch's draw, the one the release's own loss (or
    `_micro_batch_loss`) makes, observed for the run's metrics first (a window's draws are observed where made)."""
    model, inputs = prediction_arguments(*pos, **kwargs)
    profile = getattr(trainer, "diffusion_profile", None)
    if isinstance(profile, release.masked_module.MaskedDiffusionProfile) and not window.uses_window(trainer):
        args = trainer.args
        device = inputs["input_ids"].device
        metrics.observe_own_draw(
            trainer, model, device, lambda: _micro_batch_draw(release, profile, model, inputs, args)
        )
    return wrapped(*pos, **kwargs)


def _trainer_init(release, wrapped, trainer, pos, kwargs):
    wrapped(*pos, **kwargs)
    construction.check_flags(trainer, release.masked_module.MaskedDiffusionProfile)
    if not isinstance(trainer.diffusion_profile, release.masked_module.MaskedDiffusionProfile):
        return
    block_diffusion.set_up(trainer)
    mode = construction.settle_noise(trainer)
    if mode == config.PER_SAMPLE:
        profile = trainer.diffusion_profile
        if config.normalization_for(profile, trainer.args) == config.MICROBATCH and profile.loss_normalization not in (
            config.MASKED_TOKENS,
            config.GLOBAL_MASKED_TOKENS,
        ):
            if getattr(trainer.args, config.NOISE.name, None):
                asked, instead = f"{config.NOISE.name}='per_sample'", f"leave {config.NOISE.name} at None"
            else:
                asked = f"the model config's {config.DP_VARYING}=True (per-sample noise)"
                instead = f"set {config.NOISE.name}='global'"
            raise ValueError(
                f"unsloth_diffusion_norm: {asked} with {profile.name!r}'s own "
                f"{profile.loss_normalization!r} normalization is not available on this release; "
                f"set {config.NORMALIZATION.name}='window' or {instead}."
            )
        per_sample.data_order(trainer)  # registered now, to see the first epoch begin
    config.check_lower_variance(
        trainer.args, trainer.diffusion_profile, mode, window.uses_window(trainer) or mode == config.PER_SAMPLE
    )
    samples.attach(trainer)
    construction.say_noise(trainer, mode)


def release_patches(release):
    trainer_class = release.trainer_module.DiffusionTrainer
    profile_class = release.masked_module.MaskedDiffusionProfile
    return [
        Patch(
            f"{detect.NEMOTRON} profile .loss_normalization",
            detect.find_profile(release.profiles_module, detect.NEMOTRON),
            "loss_normalization",
            lambda current: config.GLOBAL_MASKED_TOKENS,
            "the profile carries its normalization: NVIDIA's is window-global (upstream's name)",
        ),
        Patch(
            "MaskedDiffusionProfile.compute_loss",
            profile_class,
            "compute_loss",
            wrap(_profile_compute_loss, release),
            f"the release's own noise and loss ({release.shape}), divided by the window's masked tokens",
        ),
        Patch(
            "DiffusionTrainer.get_batch_samples",
            trainer_class,
            "get_batch_samples",
            wrap(_get_batch_samples, release),
            "collects the window (its noise and masked-token count are shared by its micro-batches) "
            "and, for per-sample noise, each row's generator seed",
        ),
        Patch(
            "DiffusionTrainer.log",
            trainer_class,
            "log",
            wrap(metrics.logged),
            "puts among the metrics it averages the training accuracy where the loss holds the logits (dense-ce) "
            "and a per-micro-batch run's metrics, every rank's summed once per log",
        ),
        Patch(
            "DiffusionTrainer.compute_loss",
            trainer_class,
            "compute_loss",
            wrap(_trainer_compute_loss, release),
            "a per-micro-batch run (not window-normalized): each training micro-batch's draw observed for the run's "
            "metrics, under a forked RNG, before the release's loss draws it",
        ),
        Patch(
            "DiffusionTrainer.model_accepts_loss_kwargs",
            trainer_class,
            "model_accepts_loss_kwargs",
            lambda current: window.ACCEPTS_LOSS_KWARGS,
            "stops Trainer dividing a window-normalized loss by the accumulation steps again",
        ),
        Patch(
            "DiffusionTrainer.__init__",
            trainer_class,
            "__init__",
            wrap(_trainer_init, release),
            "rejects flags this trainer cannot honour, at construction; sets up per-sample noise",
        ),
        *evaluation.trainer_patches(release, trainer_class, lambda function: wrap(function, release)),
        *construction.config_patches(release),
    ]

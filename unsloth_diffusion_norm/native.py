"""The patch set of Unsloth 2026.10.7+, which normalizes by the window itself: the flags, and for each trainer what
its run needs, as patches on that trainer and on its own copy of the profile (`trainer_patches`); Unsloth's
classes are not touched beyond DiffusionConfig and DiffusionTrainer.__init__, and the loss stays upstream's."""

import dataclasses

from . import (
    batch_keys,
    block_diffusion,
    config,
    construction,
    evaluation,
    metrics,
    noise,
    per_sample,
    registry,
    samples,
    window,
)
from .registry import Patch
from .window import Window
from .wrappers import (
    batch_samples_arguments,
    loss_arguments,
    prediction_arguments,
    prepare_arguments,
    replaced,
    wrap,
    wrap_method,
)


def _trainer_init(release, wrapped, trainer, pos, kwargs):
    wrapped(*pos, **kwargs)
    construction.check_flags(trainer, release.masked_module.MaskedDiffusionProfile)
    if not isinstance(trainer.diffusion_profile, release.masked_module.MaskedDiffusionProfile):
        return  # check_flags let only 'microbatch' through: a block / encoder profile's own, nothing to change
    block = block_diffusion.set_up(trainer)
    mode = construction.settle_noise(trainer)
    profile = trainer.diffusion_profile
    config.check_lower_variance(trainer.args, profile, mode, config.plugin_draws_for(profile, trainer.args, mode))
    patches = (
        trainer_patches(release, trainer, mode) if block is None else _block_patches(release, trainer, mode, block)
    )
    registry.apply_to_trainer(trainer, patches)
    samples.attach(trainer)
    construction.say_noise(trainer, mode)


def release_patches(release):
    """Unsloth 2026.10.7+: the fix is upstream. The flags are added, and each trainer gets per-trainer
    patches (`trainer_patches`) for what its run needs: by default the resume-exact draws (upstream's own,
    made at the window's first step; bitwise upstream's in an uninterrupted run), or what a flag asks for."""
    return [
        Patch(
            "DiffusionTrainer.__init__",
            release.trainer_module.DiffusionTrainer,
            "__init__",
            wrap(_trainer_init, release),
            "sets up each trainer's run on that trainer alone (per-trainer patches: by default the resume-exact "
            "draws of Unsloth's own noise; a profile copy with upstream's loss_normalization for the flag; keyed "
            "evaluation for diffusion_eval_noise='fixed')",
        ),
        *construction.config_patches(release),
    ]


def trainer_patches(release, trainer, noise_mode):
    """What this trainer's run needs on a native release, as patches owned by the trainer and by its own
    copy of the profile (made here, installed by the first patch); Unsloth's classes are not touched.
    None at all where the release's own path is already right: a per-micro-batch profile at its own
    settings draws in compute_loss, after a resumed run's RNG is restored."""
    args = trainer.args
    wanted = config.upstream_normalization_for(trainer.diffusion_profile, args)
    deferred = noise_mode == config.GLOBAL and wanted == config.GLOBAL_MASKED_TOKENS
    keyed_evaluation = config.eval_noise_for(args) == config.FIXED
    # A per-micro-batch loss draws in compute_loss: its draws are observed there for the run's metrics
    observed = _observed_patches(trainer) if wanted != config.GLOBAL_MASKED_TOKENS and config.METRICS.of(args) else []
    if getattr(args, config.NORMALIZATION.name, None) is None and not (
        deferred or keyed_evaluation or noise_mode == config.PER_SAMPLE
    ):
        return observed
    profile, patches = _profile_copy(trainer, wanted)
    if deferred or keyed_evaluation:
        patches.append(_profile_loss(release, profile, deferred, keyed_evaluation))
    if deferred:  # (a per-micro-batch loss draws in compute_loss already, after any restore)
        patches.append(_fetch_undrawn_patch(trainer))
    if noise_mode == config.PER_SAMPLE:
        patches += _per_sample_noise(release, trainer, profile)
    if keyed_evaluation:
        patches += evaluation.trainer_patches(
            release, trainer, lambda function: wrap_method(trainer, function, release)
        )
    return patches + observed


def _profile_copy(trainer, wanted):
    """(this trainer's own copy of its profile at `wanted` normalization, the patches that install it)."""
    profile = dataclasses.replace(trainer.diffusion_profile, loss_normalization=wanted)
    return profile, [
        Patch(
            "diffusion_profile",
            trainer,
            "diffusion_profile",
            lambda current: profile,
            f"this trainer's own copy of the profile, loss_normalization={wanted!r}",
        ),
        # Upstream derives this from the profile in __init__; derive it again for the copy.
        Patch(
            "model_accepts_loss_kwargs",
            trainer,
            "model_accepts_loss_kwargs",
            lambda current: trainer._uses_global_masked_tokens(),
            "upstream's own rule, for the profile copy",
        ),
    ]


def _block_patches(release, trainer, noise_mode, block):
    """A block_diff model's run (block_diffusion): upstream's draws (keyed under per-sample noise) over each row's
    fill, the mode's loss of both window counts; Unsloth's compute_loss scales it for data parallel, as it scales
    its own. Upstream's loss never runs for such a model: it would call it with the noisy row alone."""
    profile, patches = _profile_copy(trainer, config.GLOBAL_MASKED_TOKENS)  # (a window's counts: Trainer's off)
    patches += [
        Patch(
            "diffusion_profile.compute_loss",
            profile,
            "compute_loss",
            wrap_method(profile, _block_loss, block),
            "NVIDIA's block-diffusion objective: the window's noise drawn at its first step over the filled rows, "
            "alpha * diffusion / N_masked + AR / N_supervised",
        ),
    ]
    order = None
    if noise_mode == config.PER_SAMPLE:  # the keyed draws; the fetch that tags the rows is the one below
        order = per_sample.data_order(trainer)
        patches.append(_keyed_draws(release, profile))
    return [*patches, _fetch_undrawn_patch(trainer, order, block)]


def _block_loss(block, wrapped, profile, pos, kwargs):
    """A training micro-batch of a window: the window's noise and counts; anything else (evaluation, a direct
    call): the micro-batch's own. `block`: the run's BlockDiffusion, settled at construction."""
    model, inputs, args, this_window = loss_arguments(*pos, **kwargs)

    def draw(batch):  # upstream's draw (the profile copy's: keyed under per-sample noise) over the filled rows
        prepared = lambda filled: noise.Noise(*profile.prepare_batch(model, filled, args))  # noqa: E731
        return block_diffusion.draw(prepared, batch, block, profile._token_ids(model, args)[1])

    if not isinstance(this_window, Window):
        drawn = draw(inputs)
        return block_diffusion.loss(model, drawn, block, *block_diffusion.counts(drawn))
    slot = inputs[batch_keys.SLOT]
    drawn = this_window.noise(slot, draw)
    share = len(this_window.batches)
    return this_window.logged(
        slot, block_diffusion.loss(model, drawn, block, this_window.count, this_window.supervised, share)
    )


def _observed_patches(trainer):
    """A per-micro-batch run's metrics: each training micro-batch's draw observed before upstream's loss draws it,
    the steps' metrics put among upstream's at each log."""
    return [
        Patch(
            "compute_loss",
            trainer,
            "compute_loss",
            wrap_method(trainer, _observed_loss),
            "each training micro-batch's draw observed for the run's metrics, under a forked RNG, before "
            "upstream's per-micro-batch loss draws it",
        ),
        Patch(
            "log",
            trainer,
            "log",
            wrap_method(trainer, metrics.logged),
            "puts the per-micro-batch run's metrics among those upstream averages, every rank's summed once per log",
        ),
    ]


def _observed_loss(wrapped, trainer, pos, kwargs):
    model, inputs = prediction_arguments(*pos, **kwargs)

    def draw():  # upstream's own (per-micro-batch: never drawn at the fetch), keyed where the profile copy is
        return noise.Noise(*trainer.diffusion_profile.prepare_batch(model, inputs, trainer.args))

    metrics.observe_own_draw(trainer, model, inputs["input_ids"].device, draw)
    return wrapped(*pos, **kwargs)


def _profile_loss(release, profile, deferred, keyed_evaluation):
    """The profile copy's one compute_loss wrapper (`_loss`), for whichever of the two needs it."""
    why = []
    if deferred:
        why.append("draws the window's noise at its first training step (resume-exact), upstream's loss")
    if keyed_evaluation:
        why.append(f"{config.EVAL_NOISE.name}='fixed': upstream's loss of each keyed evaluation draw, averaged")
    return Patch(
        "diffusion_profile.compute_loss", profile, "compute_loss", wrap_method(profile, _loss, release), "; ".join(why)
    )


def _loss(release, wrapped, profile, pos, kwargs):
    """In this order: an evaluation batch with its keys (diffusion_eval_noise="fixed"): upstream's loss of each
    keyed draw, averaged; a micro-batch of a window fetched undrawn (diffusion_noise="global"): the window's noise
    drawn now, upstream's loss; anything else (evaluation without keys, a direct call): upstream's own."""
    _, inputs, _, this_window = loss_arguments(*pos, **kwargs)
    if batch_keys.EVAL in inputs:
        return evaluation.keyed_upstream_loss(release, wrapped, profile, pos, kwargs)
    if isinstance(this_window, Window):
        return _loss_drawn_at_first_step(wrapped, profile, pos, kwargs)
    return wrapped(*pos, **kwargs)


def _per_sample_noise(release, trainer, profile):
    """Keyed noise for this trainer only: its profile copy draws from the keys its own get_batch_samples
    view attaches."""
    order = per_sample.data_order(trainer)
    return [
        _keyed_draws(release, profile),
        Patch(
            "get_batch_samples",
            trainer,
            "get_batch_samples",
            wrap_method(trainer, _tagged_batch_samples, order),
            "attaches each row's generator seed (seed, epoch, global position)",
        ),
    ]


def _keyed_draws(release, profile):
    return Patch(
        "diffusion_profile.prepare_batch",
        profile,
        "prepare_batch",
        wrap_method(profile, _keyed_prepare_batch, release),
        "per-sample noise: each row's draws from its own keyed generator",
    )


def _keyed_prepare_batch(release, wrapped, profile, pos, kwargs):
    model, inputs, args = prepare_arguments(*pos, **kwargs)
    rows = inputs.get(batch_keys.ROWS)
    if rows is None:  # evaluation: the release's own draws
        return wrapped(*pos, **kwargs)
    return noise.paired_if_asked(release.draw(profile, model, inputs, args, rows), profile, args).prepared()


def _tagged_batch_samples(order, wrapped, trainer, pos, kwargs):
    epoch_iterator, num_batches = batch_samples_arguments(*pos, **kwargs)
    pos, kwargs = replaced(pos, kwargs, 0, "epoch_iterator", order.tag(trainer.args, epoch_iterator))
    batches, count = wrapped(*pos, **kwargs)
    metrics.log_drawn(trainer, batches, num_batches)  # (where upstream drew them at the fetch)
    return batches, count


def _fetch_undrawn_patch(trainer, order=None, block=None):
    """diffusion_noise="global" (the default): Unsloth's own draws (its prepare_batch, in micro-batch order),
    made when the window is first trained on instead of while it is fetched - after Trainer has restored a
    resumed run's RNG. Upstream's loss and count arithmetic stay. A block-diffusion run's fetch too (`order`:
    its per-sample data order, where it has one; `block`: its BlockDiffusion)."""
    # Upstream's compute_loss scales the loss by all processes itself: count the way upstream counts.
    reduce_count, _ = window.data_parallel_rule(trainer, upstream=True)
    return Patch(
        "get_batch_samples",
        trainer,
        "get_batch_samples",
        wrap_method(trainer, _fetch_undrawn, reduce_count, order, block),
        "fetches the window without drawing; one count collective when it is drawn",
    )


def _fetch_undrawn(reduce_count, order, block, wrapped, trainer, pos, kwargs):
    # Upstream's own fetch draws; this one stands in for it whole (the device is _prepare_inputs' business).
    epoch_iterator, num_batches = batch_samples_arguments(*pos, **kwargs)
    if order is not None:
        epoch_iterator = order.tag(trainer.args, epoch_iterator)
    observer = metrics.observer(trainer, upstream=True)
    return window.collect(trainer, epoch_iterator, num_batches, (reduce_count, 1), observer, block=block)


def _loss_drawn_at_first_step(wrapped, profile, pos, kwargs):
    model, inputs, args, this_window = loss_arguments(*pos, **kwargs)
    slot = inputs[batch_keys.SLOT]
    drawn = this_window.noise(
        slot,
        lambda batch: noise.paired_if_asked(noise.Noise(*profile.prepare_batch(model, batch, args)), profile, args),
    )
    pos, kwargs = replaced(pos, kwargs, 1, "inputs", {**inputs, batch_keys.UNSLOTH_PREPARED: drawn.prepared()})
    pos, kwargs = replaced(pos, kwargs, 3, "num_items_in_batch", this_window.count)
    return this_window.logged(slot, wrapped(*pos, **kwargs))


# Which patch set each recognised shape gets, and the mode it puts the plugin in.

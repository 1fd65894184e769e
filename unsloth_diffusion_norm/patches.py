"""The patch sets, one per recognised code shape (`PATCH_SETS`), made of module-level wrappers that take
a small frozen `Release` context:

- 2026.10.4-.6 (dense / chunked shapes): the window-normalized masked-diffusion loss and the two per-run
  flags;
- 2026.10.7+ (native): the flags only; whatever a flag asks for is set up on that trainer alone, as
  per-trainer patches, and the training path stays Unsloth's;
- a disabled plugin (UNSLOTH_DIFFUSION_NORM=0, `flags_only`, no shape of its own): the flags are accepted,
  a set one is refused.

Every wrapper, class-level or per-trainer, follows the one contract of `wrappers`.

Only Unsloth's own diffusion classes are touched (DiffusionTrainer, DiffusionConfig,
MaskedDiffusionProfile and the Nemotron profile instance), never transformers.Trainer or
trl.SFTTrainer: Unsloth re-creates those methods from source text and would drop a wrapper.
"""

import dataclasses
import types

import wrapt

from . import config, detect, evaluation, loss, noise, per_sample, registry
from .registry import Patch, logger
from .window import SLOT, Window, data_parallel_rule, fetch
from .wrappers import (  # noqa: F401 - Release: every patch set is built from one (patches.Release)
    Release,
    batch_samples_arguments,
    loss_arguments,
    prediction_arguments,
    prepare_arguments,
    replaced,
    wrap,
    wrap_method,
)

LOSSES = {detect.DENSE: loss.dense_cross_entropy, detect.CHUNKED: loss.chunked_cross_entropy}


def noise_of(trainer):
    """The noise settled at construction; for a trainer built while unpatched, its flag."""
    kept = trainer.__dict__.get(registry.PER_TRAINER)
    return (kept.noise if kept is not None else None) or getattr(trainer.args, config.NOISE.name, None)


def _model_config(model):
    for candidate in (model, getattr(model, "base_model", None), getattr(model, "module", None)):
        found = getattr(candidate, "config", None)
        if found is not None:
            return found
    return None


def _settle_noise(trainer):
    """The run's noise (config.noise_for), kept on the trainer: the flag, NVIDIA's model-config switch,
    or the resume-exact global draws."""
    kept = registry.per_trainer(trainer)
    kept.noise = config.noise_for(trainer.args, _model_config(trainer.model))
    return kept.noise


def _say_noise(trainer, mode):
    # Once per trainer, on the main process only: nothing per step, nothing on the other ranks.
    for note in (config.noise_note(trainer.args, mode), config.lower_variance_note(trainer.args)):
        if note is not None and trainer.args.process_index == 0:
            logger.warning(note)


def uses_window(trainer):
    profile = getattr(trainer, "diffusion_profile", None)
    args = getattr(trainer, "args", None)
    return profile is not None and config.normalization_for(profile, args) == config.WINDOW


# --- Unsloth 2026.10.4-.6 ------------------------------------------------------------------------------


def _profile_compute_loss(release, wrapped, profile, pos, kwargs):
    model, inputs, args, num_items_in_batch = loss_arguments(*pos, **kwargs)
    if evaluation.KEYS in inputs:  # diffusion_eval_noise="fixed": the release's evaluation loss, keyed draws
        return evaluation.patched_loss(release, profile, model, inputs, args, LOSSES[release.shape])
    if config.normalization_for(profile, args) != config.WINDOW and per_sample.KEYS not in inputs:
        return wrapped(*pos, **kwargs)
    loss.check_weighting(profile, args)
    masked_loss = LOSSES[release.shape]
    if isinstance(num_items_in_batch, Window):
        window = num_items_in_batch
        if SLOT not in inputs:
            raise RuntimeError(
                "unsloth_diffusion_norm: a training micro-batch arrived without its window slot; "
                "was get_batch_samples bypassed?"
            )
        batch_noise = window.noise(
            inputs[SLOT], lambda batch: noise.paired_if_asked(release.draw(profile, model, batch, args), profile, args)
        )
        result = masked_loss(profile, model, batch_noise, args, window.count, release.masked_module)
        if window.loss_scale != 1:
            # DDP averages gradients over ranks; a count summed over ranks needs a summed numerator.
            result = (result[0] * window.loss_scale, *result[1:])
        return result
    # Evaluation, direct calls and per-sample noise under 'microbatch': the micro-batch's own count,
    # as the release computes it. Only the keyed ones are training draws, paired where asked.
    batch_noise = release.draw(profile, model, inputs, args)
    if per_sample.KEYS in inputs:
        batch_noise = noise.paired_if_asked(batch_noise, profile, args)
    return masked_loss(profile, model, batch_noise, args, batch_noise.masked.sum(), release.masked_module)


def _get_batch_samples(release, wrapped, trainer, pos, kwargs):
    epoch_iterator, num_batches = batch_samples_arguments(*pos, **kwargs)
    if noise_of(trainer) == config.PER_SAMPLE:
        epoch_iterator = per_sample.data_order(trainer).tag(trainer.args, epoch_iterator)
        pos, kwargs = replaced(pos, kwargs, 0, "epoch_iterator", epoch_iterator)
    if not uses_window(trainer):
        # Trainer's own, looked up now: Unsloth may have rewritten it since this patch was applied.
        return super(release.trainer_module.DiffusionTrainer, trainer).get_batch_samples(*pos, **kwargs)
    batches = fetch(trainer, epoch_iterator, num_batches)
    if not batches:
        return batches, None
    # The window stands in for num_items_in_batch: not None, so Trainer does not divide by the
    # accumulation steps again; its count is known once its noise is drawn.
    return batches, Window(batches, *data_parallel_rule(trainer))


def _accepts_loss_kwargs(trainer):
    # True under window normalization: the loss already carries the whole window's denominator.
    return uses_window(trainer) or trainer.__dict__.get("model_accepts_loss_kwargs", False)


def _set_accepts_loss_kwargs(trainer, value):
    trainer.__dict__["model_accepts_loss_kwargs"] = value


ACCEPTS_LOSS_KWARGS = property(_accepts_loss_kwargs, _set_accepts_loss_kwargs)


def _patched_trainer_init(release, wrapped, trainer, pos, kwargs):
    wrapped(*pos, **kwargs)
    _check_flags(trainer, release.masked_module.MaskedDiffusionProfile)
    if not isinstance(trainer.diffusion_profile, release.masked_module.MaskedDiffusionProfile):
        return
    mode = _settle_noise(trainer)
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
        trainer.args, trainer.diffusion_profile, mode, uses_window(trainer) or mode == config.PER_SAMPLE
    )
    _say_noise(trainer, mode)


def patched_release(release):
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
            "DiffusionTrainer.model_accepts_loss_kwargs",
            trainer_class,
            "model_accepts_loss_kwargs",
            lambda current: ACCEPTS_LOSS_KWARGS,
            "stops Trainer dividing a window-normalized loss by the accumulation steps again",
        ),
        Patch(
            "DiffusionTrainer.__init__",
            trainer_class,
            "__init__",
            wrap(_patched_trainer_init, release),
            "rejects flags this trainer cannot honour, at construction; sets up per-sample noise",
        ),
        *evaluation.trainer_patches(release, trainer_class, lambda function: wrap(function, release)),
        *config_patches(release),
    ]


# --- every release: the per-run flags on DiffusionConfig -----------------------------------------------


@wrapt.decorator
def _config_init(wrapped, instance, pos, kwargs):
    values = {field: config.validate(kwargs.pop(field, None), field) for field in config.FIELDS}
    config.check_together(types.SimpleNamespace(**values))
    wrapped(*pos, **kwargs)
    for field, value in values.items():
        setattr(instance, field, value)


def config_patches(release):
    """The per-run flags on DiffusionConfig: the same on every release, so scripts survive upgrades."""
    DiffusionConfig = release.trainer_module.DiffusionConfig
    patches = []
    for field in config.FIELDS:
        patches += [
            Patch(
                f"DiffusionConfig.{field} (dataclass field)",
                DiffusionConfig.__dataclass_fields__,
                field,
                lambda current, field=field: config.Fields.__dataclass_fields__[field],
                "the per-run flag survives to_dict() / to_json_string() and argument parsing",
                item=True,
            ),
            # HfArgumentParser / TrlParser take each field's type from typing.get_type_hints, which reads
            # the class annotations, not __dataclass_fields__.
            Patch(
                f"DiffusionConfig.{field} (annotation)",
                vars(DiffusionConfig)["__annotations__"],
                field,
                lambda current, field=field: config.Fields.__annotations__[field],
                "argument parsers (HfArgumentParser, TrlParser: command line, dict, YAML) see the flag",
                item=True,
            ),
            Patch(
                f"DiffusionConfig.{field} (default)",
                DiffusionConfig,
                field,
                lambda current, field=field: config.default(field),
                "the default leaves the release's / profile's own behaviour",
            ),
        ]
    patches.append(
        Patch(
            "DiffusionConfig.__init__",
            DiffusionConfig,
            "__init__",
            _config_init,
            f"accepts and validates {' and '.join(config.FIELDS)}",
        )
    )
    return patches


def _check_flags(trainer, MaskedDiffusionProfile):
    """Every flag valid (K draws need keyed evaluation); nothing asked of a non-masked-diffusion profile."""
    args, profile = trainer.args, trainer.diffusion_profile
    for field in config.FIELDS:
        config.validate(getattr(args, field, config.default(field)), field)
    config.check_together(args)
    if isinstance(profile, MaskedDiffusionProfile):
        return
    if config.normalization_for(profile, args) == config.WINDOW:
        raise ValueError(
            f"unsloth_diffusion_norm: {config.NORMALIZATION.name}={getattr(args, config.NORMALIZATION.name, None)!r}: window normalization is implemented for the "
            f"masked-diffusion profiles (Nemotron-Labs-Diffusion, Dream, LLaDA), not for {profile.name!r}. "
            f"Use None or 'microbatch'."
        )
    for field, value in config.asked(args).items():
        if field != config.NORMALIZATION.name:
            raise ValueError(
                f"unsloth_diffusion_norm: {field}={value!r} is implemented for the masked-diffusion profiles, "
                f"not for {profile.name!r}. Leave it at None."
            )


# --- a disabled plugin ---------------------------------------------------------------------------------


def _refuse_flags(release, wrapped, trainer, pos, kwargs):
    wrapped(*pos, **kwargs)
    asked = ", ".join(f"{field}={value!r}" for field, value in config.asked(trainer.args).items())
    if asked:
        raise ValueError(
            f"unsloth_diffusion_norm: the plugin is turned off ({release.disabled_by}), so {asked} cannot be honoured. "
            f"Unset UNSLOTH_DIFFUSION_NORM (or set it to 1) to use the flag, or leave the flag at None."
        )


def flags_only(release):
    """UNSLOTH_DIFFUSION_NORM=0: the flags stay accepted on DiffusionConfig (scripts keep parsing), and a
    trainer whose flag asks for something is refused - the run must not silently train other than asked."""
    return [
        Patch(
            "DiffusionTrainer.__init__",
            release.trainer_module.DiffusionTrainer,
            "__init__",
            wrap(_refuse_flags, release),
            "refuses a run whose DiffusionConfig flag the disabled plugin cannot honour",
        ),
        *config_patches(release),
    ]


# --- Unsloth 2026.10.7+ (fixed upstream) ---------------------------------------------------------------


def _native_trainer_init(release, wrapped, trainer, pos, kwargs):
    wrapped(*pos, **kwargs)
    _check_flags(trainer, release.masked_module.MaskedDiffusionProfile)
    if not isinstance(trainer.diffusion_profile, release.masked_module.MaskedDiffusionProfile):
        return  # _check_flags let only 'microbatch' through: a block / encoder profile's own, nothing to change
    mode = _settle_noise(trainer)
    profile = trainer.diffusion_profile
    config.check_lower_variance(trainer.args, profile, mode, config.plugin_draws_for(profile, trainer.args, mode))
    patches = trainer_patches(release, trainer, mode)
    if patches:
        registry.apply_to_trainer(trainer, patches)
    _say_noise(trainer, mode)


def native_release(release):
    """Unsloth 2026.10.7+: the fix is upstream. The flags are added, and each trainer gets per-trainer
    patches (`trainer_patches`) for what its run needs: by default the resume-exact draws (upstream's own,
    made at the window's first step; bitwise upstream's in an uninterrupted run), or what a flag asks for."""
    return [
        Patch(
            "DiffusionTrainer.__init__",
            release.trainer_module.DiffusionTrainer,
            "__init__",
            wrap(_native_trainer_init, release),
            "sets up each trainer's run on that trainer alone (per-trainer patches: by default the resume-exact "
            "draws of Unsloth's own noise; a profile copy with upstream's loss_normalization for the flag; keyed "
            "evaluation for diffusion_eval_noise='fixed')",
        ),
        *config_patches(release),
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
    if getattr(args, config.NORMALIZATION.name, None) is None and not (
        deferred or keyed_evaluation or noise_mode == config.PER_SAMPLE
    ):
        return []
    profile = dataclasses.replace(trainer.diffusion_profile, loss_normalization=wanted)
    patches = [
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
    if deferred:  # (a per-micro-batch loss draws in compute_loss already, after any restore)
        patches += _draw_at_first_step(trainer, profile)
    if noise_mode == config.PER_SAMPLE:
        patches += _per_sample_noise(release, trainer, profile)
    if keyed_evaluation:
        patches += evaluation.native_patches(release, trainer, profile)
    return patches


def _per_sample_noise(release, trainer, profile):
    """Keyed noise for this trainer only: its profile copy draws from the keys its own get_batch_samples
    view attaches."""
    order = per_sample.data_order(trainer)
    return [
        Patch(
            "diffusion_profile.prepare_batch",
            profile,
            "prepare_batch",
            wrap_method(profile, _keyed_prepare_batch, release),
            "per-sample noise: each row's draws from its own keyed generator",
        ),
        Patch(
            "get_batch_samples",
            trainer,
            "get_batch_samples",
            wrap_method(trainer, _tagged_batch_samples, order),
            "attaches each row's generator seed (seed, epoch, global position)",
        ),
    ]


def _keyed_prepare_batch(release, wrapped, profile, pos, kwargs):
    model, inputs, args = prepare_arguments(*pos, **kwargs)
    if per_sample.KEYS not in inputs:  # evaluation: the release's own draws
        return wrapped(*pos, **kwargs)
    return noise.paired_if_asked(release.draw(profile, model, inputs, args), profile, args).prepared()


def _tagged_batch_samples(order, wrapped, trainer, pos, kwargs):
    epoch_iterator, _ = batch_samples_arguments(*pos, **kwargs)
    pos, kwargs = replaced(pos, kwargs, 0, "epoch_iterator", order.tag(trainer.args, epoch_iterator))
    return wrapped(*pos, **kwargs)


def _draw_at_first_step(trainer, profile):
    """diffusion_noise="global" (the default): Unsloth's own draws (its prepare_batch, in micro-batch order),
    made when the window is first trained on instead of while it is fetched - after Trainer has restored a
    resumed run's RNG. Upstream's loss and count arithmetic stay."""
    # Upstream's compute_loss scales the loss by all processes itself: count the way upstream counts.
    reduce_count, _ = data_parallel_rule(trainer, upstream=True)
    return [
        Patch(
            "diffusion_profile.compute_loss",
            profile,
            "compute_loss",
            wrap_method(profile, _loss_drawn_at_first_step),
            "draws the window's noise at its first training step (resume-exact), upstream's loss",
        ),
        Patch(
            "get_batch_samples",
            trainer,
            "get_batch_samples",
            wrap_method(trainer, _fetch_undrawn, reduce_count),
            "fetches the window without drawing; one count collective when it is drawn",
        ),
    ]


def _fetch_undrawn(reduce_count, wrapped, trainer, pos, kwargs):
    # Upstream's own fetch draws; this one stands in for it whole (the device is _prepare_inputs' business).
    epoch_iterator, num_batches = batch_samples_arguments(*pos, **kwargs)
    batches = fetch(trainer, epoch_iterator, num_batches)
    return (batches, Window(batches, reduce_count, 1)) if batches else (batches, None)


def _loss_drawn_at_first_step(wrapped, profile, pos, kwargs):
    model, inputs, args, window = loss_arguments(*pos, **kwargs)
    if not isinstance(window, Window):
        return wrapped(*pos, **kwargs)
    drawn = window.noise(
        inputs[SLOT],
        lambda batch: noise.paired_if_asked(noise.Noise(*profile.prepare_batch(model, batch, args)), profile, args),
    )
    pos, kwargs = replaced(pos, kwargs, 1, "inputs", {**inputs, "_diffusion_masked_batch": drawn.prepared()})
    pos, kwargs = replaced(pos, kwargs, 3, "num_items_in_batch", window.count)
    return wrapped(*pos, **kwargs)


# Which patch set each recognised shape gets, and the mode it puts the plugin in.
PATCH_SETS = {
    detect.DENSE: (patched_release, registry.PATCHED),
    detect.CHUNKED: (patched_release, registry.PATCHED),
    detect.UPSTREAM: (native_release, registry.NATIVE),
}

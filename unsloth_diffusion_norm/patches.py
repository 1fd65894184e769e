"""The patch sets: `build` for Unsloth 2026.10.4-.6 (window-normalized masked-diffusion loss, the two
per-run flags), `build_native` for 2026.10.7+ (the flags only; anything a flag asks for is set up on
that trainer alone, and the training path stays Unsloth's).

Only Unsloth's own diffusion classes are touched (DiffusionTrainer, DiffusionConfig,
MaskedDiffusionProfile and the Nemotron profile instance), never transformers.Trainer or
trl.SFTTrainer: Unsloth re-creates those methods from source text and would drop a wrapper.
"""

import dataclasses
from typing import Optional

import wrapt

from . import config, detect, loss, noise, per_sample
from .registry import Patch
from .window import SLOT, Window, data_parallel_rule, fetch

LOSSES = {detect.DENSE: loss.dense_cross_entropy, detect.CHUNKED: loss.chunked_cross_entropy}


@dataclasses.dataclass
class _ConfigFields:
    diffusion_loss_normalization: Optional[str] = dataclasses.field(
        default=None, metadata={"help": config.HELP}
    )
    diffusion_noise: Optional[str] = dataclasses.field(default=None, metadata={"help": config.NOISE_HELP})


def uses_window(trainer):
    profile = getattr(trainer, "diffusion_profile", None)
    args = getattr(trainer, "args", None)
    return profile is not None and config.effective(profile, args) == config.WINDOW


def build(shape, trainer_module, masked_module, profiles_module):
    DiffusionTrainer = trainer_module.DiffusionTrainer
    DiffusionConfig = trainer_module.DiffusionConfig
    MaskedDiffusionProfile = masked_module.MaskedDiffusionProfile
    masked_loss = LOSSES[shape]

    def draw(profile, model, inputs, args):
        return noise.draw(profile, model, inputs, args, masked_module.response_mask)

    @wrapt.decorator
    def profile_compute_loss(wrapped, profile, pos, kwargs):
        def bind(model, inputs, args, num_items_in_batch=None):
            return model, inputs, args, num_items_in_batch

        model, inputs, args, num_items_in_batch = bind(*pos, **kwargs)
        if config.effective(profile, args) != config.WINDOW and per_sample.KEYS not in inputs:
            return wrapped(*pos, **kwargs)
        loss.check_weighting(profile, args)
        if isinstance(num_items_in_batch, Window):
            window = num_items_in_batch
            if SLOT not in inputs:
                raise RuntimeError(
                    "unsloth_diffusion_norm: a training micro-batch arrived without its window slot; "
                    "was get_batch_samples bypassed?"
                )
            batch_noise = window.noise(inputs[SLOT], lambda batch: draw(profile, model, batch, args))
            result = masked_loss(profile, model, batch_noise, args, window.count, masked_module)
            if window.loss_scale != 1:
                # DDP averages gradients over ranks; a count summed over ranks needs a summed numerator.
                result = (result[0] * window.loss_scale, *result[1:])
            return result
        # Evaluation, direct calls and per-sample noise under 'microbatch': the micro-batch's own count,
        # as the release computes it.
        batch_noise = draw(profile, model, inputs, args)
        return masked_loss(profile, model, batch_noise, args, batch_noise.masked.sum(), masked_module)

    @wrapt.decorator
    def get_batch_samples(wrapped, trainer, pos, kwargs):
        def bind(epoch_iterator, num_batches, device=None):
            return epoch_iterator, num_batches, device

        epoch_iterator, num_batches, device = bind(*pos, **kwargs)
        if getattr(trainer.args, config.NOISE_FIELD, None) == config.PER_SAMPLE:
            epoch_iterator = per_sample.data_order(trainer).tag(trainer.args, epoch_iterator)
        if not uses_window(trainer):
            return super(DiffusionTrainer, trainer).get_batch_samples(epoch_iterator, num_batches, device)
        batches = fetch(trainer, epoch_iterator, num_batches)
        if not batches:
            return batches, None
        # The window stands in for num_items_in_batch: not None, so Trainer does not divide by the
        # accumulation steps again; its count is known once its noise is drawn.
        return batches, Window(batches, *data_parallel_rule(trainer))

    def accepts_loss_kwargs(current):
        def get(trainer):
            # True under window normalization: the loss already carries the whole window's denominator.
            return uses_window(trainer) or trainer.__dict__.get("model_accepts_loss_kwargs", False)

        def set_(trainer, value):
            trainer.__dict__["model_accepts_loss_kwargs"] = value

        return property(get, set_)

    @wrapt.decorator
    def trainer_init(wrapped, trainer, pos, kwargs):
        wrapped(*pos, **kwargs)
        _check_flags(trainer, MaskedDiffusionProfile)
        noise_mode = getattr(trainer.args, config.NOISE_FIELD, None)
        if noise_mode == config.PER_SAMPLE:
            profile = trainer.diffusion_profile
            if config.effective(profile, trainer.args) == config.MICROBATCH and profile.loss_normalization not in (
                config.MASKED_TOKENS, config.GLOBAL_MASKED_TOKENS
            ):
                raise ValueError(
                    f"{config.NOISE_FIELD}='per_sample' with {profile.name!r}'s own "
                    f"{profile.loss_normalization!r} normalization is not available on this release; "
                    f"set {config.FIELD}='window' or leave {config.NOISE_FIELD} at None."
                )
            per_sample.data_order(trainer)  # registered now, to see the first epoch begin

    nemotron = detect.find_profile(profiles_module, detect.NEMOTRON)
    return [
        Patch(
            f"{detect.NEMOTRON} profile .loss_normalization",
            nemotron,
            "loss_normalization",
            lambda current: config.GLOBAL_MASKED_TOKENS,
            "the profile carries its normalization: NVIDIA's is window-global (upstream's name)",
        ),
        Patch(
            "MaskedDiffusionProfile.compute_loss",
            MaskedDiffusionProfile,
            "compute_loss",
            profile_compute_loss,
            f"the release's own noise and loss ({shape}), divided by the window's masked tokens",
        ),
        Patch(
            "DiffusionTrainer.get_batch_samples",
            DiffusionTrainer,
            "get_batch_samples",
            get_batch_samples,
            "collects the window (its noise and masked-token count are shared by its micro-batches) "
            "and, for per-sample noise, each row's generator seed",
        ),
        Patch(
            "DiffusionTrainer.model_accepts_loss_kwargs",
            DiffusionTrainer,
            "model_accepts_loss_kwargs",
            accepts_loss_kwargs,
            "stops Trainer dividing a window-normalized loss by the accumulation steps again",
        ),
        Patch(
            "DiffusionTrainer.__init__",
            DiffusionTrainer,
            "__init__",
            trainer_init,
            "rejects flags this trainer cannot honour, at construction; sets up per-sample noise",
        ),
        *config_patches(DiffusionConfig),
    ]


@wrapt.decorator
def _config_init(wrapped, instance, pos, kwargs):
    values = {field: config.validate(kwargs.pop(field, None), field) for field in config.FIELDS}
    wrapped(*pos, **kwargs)
    for field, value in values.items():
        setattr(instance, field, value)


def config_patches(DiffusionConfig):
    """The per-run flags on DiffusionConfig: the same on every release, so scripts survive upgrades."""
    patches = []
    for field in config.FIELDS:
        patches += [
            Patch(
                f"DiffusionConfig.{field} (dataclass field)",
                DiffusionConfig.__dataclass_fields__,
                field,
                lambda current, field=field: _ConfigFields.__dataclass_fields__[field],
                "the per-run flag survives to_dict() / to_json_string() and argument parsing",
                item=True,
            ),
            # HfArgumentParser / TrlParser take each field's type from typing.get_type_hints, which reads
            # the class annotations, not __dataclass_fields__.
            Patch(
                f"DiffusionConfig.{field} (annotation)",
                vars(DiffusionConfig)["__annotations__"],
                field,
                lambda current, field=field: _ConfigFields.__annotations__[field],
                "argument parsers (HfArgumentParser, TrlParser: command line, dict, YAML) see the flag",
                item=True,
            ),
            Patch(f"DiffusionConfig.{field} (default)", DiffusionConfig, field, lambda current: None,
                  "None = the release's / profile's default"),
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


def build_disabled(trainer_module, reason):
    """UNSLOTH_DIFFUSION_NORM=0: the flags stay accepted on DiffusionConfig (scripts keep parsing), and a
    trainer whose flag asks for something is refused - the run must not silently train other than asked."""

    @wrapt.decorator
    def refuse_flags(wrapped, trainer, pos, kwargs):
        wrapped(*pos, **kwargs)
        asked = {f: getattr(trainer.args, f, None) for f in config.FIELDS}
        asked = ", ".join(f"{f}={v!r}" for f, v in asked.items() if v is not None)
        if asked:
            raise ValueError(
                f"unsloth_diffusion_norm is turned off ({reason}), so {asked} cannot be honoured. Unset "
                f"UNSLOTH_DIFFUSION_NORM (or set it to 1) to use the flag, or leave the flag at None."
            )

    return [
        Patch("DiffusionTrainer.__init__", trainer_module.DiffusionTrainer, "__init__", refuse_flags,
              "refuses a run whose DiffusionConfig flag the disabled plugin cannot honour"),
        *config_patches(trainer_module.DiffusionConfig),
    ]


def _check_flags(trainer, MaskedDiffusionProfile):
    """Both flags valid, and nothing asked of a profile that is not masked diffusion."""
    args, profile = trainer.args, trainer.diffusion_profile
    for field in config.FIELDS:
        config.validate(getattr(args, field, None), field)
    if isinstance(profile, MaskedDiffusionProfile):
        return
    if config.effective(profile, args) == config.WINDOW:
        raise ValueError(
            f"{config.FIELD}={getattr(args, config.FIELD)!r}: window normalization is implemented for the "
            f"masked-diffusion profiles (Nemotron-Labs-Diffusion, Dream, LLaDA), not for {profile.name!r}. "
            f"Use None or 'microbatch'."
        )
    if getattr(args, config.NOISE_FIELD, None) is not None:
        raise ValueError(
            f"{config.NOISE_FIELD}={getattr(args, config.NOISE_FIELD)!r} is implemented for the "
            f"masked-diffusion profiles, not for {profile.name!r}. Leave it at None."
        )


def build_native(trainer_module, masked_module):
    """Unsloth 2026.10.7+: the fix is upstream. Only the flag is added; a trainer whose flag asks for
    something other than its profile's own normalization gets its own copy of the profile with
    upstream's setting for it - the training path (get_batch_samples, compute_loss, prepare_batch, ...)
    stays Unsloth's own objects, and with the flag at its default nothing at all changes."""
    DiffusionTrainer = trainer_module.DiffusionTrainer
    MaskedDiffusionProfile = masked_module.MaskedDiffusionProfile

    @wrapt.decorator
    def trainer_init(wrapped, trainer, pos, kwargs):
        wrapped(*pos, **kwargs)
        _check_flags(trainer, MaskedDiffusionProfile)
        if all(getattr(trainer.args, field, None) is None for field in config.FIELDS):
            return  # the defaults: Unsloth's own trainer, untouched
        # One copy of the profile for this trainer; whatever a flag asks for is set up on the copy.
        profile = trainer.diffusion_profile
        wanted = config.native_normalization(profile, trainer.args)
        trainer.diffusion_profile = dataclasses.replace(profile, loss_normalization=wanted)
        # Upstream derives this from the profile in __init__; derive it again for the copy.
        trainer.model_accepts_loss_kwargs = trainer._uses_global_masked_tokens()
        noise_mode = getattr(trainer.args, config.NOISE_FIELD, None)
        if noise_mode == config.GLOBAL:
            _draw_at_first_step_on_this_trainer(trainer)
        if noise_mode == config.PER_SAMPLE:
            _per_sample_on_this_trainer(trainer, masked_module)

    return [
        Patch(
            "DiffusionTrainer.__init__",
            DiffusionTrainer,
            "__init__",
            trainer_init,
            "honours the per-run flags on that trainer alone (a profile copy with upstream's "
            "loss_normalization; its own noise methods for diffusion_noise)",
        ),
        *config_patches(trainer_module.DiffusionConfig),
    ]


def _per_sample_on_this_trainer(trainer, masked_module):
    """Native releases: keyed noise for this trainer only - its own profile copy draws from the keys its
    own get_batch_samples view attaches; Unsloth's classes are not touched."""
    profile = trainer.diffusion_profile  # this trainer's own copy
    release_prepare_batch = profile.prepare_batch
    order = per_sample.data_order(trainer)

    def prepare_batch(model, inputs, args):
        if per_sample.KEYS not in inputs:  # evaluation: the release's own draws
            return release_prepare_batch(model, inputs, args)
        return noise.draw(profile, model, inputs, args, masked_module.response_mask).prepared()

    def get_batch_samples(epoch_iterator, num_batches, device=None):
        tagged = order.tag(trainer.args, epoch_iterator)
        return type(trainer).get_batch_samples(trainer, tagged, num_batches, device)

    object.__setattr__(profile, "prepare_batch", prepare_batch)
    trainer.get_batch_samples = get_batch_samples


def _draw_at_first_step_on_this_trainer(trainer):
    """Native releases, diffusion_noise="global": Unsloth's own draws (its prepare_batch, in micro-batch
    order), made when the window is first trained on instead of while it is fetched - after Trainer has
    restored a resumed run's RNG. For this trainer only; upstream's loss and count arithmetic stay."""
    if not trainer._uses_global_masked_tokens():
        return  # a per-micro-batch loss draws in compute_loss already, after any restore
    profile = trainer.diffusion_profile  # this trainer's own copy
    release_compute_loss = profile.compute_loss
    # Upstream's compute_loss scales the loss by all processes itself: count the way upstream counts.
    reduce_count, _ = data_parallel_rule(trainer, upstream=True)

    def get_batch_samples(epoch_iterator, num_batches, device=None):
        batches = fetch(trainer, epoch_iterator, num_batches)
        return (batches, Window(batches, reduce_count, 1)) if batches else (batches, None)

    def compute_loss(model, inputs, args, num_items_in_batch=None):
        if not isinstance(num_items_in_batch, Window):
            return release_compute_loss(model, inputs, args, num_items_in_batch=num_items_in_batch)
        window = num_items_in_batch
        drawn = window.noise(inputs[SLOT], lambda batch: noise.Noise(*profile.prepare_batch(model, batch, args)))
        prepared = {**inputs, "_diffusion_masked_batch": drawn.prepared()}
        return release_compute_loss(model, prepared, args, num_items_in_batch=window.count)

    object.__setattr__(profile, "compute_loss", compute_loss)
    trainer.get_batch_samples = get_batch_samples

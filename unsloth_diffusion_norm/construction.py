"""What every release's patch set does when a DiffusionConfig or a DiffusionTrainer is built: the per-run flags
on DiffusionConfig (the same on every release, so scripts survive upgrades), their checks at a trainer's
construction, the run's noise settled once and said once; and the set of a disabled plugin (`flags_only`), whose
flags are accepted and a set one refused."""

import types

import wrapt

from . import config, registry
from .registry import Patch, logger
from .wrappers import wrap


def noise_of(trainer):
    """The noise settled at construction; for a trainer built while unpatched, its flag."""
    kept = trainer.__dict__.get(registry.PER_TRAINER)
    return (kept.noise if kept is not None else None) or getattr(trainer.args, config.NOISE.name, None)


def model_config(model):
    found = [
        getattr(c, "config", None) for c in (model, getattr(model, "base_model", None), getattr(model, "module", None))
    ]
    found = [config_ for config_ in found if config_ is not None]
    # A wrapper's own config is not the model's (DeepSpeed's engine has one): a transformers config has a model_type.
    return next((config_ for config_ in found if hasattr(config_, "model_type")), found[0] if found else None)


def settle_noise(trainer):
    """The run's noise (config.noise_for), kept on the trainer: the flag, NVIDIA's model-config switch,
    or the resume-exact global draws."""
    kept = registry.per_trainer(trainer)
    kept.noise = config.noise_for(trainer.args, model_config(trainer.model))
    return kept.noise


def say_noise(trainer, mode):
    # Once per trainer, on the main process only: nothing per step, nothing on the other ranks.
    for note in (config.noise_note(trainer.args, mode), config.lower_variance_note(trainer.args)):
        if note is not None and trainer.args.process_index == 0:
            logger.warning(note)


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


def check_flags(trainer, MaskedDiffusionProfile):
    """Every flag valid (K draws need keyed evaluation); nothing asked of a non-masked-diffusion profile."""
    args, profile = trainer.args, trainer.diffusion_profile
    for field in config.FIELDS:
        config.validate(getattr(args, field, config.default(field)), field)
    config.check_together(args)
    if isinstance(profile, MaskedDiffusionProfile):
        config.check_samples(args)
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

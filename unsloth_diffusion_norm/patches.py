"""The patch set for Unsloth 2026.10.4-.6: window-normalized masked-diffusion loss.

Only Unsloth's own diffusion classes are touched (DiffusionTrainer, DiffusionConfig,
MaskedDiffusionProfile and the Nemotron profile instance), never transformers.Trainer or
trl.SFTTrainer: Unsloth re-creates those methods from source text and would drop a wrapper.
"""

import dataclasses
from typing import Optional

import wrapt

from . import config, detect, loss, noise
from .registry import Patch
from .window import SLOT, Window, data_parallel_rule

LOSSES = {detect.DENSE: loss.dense_cross_entropy, detect.CHUNKED: loss.chunked_cross_entropy}


@dataclasses.dataclass
class _ConfigField:
    diffusion_loss_normalization: Optional[str] = dataclasses.field(
        default=None, metadata={"help": config.HELP}
    )


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
        if config.effective(profile, args) != config.WINDOW:
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
        # Evaluation and direct calls: the micro-batch's own count, as the release computes it.
        batch_noise = draw(profile, model, inputs, args)
        return masked_loss(profile, model, batch_noise, args, batch_noise.masked.sum(), masked_module)

    @wrapt.decorator
    def get_batch_samples(wrapped, trainer, pos, kwargs):
        if not uses_window(trainer):
            return super(DiffusionTrainer, trainer).get_batch_samples(*pos, **kwargs)

        def bind(epoch_iterator, num_batches, device=None):
            return epoch_iterator, num_batches

        epoch_iterator, num_batches = bind(*pos, **kwargs)
        batches = []
        for _ in range(num_batches):
            try:
                inputs = next(epoch_iterator)
            except StopIteration:
                break
            batches.append({**trainer._prepare_inputs(inputs), SLOT: len(batches)})
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
        config.validate(getattr(trainer.args, config.FIELD, None))
        _refuse_window_for(trainer.diffusion_profile, MaskedDiffusionProfile, trainer.args)

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
            "collects the window; its noise and masked-token count are shared by its micro-batches",
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
            f"rejects a {config.FIELD} this trainer cannot honour, at construction",
        ),
        *config_patches(DiffusionConfig),
    ]


@wrapt.decorator
def _config_init(wrapped, instance, pos, kwargs):
    value = config.validate(kwargs.pop(config.FIELD, None))
    wrapped(*pos, **kwargs)
    setattr(instance, config.FIELD, value)


def config_patches(DiffusionConfig):
    """The per-run flag on DiffusionConfig: the same on every release, so scripts survive upgrades."""
    return [
        Patch(
            f"DiffusionConfig.{config.FIELD} (dataclass field)",
            DiffusionConfig.__dataclass_fields__,
            config.FIELD,
            lambda current: _ConfigField.__dataclass_fields__[config.FIELD],
            "the per-run flag survives to_dict() / to_json_string() and argument parsing",
            item=True,
        ),
        Patch(
            f"DiffusionConfig.{config.FIELD} (default)",
            DiffusionConfig,
            config.FIELD,
            lambda current: None,
            "None = the profile's own normalization",
        ),
        Patch(
            "DiffusionConfig.__init__",
            DiffusionConfig,
            "__init__",
            _config_init,
            f"accepts and validates {config.FIELD}",
        ),
    ]


def _refuse_window_for(profile, MaskedDiffusionProfile, args):
    if config.effective(profile, args) == config.WINDOW and not isinstance(profile, MaskedDiffusionProfile):
        raise ValueError(
            f"{config.FIELD}={getattr(args, config.FIELD)!r}: window normalization is implemented for the "
            f"masked-diffusion profiles (Nemotron-Labs-Diffusion, Dream, LLaDA), not for {profile.name!r}. "
            f"Use None or 'microbatch'."
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
        config.validate(getattr(trainer.args, config.FIELD, None))
        profile = trainer.diffusion_profile
        _refuse_window_for(profile, MaskedDiffusionProfile, trainer.args)
        wanted = config.native_normalization(profile, trainer.args)
        if wanted != getattr(profile, "loss_normalization", None):
            trainer.diffusion_profile = dataclasses.replace(profile, loss_normalization=wanted)
            # Upstream derives this from the profile in __init__; derive it again for the copy.
            trainer.model_accepts_loss_kwargs = trainer._uses_global_masked_tokens()

    return [
        Patch(
            "DiffusionTrainer.__init__",
            DiffusionTrainer,
            "__init__",
            trainer_init,
            f"honours {config.FIELD} through upstream's own loss_normalization, per trainer",
        ),
        *config_patches(trainer_module.DiffusionConfig),
    ]

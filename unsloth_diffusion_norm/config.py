"""The per-run flags on DiffusionConfig: their values, help, validation, and what each one means for a run."""

import dataclasses
import typing

FIELD = "diffusion_loss_normalization"
WINDOW, MICROBATCH = "window", "microbatch"
CHOICES = (WINDOW, MICROBATCH, None)
# Upstream's name (Unsloth 2026.10.7+) for "divide by the whole accumulation window's masked tokens".
GLOBAL_MASKED_TOKENS = "global_masked_tokens"
MASKED_TOKENS = "masked_tokens"  # the micro-batch's own masked tokens: Nemotron on 2026.10.4-.6
HELP = (
    "'window': divide each micro-batch's weighted loss sum by the masked-token count of the whole "
    "optimizer step (NVIDIA's Nemotron-Labs-Diffusion normalization); 'microbatch': the profile's own "
    "per-micro-batch normalization (Unsloth 2026.10.4-.6 behaviour); None: the profile's default."
)


# Where the noise comes from.
NOISE_FIELD = "diffusion_noise"
GLOBAL, PER_SAMPLE = "global", "per_sample"
NOISE_CHOICES = (GLOBAL, PER_SAMPLE, None)
NOISE_HELP = (
    "'global': the release's own draws from the global RNG, drawn when the window is first trained on "
    "(after a resumed run restored its RNG); 'per_sample': each example's noise from a generator keyed "
    "by (seed, epoch, its position in the global data order) - independent of the data-parallel layout "
    "and different on every rank; None (the default): 'per_sample' where the model's config sets NVIDIA's "
    "dp_varying_mask_ratio=True, else 'global', on every supported release."
)
# NVIDIA's model-config switch (default False): its forward_process varies the masks per data-parallel rank.
# Unsloth's profiles draw their own noise and never read it; with diffusion_noise=None it asks for per-sample.
DP_VARYING = "dp_varying_mask_ratio"

# Evaluation noise (opt-in): keyed draws that never touch the global RNG, averaged over K draws per example.
EVAL_NOISE_FIELD = "diffusion_eval_noise"
FIXED = "fixed"
EVAL_NOISE_CHOICES = (FIXED, None)
EVAL_NOISE_HELP = (
    "'fixed': every evaluation example's noise level and masks come from generators keyed by (seed, its "
    "position in the eval set, the draw), never from the global RNG, and an evaluation leaves every global RNG "
    "as it found it: the same weights give the same eval loss, and evaluating never changes training; None (the "
    "default): the release's own draws from the global RNG (then every evaluation moves the training draws "
    "that follow it)."
)
EVAL_DRAWS_FIELD = "diffusion_eval_draws"
EVAL_DRAWS_HELP = (
    "With diffusion_eval_noise='fixed': K keyed draws per evaluation example, one forward each; the eval loss "
    "is the mean of the K draws' losses (each normalized as the release normalizes an evaluation batch). "
    "Default 1."
)
# Lower-variance training noise (opt-in): stratified noise levels across a window; complementary mask pairs.
SAMPLER_FIELD = "diffusion_t_sampler"
STRATIFIED = "stratified"
SAMPLER_CHOICES = (STRATIFIED, None)
SAMPLER_HELP = (
    "'stratified': the n examples of an optimizer step (all micro-batches, all ranks) get one noise level in "
    "each stratum [k/n, (k+1)/n) of the release's t range, the stratum of each example drawn by key, so each "
    "example's t keeps the release's law; needs per-sample keys (diffusion_noise='per_sample'). None (the "
    "default): each example's t drawn on its own."
)
COMPLEMENTARY_FIELD = "diffusion_complementary_masks"
COMPLEMENTARY_HELP = (
    "True: every training example is trained on a pair, its mask M at level p and the complement of M within "
    "its maskable tokens at level 1 - p (where 1 - p falls below the noise floor, M again at p), each weighted "
    "by its own inverse probability and counted in the window's masked tokens; twice the forward compute. "
    "False (the default): one mask per example."
)
FIELDS = {
    FIELD: (CHOICES, HELP),
    NOISE_FIELD: (NOISE_CHOICES, NOISE_HELP),
    EVAL_NOISE_FIELD: (EVAL_NOISE_CHOICES, EVAL_NOISE_HELP),
    EVAL_DRAWS_FIELD: (None, EVAL_DRAWS_HELP),  # a count, not a choice
    SAMPLER_FIELD: (SAMPLER_CHOICES, SAMPLER_HELP),
    COMPLEMENTARY_FIELD: ((True, False), COMPLEMENTARY_HELP),
}
DEFAULTS = {EVAL_DRAWS_FIELD: 1, COMPLEMENTARY_FIELD: False}  # every other field: None


def default(field):
    return DEFAULTS.get(field)


def validate(value, field=FIELD):
    """The flag's value, or ValueError. "None" is None (the default): a command line (HfArgumentParser,
    TrlParser) has no other way to reset a value a YAML config set."""
    if value is None or (isinstance(value, str) and value.lower() == "none"):
        return default(field)
    if field == COMPLEMENTARY_FIELD:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise ValueError(f"unsloth_diffusion_norm: {field} must be True or False (the default), got {value!r}.")
        return value
    if field == EVAL_DRAWS_FIELD:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"unsloth_diffusion_norm: {field} must be a whole number of draws, 1 or more (default 1), got {value!r}."
            )
        return value
    choices = FIELDS[field][0]
    if value not in choices:
        named = " or ".join(f"{c!r}" for c in choices if c is not None)
        raise ValueError(f"unsloth_diffusion_norm: {field} must be {named} or None (the default), got {value!r}.")
    return value


def asked(args):
    """{field: value} of every flag these arguments set to something other than its default."""
    found = {field: getattr(args, field, default(field)) for field in FIELDS}
    return {field: value for field, value in found.items() if value != default(field)}


def check_together(args):
    """The flags that only mean something together: K draws are keyed draws. (Stratified levels need per-sample
    noise, which the model's config can ask for too: check_lower_variance, at the trainer.)"""
    draws = getattr(args, EVAL_DRAWS_FIELD, 1)
    if draws != 1 and getattr(args, EVAL_NOISE_FIELD, None) != FIXED:
        raise ValueError(
            f"unsloth_diffusion_norm: {EVAL_DRAWS_FIELD}={draws!r} averages keyed evaluation draws; "
            f"set {EVAL_NOISE_FIELD}='fixed' too, or leave {EVAL_DRAWS_FIELD} at 1."
        )


def argument_type(field):
    """What an argument parser converts the command line's string with: the validated value, or the one-line
    error argparse prints before it exits with status 2 (HfArgumentParser and TrlParser use a field's
    annotation as argparse's `type`; a YAML config's strings go through it too)."""

    def parse(text):
        import argparse

        value = text
        if field == EVAL_DRAWS_FIELD and isinstance(text, str) and text.strip().lstrip("+-").isdigit():
            value = int(text)
        try:
            return validate(value, field)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix("unsloth_diffusion_norm: ")) from None

    parse.__name__ = parse.__qualname__ = field
    return parse


def sampler(args):
    """'stratified' or None for a run's training noise levels."""
    return getattr(args, SAMPLER_FIELD, None)


def complementary(args):
    return bool(getattr(args, COMPLEMENTARY_FIELD, False))


def examples_per_step(args):
    """n: the examples of one optimizer step over every micro-batch and rank (the strata of a stratified run)."""
    return args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size


def eval_noise(args):
    """'fixed' or None for a run's evaluation."""
    return getattr(args, EVAL_NOISE_FIELD, None)


def eval_draws(args):
    return getattr(args, EVAL_DRAWS_FIELD, 1) or 1


def effective(profile, args):
    """'window' or 'microbatch' for this profile under these training arguments."""
    value = getattr(args, FIELD, None)
    if value is not None:
        return value
    return WINDOW if getattr(profile, "loss_normalization", None) == GLOBAL_MASKED_TOKENS else MICROBATCH


def effective_noise(args, model_config):
    """'global' or 'per_sample' for this run: the flag when set; else per-sample where the model's config
    asks NVIDIA's forward process to vary the masks per rank; else the resume-exact global draws."""
    value = getattr(args, NOISE_FIELD, None)
    if value is not None:
        return value
    return PER_SAMPLE if getattr(model_config, DP_VARYING, False) is True else GLOBAL


def native_normalization(profile, args):
    """Upstream's `loss_normalization` (2026.10.7+) that gives this run's flag. 'microbatch' keeps a
    per-micro-batch profile's own and turns window-global into the micro-batch's own masked tokens,
    which is what 2026.10.4-.6 did for Nemotron."""
    own = getattr(profile, "loss_normalization", None)
    value = getattr(args, FIELD, None)
    if value is None or own is None:
        return own
    if value == WINDOW:
        return GLOBAL_MASKED_TOKENS
    return MASKED_TOKENS if own == GLOBAL_MASKED_TOKENS else own


def native_draws(profile, args, noise_mode):
    """Whether the plugin draws a run's training noise on a native release: its resume-exact draws of a
    window-normalized run, or per-sample noise; otherwise the release draws inside its own loss."""
    wanted = native_normalization(profile, args)
    return noise_mode == PER_SAMPLE or (noise_mode == GLOBAL and wanted == GLOBAL_MASKED_TOKENS)


def check_lower_variance(args, profile, noise_mode, plugin_draws):
    """Stratified levels are keyed (per-sample noise); mask pairs need the plugin to draw the run's noise."""
    if sampler(args) == STRATIFIED and noise_mode != PER_SAMPLE:
        raise ValueError(
            f"unsloth_diffusion_norm: {SAMPLER_FIELD}='stratified' assigns strata by each example's key, and "
            f"this run's noise comes from the global RNG; set {NOISE_FIELD}='per_sample'."
        )
    if complementary(args) and not plugin_draws:
        raise ValueError(
            f"unsloth_diffusion_norm: {COMPLEMENTARY_FIELD}=True pairs the masks the plugin draws, and "
            f"{profile.name!r} at {FIELD}={getattr(args, FIELD, None)!r} draws its own inside the release's "
            f"loss; set {FIELD}='window' or {NOISE_FIELD}='per_sample'."
        )


@dataclasses.dataclass
class Fields:
    """The flags as DiffusionConfig fields: what config_patches adds to the release's dataclass."""

    # Annotations are the parsers' converters (config.argument_type; a function: typing.Optional, not `| None`).
    diffusion_loss_normalization: typing.Optional[argument_type(FIELD)] = dataclasses.field(  # noqa: UP045
        default=None, metadata={"help": HELP}
    )
    diffusion_noise: typing.Optional[argument_type(NOISE_FIELD)] = dataclasses.field(  # noqa: UP045
        default=None, metadata={"help": NOISE_HELP}
    )
    diffusion_eval_noise: typing.Optional[argument_type(EVAL_NOISE_FIELD)] = dataclasses.field(  # noqa: UP045
        default=None, metadata={"help": EVAL_NOISE_HELP}
    )
    diffusion_eval_draws: argument_type(EVAL_DRAWS_FIELD) = dataclasses.field(
        default=1, metadata={"help": EVAL_DRAWS_HELP}
    )
    diffusion_t_sampler: typing.Optional[argument_type(SAMPLER_FIELD)] = dataclasses.field(  # noqa: UP045
        default=None, metadata={"help": SAMPLER_HELP}
    )
    # True or False from a command line (`--diffusion_complementary_masks true`), with the same one-line error.
    diffusion_complementary_masks: argument_type(COMPLEMENTARY_FIELD) = dataclasses.field(
        default=False, metadata={"help": COMPLEMENTARY_HELP}
    )


def noise_note(args, mode):
    """The one line a trainer's construction logs about its noise (rank 0), or None."""
    if mode == PER_SAMPLE and getattr(args, NOISE_FIELD, None) is None:
        return (
            f"unsloth_diffusion_norm: the model's config sets {DP_VARYING}=True, so every example draws "
            f"its own noise ({NOISE_FIELD}='per_sample'); {NOISE_FIELD}='global' keeps the "
            "global RNG's draws."
        )
    if mode == GLOBAL and args.world_size > 1:
        return (
            f"unsloth_diffusion_norm: the noise comes from the global RNG, seeded alike on all {args.world_size} "
            f"data-parallel ranks, so every rank draws the same noise levels; {NOISE_FIELD}='per_sample' "
            "gives each example its own."
        )
    return None


def lower_variance_fields(args):
    """The lower-variance fields a run set, as status() names them."""
    asked = (
        (SAMPLER_FIELD, sampler(args) == STRATIFIED, "'stratified'"),
        (COMPLEMENTARY_FIELD, complementary(args), "True"),
    )
    return tuple(f"{field}={value}" for field, is_set, value in asked if is_set)


def lower_variance_note(args):
    """The line a trainer's construction logs when the run asks for lower-variance noise, or None."""
    asked = []
    if sampler(args) == STRATIFIED:
        n = examples_per_step(args)
        asked.append(f"{SAMPLER_FIELD}='stratified' (one noise level per stratum across each step's {n} examples)")
    if complementary(args):
        asked.append(f"{COMPLEMENTARY_FIELD}=True (every training micro-batch doubled: about twice the step time)")
    return f"unsloth_diffusion_norm: lower-variance noise: {'; '.join(asked)}." if asked else None

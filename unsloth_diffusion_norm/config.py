"""The normalization flag: which denominator a masked-diffusion loss uses, per profile and per run."""

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
FIELDS = {
    FIELD: (CHOICES, HELP),
    NOISE_FIELD: (NOISE_CHOICES, NOISE_HELP),
    EVAL_NOISE_FIELD: (EVAL_NOISE_CHOICES, EVAL_NOISE_HELP),
    EVAL_DRAWS_FIELD: (None, EVAL_DRAWS_HELP),  # a count, not a choice
}
DEFAULTS = {EVAL_DRAWS_FIELD: 1}  # every other field: None


def default(field):
    return DEFAULTS.get(field)


def validate(value, field=FIELD):
    """The flag's value, or ValueError. "None" is None (the default): a command line (HfArgumentParser,
    TrlParser) has no other way to reset a value a YAML config set."""
    if value is None or (isinstance(value, str) and value.lower() == "none"):
        return default(field)
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
    """The flags that only mean something together: K draws are keyed draws."""
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

"""The per-run flags on DiffusionConfig, each defined once as a `Flag`, and what they decide for one run.

Everything that lists, checks or explains a flag derives from its record: `FLAGS`, `validate`, the parsers'
converters (`argument_type`), the `Fields` dataclass the release's DiffusionConfig gets, status()'s defaults
line and the flags table of docs/api.md. The decisions about one run read as one family, `*_for(...)`:
`normalization_for`, `noise_for`, `eval_noise_for`, `upstream_normalization_for`, `plugin_draws_for`.
"""

import dataclasses
import sys
import typing

# The flags' values.
WINDOW, MICROBATCH = "window", "microbatch"
GLOBAL, PER_SAMPLE = "global", "per_sample"
FIXED = "fixed"
STRATIFIED = "stratified"
# Upstream's name (Unsloth 2026.10.7+) for "divide by the whole accumulation window's masked tokens".
GLOBAL_MASKED_TOKENS = "global_masked_tokens"
MASKED_TOKENS = "masked_tokens"  # the micro-batch's own masked tokens: Nemotron on 2026.10.4-.6
# NVIDIA's model-config switch (default False): its forward_process varies the masks per data-parallel rank.
# Unsloth's profiles draw their own noise and never read it; with diffusion_noise=None it asks for per-sample.
DP_VARYING = "dp_varying_mask_ratio"
# NVIDIA's model-config field for the training mode, and the two of its values the plugin trains.
PARADIGM_FIELD = "dlm_paradigm"
BIDIRECTIONAL, BLOCK_DIFF = "bidirectional", "block_diff"

# How a flag's value is checked: one of its choices (or None), a count of 1 or more, a finite number of 0 or more,
# True / False, or a list of one or more non-empty texts.
CHOICE, COUNT, NUMBER, SWITCH, TEXTS = "choice", "count", "number", "switch", "texts"
PREFIX = "unsloth_diffusion_norm: "


@dataclasses.dataclass(frozen=True)
class Flag:
    """One per-run flag: its name, how it is checked, its default, what it means, where it applies, and what a
    run gets at its default (the same in both modes that patch, or per mode: {'patched': ..., 'native': ...})."""

    name: str
    kind: str
    choices: tuple  # the values besides the default (CHOICE: besides None)
    default: object
    help: str
    applies: str
    at_default: object
    unit: str = "draws"  # COUNT: what it counts, as its error names it

    def gives(self, mode):
        """What a run gets at the default in this mode ('patched' or 'native')."""
        return self.at_default if isinstance(self.at_default, str) else self.at_default[mode]

    def given(self, args):
        """The value as the arguments hold it (the default where they lack the field)."""
        return getattr(args, self.name, self.default)

    def of(self, args):
        """The run's value, None read as the default."""
        value = getattr(args, self.name, None)
        if value is None:
            return self.default
        return bool(value) if self.kind == SWITCH else value

    def validate(self, value):
        """The value, or ValueError. "None" is None (the default): a command line (HfArgumentParser, TrlParser)
        has no other way to reset a value a YAML config set."""
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return self.default
        if self.kind == TEXTS:
            if isinstance(value, (list, tuple)) and list(value) == [None]:  # (a command line's "None": reset)
                return self.default
            if not (
                isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v.strip() for v in value)
            ):
                raise ValueError(f"{PREFIX}{self.name} must be a list of one or more non-empty texts, got {value!r}.")
            return list(value)
        if self.kind == SWITCH:
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            if not isinstance(value, bool):
                values = "True or False (the default)" if self.default is False else "True (the default) or False"
                raise ValueError(f"{PREFIX}{self.name} must be {values}, got {value!r}.")
            return value
        if self.kind == COUNT:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{PREFIX}{self.name} must be a whole number of {self.unit}, 1 or more "
                    f"(default {self.default}), got {value!r}."
                )
            return value
        if self.kind == NUMBER:  # (an int past the floats is refused too)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= sys.float_info.max:
                raise ValueError(
                    f"{PREFIX}{self.name} must be a finite number, 0 or more (default {self.default}), got {value!r}."
                )
            return float(value)
        if value not in self.choices:
            named = " or ".join(f"{c!r}" for c in self.choices)
            raise ValueError(f"{PREFIX}{self.name} must be {named} or None (the default), got {value!r}.")
        return value

    def argument_type(self):
        """What an argument parser converts the command line's string with: the validated value, or the one-line
        error argparse prints before it exits with status 2 (HfArgumentParser and TrlParser use a field's
        annotation as argparse's `type`; a YAML config's strings go through it too)."""

        def parse(text):
            import argparse

            if self.kind == TEXTS:  # one element of the list (the parser's nargs="+" gives each)
                if isinstance(text, str) and text.lower() == "none":
                    return None
                if not (isinstance(text, str) and text.strip()):
                    raise argparse.ArgumentTypeError(f"{self.name} takes non-empty texts, got {text!r}.")
                return text
            value = text
            if self.kind == COUNT and isinstance(text, str) and text.strip().lstrip("+-").isdigit():
                value = int(text)
            if self.kind == NUMBER and isinstance(text, str):
                try:
                    value = float(text)
                except ValueError:
                    pass  # (validate names the text)
            try:
                return self.validate(value)
            except ValueError as error:
                raise argparse.ArgumentTypeError(str(error).removeprefix(PREFIX)) from None

        parse.__name__ = parse.__qualname__ = self.name
        return parse

    def other_values(self):
        """Its values besides the default, as a user writes them."""
        if self.kind == COUNT:
            return ({"draws": "K", "buckets": "B", "samples": "N"}[self.unit],)
        if self.kind == NUMBER:
            return ("a",)
        if self.kind == TEXTS:
            return ("['...', ...]",)
        return tuple(repr(value) for value in self.choices)


EVERY_RELEASE = "2026.10.4 and later"
MASKED_PROFILES = "the masked-diffusion profiles (Nemotron-Labs-Diffusion, Dream, LLaDA)"

NORMALIZATION = Flag(
    "diffusion_loss_normalization",
    CHOICE,
    (WINDOW, MICROBATCH),
    None,
    "'window': each micro-batch's weighted loss sum divided by the whole optimizer step's masked tokens "
    "(NVIDIA's normalization); 'microbatch': the profile's own per-micro-batch normalization; None: the "
    "profile's default.",
    f"{EVERY_RELEASE}; 'window' on {MASKED_PROFILES} only (a block / encoder profile takes None or 'microbatch')",
    {
        "patched": "each profile's own (Nemotron: window)",
        "native": "Unsloth's own loss (window-normalized natively)",
    },
)
NOISE = Flag(
    "diffusion_noise",
    CHOICE,
    (GLOBAL, PER_SAMPLE),
    None,
    "'global': the release's own draws from the global RNG, made at the window's first training step "
    "(resume-exact); 'per_sample': each example's noise from a generator keyed by (seed, epoch, its position "
    "in the global data order), whatever the data-parallel layout; None: 'per_sample' where the model's "
    "config sets dp_varying_mask_ratio=True, else 'global'.",
    f"{EVERY_RELEASE}; {MASKED_PROFILES}",
    {
        "patched": "'global', the release's own draws made at the window's first training step (resume-exact), or "
        "'per_sample' where the model config sets dp_varying_mask_ratio=True",
        "native": "'global', Unsloth's own draws made at the window's first training step, so a resumed run is exact "
        "and an uninterrupted one is bitwise Unsloth's, or 'per_sample' where the model config sets "
        "dp_varying_mask_ratio=True; Unsloth's own draws (a resumed run differs): UNSLOTH_DIFFUSION_NORM=0",
    },
)
EVAL_NOISE = Flag(
    "diffusion_eval_noise",
    CHOICE,
    (FIXED,),
    None,
    "'fixed': each evaluation example's noise from generators keyed by (seed, eval position, draw), and every "
    "global RNG left as it was: the same weights give the same eval loss, and evaluating never changes "
    "training; None: the release's own draws from the global RNG.",
    f"{EVERY_RELEASE}; {MASKED_PROFILES}",
    {
        "patched": "the release's own evaluation draws from the global RNG (an evaluation moves the training draws "
        "after it)",
        "native": "Unsloth's own evaluation draws from the global RNG (an evaluation moves the training draws after "
        "it)",
    },
)
EVAL_DRAWS = Flag(
    "diffusion_eval_draws",
    COUNT,
    (),
    1,
    "With diffusion_eval_noise='fixed': K keyed draws per evaluation example, one forward each; the eval loss is "
    "their mean.",
    f"{EVERY_RELEASE}; {MASKED_PROFILES}; K > 1 with diffusion_eval_noise='fixed' only",
    "one draw per evaluation example",
)
T_SAMPLER = Flag(
    "diffusion_t_sampler",
    CHOICE,
    (STRATIFIED,),
    None,
    "'stratified': the n examples of an optimizer step (all micro-batches and ranks) get one noise level in "
    "each stratum [k/n, (k+1)/n), each example's t still following the release's law; needs "
    "diffusion_noise='per_sample'. None: each t drawn on its own.",
    f"{EVERY_RELEASE}; {MASKED_PROFILES}; with per-sample noise only",
    "each example's t drawn on its own",
)
COMPLEMENTARY = Flag(
    "diffusion_complementary_masks",
    SWITCH,
    (True,),
    False,
    "True: each training example is trained on its mask M at level p and on M's complement at level 1 - p (M "
    "again where 1 - p is below the noise floor), each weighted by its own inverse probability; twice the "
    "forward compute. False: one mask per example.",
    f"{EVERY_RELEASE}; {MASKED_PROFILES}; where the plugin draws the run's noise (window normalization or "
    "per-sample noise)",
    "one mask per example",
)
METRICS = Flag(
    "diffusion_metrics",
    SWITCH,
    (False,),
    True,
    "True: every run logs, each optimizer step, window_masked_tokens, noise_level_mean, noise_level_std and "
    "moved_weight_share (global across the ranks that share the count), and a window-normalized run on "
    "2026.10.4-.5 (dense loss) masked_token_accuracy; a keyed evaluation logs eval_masked_token_accuracy and "
    "its masked CE by noise level. Computed from the drawn masks: training is bitwise the same. False: none "
    "of them.",
    f"{EVERY_RELEASE}; {MASKED_PROFILES}; training: every run (masked_token_accuracy: window-normalized runs "
    "on 2026.10.4-.5); evaluation: where it is keyed",
    "the window's metrics logged (and keyed evaluation's accuracy and masked CE by noise level)",
)
EVAL_BUCKETS = Flag(
    "diffusion_eval_buckets",
    COUNT,
    (),
    5,
    "With diffusion_eval_noise='fixed' and diffusion_metrics on: evaluation's masked cross-entropy is also "
    "logged in B equal buckets of the noise level (eval_masked_ce_noise_<low>-<high>).",
    f"{EVERY_RELEASE}; {MASKED_PROFILES}; B other than 5 with diffusion_eval_noise='fixed' only",
    "five noise-level buckets where evaluation is keyed",
    unit="buckets",
)
EVAL_SAMPLES = Flag(
    "diffusion_eval_samples",
    COUNT,
    (),
    None,
    "N: at each evaluation the first N eval examples' answers are decoded from all-[MASK] (greedy "
    "low-confidence remasking), written to output_dir/diffusion_samples.jsonl and shown in TensorBoard / W&B; "
    "training is bitwise the same. Needs evaluation (eval_strategy other than 'no').",
    f"{EVERY_RELEASE}; {MASKED_PROFILES}",
    "no samples decoded",
    unit="samples",
)
SAMPLE_PROMPTS = Flag(
    "diffusion_eval_sample_prompts",
    TEXTS,
    (),
    None,
    "Your own prompts to decode at each evaluation instead of eval examples (a YAML list, or several values "
    "on a command line), each given a 64-token answer. Needs evaluation; not with diffusion_eval_samples.",
    f"{EVERY_RELEASE}; {MASKED_PROFILES}",
    "no prompts of your own",
)
PARADIGM = Flag(
    "diffusion_paradigm",
    CHOICE,
    (BIDIRECTIONAL, BLOCK_DIFF),
    None,
    "'block_diff': NVIDIA's block-diffusion training for a checkpoint shipped 'bidirectional', its attention "
    "switched to its class's own; 'bidirectional': the other way; None: the model config's dlm_paradigm.",
    f"{EVERY_RELEASE}; Nemotron-Labs-Diffusion",
    "the model config's dlm_paradigm",
)
AR_ALPHA = Flag(
    "diffusion_ar_loss_alpha",
    NUMBER,
    (),
    0.3,
    "a in a * diffusion term + AR term (the recipe's ar_loss_alpha).",
    f"{EVERY_RELEASE}; block-diffusion runs",
    "the recipe's 0.3",
)
FLAGS = (
    NORMALIZATION,
    NOISE,
    EVAL_NOISE,
    EVAL_DRAWS,
    EVAL_BUCKETS,
    T_SAMPLER,
    COMPLEMENTARY,
    METRICS,
    EVAL_SAMPLES,
    SAMPLE_PROMPTS,
    PARADIGM,
    AR_ALPHA,
)
FIELDS = {flag.name: flag for flag in FLAGS}


def _annotation(flag):
    parse = flag.argument_type()
    if flag.kind == TEXTS:  # HfArgumentParser gives a list field nargs="+" and its element type
        return typing.Optional[list[parse]]  # noqa: UP045
    return typing.Optional[parse] if flag.default is None else parse  # noqa: UP045


# The flags as DiffusionConfig fields: what config_patches adds to the release's dataclass. The annotations are the
# parsers' converters (HfArgumentParser / TrlParser read them with typing.get_type_hints); a flag whose default is
# None is Optional, so that a parser accepts None.
Fields = dataclasses.make_dataclass(
    "Fields",
    [
        (
            flag.name,
            _annotation(flag),
            dataclasses.field(default=flag.default, metadata={"help": flag.help}),
        )
        for flag in FLAGS
    ],
)


def default(field):
    return FIELDS[field].default


def validate(value, field=NORMALIZATION.name):
    """The flag's value, or ValueError (Flag.validate)."""
    return FIELDS[field].validate(value)


def argument_type(field):
    return FIELDS[field].argument_type()


def asked(args):
    """{field: value} of every flag these arguments set to something other than its default."""
    found = {flag.name: flag.given(args) for flag in FLAGS}
    return {field: value for field, value in found.items() if value != default(field)}


def defaults_line(mode):
    """status()'s line of what a run gets unless its DiffusionConfig opts into something else ('patched' or
    'native'), from each flag's record: its default, what that gives, and its other values."""
    told = "; ".join(f"{flag.name}={flag.default!r}: {flag.gives(mode)}" for flag in FLAGS)
    others = ", ".join(f"{flag.name}={' or '.join(flag.other_values())}" for flag in FLAGS)
    return f"{told}; opt-ins per run: {others}"


# --- the checks that read several flags together --------------------------------------------------------------


def check_together(args):
    """The flags that only mean something together: K draws and B noise-level buckets are keyed evaluation's.
    (Stratified levels need per-sample noise, which the model's config can ask for too: check_lower_variance, at
    the trainer.)"""
    for flag, what in (
        (EVAL_DRAWS, "averages keyed evaluation draws"),
        (EVAL_BUCKETS, "buckets keyed evaluation draws"),
    ):
        value = flag.given(args)
        if value not in (None, flag.default) and EVAL_NOISE.given(args) != FIXED:
            raise ValueError(
                f"{PREFIX}{flag.name}={value!r} {what}; "
                f"set {EVAL_NOISE.name}='fixed' too, or leave {flag.name} at {flag.default}."
            )


def check_samples(args):
    """Samples are decoded at evaluations: a run that never evaluates would never show them. They come from the
    eval set or from the run's own prompts, not both."""
    count, prompts = EVAL_SAMPLES.of(args), SAMPLE_PROMPTS.of(args)
    if count and prompts:
        raise ValueError(
            f"{PREFIX}{EVAL_SAMPLES.name}={count!r} decodes the eval set's first examples, and "
            f"{SAMPLE_PROMPTS.name} gives prompts of its own; give one of them."
        )
    strategy = getattr(args, "eval_strategy", None)
    for flag, value in ((EVAL_SAMPLES, count), (SAMPLE_PROMPTS, prompts)):
        if value and getattr(strategy, "value", strategy) in ("no", None):
            raise ValueError(
                f"{PREFIX}{flag.name}={value!r} decodes samples at each evaluation, and this run never "
                f"evaluates (eval_strategy='no'); set eval_strategy to 'steps' or 'epoch' with an eval_dataset, "
                f"or leave {flag.name} at None."
            )


def check_lower_variance(args, profile, noise_mode, plugin_draws):
    """Stratified levels are keyed (per-sample noise); mask pairs need the plugin to draw the run's noise."""
    if T_SAMPLER.of(args) == STRATIFIED and noise_mode != PER_SAMPLE:
        raise ValueError(
            f"{PREFIX}{T_SAMPLER.name}='stratified' assigns strata by each example's key, and "
            f"this run's noise comes from the global RNG; set {NOISE.name}='per_sample'."
        )
    if COMPLEMENTARY.of(args) and not plugin_draws:
        raise ValueError(
            f"{PREFIX}{COMPLEMENTARY.name}=True pairs the masks the plugin draws, and "
            f"{profile.name!r} at {NORMALIZATION.name}={getattr(args, NORMALIZATION.name, None)!r} draws its own "
            f"inside the release's loss; set {NORMALIZATION.name}='window' or {NOISE.name}='per_sample'."
        )


# --- what the flags decide for one run ---------------------------------------------------------------------------


def normalization_for(profile, args):
    """'window' or 'microbatch' for this profile under these training arguments."""
    value = getattr(args, NORMALIZATION.name, None)
    if value is not None:
        return value
    return WINDOW if getattr(profile, "loss_normalization", None) == GLOBAL_MASKED_TOKENS else MICROBATCH


def noise_for(args, model_config):
    """'global' or 'per_sample' for this run: the flag when set; else per-sample where the model's config
    asks NVIDIA's forward process to vary the masks per rank; else the resume-exact global draws."""
    value = getattr(args, NOISE.name, None)
    if value is not None:
        return value
    return PER_SAMPLE if getattr(model_config, DP_VARYING, False) is True else GLOBAL


def eval_noise_for(args):
    """'fixed' (keyed draws) or None (the release's own, from the global RNG) for this run's evaluation."""
    return EVAL_NOISE.of(args)


def upstream_normalization_for(profile, args):
    """Upstream's `loss_normalization` (2026.10.7+) that gives this run's flag. 'microbatch' keeps a
    per-micro-batch profile's own and turns window-global into the micro-batch's own masked tokens,
    which is what 2026.10.4-.6 did for Nemotron."""
    own = getattr(profile, "loss_normalization", None)
    value = getattr(args, NORMALIZATION.name, None)
    if value is None or own is None:
        return own
    if value == WINDOW:
        return GLOBAL_MASKED_TOKENS
    return MASKED_TOKENS if own == GLOBAL_MASKED_TOKENS else own


def plugin_draws_for(profile, args, noise_mode):
    """Whether the plugin draws a run's training noise on a native release: its resume-exact draws of a
    window-normalized run, or per-sample noise; otherwise the release draws inside its own loss."""
    wanted = upstream_normalization_for(profile, args)
    return noise_mode == PER_SAMPLE or (noise_mode == GLOBAL and wanted == GLOBAL_MASKED_TOKENS)


def examples_per_step(args):
    """n: the examples of one optimizer step over every micro-batch and rank (the strata of a stratified run)."""
    return args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size


# --- what a trainer's construction and status() say about a run ---------------------------------------------------


def noise_note(args, mode):
    """The one line a trainer's construction logs about its noise (rank 0), or None."""
    if mode == PER_SAMPLE and getattr(args, NOISE.name, None) is None:
        return (
            f"{PREFIX}the model's config sets {DP_VARYING}=True, so every example draws "
            f"its own noise ({NOISE.name}='per_sample'); {NOISE.name}='global' keeps the "
            "global RNG's draws."
        )
    if mode == GLOBAL and args.world_size > 1:
        return (
            f"{PREFIX}the noise comes from the global RNG, seeded alike on all {args.world_size} "
            f"data-parallel ranks, so every rank draws the same noise levels; {NOISE.name}='per_sample' "
            "gives each example its own."
        )
    return None


def lower_variance_fields(args):
    """The lower-variance fields a run set, as status() names them."""
    asked = (
        (T_SAMPLER.name, T_SAMPLER.of(args) == STRATIFIED, "'stratified'"),
        (COMPLEMENTARY.name, COMPLEMENTARY.of(args), "True"),
    )
    return tuple(f"{field}={value}" for field, is_set, value in asked if is_set)


def lower_variance_note(args):
    """The line a trainer's construction logs when the run asks for lower-variance noise, or None."""
    asked = []
    if T_SAMPLER.of(args) == STRATIFIED:
        n = examples_per_step(args)
        asked.append(f"{T_SAMPLER.name}='stratified' (one noise level per stratum across each step's {n} examples)")
    if COMPLEMENTARY.of(args):
        asked.append(f"{COMPLEMENTARY.name}=True (every training micro-batch doubled: about twice the step time)")
    return f"{PREFIX}lower-variance noise: {'; '.join(asked)}." if asked else None

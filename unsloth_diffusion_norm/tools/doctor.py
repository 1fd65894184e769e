"""`unsloth-diffusion-norm doctor`: is this stack affected, is the fix live, and does it hold here?

Prints at most ten lines (render): the installed versions and device, the plugin's mode with its patches counted
by owner, a verdict with each defect a run can meet here in a line (in Unsloth, and what the plugin does), the
flags a config changes, then a live self-check; `--verbose` prints every patch and default and the whole verdict
instead. The self-check: the tiny model (or, with `--model DIR`, a tiny random copy of
that checkpoint's architecture, see own_model), one GA=2 window whose micro-batches draw unequal mask
counts, through the real DiffusionTrainer, judged by the oracle. With `--config FILE` (the training script's
YAML), it also reports the plugin's fields that config sets, the self-check trains one window at its batch size
and accumulation with its noise fields, and the verdict says whether that run is affected.
Exit status: 0 fixed (patched or native) and the self-check passed; 1 affected and not fixed (disabled,
unpatched, a displaced patch, or a broken installation of the plugin), or the self-check failed (or could
not run); 2 an Unsloth this plugin does not support, or (set by the command line) a `--model DIR` the
self-check cannot run on or a `--config FILE` whose plugin fields or shape are refused; 3 (set by the command line) Unsloth is not installed or cannot be imported.
"""

import time
from importlib import metadata

from .. import config
from ..registry import BROKEN, DISABLED, NATIVE, PATCHED, UNPATCHED, UNSUPPORTED
from .console import DONE as FIXED
from .console import FAILED as AFFECTED
from .console import UNSUPPORTED as NOT_SUPPORTED
from .doctor_text import KEYED_EVALUATION, NATIVELY, PER_SAMPLE_NOISE, fixed, render  # noqa: F401  (render: doctor's text)

PACKAGES = ("unsloth", "unsloth_zoo", "transformers", "trl", "accelerate", "torch")
# What a natively fixed release (2026.10.7+) still gets wrong on its own.
NATIVE_GAPS = (
    "it draws each window's noise while fetching it, before a resumed run restores the RNG, so a resumed run "
    "trains on other masks than the uninterrupted one; and every data-parallel rank, seeded alike, draws the "
    "same noise levels"
)


def versions():
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def accelerator():
    import torch

    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return "cpu"


def natively_fixed():
    """Does the installed Unsloth normalize by the window itself (whether or not the plugin is on)?"""
    import importlib

    from .. import detect

    try:
        modules = [importlib.import_module(f"unsloth.models.diffusion_{m}") for m in ("trainer", "masked", "profiles")]
    except ImportError:
        return False
    return detect.recognise(*modules)[0] == detect.UPSTREAM


# The fields of a run's training noise: the self-check trains with a config's own, and the oracle replays them.
TRAINING_NOISE = (config.NOISE.name, config.T_SAMPLER.name, config.COMPLEMENTARY.name)


def run_fields(path):
    """{field: value} of the plugin's fields a training config (YAML or JSON) sets to other than the default,
    validated as DiffusionConfig validates them; one line (exit 2) for a value or combination it refuses."""
    import types

    from .impact.settings import Unusable, load_config

    found = load_config(path)
    try:
        values = {field: config.validate(found.get(field), field) for field in config.FIELDS}
        args = types.SimpleNamespace(**values)
        config.check_together(args)
        # (the model config's switch cannot ask for per-sample noise here: the self-check's model lacks it)
        config.check_lower_variance(args, None, config.noise_for(args, None), plugin_draws=True)
    except ValueError as error:
        raise Unusable(f"{path}: {str(error).removeprefix('unsloth_diffusion_norm: ')}") from None
    return config.asked(args)


# A run's shape: what decides how many micro-batches share an optimizer step (Trainer's defaults where a
# config leaves them out, as the run itself gets them).
SHAPE = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}


def run_shape(path):
    """{setting: value} of a training config's rows per micro-batch and micro-batches per step (Trainer's
    default for a setting it leaves out); one line (exit 2) for a value no run could have."""
    from .impact.settings import Settings, Unusable, load_config

    found = load_config(path)
    shape = {name: found.get(name, default) for name, default in SHAPE.items()}
    try:  # impact's check of the same two settings, in its words
        Settings(**shape).check()
    except Unusable as error:
        raise Unusable(f"{path}: {error}") from None
    return shape


def run_words(state, native, shape):
    """What the verdict says of the run a config describes: is that run affected on this stack, and why."""
    batch, steps = shape["per_device_train_batch_size"], shape["gradient_accumulation_steps"]
    run = f"The run in the config (batch {batch} x GA {steps} per process)"
    if native:  # whatever the plugin's state: the release's own loss
        return f" {run} is normalized by its window's masked tokens by the release itself."
    if state.mode == PATCHED and not state.displaced:
        return f" {run} is normalized by its window's masked tokens" + (
            f": without the fix its {steps} micro-batches per step would each be divided by their own."
            if steps > 1
            else "; with one micro-batch per step it needs the fix only when launched on several processes."
        )
    if steps > 1:
        return f" {run} is affected: each of its {steps} micro-batches per step is divided by its own masked tokens."
    return (
        f" {run} has one micro-batch per step: on one process it is not affected; launched on several, each "
        "process divides by its own masked tokens, and it is."
    )


def examine(self_check=True, model=None, settings=(), device="cpu", fields=None, shape=None):
    """Everything doctor reports, as a dict (what --json prints). `model`: a checkpoint directory whose
    architecture the self-check runs at a tiny size (`settings`: (key, value) for that copy's config);
    own_model.Refused, one line, when it cannot. `device`: where the self-check trains (the oracle runs
    there too). `fields`, `shape`: a run config's plugin fields (run_fields) and shape (run_shape), reported;
    the self-check trains at that shape with its noise fields, and the verdict speaks of that run."""
    from ..activation import status

    report = {"versions": versions(), "device": accelerator()}
    if fields:
        report["fields"] = dict(fields)
    if shape:
        report["shape_of_run"] = dict(shape)
    state = status()
    report.update(
        mode=state.mode,
        shape=state.shape,
        reason=state.reason,
        defaults=state.defaults,
        patches=[name for name, _ in state.patches],
        displaced=list(state.displaced),
    )
    release = f"Unsloth {state.unsloth_version or report['versions']['unsloth']}"
    if state.mode == UNSUPPORTED:
        report["verdict"] = (
            f"{release} is not supported ({state.reason}); nothing was patched and diffusion losses are Unsloth's own."
        )
        report["exit"] = NOT_SUPPORTED
        return report
    native = state.mode == NATIVE or (state.mode in (DISABLED, UNPATCHED, BROKEN) and natively_fixed())
    report["verdict"] = verdict(state, release, native)
    if shape:
        report["verdict"] += run_words(state, native, shape)
    if fields and state.mode == DISABLED:
        report["verdict"] += (
            " The config sets the plugin's fields, and with the plugin turned off a DiffusionTrainer refuses them at "
            "construction."
        )
    fixed_here = fixed(state.mode, native, state.displaced)
    noise = {field: value for field, value in (fields or {}).items() if field in TRAINING_NOISE}
    passed = _self_check(report, model, settings, device, noise, shape or {}) if self_check else True
    report["exit"] = FIXED if fixed_here and passed else AFFECTED
    return report


EVALUATION_GAP = (
    "On every release evaluation draws its noise from the global RNG, so each evaluation moves every training "
    "draw after it (a seeded run trains another model when eval_steps changes) and two evaluations of the same "
    "weights disagree"
)


def _evaluation_words(mode):
    if mode in (PATCHED, NATIVE):
        return (
            f"{EVALUATION_GAP}; the plugin keeps those draws by default, and diffusion_eval_noise='fixed' keys them "
            "(the same weights give the same eval loss, and evaluating leaves training as it was)."
        )
    return f"{EVALUATION_GAP}; the plugin is {mode}, so nothing fixes that."


def verdict(state, release, native):
    """The verdict in words: is this stack affected, and is the fix live (`native`: the release normalizes
    by the window itself)?"""
    if state.mode == PATCHED:
        said = (
            f"{release} normalizes per micro-batch; the plugin's fix is active, "
            f"so the loss is divided by the whole window's masked tokens."
        )
    elif state.mode == BROKEN:
        said = f"the plugin's {state.reason}; " + (
            f"{release} {NATIVELY}, so losses are right, but the plugin's flags are unavailable."
            if native
            else f"{release} normalizes per micro-batch, so runs with gradient accumulation are affected."
        )
    elif native and state.mode == NATIVE:
        said = (
            f"{release} {NATIVELY}, but {NATIVE_GAPS}; the plugin draws Unsloth's own noise "
            "at each window's first step by default, so a resumed run is exact (an uninterrupted one is bitwise "
            "Unsloth's), and diffusion_noise='per_sample' (or the model config's dp_varying_mask_ratio=True) "
            "gives each example its own."
        )
    elif native:
        said = f"{release} {NATIVELY}, but {NATIVE_GAPS}; the plugin is {state.mode}, so nothing fixes either."
    else:
        said = (
            f"{release} normalizes per micro-batch and the plugin is {state.mode}: "
            f"runs with gradient accumulation are affected."
        )
    said += " " + _evaluation_words(state.mode)
    if state.displaced:
        said += (
            f" But {len(state.displaced)} of the plugin's patches were replaced by something else "
            f"after they were applied ({', '.join(state.displaced)}): the fix is not whole."
        )
    return said


def _self_check(report, model, settings, device, noise, shape):
    """Train one window (`noise`, `shape`: a run config's noise fields and shape) and judge it by the oracle;
    the outcome goes into `report`. True if it passed."""
    from . import own_model, reproduce

    started = time.perf_counter()
    subject = None
    if model is not None:  # a directory it cannot run on is refused, not reported as a failed check
        subject = own_model.prepare(model, settings)
        report["model"] = subject.describe()
    try:
        if reproduce.opts_in(subject):  # Dream, LLaDA: the plugin changes them only when a run opts in
            report["verdict"] += (
                f" {subject.model_class}'s family ({subject.profile}) keeps its own normalization unless a "
                "run sets diffusion_loss_normalization='window'."
            )
            checks = reproduce.family_checks(0, subject, device)
            seconds = round(time.perf_counter() - started, 2)
            report["self_check"] = {**checks, "seconds": seconds, "device": str(device)}
            return checks["passed"]
        # this stack as it is: patched, native or unfixed
        rows = {
            "batch_size": shape.get("per_device_train_batch_size", 1),
            "gradient_accumulation_steps": shape.get("gradient_accumulation_steps", 2),
        }
        judged = reproduce.measure(seed=0, model=subject, device=device, **rows, **noise)
    except Exception as error:  # noqa: BLE001 - a health check reports what broke instead of dying
        report["self_check"] = {
            "passed": False,
            "error": f"{type(error).__name__}: {error}",
            "seconds": round(time.perf_counter() - started, 2),
        }
        return False
    report["self_check"] = {
        **judged.report(),
        "fields": noise,
        **rows,
        "passed": judged.ok,
        "seconds": round(time.perf_counter() - started, 2),
        "device": str(device),
    }
    return judged.ok


def unusable(message, code):
    """The report when doctor cannot look at Unsloth at all (not installed, not importable): what --json
    prints then, with the one line the command line shows on stderr."""
    from ..activation import status

    return {
        "versions": versions(),
        "device": None,
        "mode": status().mode,
        "verdict": message,
        "error": message,
        "exit": code,
    }

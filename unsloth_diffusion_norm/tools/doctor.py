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

import re
import time
from importlib import metadata

from .. import config
from ..registry import BROKEN, DISABLED, NATIVE, PATCHED, UNPATCHED, UNSUPPORTED
from .console import DONE as FIXED
from .console import FAILED as AFFECTED
from .console import UNSUPPORTED as NOT_SUPPORTED

PACKAGES = ("unsloth", "unsloth_zoo", "transformers", "trl", "accelerate", "torch")
# What a natively fixed release (2026.10.7+) still gets wrong on its own.
NATIVE_GAPS = (
    "it draws each window's noise while fetching it, before a resumed run restores the RNG, so a resumed run "
    "trains on other masks than the uninterrupted one; and every data-parallel rank, seeded alike, draws the "
    "same noise levels"
)
# The verdict's words for a release that is right on the loss by itself: the summary reads them back (--json's
# report has no key of its own for it, and stays as it is).
NATIVELY = "normalizes by the window natively"
# A config's opt-ins that fix a defect of every release: (field, value).
KEYED_EVALUATION = (config.EVAL_NOISE.name, config.FIXED)
PER_SAMPLE_NOISE = (config.NOISE.name, config.PER_SAMPLE)


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


def fixed(mode, native, displaced):
    """Is the loss right on this stack (`native`: the release normalizes by the window itself)?"""
    return (mode == PATCHED or (native and mode != BROKEN)) and not displaced


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


def render(report, verbose=False):
    """doctor's text. By default at most ten lines: the stack, each defect of this run in a line (is it there in
    Unsloth, and what the plugin does), the patches counted by owner, the flags a config changes, the model, the
    self-check. `verbose`: every patch, the defaults and the whole verdict (what --json holds, as text)."""
    return "\n".join(_everything(report) if verbose else _summary(report))


def _everything(report):
    lines = [
        _installed(report),
        f"Device: {report['device']}",
        f"Plugin: mode={report['mode']}" + (f", shape {report['shape']}" if report.get("shape") else ""),
    ]
    if report.get("reason"):
        lines.append(f"  reason: {report['reason']}")
    if report.get("defaults"):
        lines.append(f"  defaults: {report['defaults']}")
    lines += [f"  patched: {name}" for name in report.get("patches", [])]
    lines += [f"  DISPLACED: {name}" for name in report.get("displaced", [])]
    if report.get("fields"):
        lines.append("Run config sets: " + ", ".join(f"{k}={v!r}" for k, v in report["fields"].items()))
    lines.append(f"Verdict: {report['verdict']}")
    model = report.get("model")
    if model:
        shrunk = ", ".join(f"{key} {full}→{tiny}" for key, (full, tiny) in model["changes"].items())
        lines.append(
            f"Model: {model['dir']}: {model['class']} (model_type {model['model_type']}, Unsloth profile "
            f"{model['profile']}) from its own code, at a tiny size with random weights: {shrunk}"
        )
    return lines + _check_lines(report, verbose=True)


def _installed(report):
    return "Installed: " + ", ".join(f"{k} {v or '—'}" for k, v in report["versions"].items())


def _summary(report):
    lines = [f"{_installed(report)}; device {report['device']}", _plugin(report)]
    if report["mode"] == UNSUPPORTED:  # nothing patched, nothing checked (why: the Plugin line)
        release = f"Unsloth {report['versions']['unsloth']}"
        return [
            *lines,
            f"Verdict: {release} is not supported; nothing was patched and diffusion losses are Unsloth's own.",
        ]
    lines += [f"Verdict: {_outcome(report)}", *(f"  {line}" for line in _defects(report)), _flags(report)]
    model = report.get("model")
    if model:
        lines.append(
            f"Model: {model['dir']}: {model['class']} (profile {model['profile']}), a tiny random copy "
            "(--verbose: its sizes)"
        )
    return lines + _check_lines(report, verbose=False)


def _plugin(report):
    """The mode, why (where the other lines do not say it), and the patches counted by owner (the recognised
    shape of Unsloth's code: --verbose)."""
    line = f"Plugin: {report['mode']}"
    # (native's reason is the resume line; the verdict names the switch that disabled it)
    if report.get("reason") and report["mode"] not in (NATIVE, DISABLED):
        line += f" ({report['reason']})"
    groups = _patch_groups(report.get("patches", []))
    if groups:
        counted = ", ".join(f"{count} on {owner}" for owner, count in groups.items())
        line += f"; patches: {counted}; --verbose lists them"
    return line


def _patch_groups(names):
    """{owner: how many patches}, in the order status() lists them. DiffusionConfig's are the flags (three for
    each field, and __init__); every profile's go together; a trainer's own (`DiffusionTrainer at 0x…: …`)
    count with its class."""
    groups = {}
    for name in names:
        owner = re.split(r"[.:]| at 0x", name, maxsplit=1)[0].strip()
        if "profile" in owner.lower():
            owner = "profiles"
        elif owner == "DiffusionConfig":
            owner = "DiffusionConfig (flags)"
        groups[owner] = groups.get(owner, 0) + 1
    return groups


def _native(report):
    """Is the release right on the loss by itself? What the verdict said (the report has no key of its own)."""
    return report["mode"] == NATIVE or NATIVELY in report["verdict"]


def _outcome(report):
    """The verdict in one line: the exit status in a word, the release's normalization and the plugin's state."""
    mode, native, displaced = report["mode"], _native(report), report.get("displaced")
    release = f"Unsloth {report['versions']['unsloth']}"
    if report["exit"] == FIXED:
        word = "OK"
    else:  # a stack that should hold but whose self-check did not is a failed check, not an affected stack
        word = "FAILED (the self-check)" if fixed(mode, native, displaced) else "AFFECTED"
    said = f"{release} {NATIVELY}" if native else f"{release} normalizes per micro-batch"
    if displaced:  # (their names: --verbose)
        said += f"; {len(displaced)} plugin patches are displaced: the fix is not whole"
    elif mode == PATCHED:
        said += "; the plugin's fix is active"
    elif mode == NATIVE:
        said += "; the plugin fixes what it still gets wrong"
    else:
        said += " and the plugin's installation is broken" if mode == BROKEN else f" and the plugin is {mode}"
        said += f" ({report['reason']})" if mode == DISABLED else ""
    return f"{word} - {said}"


def _defects(report):
    """One line per defect a run can meet here: is it there in Unsloth, and what the plugin does about it."""
    mode, fields = report["mode"], report.get("fields", {})
    live = mode in (PATCHED, NATIVE)
    off = f"not fixed (the plugin is {mode})"
    if not _native(report):  # 2026.10.4-.6 draw in compute_loss, after a resumed run restored the RNG
        resume = "right in Unsloth (noise drawn at the training step)" + ("; the plugin keeps it so" if live else "")
    else:
        resume = "wrong in Unsloth (noise drawn before the RNG is restored); " + (
            "fixed by the plugin (drawn at the first step)" if live else off
        )
    # (a switched-off plugin refuses a config's opt-ins: nothing fixes these then)
    evaluation = "from the global RNG on every release; " + (
        (_opted(fields, KEYED_EVALUATION, "keyed") or "diffusion_eval_noise='fixed' keys it") if live else off
    )
    ranks = "the same on every rank, every release; " + (
        (_opted(fields, PER_SAMPLE_NOISE, "varied") or "diffusion_noise='per_sample' varies them") if live else off
    )
    return [
        f"window normalization: {_window(report)}",
        f"resume: {resume}",
        f"evaluation noise: {evaluation}",
        f"data-parallel noise levels: {ranks}",
    ]


def _opted(fields, flag, done):
    """`done` by the config's own opt-in, when the config sets the flag to the value that fixes it."""
    field, value = flag
    return f"{done} by the config's {field}={value!r}" if fields.get(field) == value else ""


def _window(report):
    """The window-normalization line: the release's own, what the plugin does, and the config's run."""
    mode, check = report["mode"], report.get("self_check") or {}
    if "checks" in check:  # an opt-in family (Dream, LLaDA): its own objective unless a run asks
        model = report["model"]
        return f"{model['class']} ({model['profile']}) keeps its own unless a run sets diffusion_loss_normalization='window'"
    if _native(report):
        return "right in Unsloth (it divides by the window's masked tokens itself)"
    if mode == PATCHED and report.get("displaced"):
        said, holds = "affected in Unsloth; the plugin's fix is NOT whole (displaced patches)", False
    elif mode == PATCHED:
        said, holds = "affected in Unsloth, fixed by the plugin", True
    else:
        said, holds = f"AFFECTED in Unsloth; the plugin is {mode}", False
    shape = report.get("shape_of_run")
    if shape:  # one micro-batch a step is right on one process, and affected once launched on several
        several = shape["gradient_accumulation_steps"] == 1
        if holds:
            said += f"; at {_run(shape)}: fixed" + (" (needed on several processes)" if several else "")
        else:
            said += f"; at {_run(shape)}: affected" + (" on several processes" if several else "")
    return said


def _run(shape):
    return f"batch {shape['per_device_train_batch_size']} x GA {shape['gradient_accumulation_steps']}"


def _flags(report):
    """The plugin's flags this run changes from their defaults (a config's), and the run's shape."""
    shape = report.get("shape_of_run")
    if not shape:
        return "Flags: all at their defaults (--config FILE checks your run's)"
    fields = report.get("fields")
    line = "Run config sets: " + (
        ", ".join(f"{k}={v!r}" for k, v in fields.items()) if fields else "no plugin flag (all at their defaults)"
    )
    if fields and report["mode"] == DISABLED:
        line += " (refused while the plugin is disabled)"
    return f"{line}; {_run(shape)}"


def _check_lines(report, verbose):
    """The self-check's line; an opt-in family's checks each on a line of their own when `verbose`."""
    check, model = report.get("self_check"), report.get("model")
    subject = f"tiny random {model['class']}" if model else "tiny model"
    if not check:
        return []
    if "checks" in check:
        return _family_lines(check, subject, verbose)
    if "error" in check:
        return [f"Self-check: FAIL - it could not run: {check['error']}"]
    return [
        f"Self-check ({check.get('device', 'cpu')}, {subject}, {_shape(check)}{_with(check.get('fields'))}, masked tokens "
        f"{check['counts']}): "
        f"{'PASS' if check['passed'] else 'FAIL'} - loss {check['loss']:.6f} vs oracle "
        f"{check['reference_loss']:.6f}, max grad error {check['grad_error']:.2e}, max param error "
        f"{check['param_error']:.2e}, worst error/tolerance {check['worst_error_over_tolerance']:.3g} "
        f"({check['seconds']} s)"
    ]


def _shape(check):
    batch = check.get("batch_size", 1)
    return (f"batch {batch} x " if batch != 1 else "") + f"GA {check.get('gradient_accumulation_steps', 2)}"


def _with(fields):
    return ", " + ", ".join(f"{k}={v!r}" for k, v in fields.items()) if fields else ""


def _family_lines(check, subject, verbose):
    """doctor's lines for a family the plugin changes only on opt-in (reproduce.family_checks): each check in a
    word on the self-check's line, or (`verbose`) each on a line of its own with its figures."""
    objective = check["objective"]
    head = (
        f"Self-check ({check['device']}, {subject}, GA 2; the family's objective: logits "
        f"{'shifted' if objective['shift'] else 'unshifted'}, {objective['normalization']} normalization, eps "
        f"{objective['eps']:g}): {'PASS' if check['passed'] else 'FAIL'}"
    )
    if not verbose:
        each = ", ".join(_in_a_word(one) for one in check["checks"].values())
        return [f"{head} - {each} ({check['seconds']} s)"]
    lines = [f"{head} ({check['seconds']} s)"]
    for one in check["checks"].values():
        flags = ", ".join(f"{k}={v!r}" for k, v in one["settings"].items()) or "default (no flag)"
        if "error" in one:
            lines.append(f"  {flags}: FAIL - it could not run: {one['error']}")
            continue
        line = (
            f"  {flags}: {'PASS' if one['passed'] else 'FAIL'} - loss {one['loss']:.6f} vs {one['normalization']} "
            f"oracle {one['reference_loss']:.6f}, max grad error {one['grad_error']:.2e}, max param error "
            f"{one['param_error']:.2e}, worst error/tolerance {one['worst_error_over_tolerance']:.3g}, masked "
            f"tokens {one['counts']}"
        )
        if "same_as_release" in one:
            line += (
                "; bitwise the release's own (an unpatched run)"
                if one["same_as_release"]
                else "; NOT bitwise the release's own (an unpatched run differs)"
            )
        if "control_worst_error_over_tolerance" in one:
            line += (
                f"; the release's own normalization misses this oracle by "
                f"{one['control_worst_error_over_tolerance']:.3g} tolerances"
            )
        lines.append(line)
    return lines


def _in_a_word(one):
    """One family check as `window+per_sample PASS`: its settings' values, and how it went."""
    settings = "+".join(str(value) for value in one["settings"].values()) or "default"
    return f"{settings} {'PASS' if one['passed'] else 'FAIL'}" + (" (it could not run)" if "error" in one else "")

"""doctor's report as text: at most ten lines by default (the stack, the mode with its patches counted by owner,
the verdict with a line per defect, the flags a config changes, the model, the self-check); `verbose`: every patch,
every default and the whole verdict. Made from the report alone (what --json prints), so both forms say the same.
"""

import re

from .. import config
from ..registry import BROKEN, DISABLED, NATIVE, PATCHED, UNSUPPORTED
from .console import DONE as FIXED

# The verdict's words for a release that is right on the loss by itself: the summary reads them back (--json's
# report has no key of its own for it, and stays as it is).
NATIVELY = "normalizes by the window natively"
# A config's opt-ins that fix a defect of every release: (field, value).
KEYED_EVALUATION = (config.EVAL_NOISE.name, config.FIXED)
PER_SAMPLE_NOISE = (config.NOISE.name, config.PER_SAMPLE)


def fixed(mode, native, displaced):
    """Is the loss right on this stack (`native`: the release normalizes by the window itself)?"""
    return (mode == PATCHED or (native and mode != BROKEN)) and not displaced


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
            f"{model['profile']}{_paradigm(report)}) from its own code, at a tiny size with random weights: {shrunk}"
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
            f"Model: {model['dir']}: {model['class']} (profile {model['profile']}{_paradigm(report)}), a tiny "
            "random copy "
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
    each field, and __init__); every profile's go together. A live trainer's own (2026.10.7+: `DiffusionTrainer at
    0x…: …`) are that trainer's, not the stack's: they come and go with the trainers, so --verbose alone lists them."""
    groups = {}
    for name in names:
        if " at 0x" in name:
            continue
        owner = re.split(r"[.:]", name, maxsplit=1)[0].strip()
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
        said += f"; {len(displaced)} patches displaced: the fix is not whole"
    elif mode == PATCHED:
        said += "; the plugin's fix is active"
    elif mode == NATIVE:
        said += "; the plugin fixes the rest"
    else:
        said += " and the plugin's installation is broken" if mode == BROKEN else f" and the plugin is {mode}"
        said += f" ({report['reason']})" if mode == DISABLED else ""
    return f"{word} - {said}"


def _paradigm(report):
    """ ", " and NVIDIA's block-diffusion mode where the checkpoint's config asks for it, with what Unsloth alone and
    the plugin do with it; nothing for the bidirectional mode every other check assumes."""
    said = report["model"].get("dlm_paradigm") or ""
    if not said.startswith("block_diff"):
        return ""
    mode = report["mode"]
    plugin = "trained by the plugin" if mode in (PATCHED, NATIVE) else f"not fixed (the plugin is {mode})"
    return f", {said}: AFFECTED in Unsloth alone (the noisy row only, cut in two by its attention); {plugin}"


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

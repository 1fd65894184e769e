"""The before / after / reference table: one optimizer step (batch 1, accumulation 2, two answers of
equal length whose realized mask counts differ) on the tiny model, CPU, a few seconds after imports."""

from ..activation import apply, status, unpatched
from ..registry import NATIVE, PATCHED
from . import experiment, fixtures, judging, oracle

EXAMPLES = [fixtures.Example([10, 11, 12], fixtures.LONG), fixtures.Example([13, 14, 15], fixtures.LONG)]


def measure(seed, model=None, device="cpu"):
    """The self-check window on the tiny model, or on `model` (an own_model.OwnModel: a user's architecture),
    trained on `device`."""
    if model is None:
        run = experiment.train(EXAMPLES, gradient_accumulation_steps=2, seed=seed, device=device)
        return judging.judge(run, run.windows[0])
    run = experiment.train(
        model.examples, gradient_accumulation_steps=2, seed=seed, checkpoint=model.checkpoint, device=device
    )
    return judging.judge(run, run.windows[0], eos_id=model.eos_id, mask_id=model.mask_id)


def table(seed=0, model=None):
    """Rows of (column, Verdict or None) for unpatched / plugin / upstream-native (`model`: see measure)."""
    mode = apply().mode if status().mode != NATIVE else NATIVE
    columns = {}
    if mode == PATCHED:
        with unpatched():
            columns["unpatched"] = measure(seed, model)
        columns["plugin"] = measure(seed, model)
        columns["upstream-native"] = None
    elif mode == NATIVE:
        columns["unpatched"] = None
        columns["plugin"] = None
        columns["upstream-native"] = measure(seed, model)
    return columns


def render(columns, model=None):
    judged = [v for v in columns.values() if v is not None]
    reference = judged[0]
    names = list(columns) + ["reference"]

    def cell(value, fmt):
        return "—" if value is None else format(value, fmt)

    rows = [
        ("loss", [cell(v and v.logged_loss, ".6f") for v in columns.values()] + [f"{reference.reference_loss:.6f}"]),
        ("max abs grad error", [cell(v and v.grad_error, ".2e") for v in columns.values()] + ["0"]),
        ("max abs param error after SGD step", [cell(v and v.param_error, ".2e") for v in columns.values()] + ["0"]),
        ("worst error / tolerance", [cell(v and v.worst, ".3g") for v in columns.values()] + ["—"]),
        ("within tolerance", [("—" if v is None else ("yes" if v.ok else "NO")) for v in columns.values()] + ["—"]),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [
        f"Unsloth {status().unsloth_version}; realized masked tokens per micro-batch: {reference.counts} "
        f"(window total {sum(reference.counts)}); {oracle.describe_tolerance()}",
        *(
            [
                f"Model: a tiny random {model.model_class} from {model.source}'s own code "
                f"({', '.join(f'{k} {a}→{b}' for k, (a, b) in model.changes.items())})"
            ]
            if model
            else []
        ),
        "",
        "| " + " | ".join([" " * width] + [f"{n:>15}" for n in names]) + " |",
        "|" + "|".join(["-" * (width + 2)] + ["-" * 17 for _ in names]) + "|",
    ]
    lines += ["| " + " | ".join([f"{label:<{width}}"] + [f"{v:>15}" for v in values]) + " |" for label, values in rows]
    return "\n".join(lines)


def succeeded(columns):
    """The fix (plugin or native) is within tolerance, and the unpatched run, when shown, clearly is not."""
    fixed = columns.get("plugin") or columns.get("upstream-native")
    unpatched = columns.get("unpatched")
    return fixed is not None and fixed.ok and (unpatched is None or unpatched.worst > oracle.CONTROL_FACTORS["fp32"])

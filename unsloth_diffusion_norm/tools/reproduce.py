"""The before / after / reference table: one optimizer step (batch 1, accumulation 2, two answers of
equal length whose realized mask counts differ) on the tiny model, CPU, a few seconds after imports."""

from ..activation import apply, status, unpatched
from ..proof import experiment, fixtures, judging, oracle, tables
from ..registry import NATIVE, PATCHED

EXAMPLES = [fixtures.Example([10, 11, 12], fixtures.LONG), fixtures.Example([13, 14, 15], fixtures.LONG)]


def measure(seed, model=None, device="cpu", normalization=None, **settings):
    """The self-check window on the tiny model, or on `model` (an own_model.OwnModel: a user's architecture),
    trained on `device`; `settings`: the run's DiffusionConfig flags and shape (`batch_size`,
    `gradient_accumulation_steps`: experiment.Setup's, 1 x 2 by default), `normalization`: the oracle's, when
    not the objective of the model's family."""
    pairs = bool(settings.get("diffusion_complementary_masks"))  # the oracle builds each row's partner
    if model is None:
        run = experiment.train(window_of(EXAMPLES, settings), seed=seed, device=device, **settings)
        return judging.judge(run, run.windows[0], judging.OracleSettings(complementary=pairs))
    return judge_copy(train_copy(seed, model, device, **settings), model, normalization, pairs)


def window_of(examples, settings):
    """One optimizer step's rows at the run's shape in `settings`: the examples in turn (1 x 2: each once)."""
    setup = experiment.Setup.of(**settings)
    return [examples[i % len(examples)] for i in range(setup.batch_size * setup.gradient_accumulation_steps)]


def train_copy(seed, model, device="cpu", **settings):
    return experiment.train(
        window_of(model.examples, settings), seed=seed, checkpoint=model.checkpoint, device=device, **settings
    )


def judge_copy(run, model, normalization=None, complementary=False):
    """A run of `model` against the oracle of its family's objective (`normalization`: another one's;
    `complementary`: a run with mask pairs)."""
    objective = oracle.OBJECTIVES[model.profile]
    return judging.judge(
        run,
        run.windows[0],
        judging.OracleSettings(
            eps=objective.eps,
            eos_id=model.eos_id,
            mask_id=model.mask_id,
            shift=objective.shift,
            normalization=normalization or objective.normalization,
            complementary=complementary,
            block=None if model.block is None else oracle.BlockDiffusion(model.block.block_size, model.block.alpha),
        ),
    )


# What the plugin changes for a family that normalizes per micro-batch (Dream, LLaDA): nothing by default;
# window normalization, with the release's noise or per-sample noise, when a run opts in.
OPT_INS = {
    "window": {"diffusion_loss_normalization": "window"},
    "window_per_sample": {"diffusion_loss_normalization": "window", "diffusion_noise": "per_sample"},
}


def opts_in(model):
    """Does the plugin change `model`'s family only when a run opts in (its own normalization per micro-batch)?"""
    return model is not None and oracle.OBJECTIVES[model.profile].normalization != oracle.WINDOW


def family_checks(seed, model, device="cpu"):
    """The self-check of an opt-in family, as doctor reports it: the default run is bitwise the release's own
    (an unpatched() run) and matches the family's own objective; each opt-in matches the window oracle, which
    the default run misses by more than the control factor. A run that cannot train is that check's error."""
    objective = oracle.OBJECTIVES[model.profile]
    factor = oracle.CONTROL_FACTORS["fp32"]

    def described(verdict, normalization, settings):
        return {"settings": settings, "normalization": normalization, **verdict.report()}

    default = train_copy(seed, model, device)
    with unpatched():
        release = train_copy(seed, model, device)
    own = described(judge_copy(default, model), objective.normalization, {})
    own["same_as_release"] = experiment.divergence(default, release) == 0.0  # logged loss and every parameter
    own["passed"] = own["worst_error_over_tolerance"] <= 1 and own["same_as_release"]
    control = judge_copy(default, model, oracle.WINDOW).worst  # the release's own normalization, by the window
    checks = {"default": own}
    for name, settings in OPT_INS.items():
        try:
            run = train_copy(seed, model, device, **settings)
            check = described(judge_copy(run, model, oracle.WINDOW), oracle.WINDOW, settings)
        except Exception as error:  # noqa: BLE001 - e.g. a disabled plugin refuses the flag: this check fails
            checks[name] = {"settings": settings, "passed": False, "error": f"{type(error).__name__}: {error}"}
            continue
        check["passed"] = check["worst_error_over_tolerance"] <= 1
        if name == "window":  # the same window as the default run's: the masks differ only in normalization
            check["control_worst_error_over_tolerance"] = control
            check["passed"] = check["passed"] and control > factor
        checks[name] = check
    return {
        "objective": {"shift": objective.shift, "normalization": objective.normalization, "eps": objective.eps},
        "checks": checks,
        "passed": all(c["passed"] for c in checks.values()),
    }


def table(seed=0, model=None):
    """Rows of (column, Verdict or None) for unpatched / plugin / upstream-native (`model`: see measure). For
    a family the plugin changes only on opt-in (`opts_in`): the release's own and the plugin's "window"
    opt-in, both by the window oracle."""
    mode = apply().mode if status().mode != NATIVE else NATIVE
    columns = {}
    if opts_in(model):
        with unpatched():
            columns["unpatched"] = measure(seed, model, normalization=oracle.WINDOW)
        columns["plugin"] = measure(seed, model, normalization=oracle.WINDOW, **OPT_INS["window"])
        columns["upstream-native"] = None
        return columns
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
        *(
            [
                f"The plugin changes the {model.profile} profile only on opt-in: unpatched = the release's own "
                f"normalization ({oracle.OBJECTIVES[model.profile].normalization}, per micro-batch), plugin = "
                "diffusion_loss_normalization='window'; reference = the window oracle"
            ]
            if opts_in(model)
            else []
        ),
        "",
    ]
    align = "<" + ">" * len(names)
    lines += tables.markdown(["", *names], [[label, *values] for label, values in rows], align, min_width=15)
    return "\n".join(lines)


def succeeded(columns):
    """The fix (plugin or native) is within tolerance, and the unpatched run, when shown, clearly is not."""
    fixed = columns.get("plugin") or columns.get("upstream-native")
    unpatched = columns.get("unpatched")
    return fixed is not None and fixed.ok and (unpatched is None or unpatched.worst > oracle.CONTROL_FACTORS["fp32"])

"""Part 2, convergence at the settings users run: global noise (the release's own draws), batch 1, GA 8 (as
examples/train.yaml), over paired seeds. A seed fixes the initialization, the data order and every noise draw,
and both arms of a seed share all three: the plugin's window normalization and per-micro-batch normalization
(`diffusion_loss_normalization="microbatch"`, the release's own run, as Part 1's check shows) differ in the
loss's denominator alone. Each arm is measured on the held-out rows (heldout.HeldOut) every few steps; the
summary gives each arm's mean and 95 % interval over the seeds and the paired difference with its interval."""

import dataclasses
import math
import os
import statistics

from .heldout import NOISE_BINS, HeldOut
from .runs import MICROBATCH, WINDOW, Arm, Training, model_for, parameter_count, split, train

ARMS = (WINDOW, MICROBATCH)  # the default arms
NATIVE = "native"  # the window arm of a run on a natively fixed release (--native): Unsloth's own fix
# The lower-variance noise arms (docs/noise.md), window-normalized, each with the fields it sets. At batch 1 every
# arm draws one noise level per row, by the release's law (keyed for per-sample noise, from the global RNG for
# the window arm), so the window arm is their plain baseline; stratified levels need the keyed draws. TWICE is
# the window arm at twice the rows per step: the forward compute of a pair arm, whose every row runs twice.
STRATIFIED, COMPLEMENTARY, BOTH, TWICE = "stratified", "complementary", "both", "twice"
LOWER_VARIANCE = (STRATIFIED, COMPLEMENTARY, BOTH, TWICE)
CHOICES = ARMS + LOWER_VARIANCE
FLAGS = {
    STRATIFIED: {"diffusion_noise": "per_sample", "diffusion_t_sampler": "stratified"},
    COMPLEMENTARY: {"diffusion_complementary_masks": True},
    BOTH: {"diffusion_noise": "per_sample", "diffusion_t_sampler": "stratified", "diffusion_complementary_masks": True},
}
PAIRS = (COMPLEMENTARY, BOTH)  # two forwards per row: also compared with TWICE, at equal forward compute
NAMES = {  # the arms' labels
    WINDOW: "window (plugin)",
    MICROBATCH: "per-micro-batch",
    NATIVE: "Unsloth's fix",
    STRATIFIED: "stratified t",
    COMPLEMENTARY: "complementary pairs",
    BOTH: "stratified + pairs",
    TWICE: "window, 2× rows",
}


def _label(name):
    """An arm's label; on a natively fixed release the window arm is Unsloth's own fix."""
    from ... import activation, registry

    return "window (Unsloth's own)" if name == WINDOW and activation.status().mode == registry.NATIVE else NAMES[name]


LOGGED = ("step", "loss", "grad_norm", "learning_rate")  # of the trainer's log, per optimizer step
METRICS = ("objective", "bound")  # the held-out figures the verdict and the table are about (lower is better)
# Student's t, two-sided 95 %, by degrees of freedom (seeds - 1): the interval of a mean over a few seeds.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
T95.update({11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 19: 2.093, 23: 2.069, 24: 2.064, 29: 2.045})


@dataclasses.dataclass(frozen=True)
class Part2(Training):
    """Part 2's settings; the defaults are the documented run, QUICK2 the test's, GPU the CUDA preset."""

    seeds: tuple = (0, 1, 2, 3, 4, 5, 6, 7)
    batch: int = 1
    ga: int = 8
    steps: int = 150  # 150 steps of 8 rows over 1024: the run spans epochs and stops at max_steps, mid-epoch
    hidden: int = 128
    warmup_steps: int = 10
    eval_draws: int = 8
    eval_batch: int = 1  # the trainer's evaluate() normalizes as HeldOut's eval_loss does (one row per batch)
    every: int = 10  # measured every so many optimizer steps


QUICK2 = Part2(
    seeds=(0, 1), ga=2, steps=3, train_rows=16, held_rows=4, hidden=32, warmup_steps=1, eval_draws=2, every=1
)
# A CUDA machine: the GPU bench's architecture (hidden 2048, 16 layers, MLP 5632, 16 heads) at the docstring
# tokenizer's vocabulary, bf16 autocast, rows up to 256 tokens, 300 steps; docs/convergence.md.
GPU = Part2(
    seeds=(0, 1, 2, 3, 4),
    steps=300,
    max_length=256,
    hidden=2048,
    layers=16,
    intermediate=5632,
    heads=16,
    learning_rate=3e-4,
    warmup_steps=20,
    every=25,
    device="cuda",
    bf16=True,
)
GPU_QUICK = dataclasses.replace(QUICK2, device="cuda", bf16=True)  # the cuda tier's test of the preset


def part2(settings, workdir, progress=None, arms=ARMS):
    """{arm: [Arm per seed]}, the model's parameter count and the train rows (for impact)."""
    train_rows, held, tokenizer_folder = split(os.path.join(workdir, "data"), settings)
    found, size = {arm: [] for arm in arms}, None
    for seed in settings.seeds:
        checkpoint = model_for(os.path.join(workdir, "models"), tokenizer_folder, settings, seed)
        size = parameter_count(checkpoint)
        for name in arms:
            normalization = MICROBATCH if name == MICROBATCH else WINDOW
            ga = settings.ga * (2 if name == TWICE else 1)
            arm = Arm(_label(name), settings.batch, ga, normalization, seed, flags=FLAGS.get(name))
            if progress is not None:
                progress(f"seed {seed} {name}: training")
            train(
                arm,
                train_rows,
                held,
                checkpoint,
                settings,
                workdir,
                noise=None,
                evaluate=True,  # the trainer's own evaluate() under the fixed noise: HeldOut's eval_loss, checked
                record_params=False,
                held_out=HeldOut(settings.eval_draws),
                every=settings.every,
            )
            found[name].append(arm)
            if progress is not None:
                final = arm.measured[-1][1]
                progress(f"seed {seed} {name}: held-out objective {final['objective']:.4f}, {arm.seconds} s")
    return found, size, (train_rows, tokenizer_folder)


def native_arms(found, settings):
    """The window arm of `found` (a Part 2 JSON written on a natively fixed release) as Arms, refused unless it
    ran at these settings: the same seeds, data, model and schedule, so its seeds pair with this run's."""
    import json

    from ..console import Failure

    theirs, ours = found["part2"]["settings"], json.loads(json.dumps(dataclasses.asdict(settings)))
    if theirs != ours:
        differ = sorted(name for name in ours if theirs.get(name) != ours[name])
        raise Failure(f"--native: that run's Part 2 settings differ from this run's in {', '.join(differ)}")
    label = f"{NAMES[NATIVE]} ({found['unsloth']})"
    return [
        Arm(label, settings.batch, settings.ga, WINDOW, row["seed"], measured=row["measured"], log=row["log"])
        for row in found["part2"]["per_seed"][WINDOW]
    ]


def interval(values):
    """(mean, low, high, standard deviation) of a mean over seeds: Student's t at 95 %."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None, None, None
    sd = statistics.stdev(values)
    df = len(values) - 1
    t = T95.get(df) or T95[max(k for k in T95 if k <= df)]  # (a smaller df: a wider, safe interval)
    half = t * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half, sd


def _stats(values):
    return dict(zip(("mean", "low", "high", "sd"), interval(values)), per_seed=values)


def summary(found):
    """Per metric (and accuracy bin): each arm's interval over the seeds and the paired difference of every arm
    against the window (arm − window, seed by seed)."""
    metrics = {name: (lambda final, name=name: final[name]) for name in METRICS}
    for i, (lo, hi) in enumerate(zip(NOISE_BINS, NOISE_BINS[1:])):
        metrics[f"accuracy {lo:.1f}-{hi:.1f}"] = lambda final, i=i: final["accuracy"][i]
    out = {}
    for metric, read in metrics.items():
        row = {}
        for name, arms in found.items():
            values = [read(arm.measured[-1][1]) for arm in arms]
            if None in values:  # no masked token fell in that bin for some seed
                continue
            row[name] = _stats(values)
            if name != WINDOW and WINDOW in row:
                row[name]["difference"] = _stats([a - b for a, b in zip(values, row[WINDOW]["per_seed"])])
        for name in PAIRS:  # at equal forward compute: against the window arm at twice the rows
            if name in row and TWICE in row:
                twice = row[TWICE]["per_seed"]
                row[name]["equal_compute"] = _stats([a - b for a, b in zip(row[name]["per_seed"], twice)])
        out[metric] = row
    return out


def verdict(summed, labels, metric="objective"):
    """The verdict in plain words, for each arm against the window: the paired difference, whether its 95 %
    interval leaves out 0, and its size against the spread between seeds."""
    row, lines = summed[metric], []
    spread = row[WINDOW]["sd"]
    for name, found in row.items():
        for key, against, words in (
            ("difference", "window", ""),
            ("equal_compute", labels.get(TWICE), ", at equal forward compute"),
        ):
            d = found.get(key)
            if name == WINDOW or d is None or d["low"] is None:
                continue
            significant = d["low"] > 0 or d["high"] < 0
            size = abs(d["mean"]) / spread if spread else float("inf")
            lines.append(
                f"{labels[name]} − {against}{words}, held-out {metric}: {d['mean']:+.4f} (95 % interval "
                f"{d['low']:+.4f} to {d['high']:+.4f}, {len(d['per_seed'])} paired seeds): "
                + (
                    f"significant at 95 % ({'worse' if d['mean'] > 0 else 'better'} than the {against})"
                    if significant
                    else "not significant at 95 %"
                )
                + f"; {size:.2f} times the spread between seeds (SD {spread:.4f})"
            )
    return lines


def spread(summed, labels, metric="objective"):
    """The spread between seeds of every arm's held-out `metric` (its SD over seeds), in one line."""
    row = summed[metric]
    each = [f"{labels[name]} {found['sd']:.4f}" for name, found in row.items() if found["sd"] is not None]
    return f"spread between seeds (SD of the held-out {metric}): " + ", ".join(each) if each else None


def curves(found):
    """Per arm: the measured steps; per measured step the mean and 95 % interval over seeds of the held-out
    objective, and of the paired difference against the window; per logged step the mean training loss and
    gradient norm."""
    out = {}
    for name, arms in found.items():
        steps = [step for step, _ in arms[0].measured]

        def objective(arm, i):
            return arm.measured[i][1]["objective"]

        held = [interval([objective(arm, i) for arm in arms]) for i in range(len(steps))]
        out[name] = {
            "steps": steps,
            "objective": [[m, lo, hi] for m, lo, hi, _ in held],
            "train_loss": [statistics.fmean(arm.log[i]["loss"] for arm in arms) for i in range(len(arms[0].log))],
            "grad_norm": [statistics.fmean(arm.log[i]["grad_norm"] for arm in arms) for i in range(len(arms[0].log))],
        }
        if name != WINDOW and WINDOW in found:
            paired = [
                interval([objective(a, i) - objective(w, i) for a, w in zip(arms, found[WINDOW])])
                for i in range(len(steps))
            ]
            out[name]["difference"] = [[m, lo, hi] for m, lo, hi, _ in paired]
    return out


def report(found, size, settings):
    summed, labels = summary(found), {name: arms[0].label for name, arms in found.items()}
    return {
        "settings": dataclasses.asdict(settings),
        "parameters": size,
        "per_seed": {
            name: [
                {
                    "seed": arm.seed,
                    "seconds": arm.seconds,
                    "trainer_eval_loss": arm.held_out,  # evaluate() under the fixed noise: the check of HeldOut
                    "measured": arm.measured,
                    "log": [{key: entry.get(key) for key in LOGGED} for entry in arm.log],
                }
                for arm in arms
            ]
            for name, arms in found.items()
        },
        "labels": labels,
        "summary": summed,
        "curves": curves(found),
        "verdict": verdict(summed, labels),
        "native_vs_window": _largest_difference(found, NATIVE) if NATIVE in found else None,
    }


def _largest_difference(found, name):
    """The largest |held-out objective of `name` − the window's| at any measured step of any seed."""
    return max(
        abs(a[1]["objective"] - w[1]["objective"])
        for arm, window in zip(found[name], found[WINDOW])
        for a, w in zip(arm.measured, window.measured)
    )


def impact_beside(train_rows, tokenizer_folder, settings, workdir, seed):
    """`impact` on the same train rows and settings (batch, GA, max_length, the first seed, eps, CPU draws):
    its share of loss weight moved per step and its verdict, to stand beside the measured difference."""
    from .. import impact

    data = os.path.join(workdir, "train.jsonl")
    train_rows.to_json(data)
    found = impact.run(
        data,
        tokenizer_folder,
        impact.Settings(
            per_device_train_batch_size=settings.batch,
            gradient_accumulation_steps=settings.ga,
            max_length=settings.max_length,
            seed=seed,
        ),
        device="cpu",
    )
    return {"share": found.share, "low": found.low, "high": found.high, "verdict": found.verdict()}


def render(part):
    """Part 2's table: per held-out metric, each arm's mean [95 % interval] over seeds, the paired difference
    against the window, and the spread between seeds; then the verdict and impact's share beside it."""
    from ...proof import tables

    def cell(found, digits=4):
        if found is None:
            return "—"
        if found["low"] is None:
            return f"{found['mean']:.{digits}f}"
        return f"{found['mean']:.{digits}f} [{found['low']:.{digits}f}, {found['high']:.{digits}f}]"

    names, labels = list(part["per_seed"]), part["labels"]
    header = ["held-out, final step"] + [f"{labels[n]}: mean [95 %]" for n in names]
    header += [f"{labels[n]} − window [95 %]" for n in names if n != WINDOW] + ["seed SD (window)"]
    body = []
    for metric, row in part["summary"].items():
        cells = [metric] + [cell(row.get(n)) for n in names]
        cells += [cell(row[n]["difference"] if n in row else None) for n in names if n != WINDOW]
        cells.append(f"{row[WINDOW]['sd']:.4f}" if WINDOW in row and row[WINDOW]["sd"] is not None else "—")
        body.append(cells)
    lines = tables.markdown(header, body) + [""] + [f"verdict: {line}" for line in part["verdict"]]
    spread_line = spread(part["summary"], labels)
    if spread_line is not None:
        lines.append(spread_line)
    if part.get("native_vs_window") is not None:
        lines.append(
            f"{labels[NATIVE]} against the window, held-out objective at every measured step of every seed: "
            f"largest |difference| {part['native_vs_window']:.3g}"
        )
    if part.get("impact"):
        i = part["impact"]
        lines.append(
            f"impact on the same rows and settings: {100 * i['share']:.2f} % of each step's loss weight moved "
            f"(95 % CI {100 * i['low']:.2f} - {100 * i['high']:.2f} %)"
        )
    return "\n".join(lines)


def _band(axis, steps, rows, label, color=None):
    (line,) = axis.plot(steps, [m for m, _, _ in rows], label=label, color=color)
    if all(lo is not None for _, lo, _ in rows):
        axis.fill_between(
            steps, [lo for _, lo, _ in rows], [hi for _, _, hi in rows], color=line.get_color(), alpha=0.2
        )
    return line.get_color()


def draw(part, axes):
    """Four panels: the held-out objective against step with 95 % bands over seeds, the paired difference
    against the window with its band, and the training loss and gradient norm (means over seeds) per arm."""
    for name, found in part["curves"].items():
        label = part["labels"][name]
        color = _band(axes[0], found["steps"], found["objective"], label)
        if "difference" in found:
            _band(axes[1], found["steps"], found["difference"], f"{label} − window", color)
        logged = range(1, len(found["train_loss"]) + 1)
        axes[2].plot(logged, found["train_loss"], color=color, lw=0.8, label=label)
        axes[3].plot(logged, found["grad_norm"], color=color, lw=0.8, label=label)
    axes[1].axhline(0.0, color="grey", lw=0.6)
    titles = (
        ("held-out objective (Σ CE/p ÷ Σ masked)", "Part 2: held-out objective, 95 % band over seeds"),
        ("paired difference in the objective", "Part 2: paired difference, 95 % band"),
        ("logged training loss", "Training loss (each arm's own normalization)"),
        ("gradient norm before clipping", "Gradient norm"),
    )
    for axis, (ylabel, title) in zip(axes, titles):
        axis.set_xlabel("optimizer step")
        axis.set_ylabel(ylabel, fontsize=8)
        axis.set_title(title, fontsize=9)
        axis.legend(fontsize=7)


def describe(settings):
    """Part 2's settings in one line."""
    return (
        f"Part 2: {len(settings.seeds)} paired seeds ({', '.join(map(str, settings.seeds))}), batch {settings.batch} at GA "
        f"{settings.ga}, global noise, {settings.steps} AdamW steps over {settings.train_rows} rows (lr "
        f"{settings.learning_rate:g}, warm-up {settings.warmup_steps} then cosine, clipping 1.0), rows up to "
        f"{settings.max_length} tokens, hidden {settings.hidden}, {settings.layers} layers, "
        f"{'bf16 on ' + settings.device if settings.bf16 else 'fp32 on ' + settings.device}; held-out: "
        f"{settings.held_rows} rows, {settings.eval_draws} keyed draws each, every {settings.every} steps"
    )

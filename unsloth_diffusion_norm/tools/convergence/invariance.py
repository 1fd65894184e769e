"""Part 1, accumulation invariance: batch B·k at GA 1 is the reference; batch B at GA k must train the same model.

The layout makes both see the same tokens and the same masks: per-sample noise (each example keyed by its place
in the data order, which does not depend on how a window is cut), every row padded to max_length (the EOS tail
does not depend on the batch), the same seeded order of examples. Then window normalization gives the
reference's gradient up to float round-off at every step, and per-micro-batch normalization does not.
"""

import dataclasses
import os

from .runs import MICROBATCH, SPLIT_SEED, WINDOW, Arm, Training, model_for, split, train

FLOOR = "floor"  # the window at another cut (batch B/2, GA 2k): how far float round-off alone moves a run


@dataclasses.dataclass(frozen=True)
class Part1(Training):
    """Part 1's settings; the defaults are the documented run, QUICK the test's."""

    ks: tuple = (2, 4, 8)
    batch: int = 2  # B: rows per micro-batch of the accumulated arms
    seed: int = SPLIT_SEED  # the model's initialization and the trainer's seed
    floor: bool = True  # also the window at batch B/2, GA 2k (B even)
    padded: bool = True  # the same EOS tail whatever rows share a batch


QUICK = Part1(ks=(2, 4), steps=4, train_rows=64, held_rows=8, max_length=32, hidden=32, eval_draws=1, floor=False)


def distances(arm, reference):
    """Per step: ||θ_arm − θ_ref|| / ||θ_ref − θ_0||, the distance to the reference relative to how far the
    reference has moved; None where it has not moved yet (the warm-up's first step has learning rate 0)."""
    origin = reference.params[0]
    found = []
    for a, r in zip(arm.params[1:], reference.params[1:]):
        moved = (r - origin).norm().item()
        found.append((a - r).norm().item() / moved if moved > 0 else None)
    return found


def _worst(values):
    return max(v for v in values if v is not None)


def part1(settings, workdir, progress=None):
    """{k: {"reference": Arm, "window": Arm, "microbatch": Arm}} and the release check (microbatch flag vs the
    unpatched release, global noise: their largest parameter difference)."""
    train_rows, held, tokenizer_folder = split(os.path.join(workdir, "data"), settings)
    data = (train_rows, held, model_for(workdir, tokenizer_folder, settings, settings.seed))
    floor = settings.floor and settings.batch % 2 == 0
    found = {}
    for k in settings.ks:
        arms = {
            "reference": Arm(f"batch {settings.batch * k}, GA 1", settings.batch * k, 1, WINDOW, settings.seed),
            # Another cut of the same window, batch B/2 at GA 2k: the same arithmetic, other summation orders.
            FLOOR: Arm(
                f"batch {settings.batch // 2}, GA {2 * k}, window", settings.batch // 2, 2 * k, WINDOW, settings.seed
            ),
            WINDOW: Arm(f"batch {settings.batch}, GA {k}, window (plugin)", settings.batch, k, WINDOW, settings.seed),
            MICROBATCH: Arm(
                f"batch {settings.batch}, GA {k}, per-micro-batch", settings.batch, k, MICROBATCH, settings.seed
            ),
        }
        if not floor:
            del arms[FLOOR]
        for name, arm in arms.items():
            train(arm, *data, settings, workdir)
            if progress is not None:
                progress(f"k={k} {name}: {arm.seconds} s")
        found[k] = arms
    return found, release_check(data, settings, workdir)


def release_check(data, settings, workdir):
    """The 'microbatch' flag against the unpatched release itself (global noise: the release has no per-sample
    noise), batch B at GA 2 for the run's steps: their largest parameter difference (0: the same run)."""
    import unsloth_diffusion_norm

    from ...registry import PATCHED

    if unsloth_diffusion_norm.status().mode != PATCHED:
        return None  # a natively fixed release has no per-micro-batch path of its own to compare with
    flagged = train(
        Arm("flag", settings.batch, 2, MICROBATCH, settings.seed), *data, settings, workdir, noise=None, evaluate=False
    )
    with unsloth_diffusion_norm.unpatched():
        own = train(
            Arm("unpatched", settings.batch, 2, WINDOW, settings.seed),
            *data,
            settings,
            workdir,
            noise=None,
            evaluate=False,
        )
    return max((a - b).abs().max().item() for a, b in zip(flagged.params, own.params))


def report(found, check):
    """The JSON of Part 1: per k, the distance to the reference after every step, and the held-out losses."""
    rows = {}
    for k, arms in found.items():
        reference = arms["reference"]
        rows[k] = {
            "reference_held_out": reference.held_out,
            **{
                name: {
                    "distance_per_step": distances(arms[name], reference),
                    "held_out": arms[name].held_out,
                    "seconds": arms[name].seconds,
                }
                for name in (WINDOW, MICROBATCH, FLOOR)
                if name in arms
            },
        }
    return {"part1": rows, "microbatch_flag_vs_unpatched": check}


def render(result):
    """Part 1's table: per k, the largest and the last relative distance to the reference of the window arm,
    of the per-micro-batch arm and of the round-off floor (the window at batch B/2, GA 2k), and the held-out losses."""
    from ...proof import tables

    header = ["k", "window: max / last", "per-micro-batch: max / last", "window at B/2, GA 2k: max / last"]
    header += ["held-out: reference", "window", "per-micro-batch"]
    body = []
    for k, row in result["part1"].items():
        cells = [str(k)]
        for name in (WINDOW, MICROBATCH, FLOOR):
            found = row[name]["distance_per_step"] if name in row else None
            cells.append(f"{_worst(found):.2e} / {found[-1]:.2e}" if found else "—")
        cells += [
            f"{row['reference_held_out']:.4f}",
            f"{row[WINDOW]['held_out']:.4f}",
            f"{row[MICROBATCH]['held_out']:.4f}",
        ]
        body.append(cells)
    lines = tables.markdown(header, body)
    check = result["microbatch_flag_vs_unpatched"]
    if check is not None:
        lines += ["", f"'microbatch' flag vs the unpatched release (global noise, GA 2): max |Δθ| = {check:.3g}"]
    return "\n".join(lines)


def draw(result, axes):
    """Distance to the reference against step for each k and arm, on a log scale, into `axes`."""
    for k, row in result["part1"].items():
        for name, style in ((WINDOW, "-"), (MICROBATCH, "--"), (FLOOR, ":")):
            if name not in row:
                continue
            steps = [(i + 1, v) for i, v in enumerate(row[name]["distance_per_step"]) if v is not None]
            axes.plot([s for s, _ in steps], [v for _, v in steps], style, label=f"k={k}, {name}")
    axes.set_yscale("log")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("‖θ − θ_ref‖ / ‖θ_ref − θ₀‖")
    axes.set_title("Part 1: distance to batch B·k at GA 1, batch B at GA k", fontsize=9)
    axes.legend(fontsize=7, ncol=2)


def within(result, bound=1e-5):
    """Part 1's verdict: every window arm within `bound` of its reference at every step, and every
    per-micro-batch arm beyond it somewhere."""
    rows = result["part1"].values()
    return all(_worst(r[WINDOW]["distance_per_step"]) <= bound for r in rows) and all(
        _worst(r[MICROBATCH]["distance_per_step"]) > bound for r in rows
    )


def describe(settings):
    """Part 1's settings in one line."""
    return (
        f"Part 1: batch {settings.batch}·k at GA 1 against batch {settings.batch} at GA k, k in "
        f"{', '.join(map(str, settings.ks))}, {settings.steps} AdamW steps (lr {settings.learning_rate:g}, warm-up "
        f"{settings.warmup_steps} then cosine, clipping 1.0), per-sample noise, rows padded to {settings.max_length}, "
        f"seed {settings.seed}; held-out: {settings.held_rows} rows, fixed eval noise, {settings.eval_draws} "
        f"draw{'s' if settings.eval_draws > 1 else ''} each"
    )

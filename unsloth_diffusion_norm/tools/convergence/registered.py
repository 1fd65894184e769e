"""The registered accuracy study (docs/convergence.md, "Registered study"): does the window make the model learn
Part 3's reversal task sooner than per-micro-batch normalization, at batch 1 x GA 8 (H1) and at batch 4 x GA 2
(H2), where less loss weight moves? Registered before it ran: the hypotheses, endpoints, tests, level, seeds,
settings and stopping rule are the constants below and the page's registration; `analysis` tests only at the
registered seed count and reports fewer seeds as progress, with no test.

A unit of work is one arm at one layout for one seed (`task.train_arm`, the real DiffusionTrainer); a chunk adds
whole seeds (every arm at every layout) to a results file, in worker processes side by side, until the next seed
would pass its minutes; the file is written after each seed, so a chunk cut short keeps every seed it finished."""

import dataclasses
import json
import math
import os
import time

from . import task
from .runs import MICROBATCH, WINDOW

LAYOUTS = {"H1": (1, 8), "H2": (4, 2)}  # (batch, GA): 8 rows a step either way
ARMS = (WINDOW, MICROBATCH)
SEEDS = 24  # per arm and layout: the pilot's spread asked 18-20 for the steps to 50 %
LEVEL = 0.05  # two-sided, per hypothesis, after Holm's adjustment over H1 and H2
SETTINGS = task.Part3(seeds=tuple(range(SEEDS)))  # Part 3's: 1,200 steps, measured every 50, hidden 64
GPU = dataclasses.replace(task.GPU3, seeds=tuple(range(SEEDS)))  # the larger model, bf16, measured every 100


def replication(settings, first):
    """The same study on SEEDS fresh seeds from `first` on (past the registered 0-23): how a reader checks the
    verdict on another machine, where the registered runs' digests need not reproduce."""
    return dataclasses.replace(settings, seeds=tuple(range(first, first + SEEDS)))


def _first_seed(found):
    return (found["settings"].get("seeds") or [0])[0]


def unit(name, layout):
    return f"{name} {layout[0]}x{layout[1]}"


UNITS = [(unit(name, layout), name, layout) for layout in LAYOUTS.values() for name in ARMS]


# ---- growing the results file ----------------------------------------------------------------------------------


def _complete(runs):
    """The seeds every unit has run, in order."""
    held = [{run["seed"] for run in runs.get(key, [])} for key, _, _ in UNITS]
    return sorted(set.intersection(*held))


def _impact(settings, workdir):
    """`impact` on the study's training rows at each layout (seed 0's draws): the share of loss weight that
    per-micro-batch normalization moves, the dose each hypothesis tests."""
    from .. import impact

    data = os.path.join(workdir, "task-train.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in task.rows(task.sequences(1, settings.train_rows, held=False)))
    tokenizer = task.checkpoint(workdir, settings, 0)
    out = {}
    for hypothesis, (batch, ga) in LAYOUTS.items():
        found = impact.run(
            data,
            tokenizer,
            impact.Settings(
                per_device_train_batch_size=batch,
                gradient_accumulation_steps=ga,
                max_length=settings.max_length,
                seed=0,
                pad_to_multiple_of=settings.pad_multiple,
            ),
            device=settings.device,
        )
        out[hypothesis] = {"share": found.share, "low": found.low, "high": found.high}
    return out


def grow(path, settings, workdir, minutes, say=print, workers=1, device="CPU", commit=None):
    """A chunk: the next whole seeds the results file at `path` lacks, one at least, up to the registered count,
    until the next would pass `minutes` (judged by the longest seed so far); `workers` processes of one thread
    each train a seed's units side by side (`task.trainers`). Returns the file's JSON."""
    from ..console import Failure, write_json

    ours = json.loads(json.dumps(dataclasses.asdict(settings)))
    if os.path.exists(path):
        with open(path) as f:
            found = json.load(f)
        if found.get("settings") != ours:
            raise Failure(f"--add-to: {path} holds the study at other settings; give another file")
    else:
        found = {"study": "registered", "settings": ours, "runs": {key: [] for key, _, _ in UNITS}, "chunks": []}
    if "impact" not in found:
        say("impact at each layout")
        found["impact"] = _impact(settings, workdir)
    chunk = {"device": device, "commit": commit, "date": time.strftime("%Y-%m-%d", time.gmtime()), "seeds": []}
    found["chunks"].append(chunk)
    started = time.time()
    longest = max((c.get("longest", 0) for c in found["chunks"]), default=0)
    with task.trainers(workers) as train:
        while len(_complete(found["runs"])) < SEEDS:
            if chunk["seeds"] and time.time() - started + longest > 60 * minutes:
                break
            seed = next(s for s in settings.seeds if s not in _complete(found["runs"]))
            began, todo = time.time(), [(k, n, lay) for k, n, lay in UNITS if seed not in _seeds(found, k)]
            jobs = [(dataclasses.replace(settings, batch=b, ga=g), seed, n, workdir) for _, n, (b, g) in todo]
            for (key, _, _), run in zip(todo, train(jobs)):
                found["runs"][key].append(run)
            longest = max(longest, time.time() - began)
            chunk.update(seeds=chunk["seeds"] + [seed], seconds=round(time.time() - started, 1))
            chunk["longest"] = round(longest, 1)
            write_json(found, path)
            say(f"seed {seed}: " + ", ".join(f"{k} {_steps_text(found['runs'][k][-1])}" for k, _, _ in todo))
    if not chunk["seeds"]:
        found["chunks"].pop()
    return found


def _seeds(found, key):
    return {run["seed"] for run in found["runs"][key]}


def _steps_text(run):
    steps = task.steps_to_learn(run)
    return "never" if steps is None else str(steps)


# ---- the registered analysis -------------------------------------------------------------------------------------


def censored(run, settings):
    """The primary endpoint of a run: its first measured step at 50 % exact match on the held-out items; a run
    that never got there counts as later than the last step (steps + every)."""
    steps = task.steps_to_learn(run)
    return settings["steps"] + settings["every"] if steps is None else steps


def sign_test(ours, theirs):
    """The exact two-sided sign test over paired seeds, ties set aside: (ours earlier, ours later, ties, p)."""
    earlier = sum(a < b for a, b in zip(ours, theirs))
    later = sum(a > b for a, b in zip(ours, theirs))
    return earlier, later, len(ours) - earlier - later, _two_sided(earlier, later)


def _tail(n, k):
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def _two_sided(a, b):
    """The exact two-sided binomial p of a split a : b at 1/2 (1 when there is nothing to split)."""
    return min(1.0, 2 * _tail(a + b, min(a, b))) if a + b else 1.0


def median_interval(differences, level=LEVEL):
    """The median of paired differences and its distribution-free interval (order statistics: the interval the
    sign test inverts), at least 1 - level."""
    d, n = sorted(differences), len(differences)
    median = (d[(n - 1) // 2] + d[n // 2]) / 2
    k = 0  # the largest k with P(Binomial(n, 1/2) < k) <= level / 2
    while _tail(n, k) <= level / 2:
        k += 1
    return median, (d[k - 1], d[n - k]) if k else (None, None)


def holm(ps):
    """Holm's step-down adjusted p-values, in the order given."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def mcnemar(ours, theirs):
    """The exact McNemar test of the share of seeds that learned: (ours only, theirs only, p)."""
    only_ours = sum(a and not b for a, b in zip(ours, theirs))
    only_theirs = sum(b and not a for a, b in zip(ours, theirs))
    return only_ours, only_theirs, _two_sided(only_ours, only_theirs)


def area(run):
    """The area under a run's learning curve: its exact match averaged over the steps (trapezoids), 0 to 1."""
    points = [(step, found["accuracy"]) for step, found in run["measured"]]
    total = sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(points, points[1:]))
    return total / (points[-1][0] - points[0][0])


def _difference(values):
    from .seeds import interval

    mean, low, high, _ = interval(values)
    return {"mean": mean, "low": low, "high": high}


def power(n=SEEDS, share=0.8, level=LEVEL):
    """The sign test's power over n decided pairs where the window learns first with probability `share`."""
    k = -1  # the rejection region: at most k, or at least n - k, of n (none: -1)
    while 2 * _tail(n, k + 1) <= level:
        k += 1
    hit = lambda i: math.comb(n, i) * share**i * (1 - share) ** (n - i)  # noqa: E731
    return sum(hit(i) for i in range(n + 1) if i <= k or i >= n - k)


def analysis(found):
    """Per hypothesis: the primary endpoint (steps to 50 %, censored) with the sign test, Holm-adjusted over the
    hypotheses, and the median paired difference; the secondary endpoints (final exact match, the seeds that
    learned, the area under the learning curve) as paired differences; the moved weight share beside them. The
    tests only at the registered seed count (`registered`); fewer seeds are progress."""
    settings, seeds = found["settings"], _complete(found["runs"])
    registered = len(seeds) >= SEEDS
    seeds = seeds[:SEEDS]
    out = {"seeds": len(seeds), "registered": registered, "first_seed": _first_seed(found), "hypotheses": {}}
    for hypothesis, layout in LAYOUTS.items():
        by = {name: {r["seed"]: r for r in found["runs"][unit(name, layout)]} for name in ARMS}
        ours, theirs = ([by[name][s] for s in seeds] for name in ARMS)
        if not seeds:
            continue
        a, b = [censored(r, settings) for r in ours], [censored(r, settings) for r in theirs]
        earlier, later, ties, p = sign_test(a, b)
        median, (low, high) = median_interval([x - y for x, y in zip(a, b)])
        learned = [[task.steps_to_learn(r) is not None for r in rows] for rows in (ours, theirs)]
        only_ours, only_theirs, p_learned = mcnemar(*learned)
        out["hypotheses"][hypothesis] = {
            "layout": f"{layout[0]}x{layout[1]}",
            "steps": {"window": a, "microbatch": b},
            "primary": {"earlier": earlier, "later": later, "ties": ties, "p": p},
            "median_difference": {"mean": median, "low": low, "high": high},
            "final": _difference(
                [task._final(x, "accuracy") - task._final(y, "accuracy") for x, y in zip(ours, theirs)]
            ),
            "palindromes": _difference(
                [task._final(x, "palindromes") - task._final(y, "palindromes") for x, y in zip(ours, theirs)]
            ),
            "learned": {"window": sum(learned[0]), "microbatch": sum(learned[1]), "p": p_learned},
            "area": _difference([area(x) - area(y) for x, y in zip(ours, theirs)]),
            "moved": found.get("impact", {}).get(hypothesis),
        }
    names = list(out["hypotheses"])
    for name, adjusted in zip(names, holm([out["hypotheses"][n]["primary"]["p"] for n in names])):
        primary = out["hypotheses"][name]["primary"]
        primary["p_holm"] = adjusted
        primary["significant"] = registered and adjusted < LEVEL
    return out


def verdict(hypothesis, found):
    """The registered answer in plain words."""
    primary, batch, ga = found["primary"], *found["layout"].split("x")
    where = f"At batch {batch} x GA {ga}"
    if primary["significant"]:
        faster = "sooner" if primary["earlier"] > primary["later"] else "later"
        return f"{where} ({hypothesis}), the window learns the task {faster} than per-micro-batch normalization."
    return (
        f"{where} ({hypothesis}), {SEEDS} seeds find no difference in when the model learns the task: the window "
        f"learned first in {primary['earlier']} seeds, later in {primary['later']}, tied in {primary['ties']}."
    )


def band(d, scale=100.0, digits=1):
    """A paired difference as a table shows it: the mean, and its interval where it has one (x scale, signed)."""
    if d["low"] is None:
        return f"{scale * d['mean']:+.{digits}f}"
    return f"{scale * d['mean']:+.{digits}f} [{scale * d['low']:+.{digits}f}, {scale * d['high']:+.{digits}f}]"


def render(found):
    """The registered table (or the progress table, with no test, below the registered seed count)."""
    from ...proof import tables

    result = analysis(found)
    seeds, registered, first = result["seeds"], result["registered"], result["first_seed"]

    header = [
        "hypothesis",
        "window first / later / tied",
        "median difference, steps [95 %]",
        "sign test p (Holm)",
        "final exact match, points [95 %]",
        "seeds that learned (window / per-micro-batch)",
        "area under the curve, points [95 %]",
        "moved weight share",
    ]
    body = []
    for hypothesis, h in result["hypotheses"].items():
        p = h["primary"]
        moved = h["moved"]
        body.append(
            [
                f"{hypothesis}: batch {h['layout'].replace('x', ' x GA ')}",
                f"{p['earlier']} / {p['later']} / {p['ties']}",
                band(h["median_difference"], 1, 0),
                f"{p['p']:.3g} ({p['p_holm']:.3g})" if registered else "(at the registered seeds only)",
                band(h["final"]),
                f"{h['learned']['window']} / {h['learned']['microbatch']} (p {h['learned']['p']:.3g})",
                band(h["area"]),
                "–" if moved is None else f"{100 * moved['share']:.1f} %",
            ]
        )
    study = f"Replication on fresh seeds {first}–{first + SEEDS - 1}" if first else "Registered study"
    title = (
        f"{study}: {seeds} seeds of every arm and layout (window − per-micro-batch)"
        if registered
        else f"{study}, progress: {seeds} of {SEEDS} seeds (no test until all have run)"
    )
    lines = [title, ""] + tables.markdown(header, body)
    if registered:
        lines += [""] + [verdict(name, h) for name, h in result["hypotheses"].items()]
    return "\n".join(lines)


def plan():
    """The registered design as the page states it, with the sign test's power."""
    shares = (0.7, 0.75, 0.8, 0.875)
    return "\n".join(
        [
            f"arms: {', '.join(ARMS)}; layouts: "
            + "; ".join(f"{h} batch {b} x GA {g}" for h, (b, g) in LAYOUTS.items()),
            f"seeds: 0-{SEEDS - 1} per arm and layout; {SETTINGS.steps} steps, measured every {SETTINGS.every}; "
            f"held-out: {SETTINGS.held_rows} distinct non-palindromic items",
            f"test: exact two-sided sign test at {LEVEL}, Holm over {', '.join(LAYOUTS)}",
            "power at n = 24 decided seeds (unadjusted level), by the share of seeds where the window learns first: "
            + ", ".join(f"{share}: {power(SEEDS, share):.2f}" for share in shares),
        ]
    )

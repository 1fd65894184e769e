"""A convergence run's figures as records of the results store (records/NAME.json, `records.write`): the summary
figures the report prints (means, 95 % intervals, standard deviations, paired differences, seed counts, seconds)
and its tables, never the per-step curves (the run's JSON keeps those).

One record per part a run holds: a run of one part writes NAME, a run of several writes NAME-part1, NAME-part2
(and NAME-part3). The default NAME is the --json file's name without '.json' (docs/convergence.json:
convergence-part1 and convergence-part2; docs/convergence-task.json: convergence-task).

Names read as what they are: `arms.ARM.objective.mean`; a paired difference is named by its sign,
`paired.microbatch_minus_window.objective.mean` (Part 2: arm − window) and
`paired.window_minus_microbatch.exact_match.mean` (Part 3: window − arm, as its report prints it); Part 3's
equal-compute difference is the window at twice the rows minus the pairs: `paired.twice_minus_pairs`.
"""

import os
import re
import sys

from .runs import WINDOW

# The covered code: the study's own, and the core it trains through.
COVERS = {
    "the core": ["unsloth_diffusion_norm/*.py"],
    "the convergence study": ["unsloth_diffusion_norm/tools/convergence/**"],
}


def key(text):
    """A label as a dotted key's part: 'accuracy 0.0-0.2' is 'accuracy_0-0_2' (a dot would split the key)."""
    return re.sub(r"[^\w-]+", "_", text.replace(".", "_")).strip("_")


def _stat(found):
    """mean, low, high, sd (and the seeds counted) of an interval; the per-seed lists stay in the run's JSON."""
    out = {name: found.get(name) for name in ("mean", "low", "high", "sd")}
    if "per_seed" in found:
        out["seeds"] = len(found["per_seed"])
    elif "seeds" in found:
        out["seeds"] = found["seeds"]
    return out


def part1(result):
    """Part 1: per k, each arm's largest and last relative distance to the reference and the held-out losses."""
    out = {"ks": {}}
    for k, row in result["part1"].items():
        entry = {"reference_held_out": row["reference_held_out"]}
        for name in ("window", "microbatch", "floor"):
            if name not in row:
                continue
            distances = [d for d in row[name]["distance_per_step"] if d is not None]
            entry[name] = {
                "max_distance": max(distances) if distances else None,
                "last_distance": distances[-1] if distances else None,
                "held_out": row[name]["held_out"],
                "seconds": row[name]["seconds"],
            }
        out["ks"][f"k{k}"] = entry
    out["microbatch_flag_vs_unpatched"] = result.get("microbatch_flag_vs_unpatched")
    out["holds"] = result.get("holds")
    settings = result.get("settings") or {}
    out["settings"] = {name: settings.get(name) for name in ("steps", "batch", "seed", "hidden", "layers")}
    return out


def part2(part):
    """Part 2: each arm's held-out metrics (mean, interval, sd over seeds), the paired differences (arm − window,
    and a pair arm − the window at twice the rows: equal forward compute), the seeds, seconds, impact's share."""
    labels = part["labels"]
    arms, paired = {}, {}
    for metric, row in part["summary"].items():
        for name, found in row.items():
            arms.setdefault(name, {"label": labels.get(name, name)})[key(metric)] = _stat(found)
            if "difference" in found:
                paired.setdefault(f"{name}_minus_window", {})[key(metric)] = _stat(found["difference"])
            if "equal_compute" in found:
                paired.setdefault(f"{name}_minus_twice", {})[key(metric)] = _stat(found["equal_compute"])
    for name, runs in part["per_seed"].items():
        seconds = [run["seconds"] for run in runs if run.get("seconds") is not None]
        arms[name]["seeds"] = len(runs)
        arms[name]["seconds"] = sum(seconds) if seconds else None
        arms[name]["seconds_mean"] = sum(seconds) / len(seconds) if seconds else None
        arms[name]["trainer_eval_loss_mean"] = _mean([run.get("trainer_eval_loss") for run in runs])
    settings = part["settings"]
    out = {
        "seeds": len(settings["seeds"]),
        "settings": {name: settings.get(name) for name in ("steps", "batch", "ga", "hidden", "layers", "train_rows")},
        "parameters": part["parameters"],
        "arms": arms,
        "paired": paired,
        "native_vs_window": part.get("native_vs_window"),
    }
    if part.get("impact"):
        out["impact"] = {name: part["impact"][name] for name in ("share", "low", "high")}
    return out


def _mean(values):
    found = [v for v in values if v is not None]
    return sum(found) / len(found) if found else None


def part3(part):
    """Part 3: each arm's exact match (mean, interval, sd, per seed, by answer length), held-out objective, steps
    to learn and seconds; the paired differences as the report prints them (window − arm; the window at twice
    the rows − the pairs at equal forward compute); Unsloth's own fix against the window; the baselines."""
    arms = {}
    for name, arm in part["arms"].items():
        accuracy, objective = arm["accuracy"], arm["objective"]
        arms[name] = {
            "label": arm["label"],
            "exact_match_mean": accuracy["mean"],
            "exact_match_low": accuracy["low"],
            "exact_match_high": accuracy["high"],
            "exact_match_sd": accuracy["sd"],
            "exact_match_per_seed": arm["per_seed"],
            "exact_match_by_length": {key(b): v for b, v in zip(part["bins"], arm["by_length"])},
            "objective": _stat(objective),
            "steps_to_learn": arm["steps_to_learn"],
            "learned_seeds": sum(s is not None for s in arm["steps_to_learn"]),
            "seconds": arm["seconds"],
        }
    paired = {}
    for name, found in part["paired"].items():
        # task.report names each difference by its sign (a_minus_b); a file written before it did: window − arm,
        # and equal_compute, the window at twice the rows − the pairs
        label = {"equal_compute": "twice_minus_pairs", "twice_minus_complementary": "twice_minus_pairs"}.get(name)
        label = label or (name if "_minus_" in name else f"window_minus_{name}")
        paired[label] = {"exact_match": _stat(found["accuracy"]), "objective": _stat(found["objective"])}
        if "steps" in found:
            paired[label]["steps_to_learn"] = _stat(found["steps"])
    settings = part["settings"]
    out = {
        "seeds": len(part["seeds"]),
        "settings": {name: settings.get(name) for name in ("steps", "batch", "ga", "hidden", "layers", "train_rows")},
        "arms": arms,
        "paired": paired,
        "baselines": {key(name): value for name, value in part["baselines"].items()},
    }
    if part.get("native"):
        out["native"] = dict(part["native"])
    return out


def _tuples(settings):
    """A result file's settings as the parts' dataclasses take them (JSON's lists back to tuples)."""
    return {name: tuple(value) if isinstance(value, list) else value for name, value in settings.items()}


def tables(result):
    """The report's tables of each part, as the run prints them (render_all's pieces)."""
    from . import seeds, task
    from .invariance import Part1, describe, render
    from .seeds import Part2

    out = {}
    if "part1" in result:
        out["part1"] = {"report": describe(Part1(**_tuples(result["settings"]))) + "\n\n" + render(result)}
    if "part2" in result:
        part = result["part2"]
        out["part2"] = {
            "report": seeds.describe(Part2(**_tuples(part["settings"])))
            + f"; {part['parameters']:,} parameters\n\n"
            + seeds.render(part),
        }
        out["part2"]["summary"] = "\n".join(line for line in seeds.render(part).splitlines() if line.startswith("|"))
    if "part3" in result:
        part = result["part3"]
        rendered = task.render(part)
        out["part3"] = {
            "report": task.describe(task.Part3(**_tuples(part["settings"]))) + "\n\n" + rendered,
            "arms": _first_table(rendered),
        }
    return out


def _first_table(text):
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def records_of(result, name):
    """[(record name, figures, tables)] of a run's JSON: one per part it holds."""
    parts = [p for p in ("part1", "part2", "part3") if p in result]
    tables_ = tables(result)
    common = {key_: result.get(key_) for key_ in ("mode", "unsloth", "seconds") if key_ in result}
    common["run_seconds"] = common.pop("seconds", None)
    out = []
    for p in parts:
        figures = {
            **common,
            **{"part1": part1, "part2": part2, "part3": part3}[p](result if p == "part1" else result[p]),
        }
        out.append((name if len(parts) == 1 else f"{name}-{p}", figures, tables_[p]))
    return out


def default_name(path):
    """A run's record name from its --json file: 'docs/convergence-task.json' is 'convergence-task'."""
    return os.path.splitext(os.path.basename(path))[0]


def write(result, name, command, **where):
    """Write the records of a run's JSON; their names. `where`: records.write's commit/date/where/found/source."""
    from .. import records

    written = []
    for record_name, figures, tables_ in records_of(result, name):
        records.write(record_name, command, figures, covers=COVERS, tables=tables_, **where)
        written.append(record_name)
    return written


__all__ = ["WINDOW", "default_name", "key", "records_of", "tables", "write"]


def write_registered(found, path, name, command, study=None):
    """A registered study's record (`study`: its module, by default the accuracy study's, `registered`): its
    analysis (at the registered seed count, its tests) and its table."""
    from .. import records
    from . import registered

    study = study or registered
    name = default_name(path) if name is None else name
    if name:
        records.write(name, command, study.analysis(found), covers=COVERS, tables={"report": study.render(found)})
        print(f"records: records/{name}.json", file=sys.stderr)

"""`unsloth-diffusion-norm bench`'s report: a run's table, noise note and plot, the GPU bench's table of parts, and
a run's figures as a record (records/NAME.json, `records.write`: `figures` and `steps_table` for the CPU bench,
`gpu_check_figures` for the files scripts/gpu_check.sh wrote). Reads only what `bench.run` returns."""

import re

from ..proof import tables
from .console import pyplot

QUICK_LABEL = (
    "quick smoke run ({blocks} blocks of {steps} timed step, tiny model, memory from the timing process): every "
    "figure is produced, none is a measurement - run `unsloth-diffusion-norm bench` for those"
)


def noise_note(found):
    """A ratio whose distance from 1 is within the spread between blocks (its own or its baseline's) is
    noise, not an effect: name those rows. None when every ratio stands out of its noise."""
    if found["blocks"] < 2:
        return (
            "note: one block per figure, so nothing shows how much step times vary between blocks; "
            "use --blocks 3 or more before reading the ratios"
        )
    baselines, noisy, compared = {}, [], 0
    for r in found["rows"]:
        base = baselines.setdefault((r["model"], r["ga"]), r)  # the first variant of each model and GA
        if r is base:
            continue
        compared += 1
        noise = max(r["spread"], base["spread"])
        if abs(r["ratio"] - 1) < noise:
            noisy.append(f"{r['model']} GA {r['ga']} {r['variant']} {r['ratio']:.3f} (blocks {noise:.0%} apart)")
    if not noisy:
        return None
    return (
        f"note: in {len(noisy)} of {compared} rows the blocks' step times spread further apart than the "
        f"ratio is from 1, so the ratio is noise, not an effect: " + "; ".join(noisy)
    )


def render(found):
    device = found.get("device", "cpu")
    where = "CPU" if device == "cpu" else found.get("device_name", device)
    lines = [
        f"Unsloth {found['unsloth']} (mode {found['mode']}); {where}; medians over interleaved blocks, first step "
        f"of each block dropped",
        *([QUICK_LABEL.format(**found)] if found.get("quick") else []),
        "",
    ]
    ga1 = {(r["model"], r["variant"]): r["peak_mib"] for r in found["rows"] if r["ga"] == 1}
    lines += tables.markdown(
        [
            "model",
            "GA",
            "variant",
            "step time (ms)",
            "ratio to first variant",
            "peak RSS (MiB)",
            "peak above start (MiB)",
            "peak vs GA 1",
        ],
        [
            [
                r["model"],
                r["ga"],
                r["variant"],
                f"{r['step_ms']:.1f}",
                f"{r['ratio']:.3f}",
                f"{r['peak_mib']:.0f}",
                f"{r['above_mib']:.1f}",
                f"{r['peak_mib'] / ga1[(r['model'], r['variant'])]:.3f}",
            ]
            for r in found["rows"]
        ],
    )
    note = noise_note(found)
    lines += [
        *(["", note] if note else []),
        "",
        f"`import unsloth_diffusion_norm` alone: {found['import_ms']:.1f} ms (median of 5 fresh interpreters); "
        f"imports torch: {found['import_torch']}; imports unsloth: {found['import_unsloth']}",
    ]
    if found.get("collectives_per_step") is not None:
        lines.append(f"count collectives per optimizer step under 2-rank DDP: {found['collectives_per_step']}")
    if found.get("record"):
        lines.append(f"record: {found['record']}")
    if found.get("plot"):
        lines.append(f"plot: {found['plot']}")
    elif found.get("plot_note"):
        lines.append(f"plot: {found['plot_note']}")
    return "\n".join(lines)


def draw(found, path):
    """Step time and peak memory against GA, one line per variant, one row per model; None without
    matplotlib (an optional extra; run() says so)."""
    plt = pyplot()
    if plt is None:
        return None
    models = list(dict.fromkeys(r["model"] for r in found["rows"]))
    figure, axes = plt.subplots(len(models), 2, figsize=(10, 3.6 * len(models)), squeeze=False)
    for row, model in zip(axes, models):
        for label in dict.fromkeys(r["variant"] for r in found["rows"]):
            points = [r for r in found["rows"] if r["model"] == model and r["variant"] == label]
            gas = [r["ga"] for r in points]
            row[0].plot(gas, [r["step_ms"] for r in points], marker="o", label=label)
            row[1].plot(gas, [r["peak_mib"] for r in points], marker="o", label=label)
        row[0].set(title=f"{model}: step time", xlabel="gradient accumulation", ylabel="ms per optimizer step")
        row[1].set(title=f"{model}: peak resident memory", xlabel="gradient accumulation", ylabel="MiB")
        for axis in row:
            axis.set_xticks(sorted({r["ga"] for r in found["rows"]}))
            axis.grid(alpha=0.3)
        row[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def block_ratio_range(row, first_row=False):
    """'lowest-highest' of a row's ratios to its part's baseline block by block (timed side by side, so what drifts
    between blocks cancels): the figure that says whether a ratio is resolved to 1 %. '—' for the baseline itself,
    a part of its own (no baseline beside it) or a part written before the bench paired its blocks."""
    ratios = row.get("block_ratios")
    if first_row or not ratios:
        return "—"
    return f"{min(ratios):.3f}–{max(ratios):.3f}"


def render_gpu(parts):
    """One table of the GPU bench's parts, in the order run: every variant's step time and peak memory, as
    ratios to the first part's first variant (the unpatched release, timed interleaved with the plugin)."""
    base = parts[0]["rows"][0]
    overrides, prompt, answer = parts[0]["preset"]["config"]
    first = parts[0]
    lines = [
        f"{first.get('device_name', first['device'])}; random-weight model of the tiny model's architecture "
        f"(hidden {overrides.get('hidden_size', '-')}, {overrides.get('num_hidden_layers', '-')} layers, vocabulary "
        f"{overrides.get('vocab_size', '-')}), sequence {prompt + answer + 1}, "
        f"{'bf16 autocast' if first['bf16'] else 'fp32'}; medians over {first['blocks']} interleaved blocks of "
        f"{first['steps']} timed optimizer steps (each block's first step dropped); ratios to "
        f"Unsloth {first['unsloth']} {base['variant']}",
        "",
    ]
    rows = [
        [
            f"{part['unsloth']} ({part['mode']})",
            r["ga"],
            r["variant"],
            f"{r['step_ms']:.1f}",
            f"{r['step_ms'] / base['step_ms']:.3f}",
            "—" if r["spread"] is None else f"{r['spread']:.1%}",
            block_ratio_range(r, first_row=r is part["rows"][0]),
            f"{r['peak_mib']:.0f}",
            f"{r['peak_mib'] / base['peak_mib']:.4f}",
        ]
        for part in parts
        for r in part["rows"]
    ]
    header = [
        "Unsloth",
        "GA",
        "variant",
        "step time (ms)",
        "ratio",
        "blocks apart",
        "ratio per block",
        "peak memory (MiB)",
        "peak ratio",
    ]
    lines += tables.markdown(header, rows)
    if len(parts) > 1:
        lines += ["", "Each release ran in its own process, one after the other on the same device."]
    note = noise_note(first)
    return "\n".join(lines + (["", note] if note else []))


# The record. A variant's key in a record (a dotted key's part: letters, digits, '_' and '-'), by its label in bench.variants.
VARIANT_KEYS = {
    "unpatched": "unpatched",
    "plugin": "plugin",
    "plugin, diffusion_metrics=False": "plugin-metrics-off",
    "plugin + diffusion_noise='per_sample'": "per-sample",
    "plugin + complementary masks": "complementary",
    "native, unpatched (Unsloth's own)": "native",
    "native + plugin (resume-exact draws)": "native-plugin",
    "native + plugin, diffusion_metrics=False": "native-plugin-metrics-off",
    "native + plugin + diffusion_noise='per_sample'": "native-per-sample",
    "native + plugin + complementary masks": "native-complementary",
}


def variant_key(label):
    return VARIANT_KEYS.get(label) or re.sub(r"[^\w]+", "-", label.lower()).strip("-")


def figures(found):
    """A bench run's figures, by model, 'gaN' and variant (step time ms, ratio to the first variant, peak and
    peak-above-start MiB, the blocks' spread, peak against GA 1), and the import cost, as a record holds them."""
    steps = {}
    ga1 = {(r["model"], r["variant"]): r["peak_mib"] for r in found["rows"] if r["ga"] == 1}
    for r in found["rows"]:
        row = {
            "variant": r["variant"],
            "step_ms": r["step_ms"],
            "ratio": r["ratio"],
            "spread": r["spread"],
            "peak_mib": r["peak_mib"],
            "above_mib": r["above_mib"],
            "samples": r["samples"],
        }
        if (r["model"], r["variant"]) in ga1:
            row["peak_vs_ga1"] = r["peak_mib"] / ga1[(r["model"], r["variant"])]
        steps.setdefault(r["model"], {}).setdefault(f"ga{r['ga']}", {})[variant_key(r["variant"])] = row
    out = {
        "mode": found["mode"],
        "unsloth": found["unsloth"],
        "blocks": found["blocks"],
        "steps": found["steps"],
        "models": steps,
        "import_ms": found.get("import_ms"),
        "import_torch": found.get("import_torch"),
        "import_unsloth": found.get("import_unsloth"),
        "collectives_per_step": found.get("collectives_per_step"),
    }
    for name in ("seconds", "load_average"):
        if found.get(name) is not None:
            out[name] = found[name]
    return out


def steps_table(found):
    """The markdown table of a run's rows (what `render` prints, without its header and notes)."""
    return "\n".join(line for line in render(found).splitlines() if line.startswith("|"))


def write_record(found, command, name="bench-cpu", **where):
    """records/NAME.json of a bench run (its figures, tables.steps, and tables.report: the whole printed report)."""
    from . import records

    tables_ = {"steps": steps_table(found), "report": render(found)}
    note = noise_note(found)
    if note:
        tables_["note"] = note
    return records.write(name, command, figures(found), tables=tables_, **where)


def _junit(path):
    """{suite: {passed, skipped, failed, tests, seconds, worst_error_over_tolerance, cases: {name: {...}}}} of the
    GPU check's merged JUnit XML."""
    import xml.etree.ElementTree as ET

    found = {}
    for suite in ET.parse(path).getroot():
        cases, outcomes, worst = {}, [], []
        for case in suite.iter("testcase"):
            outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
            outcomes.append(outcome)
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            entry = {"outcome": outcome, "seconds": float(case.get("time", 0))}
            if "worst_error_over_tolerance" in props:
                entry["worst_error_over_tolerance"] = float(props["worst_error_over_tolerance"])
                worst.append(entry["worst_error_over_tolerance"])
            if "grad_error" in props:
                entry["grad_error"] = float(props["grad_error"])
            cases[case_key(case.get("name"))] = entry
        found[suite.get("name")] = {
            "tests": len(outcomes),
            "passed": outcomes.count("passed"),
            "skipped": outcomes.count("skipped"),
            "failed": sum(o in ("failure", "error") for o in outcomes),
            "seconds": float(suite.get("time", 0)),
            "worst_error_over_tolerance": max(worst, default=None),
            "cases": cases,
        }
    return found


def case_key(name):
    """A test's name as a record's key: 'test_x[seed-0]' is 'x-seed-0' (a dotted key has no brackets or dots)."""
    return re.sub(r"[^\w-]+", "-", name.removeprefix("test_")).strip("-")


def release_key(release):
    """'2026.10.4' as a record's key: '2026-10-4' (a dot would split the dotted key)."""
    return release.replace(".", "-")


def _log_steps(path):
    """The GPU check's log: each step's start (seconds from the script's start) and the exit it ended with."""
    steps, done = [], None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            match = re.match(r"^== \[(\d+) s\] (.*)$", line.rstrip("\n"))
            if not match:
                continue
            seconds, what = int(match.group(1)), match.group(2).strip()
            finished = re.match(r"done: exit (\d+)$", what)
            if finished:
                done = {"seconds": seconds, "exit": int(finished.group(1))}
            else:
                steps.append((seconds, what))
    return steps, done


def _step_key(what):
    for pattern, key in (
        (r"^install the kit", "install"),
        (r"^the stack", "stack"),
        (r"^the cuda tier", "tier"),
        (r"^GPU bench on (\S+)", "bench-{0}"),  # (the release's dots made dashes below)
        (r"^the bench's table", "table"),
    ):
        match = re.match(pattern, what)
        if match:
            return key.format(*(release_key(group) for group in match.groups()))
    return re.sub(r"[^\w]+", "-", what.lower()).strip("-")


def gpu_check_figures(folder):
    """The GPU check's figures from its output folder (scripts/gpu_check.sh's $OUT): the tier's counts per release
    and suite with each case's figures (junit.xml), the bench's ratios (bench.json), each step's seconds and the
    exit (gpu_check.log); and its tables (bench.md's table). Plain Python: what a GPU host and the unit tier run."""
    import json
    import os

    figures_, tables_ = {}, {}
    junit = os.path.join(folder, "junit.xml")
    if os.path.exists(junit):
        suites = _junit(junit)
        releases = {}
        for suite, found in suites.items():
            release, _, part = suite.removeprefix("cuda-").partition("-")
            releases.setdefault(release_key(release), {})[part.replace("-", "_")] = found
        for found in releases.values():
            worst = [s["worst_error_over_tolerance"] for s in found.values() if s["worst_error_over_tolerance"]]
            found["worst_error_over_tolerance"] = max(worst, default=None)
        figures_["tier"] = releases
        figures_["tests"] = {k: sum(s[k] for s in suites.values()) for k in ("passed", "skipped", "failed")}
        figures_["tests"]["total"] = sum(s["tests"] for s in suites.values())
        worst = [
            s["worst_error_over_tolerance"] for s in suites.values() if s["worst_error_over_tolerance"] is not None
        ]
        figures_["tests"]["worst_error_over_tolerance"] = max(worst, default=None)
    bench_json = os.path.join(folder, "bench.json")
    if os.path.exists(bench_json):
        with open(bench_json) as f:
            parts = json.load(f)
        base = parts[0]["rows"][0]
        bench_ = {}
        for part in parts:
            for r in part["rows"]:
                row = {
                    "unsloth": part["unsloth"],
                    "mode": part["mode"],
                    "variant": r["variant"],
                    "ga": r["ga"],
                    "step_ms": r["step_ms"],
                    "ratio": r["step_ms"] / base["step_ms"],
                    "spread": r["spread"],
                    "peak_mib": r["peak_mib"],
                    "peak_ratio": r["peak_mib"] / base["peak_mib"],
                }
                if r.get("block_ratios"):
                    row["block_ratios"] = r["block_ratios"]
                    row["block_ratio_low"], row["block_ratio_high"] = min(r["block_ratios"]), max(r["block_ratios"])
                bench_[f"{release_key(part['unsloth'])}-{variant_key(r['variant'])}"] = row
        figures_["bench"] = bench_
        figures_["bench_blocks"], figures_["bench_steps"] = parts[0]["blocks"], parts[0]["steps"]
        overrides, prompt, answer = parts[0]["preset"]["config"]
        figures_["bench_model"] = {
            "hidden": overrides.get("hidden_size"),
            "layers": overrides.get("num_hidden_layers"),
            "vocabulary": overrides.get("vocab_size"),
            "sequence": prompt + answer + 1,
        }
    bench_md = os.path.join(folder, "bench.md")
    if os.path.exists(bench_md):
        with open(bench_md, encoding="utf-8") as f:
            tables_["bench"] = "\n".join(line.rstrip("\n") for line in f if line.startswith("|"))
    log = os.path.join(folder, "gpu_check.log")
    if os.path.exists(log):
        steps, done = _log_steps(log)
        ends = [start for start, _ in steps[1:]] + [done["seconds"] if done else None]
        figures_["seconds"] = {
            _step_key(what): (None if end is None else end - start) for (start, what), end in zip(steps, ends)
        }
        if done:
            figures_["seconds"]["all"] = done["seconds"]
            figures_["exit"] = done["exit"]
    return figures_, tables_


def gpu_check_versions(folder):
    """The versions the GPU check's log states (its 'the stack' lines): Python, torch, CUDA, the GPU, and each
    package, several releases' versions joined by ', '."""
    import os

    found, each = {}, {}
    log = os.path.join(folder, "gpu_check.log")
    if not os.path.exists(log):
        return found
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack = re.match(r"^Python (\S+), torch (\S+) \(CUDA ([^)]+)\), (.+)$", line.strip())
            if stack:
                found.update(python=stack.group(1), torch=stack.group(2), cuda=stack.group(3), gpu=stack.group(4))
                continue
            release = re.match(r"^(\d{4}\.\d+\.\d+): (.+)$", line.strip())
            if release and " (kit)" in release.group(2):
                for package in release.group(2).split(", "):
                    name, _, rest = package.partition(" ")
                    version = rest.split(" ")[0]
                    each.setdefault(name, [])
                    if version not in each[name]:
                        each[name].append(version)
    found.update({name: ", ".join(versions) for name, versions in each.items()})
    return found


GPU_CHECK_COMMAND = "scripts/gpu_check.sh"


def write_gpu_check(folder, kit_commit=None, exit_code=None, seconds=None):
    """records/gpu-check.json from the GPU check's output folder (and a copy there, gpu-check.json, since only
    the folder comes back from a GPU host). The machine: the GPU's name as the check's stack printed it
    (torch.cuda.get_device_name(0)); the commit: git's, or where this copy has no git history the kit's
    (`kit_commit`: .whl/COMMIT, written by scripts/device_kit.sh). Without a CUDA device (a rehearsal on a CPU
    host) the record goes into the folder only. Returns the record."""
    import json
    import os
    import shutil

    from . import records

    figures_, tables_ = gpu_check_figures(folder)
    if exit_code is not None:
        figures_["exit"] = exit_code
    if seconds is not None:
        figures_.setdefault("seconds", {})["all"] = seconds
    found = gpu_check_versions(folder)
    gpu = found.get("gpu")
    where, source = (
        {},
        f"{folder}: junit.xml, bench.json, bench.md and gpu_check.log, as scripts/gpu_check.sh wrote them",
    )
    if records.head() is None and kit_commit and os.path.exists(kit_commit):
        with open(kit_commit) as f:
            lines = f.read().split()
        if lines and lines[0] != "unknown":
            where["commit"] = lines[0]
            source += f"; the commit from the kit ({os.path.basename(kit_commit)}" + (
                ", whose plugin had uncommitted changes)" if "dirty" in lines[1:] else ")"
            )
    cuda = bool(gpu) and gpu != "NO CUDA DEVICE"
    store = records.STORE
    try:
        if not cuda:
            records.STORE = folder  # a rehearsal: its figures are no measurement of a GPU
        record = records.write(
            "gpu-check",
            GPU_CHECK_COMMAND,
            figures_,
            covers=records.PLUGIN,
            tables=tables_,
            found=found,
            where=gpu if cuda else None,
            source=source,
            **where,
        )
    finally:
        records.STORE = store
    written = os.path.join(records.STORE if cuda else folder, "gpu-check.json")
    if cuda and os.path.abspath(os.path.dirname(written)) != os.path.abspath(folder):
        shutil.copy(written, os.path.join(folder, "gpu-check.json"))
    print(f"record: {written}" + ("" if cuda else " (no CUDA device: a rehearsal, into the output folder only)"))
    print(json.dumps(record["figures"].get("tests", {})))
    return record


def main(argv=None):
    """python -m unsloth_diffusion_norm.tools.bench_report gpu-check OUT [--kit-commit FILE] [--exit N]
    [--seconds S]: the GPU check's record from its output folder (scripts/gpu_check.sh runs it last)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m unsloth_diffusion_norm.tools.bench_report")
    parser.add_argument("what", choices=["gpu-check"])
    parser.add_argument("folder", help="the GPU check's output folder ($OUT)")
    parser.add_argument("--kit-commit", help="the kit's COMMIT file: the commit where this copy has no git history")
    parser.add_argument("--exit", type=int, help="the check's exit status")
    parser.add_argument("--seconds", type=int, help="the check's seconds in all")
    args = parser.parse_args(argv)
    write_gpu_check(args.folder, args.kit_commit, args.exit, args.seconds)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())

"""`unsloth-diffusion-norm bench`'s report: the table of a run, its noise note and plot, and the GPU bench's
table of parts. Reads only what `bench.run` returns."""

from ..proof import tables
from .console import pyplot

QUICK_LABEL = (
    "quick smoke run ({blocks} blocks of {steps} timed step, tiny model, memory from the timing "
    "process): every figure is produced, none is a measurement - run `unsloth-diffusion-norm bench` "
    "for those"
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

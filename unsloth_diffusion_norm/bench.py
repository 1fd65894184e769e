"""`unsloth-diffusion-norm bench`: what the fix costs, measured side by side in one run.

Step time (median over interleaved blocks of real Trainer.train() steps, each block's first step dropped
as warm-up) and peak memory, for the release as it is (unpatched, or native on 2026.10.7+) and with the
plugin, at gradient accumulation 1, 4 and 8, on the tiny model and on a larger CPU-sized one; the cost of
`import unsloth_diffusion_norm` alone; the count collectives per optimizer step under 2-rank DDP.
Prints a markdown table of medians and ratios and, when matplotlib is installed, writes a PNG plot.

Peak memory: on CPU the process's peak resident set (VmHWM, reset before each block through
/proc/self/clear_refs), which includes every library loaded; the "above start" column is the peak minus
the resident set at the block's start. Memory is measured in a second process started with a fixed glibc
mmap threshold (MALLOC_MMAP_THRESHOLD_), so freed tensors go back to the system between blocks and every
block starts from what is really live; step times come from the first process, with glibc's defaults.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

GRADIENT_ACCUMULATION = (1, 4, 8)
MODELS = {
    # name: (config overrides, prompt length, answer length)
    "tiny": ({}, 3, 9),
    "larger": (dict(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                    num_attention_heads=4, max_position_embeddings=512), 12, 499),
}


def variants(mode):
    """(label, plugin applied?, DiffusionConfig flags); the first is the baseline of the ratios."""
    from .registry import NATIVE

    if mode == NATIVE:
        return [("native (Unsloth's own)", True, {}),
                ("native + diffusion_noise='global'", True, {"diffusion_noise": "global"}),
                ("native + diffusion_noise='per_sample'", True, {"diffusion_noise": "per_sample"})]
    return [("unpatched", False, {}), ("plugin", True, {}),
            ("plugin + diffusion_noise='per_sample'", True, {"diffusion_noise": "per_sample"})]


def examples(vocab, prompt, answer, n, seed=0):
    import torch

    from .experiment import Example

    generator = torch.Generator().manual_seed(seed)
    draw = lambda k: torch.randint(3, vocab, (k,), generator=generator).tolist()  # noqa: E731 - not special ids
    return [Example(draw(prompt), draw(answer)) for _ in range(n)]


def _rss_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


class StepClock:
    """Times between consecutive optimizer-step ends (fetch, noise, forward, backward, optimizer)."""

    def __init__(self):
        self.ends = []

    def attach(self, trainer):
        from transformers import TrainerCallback

        clock = self

        class Clock(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                clock.ends.append(time.perf_counter())

        trainer.add_callback(Clock())

    def steps(self):
        return [b - a for a, b in zip(self.ends, self.ends[1:])]  # the first step is warm-up


def block(checkpoint, data, ga, applied, flags, steps):
    """One Trainer.train() of `steps` + 1 optimizer steps; (step seconds, peak KiB, peak above start)."""
    import unsloth_diffusion_norm

    from . import experiment

    (unsloth_diffusion_norm.apply if applied else unsloth_diffusion_norm.unpatch)()
    clock = StepClock()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident set (VmHWM) to the current one
        start = _rss_kib("VmRSS")
        experiment.train(data[: ga * (steps + 1)], gradient_accumulation_steps=ga, checkpoint=checkpoint,
                         record=False, before_train=clock.attach, logging_steps=10**6, **flags)
        peak = _rss_kib("VmHWM")
    finally:
        unsloth_diffusion_norm.apply()
    return clock.steps(), peak, peak - start


def import_cost(repeats=5):
    """Milliseconds for `import unsloth_diffusion_norm` in a fresh interpreter, and whether torch came."""
    code = ("import sys, time; t = time.perf_counter(); import unsloth_diffusion_norm; "
            "print((time.perf_counter() - t) * 1000, 'torch' in sys.modules, 'unsloth' in sys.modules)")
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
        runs.append((float(out[0]), out[1] == "True", out[2] == "True"))
    return statistics.median(r[0] for r in runs), any(r[1] for r in runs), any(r[2] for r in runs)


def collectives():
    from . import data_parallel

    rows = data_parallel.launch(2, ["unequal-counts"])
    return sorted({c for row in rows for c in row["collectives"]})


def memory_in_child(models, log):
    """{(model, ga, variant): (peak MiB, above start MiB)} from `bench --memory-only` under a fixed mmap
    threshold (see the module docstring)."""
    import json

    out = tempfile.mkstemp(prefix="udn-bench-", suffix=".json")[1]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
    command = [sys.executable, "-m", "unsloth_diffusion_norm.cli", "bench", "--memory-only", "--blocks", "1",
               "--steps", "1", "--no-ddp", "--plot", "", "--json", out, "--models", *models]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        rows = json.load(f)["rows"]
    os.unlink(out)
    log("bench: memory measured")
    return {(r["model"], r["ga"], r["variant"]): (r["peak_mib"], r["above_mib"]) for r in rows}


def run(blocks=3, steps=3, models=tuple(MODELS), plot=None, ddp=True, log=print, memory_only=False):
    from . import experiment
    from .activation import status

    mode = status().mode
    found = {"mode": mode, "unsloth": status().unsloth_version, "rows": []}
    for name in models:
        overrides, prompt, answer = MODELS[name]
        checkpoint = experiment.tiny_checkpoint() if not overrides else experiment.write_tiny_checkpoint(
            os.path.join(tempfile.mkdtemp(prefix="udn-bench-"), name), **overrides)
        vocab = overrides.get("vocab_size", 97)
        data = examples(vocab, prompt, answer, max(GRADIENT_ACCUMULATION) * (steps + 1))
        times, peaks = {}, {}
        for b in range(blocks):  # interleaved: every variant and GA once per block
            for ga in GRADIENT_ACCUMULATION:
                for label, applied, flags in variants(mode):
                    seconds, peak, above = block(checkpoint, data, ga, applied, flags, steps)
                    times.setdefault((ga, label), []).extend(seconds)
                    peaks.setdefault((ga, label), []).append((peak, above))
            log(f"bench: {name} block {b + 1}/{blocks} done")
        for ga in GRADIENT_ACCUMULATION:
            base = statistics.median(times[(ga, variants(mode)[0][0])])
            for label, _, _ in variants(mode):
                median = statistics.median(times[(ga, label)])
                found["rows"].append(dict(
                    model=name, ga=ga, variant=label, step_ms=median * 1000, ratio=median / base,
                    peak_mib=max(p for p, _ in peaks[(ga, label)]) / 1024,
                    above_mib=max(a for _, a in peaks[(ga, label)]) / 1024, samples=len(times[(ga, label)]),
                ))
    if memory_only:
        return found
    if sys.platform == "linux":
        memory = memory_in_child(models, log)
        for row in found["rows"]:
            row["peak_mib"], row["above_mib"] = memory[(row["model"], row["ga"], row["variant"])]
    found["import_ms"], found["import_torch"], found["import_unsloth"] = import_cost()
    found["collectives_per_step"] = collectives() if ddp else None
    if plot:
        found["plot"] = draw(found, plot)
    return found


def render(found):
    lines = [
        f"Unsloth {found['unsloth']} (mode {found['mode']}); CPU; medians over interleaved blocks, first step "
        f"of each block dropped",
        "",
        "| model | GA | variant | step time (ms) | ratio to first variant | peak RSS (MiB) | peak above start (MiB) | peak vs GA 1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ga1 = {(r["model"], r["variant"]): r["peak_mib"] for r in found["rows"] if r["ga"] == 1}
    for r in found["rows"]:
        lines.append(
            f"| {r['model']} | {r['ga']} | {r['variant']} | {r['step_ms']:.1f} | {r['ratio']:.3f} | "
            f"{r['peak_mib']:.0f} | {r['above_mib']:.1f} | {r['peak_mib'] / ga1[(r['model'], r['variant'])]:.3f} |"
        )
    lines += [
        "",
        f"`import unsloth_diffusion_norm` alone: {found['import_ms']:.1f} ms (median of 5 fresh interpreters); "
        f"imports torch: {found['import_torch']}; imports unsloth: {found['import_unsloth']}",
    ]
    if found.get("collectives_per_step") is not None:
        lines.append(f"count collectives per optimizer step under 2-rank DDP: {found['collectives_per_step']}")
    if found.get("plot"):
        lines.append(f"plot: {found['plot']}")
    return "\n".join(lines)


def draw(found, path):
    """Step time and peak memory against GA, one line per variant, one row per model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None  # matplotlib is an optional extra: pip install 'unsloth-diffusion-norm[bench]'
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
            axis.set_xticks(GRADIENT_ACCUMULATION)
            axis.grid(alpha=0.3)
        row[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path

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

`--quick` is a smoke run of every figure (tiny model, 2 blocks of 1 step, memory from the timing process):
about a minute, and its ratios and memory are not measurements. Every temporary directory the bench makes
is removed when it ends, Ctrl-C included.
"""

import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from . import processes, tables

GRADIENT_ACCUMULATION = (1, 4, 8)
MODELS = {
    # name: (config overrides, prompt length, answer length)
    "tiny": ({}, 3, 9),
    "larger": (
        dict(
            vocab_size=32000,
            hidden_size=256,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=4,
            max_position_embeddings=512,
        ),
        12,
        499,
    ),
}
QUICK = dict(models=("tiny",), blocks=2, steps=1)  # a smoke run: every figure, none of them a measurement
# On a GPU (scripts/gpu_check.sh): a random-weight model of the tiny model's architecture at a realistic size,
# sequence 2048 (48 prompt + 1999 answer + EOS), GA 8, bf16 autocast; peak memory from torch's CUDA allocator.
GPU_MODELS = {
    "nemotron-2048": (
        dict(
            vocab_size=32000,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=16,
            num_attention_heads=16,
            max_position_embeddings=2048,
        ),
        48,
        1999,
    ),
}
GPU = dict(models=("nemotron-2048",), gas=(8,), blocks=2, steps=2, device="cuda", bf16=True, ddp=False, opt_ins=False)
# The same figures at the tiny size on the CPU: what a test can afford to run of the GPU bench's code.
GPU_SMOKE = dict(models=("tiny",), gas=(2,), blocks=1, steps=1, device="cpu", bf16=False, ddp=False, quick=True)
PLOT_HINT = "pip install 'unsloth-diffusion-norm[bench]'"  # matplotlib is an optional extra


def variants(mode):
    """(label, plugin applied?, DiffusionConfig flags); the first is the baseline of the ratios."""
    from ..registry import NATIVE

    if mode == NATIVE:
        return [  # (the release is window-normalized itself; the plugin's default moves the draws)
            ("native, unpatched (Unsloth's own)", False, {}),
            ("native + plugin (resume-exact draws)", True, {}),
            ("native + plugin + diffusion_noise='per_sample'", True, {"diffusion_noise": "per_sample"}),
        ]
    return [
        ("unpatched", False, {}),
        ("plugin", True, {}),
        ("plugin + diffusion_noise='per_sample'", True, {"diffusion_noise": "per_sample"}),
    ]


def examples(vocab, prompt, answer, n, seed=0):
    import torch

    from .fixtures import Example

    generator = torch.Generator().manual_seed(seed)
    draw = lambda k: torch.randint(3, vocab, (k,), generator=generator).tolist()  # noqa: E731 - not special ids
    return [Example(draw(prompt), draw(answer)) for _ in range(n)]


def _rss_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


class Progress:
    """Lines on stderr a person can follow: `say` for each new phase or run, and while one lasts longer
    than `every` seconds a line saying it is still going (a long training run, the memory process, the
    DDP launch), so the output is never silent for long."""

    def __init__(self, write, every=10.0):
        self.write, self.every = write, every
        self.started = self.last = time.monotonic()
        self.doing = "starting"
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)

    def __enter__(self):
        self._beat.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._beat.join()

    def say(self, doing):
        self.doing = doing
        self._emit(doing)

    def _emit(self, text):
        self.last = time.monotonic()
        self.write(f"bench [{self.last - self.started:4.0f} s] {text}")

    def _heartbeat(self):
        while not self._stop.wait(1.0):
            if time.monotonic() - self.last >= self.every:
                self._emit(f"{self.doing} - still running")


def can_plot():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _memory_kib(device, start=False):
    """The peak since the last start (start=True: reset it and return the current use), in KiB: the resident
    set on the CPU; torch's allocator on an accelerator (what tensors hold, not the driver's context)."""
    import torch

    if device == "cpu":
        if start:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets the peak resident set (VmHWM) to the current one
        return _rss_kib("VmRSS" if start else "VmHWM")
    memory = getattr(torch, torch.device(device).type)
    if start:
        memory.synchronize()
        memory.reset_peak_memory_stats()
        return memory.memory_allocated() // 1024
    return memory.max_memory_allocated() // 1024


def block(checkpoint, data, ga, applied, flags, steps, output_dir=None, device="cpu", bf16=False):
    """One Trainer.train() of `steps` + 1 optimizer steps; (step seconds, peak KiB, peak above start)."""
    import unsloth_diffusion_norm

    from . import experiment, instruments

    (unsloth_diffusion_norm.apply if applied else unsloth_diffusion_norm.unpatch)()
    clock = instruments.StepClock()
    where = {} if output_dir is None else {"output_dir": output_dir}
    if device != "cpu":
        where.update(device=device)
    if bf16:
        where.update(bf16=True)
    try:
        start = _memory_kib(device, start=True)
        experiment.train(
            data[: ga * (steps + 1)],
            gradient_accumulation_steps=ga,
            checkpoint=checkpoint,
            record=False,
            before_train=clock.attach,
            logging_steps=10**6,
            **flags,
            **where,
        )
        peak = _memory_kib(device)
    finally:
        unsloth_diffusion_norm.apply()
    return clock.steps(), peak, peak - start


def import_cost(repeats=5):
    """Milliseconds for `import unsloth_diffusion_norm` in a fresh interpreter, and whether torch came."""
    code = (
        "import sys, time; t = time.perf_counter(); import unsloth_diffusion_norm; "
        "print((time.perf_counter() - t) * 1000, 'torch' in sys.modules, 'unsloth' in sys.modules)"
    )
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
        runs.append((float(out[0]), out[1] == "True", out[2] == "True"))
    return statistics.median(r[0] for r in runs), any(r[1] for r in runs), any(r[2] for r in runs)


def collectives():
    from .ranks import launch

    rows = launch(2, ["unequal-counts"])
    return sorted({c for row in rows for c in row["collectives"]})


def memory_in_child(models, log, workdir):
    """{(model, ga, variant): (peak MiB, above start MiB)} from `bench --memory-only` under a fixed mmap
    threshold (see the module docstring); its progress lines are passed on to `log`."""
    import json

    out = os.path.join(workdir, "memory.json")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
    command = [
        sys.executable,
        "-m",
        "unsloth_diffusion_norm",
        "bench",
        "--memory-only",
        "--blocks",
        "1",
        "--steps",
        "1",
        "--no-ddp",
        "--plot",
        "",
        "--json",
        out,
        "--models",
        *models,
    ]
    tail = collections.deque(maxlen=40)  # what to show if it fails
    # Stopped and reaped however this ends (Ctrl-C included) before the caller removes the directory it writes into.
    with processes.group(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as child:
        for line in child.stderr:
            tail.append(line)
            if line.startswith("bench [") and "still running" not in line:
                log("memory process: " + line.split("] ", 1)[-1].strip())
        child.wait()
    if child.returncode != 0:
        raise RuntimeError(f"the memory process failed (exit {child.returncode}):\n{''.join(tail)}")
    with open(out) as f:
        rows = json.load(f)["rows"]
    return {(r["model"], r["ga"], r["variant"]): (r["peak_mib"], r["above_mib"]) for r in rows}


def spread(block_times):
    """(slowest - fastest) / median of the blocks' median step times; None with a single block."""
    medians = [statistics.median(times) for times in block_times]
    if len(medians) < 2:
        return None
    return (max(medians) - min(medians)) / statistics.median(medians)


def run(
    blocks=3,
    steps=3,
    models=tuple(MODELS),
    plot=None,
    ddp=True,
    log=print,
    memory_only=False,
    quick=False,
    gas=GRADIENT_ACCUMULATION,
    device="cpu",
    bf16=False,
    opt_ins=True,
    checkpoints=None,
    first=None,
):
    """Every figure of the bench as a dict (what --json writes). `quick`: peak memory from this process
    instead of a second one (see QUICK). `gas`, `device`, `bf16`: see GPU; `opt_ins=False`: the variants
    without an opt-in flag only; `first`: the first so many variants only; `checkpoints`: a directory where the random-weight checkpoints are kept
    and reused (by the next release's process). Removes every temporary directory it makes, also on Ctrl-C."""
    workdir = tempfile.mkdtemp(prefix="udn-bench-")
    try:
        settings = dict(gas=tuple(gas), device=device, bf16=bf16, opt_ins=opt_ins, checkpoints=checkpoints, first=first)
        return _run(blocks, steps, models, plot, ddp, log, memory_only, quick, workdir, **settings)
    finally:
        with processes.deferred_interrupts():
            shutil.rmtree(workdir, ignore_errors=True)


def _run(
    blocks, steps, models, plot, ddp, log, memory_only, quick, workdir, gas, device, bf16, opt_ins, checkpoints, first
):
    from ..activation import status
    from . import fixtures

    mode = status().mode
    found = {
        "mode": mode,
        "unsloth": status().unsloth_version,
        "quick": quick,
        "blocks": blocks,
        "steps": steps,
        "device": device,
        "bf16": bf16,
        "rows": [],
    }
    if device != "cpu":
        found["device_name"] = _device_name(device)
    if plot and not can_plot():
        log(f"no plot: matplotlib is not installed ({PLOT_HINT})")
    chosen = [v for v in variants(mode) if opt_ins or not v[2]][:first]
    runs, total = 0, len(models) * blocks * len(gas) * len(chosen)
    for name in models:
        overrides, prompt, answer = {**MODELS, **GPU_MODELS}[name]
        kept = checkpoints and os.path.join(checkpoints, name)
        if not overrides:
            checkpoint = fixtures.tiny_checkpoint()
        elif kept and os.path.exists(os.path.join(kept, "complete")):
            checkpoint = kept
        else:
            checkpoint = fixtures.write_tiny_checkpoint(kept or os.path.join(workdir, name), **overrides)
            open(os.path.join(checkpoint, "complete"), "w").close()  # a later process may reuse it
        vocab = overrides.get("vocab_size", 97)
        data = examples(vocab, prompt, answer, max(gas) * (steps + 1))
        times, peaks = {}, {}  # times: {(ga, variant): [each block's step seconds]}
        for b in range(blocks):  # interleaved: every variant and GA once per block
            for ga in gas:
                for label, applied, flags in chosen:
                    runs += 1
                    log(f"{name} model, block {b + 1}/{blocks}: GA {ga}, {label} (run {runs}/{total})")
                    seconds, peak, above = block(
                        checkpoint,
                        data,
                        ga,
                        applied,
                        flags,
                        steps,
                        output_dir=os.path.join(workdir, "run"),
                        device=device,
                        bf16=bf16,
                    )
                    times.setdefault((ga, label), []).append(seconds)
                    peaks.setdefault((ga, label), []).append((peak, above))
        every = {key: [s for one in blocks_of for s in one] for key, blocks_of in times.items()}
        for ga in gas:
            base = statistics.median(every[(ga, chosen[0][0])])
            for label, _, _ in chosen:
                median = statistics.median(every[(ga, label)])
                found["rows"].append(
                    dict(
                        model=name,
                        ga=ga,
                        variant=label,
                        step_ms=median * 1000,
                        ratio=median / base,
                        spread=spread(times[(ga, label)]),
                        peak_mib=max(p for p, _ in peaks[(ga, label)]) / 1024,
                        above_mib=max(a for _, a in peaks[(ga, label)]) / 1024,
                        samples=len(every[(ga, label)]),
                    )
                )
    if memory_only:
        return found
    if sys.platform == "linux" and not quick and device == "cpu":  # an accelerator's allocator needs no second process
        log("peak memory: the same runs again in a second process with a fixed mmap threshold")
        memory = memory_in_child(models, log, workdir)
        for row in found["rows"]:
            row["peak_mib"], row["above_mib"] = memory[(row["model"], row["ga"], row["variant"])]
    log("import cost: `import unsloth_diffusion_norm` in 5 fresh interpreters")
    found["import_ms"], found["import_torch"], found["import_unsloth"] = import_cost()
    if ddp:
        log("count collectives: one optimizer step under 2-rank DDP (torchrun, Gloo; about 20 s)")
    found["collectives_per_step"] = collectives() if ddp else None
    if plot:
        found["plot"] = draw(found, plot)
        if found["plot"] is None:
            found["plot_note"] = f"not drawn: matplotlib is not installed ({PLOT_HINT} adds it)"
    return found


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
    lines = [
        f"Unsloth {found['unsloth']} (mode {found['mode']}); CPU; medians over interleaved blocks, first step "
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
    """Step time and peak memory against GA, one line per variant, one row per model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None  # an optional extra (PLOT_HINT); run() says so
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


def gpu_part(path, preset=GPU, log=print):
    """This release's share of the GPU bench, written to `path` as JSON: scripts/gpu_check.sh runs it once per
    installed release (a process holds one Unsloth), and `render_gpu` puts the parts side by side."""
    import json

    found = run(plot=None, log=log, **preset)
    found["preset"] = {**preset, "config": {**MODELS, **GPU_MODELS}[preset["models"][0]]}
    with open(path, "w") as f:
        json.dump(found, f, indent=1)
    return found


def _device_name(device):
    import torch

    kind = torch.device(device).type
    return getattr(torch, kind).get_device_name(device) if kind == "cuda" else kind


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
            f"{r['peak_mib']:.0f}",
            f"{r['peak_mib'] / base['peak_mib']:.4f}",
        ]
        for part in parts
        for r in part["rows"]
    ]
    header = ["Unsloth", "GA", "variant", "step time (ms)", "ratio", "blocks apart", "peak memory (MiB)", "peak ratio"]
    lines += tables.markdown(header, rows)
    if len(parts) > 1:
        lines += ["", "Each release ran in its own process, one after the other on the same device."]
    note = noise_note(first)
    return "\n".join(lines + (["", note] if note else []))


def main(argv=None):
    """python -m unsloth_diffusion_norm.verify.bench gpu PART.json [--smoke] [--checkpoints DIR]
    | table PART.json ... [--json ALL.json]: this release's part of the GPU bench; the table of the parts."""
    import argparse
    import contextlib
    import io
    import json

    parser = argparse.ArgumentParser(prog="python -m unsloth_diffusion_norm.verify.bench")
    parser.add_argument("what", choices=["gpu", "table"])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--smoke", action="store_true", help="the GPU bench's code at the tiny size on the CPU")
    parser.add_argument("--checkpoints", help="keep the random-weight checkpoint here, for the next release's part")
    parser.add_argument("--json", help="table: also write every part, as a list, here")
    parser.add_argument("--first", type=int, help="gpu: the first so many variants only (the release's own: 1)")
    args = parser.parse_args(argv)
    if args.what == "table":
        parts = []
        for path in args.paths:
            with open(path) as f:
                parts.append(json.load(f))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(parts, f, indent=1)
        print(render_gpu(parts))
        return 0
    import unsloth_diffusion_norm  # noqa: F401 - before unsloth, as users do

    with contextlib.redirect_stdout(io.StringIO()):
        import unsloth  # noqa: F401
    preset = {**(GPU_SMOKE if args.smoke else GPU), "checkpoints": args.checkpoints, "first": args.first}
    with Progress(lambda line: print(line, file=sys.stderr, flush=True)) as progress:
        found = gpu_part(args.paths[0], preset, log=progress.say)
    print(render_gpu([found]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

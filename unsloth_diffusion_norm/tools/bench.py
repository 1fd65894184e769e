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

The record: a measuring run (not --quick) in a checkout of the project writes its figures to the results store,
records/bench-cpu.json (`Plan.record`; `bench_report.write_record` through `records.write`): per model, GA and
variant the step time, ratio, spread and peak memory, the import cost, and tables.steps, the printed table.
The GPU bench's parts write none: scripts/gpu_check.sh writes records/gpu-check.json of the whole check.
"""

import collections
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from ..proof import processes
from ..proof.tiny_model import VOCAB_SIZE
from .bench_report import draw, noise_note, render, render_gpu, write_record  # noqa: F401 - the report, by its name
from .console import NO_PLOT, Progress, pyplot, write_json

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


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one bench run measures, and how."""

    models: tuple = tuple(MODELS)  # names in MODELS / GPU_MODELS
    blocks: int = 3  # interleaved blocks: every variant and GA once per block
    steps: int = 3  # timed optimizer steps per block (each block trains one more, dropped as warm-up)
    gas: tuple = GRADIENT_ACCUMULATION
    device: str = "cpu"
    bf16: bool = False  # bf16 autocast (the GPU bench)
    opt_ins: bool = True  # False: only the variants without an opt-in flag
    first: int = None  # the first so many variants only (the release's own: 1)
    ddp: bool = True  # count the collectives of one optimizer step under 2-rank DDP
    plot: str = None  # PNG path, or None
    quick: bool = False  # peak memory from the timing process (see QUICK); no figure is a measurement
    memory_only: bool = False  # the timed runs only (the memory process of a full run)
    checkpoints: str = None  # a directory where the random-weight checkpoints are kept for the next process
    record: str = "bench-cpu"  # the results store's record a measuring run writes (records/NAME.json); None: none


QUICK = Plan(models=("tiny",), blocks=2, steps=1, quick=True, record=None)  # every figure, none a measurement
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
# Four interleaved blocks of four steps: each variant's ratio is read block by block against the baseline timed
# beside it (a paired ratio per block), which two blocks of two steps could not resolve to 1 %.
GPU = Plan(
    models=("nemotron-2048",),
    gas=(8,),
    blocks=4,
    steps=4,
    device="cuda",
    bf16=True,
    ddp=False,
    opt_ins=False,
    record=None,
)
# The same figures at the tiny size on the CPU: what a test can afford to run of the GPU bench's code.
GPU_SMOKE = Plan(
    models=("tiny",), gas=(2,), blocks=1, steps=1, device="cpu", bf16=False, ddp=False, quick=True, record=None
)


def variants(mode):
    """(label, plugin applied?, DiffusionConfig flags); the first is the baseline of the ratios."""
    from ..registry import NATIVE

    if mode == NATIVE:
        return [  # (the release is window-normalized itself; the plugin's default moves the draws)
            ("native, unpatched (Unsloth's own)", False, {}),
            ("native + plugin (resume-exact draws)", True, {}),
            ("native + plugin, diffusion_metrics=False", True, {"diffusion_metrics": False}),  # what logging costs
            ("native + plugin + diffusion_noise='per_sample'", True, {"diffusion_noise": "per_sample"}),
            ("native + plugin + complementary masks", True, {"diffusion_complementary_masks": True}),
        ]
    return [
        ("unpatched", False, {}),
        ("plugin", True, {}),
        ("plugin, diffusion_metrics=False", True, {"diffusion_metrics": False}),  # what the metrics cost
        ("plugin + diffusion_noise='per_sample'", True, {"diffusion_noise": "per_sample"}),
        ("plugin + complementary masks", True, {"diffusion_complementary_masks": True}),  # a doubled batch
    ]


def opts_in(flags):
    """Does a variant ask for more than the defaults? (Turning the metrics off is no opt-in: it is what they cost.)"""
    return any(value is not False for value in flags.values())


def examples(vocab, prompt, answer, n, seed=0):
    import torch

    from ..proof.fixtures import Example

    generator = torch.Generator().manual_seed(seed)
    draw = lambda k: torch.randint(3, vocab, (k,), generator=generator).tolist()  # noqa: E731 - not special ids
    return [Example(draw(prompt), draw(answer)) for _ in range(n)]


def _rss_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


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

    from ..proof import experiment, instruments

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
    from ..proof.ranks import launch

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


def run(plan=Plan(), log=print):
    """Every figure of the bench as a dict (what --json writes), measured as `plan` says; a measuring run writes
    its record (`plan.record`, see the module's docstring). Removes every temporary directory it makes, also on
    Ctrl-C."""
    workdir = tempfile.mkdtemp(prefix="udn-bench-")
    started, load = time.perf_counter(), os.getloadavg()[0]  # (other jobs on the host widen the blocks' spread)
    try:
        found = _run(plan, log, workdir)
    finally:
        with processes.deferred_interrupts():
            shutil.rmtree(workdir, ignore_errors=True)
    found["seconds"] = round(time.perf_counter() - started, 1)
    found["load_average"] = {"start": load, "end": os.getloadavg()[0]}  # the host's 1-minute load average
    if plan.record and not plan.quick and not plan.memory_only:
        from . import records

        if os.path.isdir(records.STORE):  # a checkout of the project: an installed plugin keeps no store
            write_record(found, command(plan), plan.record)
            found["record"] = os.path.relpath(os.path.join(records.STORE, plan.record + ".json"), records.ROOT)
            log(f"record: {found['record']}")
    return found


def command(plan):
    """The command line that runs `plan` (what the record names)."""
    default, words = Plan(), ["unsloth-diffusion-norm", "bench"]
    if plan.models != default.models:
        words += ["--models", *plan.models]
    if plan.blocks != default.blocks:
        words += ["--blocks", str(plan.blocks)]
    if plan.steps != default.steps:
        words += ["--steps", str(plan.steps)]
    if not plan.ddp:
        words.append("--no-ddp")
    if plan.gas != default.gas:
        words.append(f"(GA {', '.join(map(str, plan.gas))})")  # no flag sets it: a plan made in code
    return " ".join(words)


def _run(plan, log, workdir):
    from ..activation import status

    state = status()
    found = {
        "mode": state.mode,
        "unsloth": state.unsloth_version,
        "quick": plan.quick,
        "blocks": plan.blocks,
        "steps": plan.steps,
        "device": plan.device,
        "bf16": plan.bf16,
        "rows": [],
    }
    if plan.device != "cpu":
        found["device_name"] = _device_name(plan.device)
    if plan.plot and pyplot() is None:
        log(f"no plot: {NO_PLOT}")
    chosen = [v for v in variants(state.mode) if plan.opt_ins or not opts_in(v[2])][: plan.first]
    counter = _Counter(len(plan.models) * plan.blocks * len(plan.gas) * len(chosen))
    for name in plan.models:
        found["rows"] += _time_model(plan, name, chosen, workdir, log, counter)
    if plan.memory_only:
        return found
    # an accelerator's allocator needs no second process
    if sys.platform == "linux" and not plan.quick and plan.device == "cpu":
        log("peak memory: the same runs again in a second process with a fixed mmap threshold")
        memory = memory_in_child(plan.models, log, workdir)
        for row in found["rows"]:
            row["peak_mib"], row["above_mib"] = memory[(row["model"], row["ga"], row["variant"])]
    log("import cost: `import unsloth_diffusion_norm` in 5 fresh interpreters")
    found["import_ms"], found["import_torch"], found["import_unsloth"] = import_cost()
    if plan.ddp:
        log("count collectives: one optimizer step under 2-rank DDP (torchrun, Gloo; about 20 s)")
    found["collectives_per_step"] = collectives() if plan.ddp else None
    if plan.plot:
        found["plot"] = draw(found, plan.plot)
        if found["plot"] is None:
            found["plot_note"] = f"not drawn: {NO_PLOT}"
    return found


class _Counter:
    """Which run of how many, for the progress lines."""

    def __init__(self, total):
        self.done, self.total = 0, total

    def next(self):
        self.done += 1
        return f"run {self.done}/{self.total}"


def _checkpoint(plan, name, workdir):
    """The model's random-weight checkpoint: the tiny one, one kept in plan.checkpoints, or a new one."""
    from ..proof import fixtures

    overrides = {**MODELS, **GPU_MODELS}[name][0]
    kept = plan.checkpoints and os.path.join(plan.checkpoints, name)
    if not overrides:
        return fixtures.tiny_checkpoint()
    if kept and os.path.exists(os.path.join(kept, "complete")):
        return kept
    checkpoint = fixtures.write_tiny_checkpoint(kept or os.path.join(workdir, name), **overrides)
    open(os.path.join(checkpoint, "complete"), "w").close()  # a later process may reuse it
    return checkpoint


def _time_model(plan, name, chosen, workdir, log, counter):
    """One model's rows: every GA and variant, timed in interleaved blocks; ratios to the first variant."""
    overrides, prompt, answer = {**MODELS, **GPU_MODELS}[name]
    checkpoint = _checkpoint(plan, name, workdir)
    data = examples(overrides.get("vocab_size", VOCAB_SIZE), prompt, answer, max(plan.gas) * (plan.steps + 1))
    times, peaks = {}, {}  # times: {(ga, variant): [each block's step seconds]}
    for b in range(plan.blocks):  # interleaved: every variant and GA once per block
        for ga in plan.gas:
            for label, applied, flags in chosen:
                log(f"{name} model, block {b + 1}/{plan.blocks}: GA {ga}, {label} ({counter.next()})")
                seconds, peak, above = block(
                    checkpoint,
                    data,
                    ga,
                    applied,
                    flags,
                    plan.steps,
                    output_dir=os.path.join(workdir, "run"),
                    device=plan.device,
                    bf16=plan.bf16,
                )
                times.setdefault((ga, label), []).append(seconds)
                peaks.setdefault((ga, label), []).append((peak, above))
    every = {key: [s for one in blocks_of for s in one] for key, blocks_of in times.items()}
    rows = []
    for ga in plan.gas:
        first = chosen[0][0]
        base = statistics.median(every[(ga, first)])
        for label, _, _ in chosen:
            median = statistics.median(every[(ga, label)])
            # each block's ratio to the baseline timed in the same block: what drifts between blocks cancels
            paired = [
                statistics.median(ours) / statistics.median(theirs)
                for ours, theirs in zip(times[(ga, label)], times[(ga, first)])
            ]
            rows.append(
                dict(
                    model=name,
                    ga=ga,
                    variant=label,
                    step_ms=median * 1000,
                    ratio=median / base,
                    spread=spread(times[(ga, label)]),
                    block_ratios=paired,
                    peak_mib=max(p for p, _ in peaks[(ga, label)]) / 1024,
                    above_mib=max(a for _, a in peaks[(ga, label)]) / 1024,
                    samples=len(every[(ga, label)]),
                )
            )
    return rows


def gpu_part(path, preset=GPU, log=print):
    """This release's share of the GPU bench, written to `path` as JSON: scripts/gpu_check.sh runs it once per
    installed release (a process holds one Unsloth), and `render_gpu` puts the parts side by side."""
    found = run(dataclasses.replace(preset, plot=None), log=log)
    found["preset"] = {**dataclasses.asdict(preset), "config": {**MODELS, **GPU_MODELS}[preset.models[0]]}
    write_json(found, path)
    return found


def _device_name(device):
    import torch

    kind = torch.device(device).type
    return getattr(torch, kind).get_device_name(device) if kind == "cuda" else kind


def main(argv=None):
    """python -m unsloth_diffusion_norm.tools.bench gpu PART.json [--smoke] [--checkpoints DIR]
    | table PART.json ... [--json ALL.json]: this release's part of the GPU bench; the table of the parts."""
    import argparse
    import json

    from ..proof.fixtures import import_unsloth

    parser = argparse.ArgumentParser(prog="python -m unsloth_diffusion_norm.tools.bench")
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
            write_json(parts, args.json)
        print(render_gpu(parts))
        return 0
    import_unsloth()
    preset = dataclasses.replace(GPU_SMOKE if args.smoke else GPU, checkpoints=args.checkpoints, first=args.first)
    with Progress("bench") as progress:
        found = gpu_part(args.paths[0], preset, log=progress.say)
    print(render_gpu([found]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

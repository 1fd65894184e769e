"""Does the fix change the model? python scripts/convergence.py [--quick] [--part 1|2|3] [--json [FILE]] [--plot FILE]
[--record NAME]

Part 1, accumulation invariance (`invariance`): batch B·k at GA 1 against batch B at GA k, with the same tokens
and masks; the window must stay on the reference to float round-off, per-micro-batch normalization need not.
Part 2, convergence at the settings users run (`seeds`): global noise, batch 1, GA 8, paired seeds; the held-out
objective, per-token bound and masked-token accuracy by noise level (`heldout`, under evaluation noise that holds
still), each arm's mean and 95 % interval and the paired difference, with `impact`'s share moved beside it.
Part 3, what a model can do (`task`, --part 3 only): exact-match accuracy on a reversal task the model learns in
minutes, every arm against the window over paired seeds, by answer length, with the held-out objective and the
learning curves; its seeds run side by side in worker processes (--workers), and a results file can grow a chunk
at a time (--add-to, --minutes: the GPU form).
Every arm is the real DiffusionTrainer and Trainer.train() (`runs`): AdamW, warm-up then cosine, clipping at
1.0, fp32 on CPU, a random-initialized model of the tiny model's class at the docstring tokenizer's vocabulary,
the docstring data set (built here, nothing downloaded) split into train and held-out rows by a fixed seed.
A run with --json FILE (or --add-to FILE) also writes its figures as records of the results store (`figures`:
records/NAME.json, NAME the file's name without .json or --record NAME; one record per part a run holds).
"""

import dataclasses
import json
import os
import sys
import time

from .. import console
from .figures import _tuples
from .invariance import FLOOR, QUICK, Part1, describe, part1, release_check, render, report, within
from .runs import MICROBATCH, WINDOW
from .seeds import QUICK2, Part2, part2

__all__ = [
    "FLOOR",
    "MICROBATCH",
    "QUICK",
    "QUICK2",
    "WINDOW",
    "Part1",
    "Part2",
    "describe",
    "main",
    "part1",
    "part2",
    "release_check",
    "render",
    "report",
    "within",
]


def run(part1_settings, part2_settings, workdir, say, arms=None, native=None, part3_settings=None, workers=1):
    """The JSON of the parts given settings (None: that part does not run); Parts 2 and 3 train `arms` (default:
    each part's own); Part 2 adds `native`'s window arm (the JSON of a run on a natively fixed release, at the same
    settings) as a third arm, Part 3 holds its window arm to this run's, seed by seed."""
    from . import seeds

    result = {}
    if part1_settings is not None:
        settings = part1_settings
        say(describe(settings))
        found, check = part1(settings, workdir, say)
        result.update(report(found, check), settings=dataclasses.asdict(settings))
        result["holds"] = within(result)
    if part2_settings is not None:
        settings = part2_settings
        say(seeds.describe(settings))
        found, size, (train_rows, tokenizer_folder) = part2(settings, workdir, say, arms or seeds.ARMS)
        if native is not None and "part2" in native:
            found[seeds.NATIVE] = seeds.native_arms(native, settings)
        result["part2"] = seeds.report(found, size, settings)
        say("impact on the same rows and settings")
        result["part2"]["impact"] = seeds.impact_beside(
            train_rows, tokenizer_folder, settings, workdir, settings.seeds[0]
        )
    if part3_settings is not None:
        from . import task

        say(task.describe(part3_settings))
        found = task.part3(part3_settings, workdir, say, arms or task.ARMS, workers)
        theirs = native if native is not None and "part3" in native else None
        result["part3"] = task.report(found, part3_settings, theirs)
    return result


def render_all(result):
    from . import seeds

    lines = []
    if "part1" in result:
        lines += [describe(Part1(**_tuples(result["settings"]))), ""]
        lines += [render(result), ""]
    if "part2" in result:
        part = result["part2"]
        lines += [
            seeds.describe(Part2(**_tuples(part["settings"]))) + f"; {part['parameters']:,} parameters",
            "",
            seeds.render(part),
        ]
    if "part3" in result:
        from . import task

        lines += [
            "",
            task.describe(task.Part3(**_tuples(result["part3"]["settings"]))),
            "",
            task.render(result["part3"]),
        ]
    return "\n".join(lines).rstrip()


def draw(result, path):
    """One PNG: Part 1's distances (log scale); Part 2's held-out objective and paired difference with bands,
    training loss and gradient norm; the panels of the parts that ran."""
    from . import invariance, seeds, task

    plt = console.pyplot()
    if "part3" in result and not ("part1" in result or "part2" in result):
        figure, axes = plt.subplots(1, 3, figsize=(14.4, 3.8))
        task.draw(result["part3"], axes)
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)
        return
    panels = (1 if "part1" in result else 0) + (4 if "part2" in result else 0)
    columns = min(panels, 3)
    rows = -(-panels // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.8 * columns, 3.6 * rows), squeeze=False)
    axes = [axis for row in axes for axis in row]
    for spare in axes[panels:]:
        spare.set_visible(False)
    if "part1" in result:
        invariance.draw(result, axes.pop(0))
    if "part2" in result:
        seeds.draw(result["part2"], axes)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _arms(text):
    import argparse

    from .seeds import CHOICES

    arms = tuple(dict.fromkeys(a.strip() for a in text.split(",")))
    if not arms or any(a not in CHOICES for a in arms):
        raise argparse.ArgumentTypeError(f"arms are {', '.join(CHOICES)}, comma-separated; not {text!r}")
    return arms


def _native(path):
    """The JSON of a Part 2 or Part 3 run on a natively fixed release, read whole before anything runs."""
    import argparse
    import json

    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError) as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {error}") from None
    windows = [found.get("part2", {}).get("per_seed", {}), found.get("part3", {}).get("runs", {})]
    if found.get("mode") != "native" or not any("window" in arms for arms in windows):
        raise argparse.ArgumentTypeError(
            f"{path} is not a Part 2 or 3 run with a window arm on a natively fixed Unsloth (2026.10.7+): "
            f"mode {found.get('mode')!r}"
        )
    return found


NO_CUDA = "--gpu needs a CUDA device, and torch.cuda.is_available() is False here"


def _cuda():
    import torch

    return torch.cuda.is_available()


def _device_name():
    import torch

    return torch.cuda.get_device_name(0)


def _positive_float(text):
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"a number of minutes above 0, not {text!r}")
    return value


def _write_records(result, path, name, command):
    """The run's records (figures.py): records/NAME.json, NAME from --record or the results file's name."""
    from . import figures

    name = figures.default_name(path) if name is None else name
    if name:
        written = figures.write(result, name, command)
        print("records: " + ", ".join(f"records/{n}.json" for n in written), file=sys.stderr)


def _parser():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add(
        "--quick",
        action="store_true",
        help="the test's settings (Part 1: k = 2 and 4, 4 steps; Part 2: 2 seeds, 3 steps); exit 1 unless Part 1 holds",
    )
    add("--part", type=int, choices=(1, 2, 3), help="run this part only (default: 1 and 2; 3 only when asked)")
    add(
        "--registered",
        action="store_true",
        help="the registered accuracy study (Part 3's task, window against per-micro-batch at batch 1 x GA 8 and "
        "4 x GA 2, 24 seeds): alone, print its design and power; with --add-to FILE, grow its results file by whole "
        "seeds and print the registered table (the tests only once every registered seed has run)",
    )
    add(
        "--block-study",
        action="store_true",
        help="the registered block-diffusion study (NVIDIA's training mode against bidirectional training on Part "
        "3's task, decoded block by block and over the whole canvas, 24 seeds): alone, print its design and power; "
        "with --add-to FILE, grow its results file by whole seeds and print its table; with --quick, its quick "
        "form and checks (exit 1 when one fails)",
    )
    add(
        "--replicate",
        type=_fresh_seed,
        metavar="FIRST",
        help="with --registered or --block-study, and --add-to FILE: the study again on 24 fresh seeds from FIRST "
        "on (24 or more, and none of 1000-1023 for --block-study: its registered ones), its table labelled a "
        "replication; how to check the verdict on another machine, where the registered runs need not reproduce "
        "bitwise",
    )
    add(
        "--gpu",
        action="store_true",
        help="Part 2 at the CUDA preset (the GPU bench's architecture, bf16, 300 steps, 5 seeds), or with --part 3 "
        "or --registered a larger model (hidden 256, 4 layers, bf16; with --add-to); skipped, with the reason, where "
        "CUDA is not available",
    )
    add(
        "--arms",
        type=_arms,
        help="the arms to train, comma-separated: window, microbatch (Part 2's default); the lower-variance "
        "noise arms stratified, complementary, both, and twice (the window at twice the rows per step); Part 3's "
        "default: window, microbatch, stratified, complementary, twice",
    )
    add("--seeds", type=console.positive_int, metavar="N", help="the part's first N seeds only")
    add(
        "--workers",
        type=console.positive_int,
        metavar="N",
        help="Part 3 and --registered: runs side by side in N processes of one thread each (default: the CPU "
        "cores; the results do not depend on it)",
    )
    add(
        "--add-to",
        type=console.writable,
        metavar="FILE",
        help="Part 3 or --registered: add the runs this results file lacks, seeds in order, until --minutes would "
        "pass; the file (written after each run, or each seed) reports the seeds every arm has run, and where and "
        "when each chunk ran",
    )
    add("--minutes", type=_positive_float, default=8.0, help="--add-to's time for this chunk (default: 8)")
    add(
        "--native",
        type=_native,
        metavar="FILE",
        help="Part 2: add the window arm of this JSON, written on Unsloth 2026.10.7+ at the same settings, as a "
        "third arm (Unsloth's own fix); Part 3: hold its window arm to this run's, seed by seed",
    )
    add("--json", nargs="?", const="-", type=console.writable, help="write the numbers to FILE (alone: on stdout)")
    add("--plot", type=console.writable, help="draw the curves into this PNG")
    add(
        "--record",
        metavar="NAME",
        help="with --json FILE or --add-to FILE: the results store's record of the run's figures, records/NAME.json "
        "(NAME-part1, NAME-part2, NAME-part3 for a run of several parts; default: FILE's name without .json, none "
        "with --quick; '' for none)",
    )
    return parser


def _fresh_seed(text):
    """--replicate's first seed: past the registered seeds, so the replication's draws are new."""
    import argparse

    from . import registered

    first = console.positive_int(text)
    if first < registered.SEEDS:
        raise argparse.ArgumentTypeError(
            f"seeds 0-{registered.SEEDS - 1} are the registered ones: give {registered.SEEDS} or more"
        )
    return first


def _refuse(parser, args, parts):
    """The combinations that cannot run, refused before anything is imported."""
    if args.gpu and args.part == 1:
        parser.error("--gpu is Part 2's or Part 3's preset: leave out --part 1")
    if args.registered and (args.part or args.quick or args.seeds or args.native or args.arms or args.json):
        parser.error("--registered is its own study: leave out --part, --quick, --seeds, --native, --arms, --json")
    if args.block_study and (args.registered or args.part or args.seeds or args.native or args.arms or args.json):
        parser.error(
            "--block-study is its own study: leave out --registered, --part, --seeds, --native, --arms, --json"
        )
    if args.block_study and args.gpu:
        parser.error("--block-study runs on the CPU (its stand-in for FlexAttention): leave out --gpu")
    if args.replicate is not None and not ((args.registered or args.block_study) and args.add_to):
        parser.error(
            "--replicate runs a registered study on fresh seeds: give --registered or --block-study, and --add-to FILE"
        )
    if args.replicate is not None and args.block_study and (why := _block_study_module().fresh(args.replicate)):
        parser.error(f"argument --replicate: {why}")
    if args.add_to and parts != (3,) and not (args.registered or args.block_study):
        parser.error("--add-to grows a Part 3 results file: give --part 3 (or --registered, or --block-study)")
    if args.add_to and (args.json or args.quick or args.seeds or args.native):
        parser.error("--add-to writes its own file: leave out --json, --quick, --seeds and --native")
    if args.native is not None and not any(f"part{p}" in args.native for p in parts):
        parser.error(f"--native: that file holds no Part {' or '.join(map(str, parts))} run")


def _settings(args, parts):
    """(Part 1's, Part 2's, Part 3's settings) of this run; None for a part that does not run."""
    from . import seeds, task

    first = (QUICK if args.quick else Part1()) if 1 in parts else None
    second = (seeds.GPU_QUICK if args.quick else seeds.GPU) if args.gpu else (QUICK2 if args.quick else Part2())
    if args.native is not None and 2 in parts:  # refused before the training, not after it
        seeds.native_arms(args.native, second)
    third = (task.QUICK3 if args.quick else task.GPU3 if args.gpu else task.Part3()) if 3 in parts else None
    if args.seeds:
        first, second, third = (
            None if s is None else dataclasses.replace(s, seeds=s.seeds[: args.seeds]) for s in (first, second, third)
        )
    if args.native is not None and "part3" in args.native and third is not None:
        task.check_native(args.native, third)
    return first if 1 in parts else None, second if 2 in parts else None, third


def _grow(args, third, state, workdir, say, command):
    """--add-to: a chunk of Part 3's results file or of the registered study's; prints its table, writes its record."""
    from .. import records
    from . import figures, registered, task

    device = _device_name() if args.gpu else records.machine()  # (a chunk's results name where they ran)
    if args.registered:
        settings = registered.GPU if args.gpu else registered.SETTINGS
        if args.replicate is not None:
            settings = registered.replication(settings, args.replicate)
        workers = args.workers or (1 if args.gpu else os.cpu_count() or 1)
        before = 0
        if os.path.exists(args.add_to):
            with open(args.add_to) as f:
                before = len(json.load(f)["chunks"])
        found = registered.grow(args.add_to, settings, workdir, args.minutes, say, workers, device, records.head())
        print(registered.render(found))
        if len(found["chunks"]) > before:  # (a chunk that added nothing leaves the record where its runs put it)
            figures.write_registered(found, args.add_to, args.record, command)
        return 0
    result = task.grow(args.add_to, third, workdir, args.minutes, say, args.arms or task.ARMS, device)
    print(task.render(result["part3"]) if result["part3"]["arms"] else "no seed complete yet")
    if result["part3"]["arms"]:
        result.update(mode=state.mode, unsloth=state.unsloth_version)
        _write_records(result, args.add_to, args.record, command)
    return 0


def _block_study_module():
    from . import block_study

    return block_study


def _block_study(args, workdir, say, command):
    """--block-study: its quick form and checks (exit 1 when one fails), or a chunk of its results file."""
    from .. import records
    from . import block_study, figures

    if args.quick:
        settings, (seed,) = block_study.QUICK, block_study.QUICK.seeds
        runs = {arm: [block_study.train_arm(settings, seed, arm, workdir)] for arm in block_study.ARMS}
        for arm, (run,) in runs.items():
            last = run["measured"][-1][1]
            say(f"{arm}: exact match {last['accuracy']:.3f} block by block, {last['canvas_accuracy']:.3f} whole")
        wrong = block_study.check(runs)
        print("\n".join(wrong) if wrong else "block-diffusion study, quick form: every check holds")
        return console.FAILED if wrong else 0
    settings = block_study.SETTINGS
    if args.replicate is not None:
        settings = block_study.replication(settings, args.replicate)
    workers = args.workers or os.cpu_count() or 1
    found = block_study.grow(
        args.add_to, settings, workdir, args.minutes, say, workers, records.machine(), records.head()
    )
    print(block_study.render(found))
    if found["chunks"]:
        figures.write_registered(found, args.add_to, args.record, command, block_study)
    return 0


def main(argv=None):
    """The command line (scripts/convergence.py): the tables on stdout, progress on stderr; --json FILE or
    --json alone (JSON on stdout instead of the tables), --plot FILE. Exit 0 when Part 1 holds (or did not
    run), 1 when --quick finds it does not; the documented run reports what comes out and exits 0."""
    parser = _parser()
    args = parser.parse_args(argv)
    command = "python scripts/convergence.py " + " ".join(sys.argv[1:] if argv is None else argv)
    parts = (args.part,) if args.part else (3,) if args.registered else (2,) if args.gpu else (1, 2)
    _refuse(parser, args, parts)
    if args.registered and not args.add_to:
        from . import registered

        print(registered.plan())
        return 0
    if args.block_study and not (args.add_to or args.quick):
        print(_block_study_module().plan())
        return 0
    try:
        if args.plot and not console.can_plot():
            raise console.Failure(console.NO_PLOT)
        started = time.perf_counter()
        with console.scratch_space() as workdir, console.Progress("convergence") as progress:
            console.import_unsloth()
            console.refuse_unsupported()
            if args.gpu and not _cuda():  # (torch only after Unsloth, as Unsloth asks)
                raise console.Failure(f"skipped: {NO_CUDA}", console.DONE)
            from ... import activation

            state = activation.status()
            progress.say(f"Unsloth {state.unsloth_version} ({state.mode})")
            if args.block_study:
                return _block_study(args, workdir, progress.say, command)
            first, second, third = _settings(args, parts)
            if args.add_to:
                return _grow(args, third, state, workdir, progress.say, command)
            workers = args.workers or (1 if args.gpu else os.cpu_count() or 1)
            result = run(first, second, workdir, progress.say, args.arms, args.native, third, workers)
        result["mode"] = state.mode
        result["unsloth"], result["seconds"] = state.unsloth_version, round(time.perf_counter() - started, 1)
        if args.json == "-":
            console.print_json(result)
        else:
            print(f"Unsloth {state.unsloth_version} ({state.mode}); {result['seconds']} s\n")
            print(render_all(result))
            if args.json:
                console.write_json(result, args.json)
                _write_records(
                    result, args.json, args.record if args.record is not None else ("" if args.quick else None), command
                )
        if args.plot:
            draw(result, args.plot)
    except console.Failure as failure:
        print(f"convergence: {failure}", file=sys.stderr)
        return failure.code
    except ValueError as error:  # a run the installed plugin refuses (switched off: the flags cannot be honoured)
        print(f"convergence: {error}", file=sys.stderr)
        return console.FAILED
    return 1 if args.quick and not result.get("holds", True) else 0

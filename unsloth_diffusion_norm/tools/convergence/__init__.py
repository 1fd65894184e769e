"""Does the fix change the model? python scripts/convergence.py [--quick] [--part 1|2] [--json [FILE]] [--plot FILE]

Part 1, accumulation invariance (`invariance`): batch B·k at GA 1 against batch B at GA k, with the same tokens
and masks; the window must stay on the reference to float round-off, per-micro-batch normalization need not.
Part 2, convergence at the settings users run (`seeds`): global noise, batch 1, GA 8, paired seeds; the held-out
objective, per-token bound and masked-token accuracy by noise level (`heldout`, under evaluation noise that holds
still), each arm's mean and 95 % interval and the paired difference, with `impact`'s share moved beside it.
Part 3, what a model can do (`task`, --part 3 only): exact-match accuracy on a reversal task the model learns in
minutes, window against per-micro-batch over paired seeds, by answer length, with the learning curves.
Every arm is the real DiffusionTrainer and Trainer.train() (`runs`): AdamW, warm-up then cosine, clipping at
1.0, fp32 on CPU, a random-initialized model of the tiny model's class at the docstring tokenizer's vocabulary,
the docstring data set (built here, nothing downloaded) split into train and held-out rows by a fixed seed.
"""

import dataclasses
import time

from .. import console
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


def run(part1_settings, part2_settings, workdir, say, arms=None, native=None, part3_settings=None):
    """The JSON of the parts given settings (None: that part does not run); Part 2 trains `arms` (default: the
    window and per-micro-batch arms) and adds `native`'s window arm (the JSON of a Part 2 run on a natively
    fixed release, at the same settings) as a third."""
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
        if native is not None:
            found[seeds.NATIVE] = seeds.native_arms(native, settings)
        result["part2"] = seeds.report(found, size, settings)
        say("impact on the same rows and settings")
        result["part2"]["impact"] = seeds.impact_beside(
            train_rows, tokenizer_folder, settings, workdir, settings.seeds[0]
        )
    if part3_settings is not None:
        from . import task

        say(task.describe(part3_settings))
        found, held = task.part3(part3_settings, workdir, say)
        result["part3"] = task.report(found, held, part3_settings)
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


def _tuples(settings):
    return {name: tuple(value) if isinstance(value, list) else value for name, value in settings.items()}


def draw(result, path):
    """One PNG: Part 1's distances (log scale); Part 2's held-out objective and paired difference with bands,
    training loss and gradient norm; the panels of the parts that ran."""
    from . import invariance, seeds, task

    plt = console.pyplot()
    if "part3" in result and not ("part1" in result or "part2" in result):
        figure, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
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
    """The JSON of a Part 2 run on a natively fixed release, read whole before anything runs."""
    import argparse
    import json

    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError) as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {error}") from None
    if found.get("mode") != "native" or "window" not in found.get("part2", {}).get("per_seed", {}):
        raise argparse.ArgumentTypeError(
            f"{path} is not a Part 2 run with a window arm on a natively fixed Unsloth (2026.10.7+): "
            f"mode {found.get('mode')!r}"
        )
    return found


NO_CUDA = "--gpu needs a CUDA device, and torch.cuda.is_available() is False here"


def _cuda():
    import torch

    return torch.cuda.is_available()


def main(argv=None):
    """The command line (scripts/convergence.py): the tables on stdout, progress on stderr; --json FILE or
    --json alone (JSON on stdout instead of the tables), --plot FILE. Exit 0 when Part 1 holds (or did not
    run), 1 when --quick finds it does not; the documented run reports what comes out and exits 0."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the test's settings (Part 1: k = 2 and 4, 4 steps; Part 2: 2 seeds, 3 steps); exit 1 unless Part 1 holds",
    )
    parser.add_argument(
        "--part", type=int, choices=(1, 2, 3), help="run this part only (default: 1 and 2; 3 only when asked)"
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="Part 2 at the CUDA preset (the GPU bench's architecture, bf16, 300 steps, 5 seeds); "
        "skipped, with the reason, where CUDA is not available",
    )
    parser.add_argument(
        "--arms",
        type=_arms,
        help="Part 2's arms to train, comma-separated: window, microbatch (default: both); the lower-variance "
        "noise arms stratified, complementary, both, and twice (the window at twice the rows per step)",
    )
    parser.add_argument(
        "--native",
        type=_native,
        metavar="FILE",
        help="add the window arm of this Part 2 JSON, written on Unsloth 2026.10.7+ at the same settings, as a "
        "third arm (Unsloth's own fix)",
    )
    parser.add_argument(
        "--json", nargs="?", const="-", type=console.writable, help="write the numbers to FILE (alone: on stdout)"
    )
    parser.add_argument("--plot", type=console.writable, help="draw the curves into this PNG")
    args = parser.parse_args(argv)
    parts = (2,) if args.gpu else (args.part,) if args.part else (1, 2)
    if args.gpu and args.part == 1:
        parser.error("--gpu is Part 2's preset: leave out --part 1")
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
            from . import seeds

            first = (QUICK if args.quick else Part1()) if 1 in parts else None
            second = (seeds.GPU_QUICK if args.quick else seeds.GPU) if args.gpu else (QUICK2 if args.quick else Part2())
            if args.native is not None and 2 in parts:  # refused before the training, not after it
                seeds.native_arms(args.native, second)
            from .task import QUICK3, Part3

            third = (QUICK3 if args.quick else Part3()) if 3 in parts else None
            result = run(
                first if 1 in parts else None,
                second if 2 in parts else None,
                workdir,
                progress.say,
                args.arms,
                args.native,
                third,
            )
        result["mode"] = state.mode
        result["unsloth"], result["seconds"] = state.unsloth_version, round(time.perf_counter() - started, 1)
        if args.json == "-":
            console.print_json(result)
        else:
            print(f"Unsloth {state.unsloth_version} ({state.mode}); {result['seconds']} s\n")
            print(render_all(result))
            if args.json:
                console.write_json(result, args.json)
        if args.plot:
            draw(result, args.plot)
    except console.Failure as failure:
        print(f"convergence: {failure}", file=sys.stderr)
        return failure.code
    except ValueError as error:  # a run the installed plugin refuses (switched off: the flags cannot be honoured)
        print(f"convergence: {error}", file=sys.stderr)
        return console.FAILED
    return 1 if args.quick and not result.get("holds", True) else 0

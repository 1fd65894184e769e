"""`unsloth-diffusion-norm`: reproduce (before / after / reference table), status, doctor, bench, impact.

Exit status, every command: 0 done (doctor, reproduce: the fix holds here); 1 doctor, reproduce: this stack
is affected and not fixed, or the check failed; 2 a bad command line, a `--model DIR` the self-check cannot
run on, an Unsloth release the plugin does not support, or `impact` input it cannot use; 3 Unsloth is not installed or cannot be imported;
4 an output file could not be written; 130 interrupted. An error is one line on stderr; `doctor --json` prints its JSON report whatever happens.
"""

import argparse
import contextlib
import dataclasses
import io
import os
import re
import sys

from .. import __version__
from .console import (
    DONE,
    FAILED,
    INTERRUPTED,
    NO_PLOT,
    PROG,
    SCRATCH,
    UNWRITABLE,
    USAGE,
    Failure,
    Progress,
    can_plot,
    import_unsloth,
    installed_unsloth,
    positive_int,
    print_json,
    refuse_unsupported,
    scratch_space,
    write_json,
)
from .console import writable as _writable


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the whole usage; one line says it
        # (argparse quotes unrecognized arguments as they are: a newline in one would break the line)
        message = re.sub(r"[\x00-\x1f\x7f]", lambda control: repr(control.group())[1:-1], message)
        raise Failure(f"{self.prog}: {message} (see {self.prog} --help)", USAGE)


def _seed(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**32:  # Trainer seeds numpy, which takes 0 .. 2**32 - 1
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {2**32 - 1}, not {text!r}")
    return value


def _setting(text):
    from .own_model import parse_setting

    try:
        return parse_setting(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _own_model_options(command):
    command.add_argument(
        "--model",
        metavar="DIR",
        help="run the self-check on a tiny random copy of this local checkpoint's architecture, "
        "built from its own remote code (its weights are never read; nothing is downloaded)",
    )
    command.add_argument(
        "--set",
        action="append",
        type=_setting,
        default=[],
        metavar="KEY=VALUE",
        help="with --model: set a key of the tiny copy's config (a JSON value), for a size key "
        "the shrink does not know; repeatable",
    )
    command.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="with --model: allow importing and running DIR's own Python files (its modeling code), as "
        "transformers' trust_remote_code=True does; without it nothing of DIR is imported",
    )


def _parser():
    installed = "Unsloth not installed"
    with contextlib.suppress(Exception):
        from importlib import metadata

        installed = f"Unsloth {metadata.version('unsloth')} installed"
    parser = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__} ({installed})")
    commands = parser.add_subparsers(dest="command", required=True)
    reproduce = commands.add_parser("reproduce", help="before / after / reference table on a tiny model (CPU)")
    reproduce.add_argument("--seed", type=_seed, default=0, help="training seed (decides the noise)")
    _own_model_options(reproduce)
    commands.add_parser("status", help="print what the plugin did to the installed Unsloth")
    doctor = commands.add_parser(
        "doctor",
        help="is this stack affected, is the fix live, and a self-check against the oracle: ten lines at most "
        "(--verbose: every patch, every default and the whole verdict)",
        description="Prints a verdict of ten lines at most; --verbose prints every patch, every default and the "
        "whole verdict. Exit status: 0 fixed (patched or native) and self-check passed; 1 affected and not "
        "fixed, or self-check failed; 2 unsupported Unsloth, a --model DIR the self-check cannot run on, or a "
        "--config FILE whose plugin fields or shape are refused; "
        "3 Unsloth not installed or not importable.",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON (always, also on errors)")
    doctor.add_argument(
        "--verbose",
        action="store_true",
        help="print the whole report: every patch, the defaults line and the whole verdict (the default is ten lines "
        "at most)",
    )
    doctor.add_argument(
        "--config",
        metavar="FILE",
        help="the training script's YAML config: report the plugin's fields it sets, self-check one step at its "
        "batch size and accumulation with its noise, and say whether that run is affected",
    )
    _own_model_options(doctor)
    bench = commands.add_parser("bench", help="step time, peak memory, import cost and DDP collectives")
    bench.add_argument(
        "--quick",
        action="store_true",
        help="smoke run of every figure in about a minute (tiny model, 2 blocks of 1 step); "
        "its ratios are not measurements",
    )
    bench.add_argument("--models", nargs="+", choices=["tiny", "larger"], help="default: tiny larger")
    bench.add_argument("--blocks", type=positive_int, help="interleaved blocks per variant and GA (default 3)")
    bench.add_argument("--steps", type=positive_int, help="timed optimizer steps per block (default 3)")
    bench.add_argument(
        "--plot",
        type=_writable,
        help="PNG path (needs matplotlib); '' for none (default: bench.png, none with --quick)",
    )
    bench.add_argument("--no-ddp", action="store_true", help="skip the 2-rank collective count")
    bench.add_argument("--json", type=_writable, help="also write the measurements here")
    bench.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)
    _impact_options(commands)
    return parser


def _eps(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), not {text!r}")
    return value


def _max_length(text):
    return None if text.lower() == "none" else positive_int(text)


def _impact_options(commands):
    impact = commands.add_parser(
        "impact",
        help="how much per-micro-batch normalization moved your run's loss weight, from your data and settings",
        description="The share of loss weight per-micro-batch normalization (Unsloth 2026.10.4-.6) moves per "
        "optimizer step, on your own data and settings, with no model: maskable counts as the trainer makes them, "
        "then a Monte Carlo of the noise. Settings come from --config (a training YAML such as "
        "examples/train.yaml), then the options; the trainer's defaults otherwise.",
    )
    impact.add_argument(
        "--data", help="JSON-lines file or datasets.save_to_disk folder (default: the config's dataset_name)"
    )
    impact.add_argument("--split", help="the split of a saved DatasetDict (default: dataset_train_split, or train)")
    impact.add_argument(
        "--tokenizer", metavar="DIR", help="local tokenizer folder (default: the config's model_name_or_path)"
    )
    impact.add_argument("--config", metavar="FILE", help="the training script's YAML config; the options override it")
    impact.add_argument("--per-device-train-batch-size", type=positive_int, help="default 8 (Trainer's)")
    impact.add_argument("--gradient-accumulation-steps", type=positive_int, help="default 1 (Trainer's)")
    impact.add_argument("--world-size", type=positive_int, help="data-parallel ranks (default 1)")
    impact.add_argument("--diffusion-eps", type=_eps, help="noise floor, p_mask = (1-eps)·t + eps (default 0.001)")
    impact.add_argument(  # absent unless given: "none" (no truncation) must override a config's max_length
        "--max-length",
        type=_max_length,
        default=argparse.SUPPRESS,
        help="TRL's truncation length, or none (default 1024)",
    )
    impact.add_argument("--seed", type=_seed, help="the run's seed: decides the sampler's order (default 42)")
    impact.add_argument(
        "--per-sample-noise",
        action="store_true",
        help="the share under diffusion_noise='per_sample' (every row its own t) instead of the global RNG",
    )
    impact.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="the device the training run drew its noise on; default cuda",
    )
    impact.add_argument("--draws", type=positive_int, help="optimizer steps to draw (default 20000)")
    impact.add_argument(
        "--json",
        nargs="?",
        const=True,  # not a string: argparse passes it through without _writable
        type=_writable,
        metavar="FILE",
        help="the results as JSON: --json alone prints them on stdout instead of the table; --json FILE writes them "
        "to FILE and prints the table",
    )
    impact.add_argument("--plot", type=_writable, help="PNG of the weight by noise level and answer length")


def _quiet_imports():
    from ..proof.fixtures import CPU_ENVIRONMENT  # our own runs' environment; the plugin itself never sets it

    for name, value in CPU_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' "Loading weights" bars
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)


def _status(args):
    from ..activation import status

    import_unsloth()
    print(status())
    return DONE


def _own_model(args):
    """--model DIR read before Unsloth's import (the cheap refusals come in a moment); --set needs --model."""
    from .own_model import code_files, read

    if args.set and not args.model:
        raise Failure("--set is for the tiny copy of --model DIR; give --model too", USAGE)
    if args.trust_remote_code and not args.model:
        raise Failure("--trust-remote-code is for the code of --model DIR; give --model too", USAGE)
    if args.model:
        config = read(args.model)
        if not args.trust_remote_code:  # asked before anything of DIR is imported, as transformers and vLLM ask
            files = ", ".join(sorted(code_files(config)))
            raise Failure(
                f"--model {args.model}: the self-check imports and runs this directory's own Python code "
                f"({files}); if you trust it, add --trust-remote-code",
                USAGE,
            )


def _doctor(args):
    from . import doctor

    try:
        _own_model(args)
        # a config's fields and shape: refused before anything imports
        fields, shape = (doctor.run_fields(args.config), doctor.run_shape(args.config)) if args.config else (None, None)
        import_unsloth()
        with contextlib.redirect_stdout(sys.stderr):  # the Trainer's banners and prints
            report = doctor.examine(model=args.model, settings=args.set, fields=fields, shape=shape)
    except Failure as failure:  # (own_model.Refused too: a --model DIR the self-check cannot run on)
        report = doctor.unusable(str(failure), failure.code)
    except Exception as error:  # noqa: BLE001 - a health check reports what broke
        report = doctor.unusable(f"doctor failed: {type(error).__name__}: {error}", FAILED)
    if args.json:
        print_json(report)
    if "error" in report:
        print(f"{PROG} doctor: {report['error']}", file=sys.stderr)
    elif not args.json:
        print(doctor.render(report, verbose=args.verbose))
    return report["exit"]


def _reproduce(args):
    from .own_model import prepare

    _own_model(args)
    import_unsloth()
    refuse_unsupported()
    from . import reproduce  # imports torch: after Unsloth, as users do

    with contextlib.redirect_stdout(sys.stderr):  # the Trainer's banners and prints
        model = prepare(args.model, args.set) if args.model else None
        columns = reproduce.table(args.seed, model)
    print(reproduce.render(columns, model))
    return DONE if reproduce.succeeded(columns) else FAILED


def _bench(args):
    from . import bench

    if args.quick and (args.models or args.blocks or args.steps):
        raise Failure(
            f"{PROG} bench: --quick sets the model, blocks and steps itself; leave out --models, --blocks and --steps",
            USAGE,
        )
    preset = bench.QUICK if args.quick else bench.Plan()
    plot = args.plot
    if plot is None and not args.quick:
        try:
            plot = _writable("bench.png")
        except argparse.ArgumentTypeError as error:
            raise Failure(f"{PROG} bench: --plot: {error} (give --plot PATH, or --plot '' for none)", USAGE) from None
    installed_unsloth()  # before the first progress line: a missing Unsloth is all the user should read
    plan = dataclasses.replace(
        preset,
        models=tuple(args.models or preset.models),
        blocks=args.blocks or preset.blocks,
        steps=args.steps or preset.steps,
        plot=plot or None,
        ddp=not args.no_ddp,
        memory_only=args.memory_only,
    )
    with Progress("bench") as progress:
        progress.say("importing Unsloth (about 10 s)")
        import_unsloth()
        refuse_unsupported()
        with contextlib.redirect_stdout(io.StringIO()):  # the Trainer's banners, once per run: not progress
            found = bench.run(plan, log=progress.say)
        progress.say("done")
    if not args.memory_only:
        print(bench.render(found))
    if args.json:
        write_json(found, args.json)
    return DONE


def _impact(args):
    from . import impact

    settings, data, tokenizer, split, defaulted = impact.from_command_line(args)
    if args.plot and not can_plot():
        raise Failure(f"--plot: {NO_PLOT}", USAGE)
    # from the moment the run has lasted a few seconds: a quick refusal stays one line
    with Progress("impact", every=5.0, quiet_for=5.0) as progress:
        found = impact.run(
            data,
            tokenizer,
            settings,
            draws=args.draws or impact.DRAWS,
            global_rng=not args.per_sample_noise,
            split=split,
            log=progress.say,
            device=args.device,
        )
        progress.say("done")
    found.defaulted, found.configured = defaulted, bool(args.config)
    if args.json is True:
        print_json(impact.as_json(found))
    else:
        print(impact.render(found))
    if args.json and args.json is not True:
        write_json(impact.as_json(found), args.json)
    if args.plot:
        try:
            impact.plot(found, args.plot)
        except OSError as error:
            raise Failure(f"cannot write {args.plot!r}: {error.strerror}", UNWRITABLE) from None
    return DONE


COMMANDS = {"status": _status, "doctor": _doctor, "reproduce": _reproduce, "bench": _bench, "impact": _impact}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(argv)
    except Failure as failure:
        print(failure, file=sys.stderr)
        if argv[:1] == ["doctor"] and "--json" in argv:  # its JSON comes whatever happens
            print_json({"exit": failure.code, "error": str(failure)})
        return failure.code
    _quiet_imports()
    try:
        with scratch_space():
            return COMMANDS[args.command](args)
    except Failure as failure:
        line = str(failure)
        print(line if line.startswith(PROG) else f"{PROG} {args.command}: {line}", file=sys.stderr)
        return failure.code
    except KeyboardInterrupt:
        from ..proof.processes import deferred_interrupts, left_running

        with deferred_interrupts():  # said only when true
            running, files = left_running(), [root for root in SCRATCH if os.path.exists(root)]
            if running or files:
                print(
                    f"{PROG} {args.command}: interrupted; still running: processes {running or 'none'}; left "
                    f"behind: {', '.join(files) or 'no files'}",
                    file=sys.stderr,
                )
            else:
                print(
                    f"{PROG} {args.command}: interrupted; every process it started is stopped and its temporary "
                    "files are removed",
                    file=sys.stderr,
                )
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

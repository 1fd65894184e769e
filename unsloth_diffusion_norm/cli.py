"""`unsloth-diffusion-norm`: reproduce (before / after / reference table), status, doctor, bench."""

import argparse
import logging
import os
import sys


def _quiet_imports():
    # CPU-only hosts need this for `import unsloth`; the plugin itself never sets it.
    os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    logging.getLogger("transformers").setLevel(logging.ERROR)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="unsloth-diffusion-norm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    reproduce = commands.add_parser("reproduce", help="before / after / reference table on a tiny model (CPU)")
    reproduce.add_argument("--seed", type=int, default=0, help="training seed (decides the noise)")
    commands.add_parser("status", help="print what the plugin did to the installed Unsloth")
    doctor = commands.add_parser(
        "doctor", help="is this stack affected, is the fix live, and a self-check against the oracle",
        description="Exit status: 0 fixed (patched or native) and self-check passed; 1 affected and not "
        "fixed, or self-check failed; 2 unsupported Unsloth.",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    bench = commands.add_parser("bench", help="step time, peak memory, import cost and DDP collectives")
    bench.add_argument("--models", nargs="+", default=["tiny", "larger"], choices=["tiny", "larger"])
    bench.add_argument("--blocks", type=int, default=3, help="interleaved blocks per variant and GA")
    bench.add_argument("--steps", type=int, default=3, help="timed optimizer steps per block")
    bench.add_argument("--plot", default="bench.png", help="PNG path (needs matplotlib); '' for none")
    bench.add_argument("--no-ddp", action="store_true", help="skip the 2-rank collective count")
    bench.add_argument("--json", help="also write the measurements here")
    bench.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    _quiet_imports()
    import unsloth_diffusion_norm

    if args.command == "status":
        import unsloth  # noqa: F401 - the hooks act on import

        print(unsloth_diffusion_norm.status())
        return 0
    import contextlib
    import io

    # Unsloth and the Trainer print banners and progress; keep the output readable.
    with contextlib.redirect_stdout(io.StringIO()):
        import unsloth  # noqa: F401
    if args.command == "bench":
        import json

        from . import bench as bench_module

        with contextlib.redirect_stdout(io.StringIO()):
            found = bench_module.run(args.blocks, args.steps, args.models, args.plot or None, not args.no_ddp,
                                     log=lambda line: print(line, file=sys.stderr), memory_only=args.memory_only)
        if not args.memory_only:
            print(bench_module.render(found))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(found, f, indent=1)
        return 0
    if args.command == "doctor":
        import json

        from . import doctor as doctor_module

        with contextlib.redirect_stdout(io.StringIO()):
            report = doctor_module.examine()
        print(json.dumps(report, indent=1) if args.json else doctor_module.render(report))
        return report["exit"]
    from . import reproduce as reproduce_module

    with contextlib.redirect_stdout(io.StringIO()):
        columns = reproduce_module.table(args.seed)
    print(reproduce_module.render(columns))
    return 0 if reproduce_module.succeeded(columns) else 1


if __name__ == "__main__":
    sys.exit(main())

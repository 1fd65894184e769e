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

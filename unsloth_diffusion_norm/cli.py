"""`unsloth-diffusion-norm reproduce`: the before / after / reference table on the tiny model."""

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
    args = parser.parse_args(argv)

    _quiet_imports()
    import unsloth_diffusion_norm

    if args.command == "status":
        import unsloth  # noqa: F401 - the hooks act on import

        print(unsloth_diffusion_norm.status())
        return 0
    import contextlib
    import io

    # Unsloth and the Trainer print banners and progress; keep the table readable.
    with contextlib.redirect_stdout(io.StringIO()):
        import unsloth  # noqa: F401
    from . import reproduce as reproduce_module

    with contextlib.redirect_stdout(io.StringIO()):
        columns = reproduce_module.table(args.seed)
    print(reproduce_module.render(columns))
    return 0 if reproduce_module.succeeded(columns) else 1


if __name__ == "__main__":
    sys.exit(main())

"""make fuzz: the fuzzer of tests/integration/test_fuzz.py for as long as it is given, then its counts.

    python scripts/fuzz.py [--minutes 10] [--seed N]

Random configurations through the real DiffusionTrainer against the oracle, and random values for every flag
(command line, YAML, Python) and every option of every subcommand, in rounds of fresh random examples until the
time is up. Each failure is printed with Hypothesis' shrunk example (make it a named regression test); the counts
say how many configurations and bad inputs were tried, how many diverged from the oracle, how many gave more than
one line, and how many escaped as tracebacks. Exit 0 when nothing failed, 1 otherwise. No example database is
kept (nothing is written under the checkout).
"""

import argparse
import collections
import contextlib
import functools
import io
import os
import pathlib
import sys
import tempfile
import time
import traceback

os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import unsloth_diffusion_norm  # noqa: E402 - before Unsloth, as users do

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))

ROUND = 10  # examples per check per round


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to fuzz (default: 10)")
    parser.add_argument("--seed", type=int, default=None, help="the first round's seed (default: random)")
    args = parser.parse_args(argv)
    if not args.minutes > 0:
        parser.error(f"--minutes must be above 0, not {args.minutes}")

    from hypothesis import HealthCheck, given, seed, settings

    from unsloth_diffusion_norm.proof import fixtures, fuzz

    fixtures.import_unsloth(banners=sys.stderr)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # (a bar per loaded model)
    unsloth_diffusion_norm.apply()
    import test_fuzz  # the checks the suite runs, here at random seeds

    counts = collections.Counter()
    failures = []

    def counted(kind, check):
        @functools.wraps(check)  # (its signature: given() draws by the parameters' names)
        def run(*args, **kwargs):
            counts[f"{kind} tried"] += 1
            try:
                check(*args, **kwargs)
            except AssertionError:
                counts[f"{kind} failed"] += 1
                raise
            except Exception:
                counts[f"{kind} tracebacks"] += 1
                raise

        return run

    def configuration(configuration):
        missed = fuzz.check(configuration)
        assert not missed, f"{configuration.describe()}: windows {missed}"

    def flag(flag, text):
        with tempfile.TemporaryDirectory() as where:
            fuzz.check_flag(flag, text, pathlib.Path(where))

    def command_line(argv):
        with tempfile.TemporaryDirectory() as where:
            test_fuzz.command_line_holds(argv, pathlib.Path(where))

    options = test_fuzz._options()
    checks = [  # (name, the check, its strategies)
        ("configurations", counted("configurations", configuration), {"configuration": fuzz.configurations()}),
        ("flag values", counted("bad inputs", flag), {"flag": fuzz.flag_values(), "text": fuzz.texts()}),
        ("command lines", counted("bad inputs", command_line), {"argv": fuzz.option_values(options)}),
    ]
    started, round_seed = time.time(), args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    rounds = 0
    while time.time() - started < 60 * args.minutes:
        for name, check, strategies in checks:
            runner = settings(
                max_examples=ROUND * (10 if name != "configurations" else 1),  # (parsing is cheap)
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                print_blob=True,
            )(seed(round_seed)(given(**strategies)(check)))
            try:
                with contextlib.redirect_stdout(
                    io.StringIO()
                ):  # (the trainer's logs; a failure's example is in its notes)
                    runner()
            except Exception as error:  # noqa: BLE001 - a failure is reported and the fuzzing goes on
                failures.append((name, round_seed, error))
                print(f"\n== {name}, seed {round_seed}: {type(error).__name__}", file=sys.stderr)
                traceback.print_exception(error, file=sys.stderr, limit=-2)
        round_seed, rounds = round_seed + 1, rounds + 1
    minutes = (time.time() - started) / 60
    print(f"fuzz: {rounds} rounds in {minutes:.1f} minutes (seeds from {round_seed - rounds})")
    for key in ("configurations tried", "configurations failed", "configurations tracebacks"):
        print(f"  {key}: {counts[key]}")
    for key in ("bad inputs tried", "bad inputs failed", "bad inputs tracebacks"):
        print(f"  {key}: {counts[key]}")
    print(f"  failures (each shrunk, above): {len(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

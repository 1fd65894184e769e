"""make fuzz: the fuzzer of tests/integration/test_fuzz.py for as long as it is given, then its counts.

    python scripts/fuzz.py [--minutes 10] [--seed N] [--record NAME]

Random configurations through the real DiffusionTrainer against the oracle (on the tiny model, and on tiny copies
of the Dream and LLaDA fixtures by their families' oracles), random two-rank cases in one launch of two real
processes per round, and random values for every flag (command line, YAML, Python) and every option of every
subcommand, in rounds of fresh random examples until the time is up. Each failure is printed with Hypothesis' shrunk example (make it a named regression test); the counts
say how many configurations and bad inputs were tried, how many diverged from the oracle, how many gave more than
one line, and how many escaped as tracebacks. Exit 0 when nothing failed, 1 otherwise. No example database is
kept. The run's counts are written as a record of the results store, records/fuzz.json (`records.write`;
`--record NAME` for records/NAME.json, `--record ''` for none): per kind tried, diverged and tracebacks, the
totals, rounds, minutes and seeds, and the counts' table; nothing else is written under the checkout.
"""

import argparse
import collections
import contextlib
import functools
import io
import os
import pathlib
import shutil
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


def said(error):
    """An exception as text: its type, message and the last frames of its traceback."""
    return "".join(traceback.format_exception(error, limit=-4)).rstrip()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--minutes",
        type=float,
        default=10.0,
        help="how long to fuzz, a limit: no example starts after it; a running one (or a launch of two ranks) "
        "finishes, and the run says how far past the limit that took (default: 10)",
    )
    parser.add_argument("--seed", type=int, default=None, help="the first round's seed (default: random)")
    parser.add_argument(
        "--record",
        default="fuzz",
        metavar="NAME",
        help="write the counts to the results store as records/NAME.json (default: fuzz; '' for none)",
    )
    args = parser.parse_args(argv)
    command = "python scripts/fuzz.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if not args.minutes > 0:
        parser.error(f"--minutes must be above 0, not {args.minutes}")

    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    from unsloth_diffusion_norm import registry
    from unsloth_diffusion_norm.proof import fixtures, fuzz, ranks, tables
    from unsloth_diffusion_norm.tools import own_model

    fixtures.import_unsloth(banners=sys.stderr)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # (a bar per loaded model)
    mode = unsloth_diffusion_norm.apply().mode
    import test_fuzz  # the checks the suite runs, here at random seeds

    # The family fixtures' tiny copies (their weight files are never read: the fixtures hold none).
    families = pathlib.Path(__file__).parents[1] / "tests" / "integration" / "fixtures"
    workdir = tempfile.mkdtemp(prefix="udn-fuzz-")
    copies = [
        own_model.prepare(str(families / name), workdir=workdir)
        for name in ("dream_shifted_logits", "llada_answer_length")
    ]

    counts = collections.Counter()
    failures = []

    def counted(kind, check):
        @functools.wraps(check)  # (its signature: given() draws by the parameters' names)
        def run(*args, **kwargs):
            if time.time() >= deadline:  # the limit: the rest of this check's examples are drawn, not run
                return
            counts[f"{kind} tried"] += 1
            failure = None
            try:
                check(*args, **kwargs)
            except AssertionError as error:
                counts[f"{kind} failed"] += 1
                failure = AssertionError(said(error))
            except Exception as error:  # noqa: BLE001 - counted, then raised again as its text
                counts[f"{kind} tracebacks"] += 1
                failure = RuntimeError(said(error))
            # Raised as text, outside the handler: Hypothesis keeps every failure it meets while shrinking, and a
            # failure's frames hold its trainer and models (a family copy's: the memory of the machine, in one shrink).
            if failure is not None:
                raise failure

        return run

    def configuration(configuration):
        missed = fuzz.check(configuration)
        assert not missed, f"{configuration.describe()}: windows {missed}"

    def family(data):
        copy = data.draw(st.sampled_from(copies))
        drawn = data.draw(fuzz.configurations(copy.profile, llada_per_sample=mode == registry.NATIVE))
        missed = fuzz.check(drawn, copy)
        assert not missed, f"{copy.profile}: {drawn.describe()}: {missed}"

    def rank_cases(round_seed):
        """One launch of two ranks with a round of drawn cases (not shrunk: each failure printed whole)."""
        cases = {f"drawn-{i}": case for i, case in enumerate(fuzz.drawn(fuzz.rank_cases(), ROUND, round_seed))}
        counts["rank cases tried"] += len(cases)
        try:
            found = ranks.launch(2, [], drawn=cases)
        except Exception as error:  # noqa: BLE001 - a launch that fails is a traceback of every case in it
            counts["rank cases tracebacks"] += len(cases)
            failures.append(("rank cases", round_seed, error))
            print(f"\n== rank cases, seed {round_seed}: {error}", file=sys.stderr)
            return
        for name, case in cases.items():
            missed = fuzz.rank_case_misses(case, [row for row in found if row["case"] == name], mode == registry.NATIVE)
            if missed:
                counts["rank cases failed"] += 1
                failures.append(("rank cases", round_seed, case))
                print(f"\n== rank case, seed {round_seed}: {missed}: {case}", file=sys.stderr)

    def flag(flag, text):
        with tempfile.TemporaryDirectory() as where:
            fuzz.check_flag(flag, text, pathlib.Path(where))

    def command_line(argv):
        with tempfile.TemporaryDirectory() as where:
            test_fuzz.command_line_holds(argv, pathlib.Path(where))

    options = test_fuzz._options()
    checks = [  # (name, the check, its strategies)
        ("configurations", counted("configurations", configuration), {"configuration": fuzz.configurations()}),
        ("family configurations", counted("family configurations", family), {"data": st.data()}),
        ("flag values", counted("bad inputs", flag), {"flag": fuzz.flag_values(), "text": fuzz.texts()}),
        ("command lines", counted("bad inputs", command_line), {"argv": fuzz.option_values(options)}),
    ]
    started, round_seed = time.time(), args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    deadline, rounds = started + 60 * args.minutes, 0
    while time.time() < deadline:
        for name, check, strategies in checks:
            if time.time() >= deadline:
                break
            runner = settings(
                max_examples=ROUND * (1 if "configurations" in name else 10),  # (parsing is cheap)
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
        if time.time() < deadline:  # (one launch of two ranks: the one step that runs past the limit whole)
            rank_cases(round_seed)
        round_seed, rounds = round_seed + 1, rounds + 1
    minutes, past = (time.time() - started) / 60, max(0.0, time.time() - deadline)
    print(f"fuzz: {rounds} rounds in {minutes:.1f} minutes (seeds from {round_seed - rounds})")
    print(f"  the limit was {args.minutes:g} minutes; the last round went {past:.0f} s past it")
    for kind in ("configurations", "family configurations", "rank cases"):
        for key in (f"{kind} tried", f"{kind} failed", f"{kind} tracebacks"):
            print(f"  {key}: {counts[key]}")
    for key in ("bad inputs tried", "bad inputs failed", "bad inputs tracebacks"):
        print(f"  {key}: {counts[key]}")
    print(f"  failures (each shrunk, above; a rank case as drawn): {len(failures)}")
    shutil.rmtree(workdir, ignore_errors=True)
    if args.record:
        from unsloth_diffusion_norm.tools import records

        state = unsloth_diffusion_norm.status()
        figures = tables.fuzz_figures(
            counts, rounds, round(minutes, 2), round_seed - rounds, len(failures), mode, state.unsloth_version
        )
        figures.update(limit_minutes=args.minutes, past_limit_seconds=round(past, 1))
        records.write(
            args.record,
            command.strip(),
            figures,
            covers=tables.FUZZ_COVERS,
            tables={"counts": tables.fuzz_table(figures)},
        )
        print(f"record: records/{args.record}.json")
    return 1 if failures else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

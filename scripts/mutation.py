"""Mutation testing of the core (the runtime room): does the suite fail when the code is wrong?

    python scripts/mutation.py run --label unsloth-2026.10.6   # pass 1 + pass 2 in this environment
    python scripts/mutation.py legs                            # the other code shapes' legs: what is alive here
    python scripts/mutation.py report                          # mutation/report.md from every result file

After new tests, `run --label L --again` (with the leg's --python and --workdir for a leg) reruns only what
L's last run left alive; after a function changed, `run --label L --mutants 'module.x_function__mutmut_*'`
reruns all of its mutants; `legs --only LEG` runs one leg.

`make mutation` runs both, on the chunked-shape release (.venv) and then on the legs of the other two code
shapes (2026.10.4 dense, 2026.10.9 native: a patch set is only reachable on its own shape), which get the
mutants the first left alive. Takes about an hour and a half on 2 cores; not part of CI.

Pass 1 is mutmut (config in pyproject.toml): it copies the package to mutants/, compiles every mutant of the
core in behind a switch, maps each test to the functions it calls, and runs, per mutant, the tests of its
function - forked from a server that has already imported Unsloth. mutmut sees only what runs in its own
process, so pass 2 takes each mutant pass 1 left alive in a function that only a fresh interpreter or
launched ranks reach (`FRESH`) and runs those tests with the mutant switched on (MUTANT_UNDER_TEST and
PYTHONPATH are inherited by every child process, so they import the mutated copy).

The report lists every mutant with its fate. A survivor is either killed by a new test or named in
mutation/equivalent.txt with a one-line reason why no behaviour can differ; the score is
killed / (all - equivalent).
"""

import argparse
import dataclasses
import fnmatch
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = ROOT  # where mutmut runs (a leg runs in a copy of the tree: mutants/ and its stats are per environment)
RESULTS = os.path.join(ROOT, "mutation")
EQUIVALENT = os.path.join(RESULTS, "equivalent.txt")
REPORT = os.path.join(RESULTS, "report.md")
MUTMUT = "mutmut==3.8.1"
KILLED = {
    1: "killed",
    3: "killed",
    36: "timeout",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    -11: "killed (crash)",
    -9: "killed (crash)",
}

# One thread per process: two workers fill two cores.
SINGLE_THREADED = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

TESTS = "tests/integration/"
SWITCH = [
    TESTS + "test_field.py::test_unknown_switch_values_warn_once_and_leave_patching_on",
    TESTS + "test_field.py::test_switched_off_the_flags_still_parse_and_a_set_flag_is_refused_by_name",
    TESTS + "test_release.py::test_import_after_unsloth_works_and_the_env_switch_disables",
]
HOOKS = [
    TESTS + "test_release.py::test_import_alone_imports_neither_torch_nor_unsloth_and_apply_then_imports_and_patches",
    TESTS + "test_release.py::test_import_after_unsloth_works_and_the_env_switch_disables",
    TESTS + "test_field.py::test_unpatch_before_unsloth_is_remembered_until_apply",
    TESTS + "test_field.py::test_a_missing_dependency_is_named_as_a_broken_installation",
]
DISABLED = [
    TESTS + "test_field.py::test_switched_off_the_flags_still_parse_and_a_set_flag_is_refused_by_name",
    TESTS + "test_release.py::test_import_after_unsloth_works_and_the_env_switch_disables",
    TESTS + "test_doctor.py::test_disabled_plugin_on_an_affected_release_exits_1_and_the_self_check_shows_why",
]
BROKEN = [TESTS + "test_field.py::test_a_missing_dependency_is_named_as_a_broken_installation"]
RANKS = [TESTS + "multiprocess/test_data_parallel.py"]
# Functions that only fresh interpreters or launched ranks reach (wholly or in part) -> those tests.
FRESH = {
    "unsloth_diffusion_norm.x__switch": SWITCH,
    "unsloth_diffusion_norm.activation.x_register_hooks": HOOKS,
    "unsloth_diffusion_norm.activation.xǁ_PostImportFinderǁ*": HOOKS,
    "unsloth_diffusion_norm.activation.xǁ_HookedLoaderǁ*": HOOKS,
    "unsloth_diffusion_norm.activation.x__on_trainer_module": HOOKS + DISABLED,
    "unsloth_diffusion_norm.activation.x__on_unsloth": HOOKS,
    "unsloth_diffusion_norm.activation.x__log_once": SWITCH + BROKEN,
    "unsloth_diffusion_norm.activation.x_disable": DISABLED,
    "unsloth_diffusion_norm.activation.x__accept_flags_only": DISABLED,
    "unsloth_diffusion_norm.activation.x__broken": BROKEN,
    "unsloth_diffusion_norm.activation.x__install_hint": BROKEN,
    "unsloth_diffusion_norm.activation.x_apply": HOOKS + BROKEN,
    "unsloth_diffusion_norm.patches.x_flags_only": DISABLED,
    "unsloth_diffusion_norm.patches.x__refuse_flags": DISABLED,
    "unsloth_diffusion_norm.window.x_data_parallel_rule": RANKS,
    "unsloth_diffusion_norm.window.x_counting_rule": RANKS,
    "unsloth_diffusion_norm.window.xǁWindowǁnoise": RANKS,
    "unsloth_diffusion_norm.per_sample.xǁDataOrderǁtag": RANKS,
}


def mutmut_results():
    """{mutant: exit code} from mutmut's own files under mutants/."""
    found = {}
    for folder, _, files in os.walk(os.path.join(WORK, "mutants", "unsloth_diffusion_norm")):
        for name in files:
            if name.endswith(".py.meta"):
                found.update(json.load(open(os.path.join(folder, name)))["exit_code_by_key"])
    return found


def fate_of(code):
    """mutmut's exit code -> fate; None: mutmut never ran it (stopped, or not asked), which is not a kill."""
    if code is None:
        return "not run"
    return KILLED.get(code, "survived" if code == 0 else "no tests" if code == 33 else f"exit {code}")


def function_of(mutant):
    return mutant.rsplit("__mutmut_", 1)[0]


def fresh_tests(mutant):
    tests = []
    for pattern, names in FRESH.items():
        if fnmatch.fnmatchcase(function_of(mutant), pattern):
            tests += [n for n in names if n not in tests]
    return tests


def run_fresh(python, mutant, tests):
    """Pass 2 for one mutant: pytest in a fresh interpreter in mutants/, the mutant switched on."""
    mutants = os.path.join(WORK, "mutants")
    env = {
        **os.environ,
        **SINGLE_THREADED,
        "MUTANT_UNDER_TEST": mutant,
        "PYTHONPATH": mutants,
        "UNSLOTH_ALLOW_CPU": "1",
    }
    started = time.time()
    done = subprocess.run(
        [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
        cwd=mutants,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return done.returncode, round(time.time() - started, 1)


def run(args):
    global WORK
    WORK = os.path.abspath(args.workdir or ROOT)
    python = args.python or sys.executable
    env = {**os.environ, **SINGLE_THREADED, "UNSLOTH_ALLOW_CPU": "1"}
    started = time.time()
    names = []
    out = os.path.join(RESULTS, f"results-{args.label}.json")
    before = json.load(open(out))["mutants"] if (args.again or args.mutants) and os.path.exists(out) else {}

    def changed(mutant):  # of a function that changed since the last run: its old verdicts say nothing now
        return any(fnmatch.fnmatchcase(mutant, pattern) for pattern in args.mutants or ())

    before = {m: r for m, r in before.items() if not changed(m)}
    said = equivalents()
    if args.mutants:  # these (mutmut's patterns), the rest as the last run found them
        names = list(args.mutants)
        print(f"pass 1 on {args.label}: {' '.join(names)}", flush=True)
    elif args.again:  # after new tests: only what the last run left alive runs again (mutmut keeps the rest)
        alive = {m: r["fate"] for m, r in before.items()} or {
            m: "alive" for m, c in mutmut_results().items() if c in (0, 33, None)
        }
        names = sorted(
            m for m, fate in alive.items() if fate in ("survived", "no tests", "not run", "alive") and m not in said
        )
        print(f"pass 1 on {args.label}: the {len(names)} mutants the last run left alive", flush=True)
    elif args.alive_from:  # what another release's run left alive, less what is known to be equivalent
        names = sorted(
            m
            for m, r in merged(args.alive_from).items()
            if not r["killed"]
            and m not in said
            and (r["fate"] in ("no tests", "not run") or function_of(m).split(".")[-1] in SHAPE_SPECIFIC)
        )
        print(f"pass 1 on {args.label}: the {len(names)} mutants left alive there", flush=True)
    code = subprocess.run(
        [python, os.path.abspath(__file__), "mutmut", "run", "--max-children", str(args.jobs), *names],
        cwd=WORK,
        env=env,
    ).returncode
    if code != 0:
        sys.exit(f"mutmut run failed (exit {code})")
    pass1 = mutmut_results()  # mutmut's own record: cached verdicts and this run's
    if args.alive_from:  # a leg answers only for what it was given
        pass1 = {m: c for m, c in pass1.items() if m in set(names)}
    elif before:  # and so does a rerun: for what its last run answered
        pass1 = {m: c for m, c in pass1.items() if m in before or changed(m)}
    results = {m: {"pass": 1, "code": c, "fate": fate_of(c)} for m, c in pass1.items()}
    for mutant, r in before.items():  # not run this time (a fresh mutants/ keeps no verdicts): the last run's
        if results.get(mutant, {}).get("fate", "not run") == "not run":
            results[mutant] = r
    for mutant, r in before.items():  # the last run's pass-2 kills stand (tests were only added since)
        if r["pass"] == 2 and r["fate"] == "killed" and results.get(mutant, {}).get("fate") in ("survived", "no tests"):
            results[mutant] = r
    first = time.time() - started

    # Pass 2: first make sure the switch reaches fresh interpreters at all ("fail" fails every trampoline).
    todo = {
        m: fresh_tests(m)
        for m, r in results.items()
        if r["fate"] in ("survived", "no tests")
        and m not in said
        and fresh_tests(m)
        and (changed(m) or not args.mutants)
    }
    groups = sorted({tuple(t) for t in todo.values()})
    for tests in groups:
        if tests != tuple(RANKS) and run_fresh(python, "fail", list(tests))[0] == 0:
            sys.exit(f"pass 2 cannot see mutants: {tests} pass with every mutated function failing")
    print(f"pass 2 on {args.label}: {len(todo)} mutants in fresh interpreters / launched ranks", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for mutant, (code, seconds) in zip(todo, pool.map(lambda m: run_fresh(python, m, todo[m]), todo)):
            fate = "killed" if code not in (0, 5) else "survived"
            results[mutant] = {"pass": 2, "code": code, "fate": fate, "seconds": seconds}
            print(f"  {fate:8} {mutant} ({seconds} s)", flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    json.dump(
        {
            "label": args.label,
            "pass1_seconds": round(first),
            "seconds": round(time.time() - started),
            "mutants": results,
        },
        open(out, "w"),
        indent=1,
        sort_keys=True,
    )
    print(f"wrote {os.path.relpath(out, ROOT)} ({round(time.time() - started)} s)")


# The other code shapes, each on its leg of scripts/matrix.py: the mutants the first run left alive (above
# all the dense loss and the native patch set, which no test reaches on 2026.10.6) run there.
LEGS = ["unsloth-2026.10.4-transformers-5.17.0-trl-1.15.0", "unsloth-2026.10.9-transformers-5.17.0-trl-1.15.0"]
FIRST = "unsloth-2026.10.6"  # `make mutation`'s run in .venv
# Functions whose code runs only on another shape: a survivor of the first run may die there. (Any other
# survivor would survive a leg too: the same code under the same tests.)
SHAPE_SPECIFIC = {
    "x_apply",
    "x_native_release",
    "x__native_trainer_init",
    "x_trainer_patches",
    "x__per_sample_noise",
    "x__draw_at_first_step",
    "x_dense_cross_entropy",
    "x_native_normalization",
}


def legs(args):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import matrix

    for name in args.only or LEGS:
        # DeepSpeed is not needed here (the launched-rank tiers are not part of a leg's mutation run).
        leg = dataclasses.replace(next(leg for leg in matrix.LEGS if leg.name == name), sharded=False)
        where, log = os.path.join(ROOT, ".matrix", name), os.path.join(ROOT, ".matrix", name + ".mutation.log")
        if not matrix.build(leg, where, log):
            sys.exit(f"could not build {name}: see {log}")
        python = os.path.join(where, "bin", "python")
        uv = os.path.join(os.path.dirname(sys.executable), "uv")  # the legs have no pip (scripts/matrix.py)
        subprocess.run(
            [uv, "pip", "install", "-q", "--python", python, "-c", os.path.join(ROOT, "constraints.txt"), MUTMUT],
            check=True,
        )
        # A copy of the tracked tree: mutmut keeps mutants/ and its test map in the directory it runs in.
        work = os.path.join(ROOT, ".matrix", name + ".mutation")
        subprocess.run(["rm", "-rf", work], check=True)
        os.makedirs(work)
        tracked = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
        subprocess.run(["tar", "-cf", "-", *tracked], cwd=ROOT, stdout=open(work + ".tar", "wb"), check=True)
        subprocess.run(["tar", "-xf", work + ".tar", "-C", work], check=True)
        os.remove(work + ".tar")
        label = "unsloth-" + leg.unsloth
        code = subprocess.run(
            [
                python,
                os.path.join(ROOT, "scripts", "mutation.py"),
                "run",
                "--python",
                python,
                "--label",
                label,
                "--workdir",
                work,
                "--jobs",
                str(args.jobs),
                "--alive-from",
                FIRST,
            ]
        ).returncode
        if code != 0:
            sys.exit(f"the mutation run on {name} failed (exit {code})")


def result_files(labels=None):
    files = sorted(f for f in os.listdir(RESULTS) if f.startswith("results-") and f.endswith(".json"))
    return [json.load(open(os.path.join(RESULTS, f))) for f in files if not labels or f[8:-5] in labels]


def merged(labels=None):
    """{mutant: {killed, fate, by}}: killed on any leg counts (each patch set runs on its own shape only)."""
    found = {}
    for result in result_files(labels):
        for mutant, r in result["mutants"].items():
            killed = r["fate"] not in ("survived", "no tests", "not run")
            old = found.get(mutant)
            if (
                old is None
                or (killed and not old["killed"])
                or (not old["killed"] and old["fate"] in ("no tests", "not run"))
            ):
                found[mutant] = {"killed": killed, "fate": r["fate"], "by": f"{result['label']} pass {r['pass']}"}
    return found


def equivalents():
    found = {}
    if os.path.exists(EQUIVALENT):
        for line in open(EQUIVALENT):
            if line.strip() and not line.startswith("#"):
                mutant, _, reason = line.strip().partition(" ")
                found[mutant] = reason.strip()
    return found


def diff_of(mutant):
    """The mutated line(s), from mutmut's own diff (mutants/ here, or a leg's: the same source, mutated alike)."""
    legs = [os.path.join(ROOT, ".matrix", name + ".mutation") for name in LEGS]
    os.chdir(next((d for d in [ROOT, *legs] if os.path.isdir(os.path.join(d, "mutants"))), ROOT))
    from mutmut.__main__ import find_mutant
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(mutant, path=find_mutant(mutant).path)
    return [line for line in diff.splitlines() if re.match(r"^[+-](?![+-])", line)]


def report(args):
    results, said = merged(), equivalents()
    legs = result_files()
    stale = sorted(set(said) - set(results))
    if stale:
        sys.exit(f"mutation/equivalent.txt names mutants that no longer exist: {stale}")
    alive = sorted(m for m, r in results.items() if not r["killed"])
    open_ = [m for m in alive if m not in said]
    equivalent = [m for m in alive if m in said]
    killed = len(results) - len(alive)
    score = killed / max(len(results) - len(equivalent), 1)
    modules = {}
    for mutant, r in results.items():
        row = modules.setdefault(mutant.split(".x")[0], [0, 0, 0, 0])
        row[0] += 1
        row[1] += r["killed"]
        row[2] += mutant in said and not r["killed"]
        row[3] += not r["killed"] and mutant not in said
    lines = [
        "# Mutation testing of the core",
        "",
        "Written by `scripts/mutation.py report` (`make mutation`); do not edit. Justifications of equivalent",
        "mutants: `mutation/equivalent.txt`.",
        "",
        f"**Score: {killed} killed / {len(results) - len(equivalent)} non-equivalent = {100 * score:.1f} %** "
        f"({len(results)} mutants, {len(equivalent)} equivalent, {len(open_)} surviving).",
        "",
        "Results: "
        + "; ".join(f"{r['label']} ({len(r['mutants'])} mutants; its last run {r['seconds']} s)" for r in legs)
        + ".",
        "",
        "| module | mutants | killed | equivalent | surviving |",
        "|---|---|---|---|---|",
        *(f"| {m} | {a} | {b} | {c} | {d} |" for m, (a, b, c, d) in sorted(modules.items())),
        "",
        "## Surviving (no test kills them yet)",
        "",
        *(f"- `{m}`: `{' / '.join(diff_of(m))}`" for m in open_),
        *([] if open_ else ["None."]),
        "",
        "## Equivalent (behaviour cannot differ)",
        "",
        *(f"- `{m}`: `{' / '.join(diff_of(m))}` — {said[m]}" for m in equivalent),
        *([] if equivalent else ["None."]),
        "",
        "## Every mutant",
        "",
        "| mutant | fate | by |",
        "|---|---|---|",
        *(
            f"| `{m}` | {'equivalent' if m in said and not r['killed'] else r['fate']} | {r['by']} |"
            for m, r in sorted(results.items())
        ),
        "",
    ]
    open(REPORT, "w").write("\n".join(lines))
    print(
        f"score {100 * score:.1f} %: {killed} killed, {len(equivalent)} equivalent, {len(open_)} surviving "
        f"of {len(results)}; wrote {os.path.relpath(REPORT, ROOT)}"
    )
    return 0 if score >= args.min_score else 1


def mutmut_fastest_first(argv):
    """mutmut's own command line, with one change: its fork server gets each mutant's tests fastest first,
    as mutmut's plain fork runner orders them (torch needs the fork server), so a killed mutant stops
    at its first failing test early."""
    from mutmut.__main__ import cli
    from mutmut.state import state
    from mutmut.workers.isolation import ForkServerRunner

    submit = ForkServerRunner.submit

    def sorted_submit(self, mutant_name, tests, *rest):
        return submit(self, mutant_name, sorted(tests, key=lambda t: state().duration_by_test[t]), *rest)

    ForkServerRunner.submit = sorted_submit
    return cli(argv, prog_name="mutmut")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["mutmut"]:
        return mutmut_fastest_first(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="pass 1 (mutmut) and pass 2 in one environment")
    r.add_argument("--python", help="the environment's python (default: this one)")
    r.add_argument("--label", required=True, help="names the result file, e.g. unsloth-2026.10.6")
    r.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    r.add_argument("--alive-from", nargs="+", help="only the mutants these runs left alive (labels)")
    r.add_argument(
        "--again",
        action="store_true",
        help="rerun only what this label's last run (or mutmut's own results, before a first report) left alive",
    )
    r.add_argument("--workdir", help="run mutmut in this copy of the tree (default: the checkout)")
    r.add_argument(
        "--mutants",
        nargs="+",
        help="only these mutants (fnmatch patterns, e.g. all of a function "
        "that changed: its mutants are renumbered); the rest keep this label's last verdicts",
    )
    g = sub.add_parser("legs", help="the other code shapes' legs (built as in scripts/matrix.py)")
    g.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    g.add_argument("--only", nargs="+", choices=LEGS, help="these legs only")
    p = sub.add_parser("report", help="mutation/report.md from every result file")
    p.add_argument("--min-score", type=float, default=0.95)
    args = parser.parse_args(argv)
    return {"run": run, "legs": legs, "report": report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())

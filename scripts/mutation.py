"""Mutation testing of the core (the runtime room): does the suite fail when the code is wrong?

    python scripts/mutation.py run --label unsloth-2026.10.6   # pass 1 + pass 2 in this environment
    python scripts/mutation.py legs                            # the other code shapes' legs: what is alive here
    python scripts/mutation.py report                          # mutation/report.md and records/mutation.json
    python scripts/mutation.py forget                          # drop the verdicts of functions the core lost

After new tests, `run --label L --again` (with the leg's --python and --workdir for a leg) reruns only what
L's last run left alive; after a function changed, `run --label L --mutants module.function` (a method:
module.Class.method) reruns all of its mutants (renamed: `--mutants OLD NEW` also drops the old name's
verdicts; a stopped `--mutants` run goes on with the same names and `--go-on`); `legs --only LEG` runs one leg. A run stopped part-way goes on where it stopped with `run --label L`
alone: mutmut keeps each verdict under mutants/ as it comes (`make mutation` starts over: it removes mutants/).
After functions changed, `legs --mutants NAMES` reruns theirs on each leg and keeps the leg's other verdicts.
`run --label L --changed-since REV` runs every mutant of the functions changed since REV (the report's commit);
with `--go-on` it goes on with a stopped one.

`make mutation` runs both, on the chunked-shape release (.venv) and then on the legs of the other two code
shapes (2026.10.4 dense, 2026.10.9 native: a patch set is only reachable on its own shape), which get the
mutants the first left alive. Takes several hours on 2 cores (the native leg alone 75 minutes); not part of CI.

Pass 1 is mutmut (config in pyproject.toml): it copies the package to mutants/, compiles every mutant of the
core in behind a switch, maps each test to the functions it calls, and runs, per mutant, the tests of its
function - forked from a server that has already imported Unsloth. mutmut sees only what runs in its own
process, so pass 2 takes each mutant pass 1 left alive in a function that only a fresh interpreter or
launched ranks reach (`FRESH`) and runs those tests with the mutant switched on (MUTANT_UNDER_TEST and
PYTHONPATH are inherited by every child process, so they import the mutated copy).

The report lists every mutant with its fate. A survivor is either killed by a new test or named in
mutation/equivalent.txt with a one-line reason why no behaviour can differ (or, still surviving, in
mutation/out-of-reach.txt with what only a CUDA machine has); the score is killed / (all - equivalent).
`report` also writes the record records/mutation.json (`records.write`, always): the score, the killed,
non-equivalent, equivalent and surviving counts, each leg's mutants and seconds, and the per-module counts, with
the module table as tables.modules; the pages render their figures from it.

Names: a mutant is `module.function#N` or `module.Class.method#N` (its function's qualified name and mutmut's
number), in every table here, the result files, equivalent.txt and the report. mutmut's own spelling
(`module.x_function__mutmut_N`, `module.xǁClassǁmethod__mutmut_N`) is met only where mutmut is: `qualified` and
`mangled` translate (tests/unit/test_mutation_tables.py checks every name against the source).
"""

import argparse
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
# Survivors no CPU run can kill (a CUDA device, a model split over devices): why, in equivalent.txt's format.
# They stay surviving in the score; the report gives each its reason.
OUT_OF_REACH = os.path.join(RESULTS, "out-of-reach.txt")
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
LOWER_VARIANCE_STATUS = (
    TESTS + "test_lower_variance.py::test_a_run_that_asks_for_them_says_so_once_at_construction_and_status_names_them"
)
BROKEN = [TESTS + "test_field.py::test_a_missing_dependency_is_named_as_a_broken_installation"]
# A user's run: the sample YAML and a command line through TrlParser, watched in TensorBoard and W&B.
EXAMPLE = [TESTS + "test_field.py::test_example_script_trains_from_its_sample_yaml_with_flags_from_the_command_line"]
RANKS = [TESTS + "multiprocess/test_data_parallel.py"]
GATHERED = [TESTS + "multiprocess/test_gathered.py"]  # two ranks, no model: the metrics' gathers alone
# Functions that only fresh interpreters or launched ranks reach (wholly or in part) -> those tests.
FRESH = {
    "unsloth_diffusion_norm._switch": SWITCH,
    "unsloth_diffusion_norm.activation.register_hooks": HOOKS,
    "unsloth_diffusion_norm.hooks.run_after_import": HOOKS,
    "unsloth_diffusion_norm.hooks._PostImportFinder.*": HOOKS,
    "unsloth_diffusion_norm.hooks._HookedLoader.*": HOOKS,
    "unsloth_diffusion_norm.activation._on_trainer_module": HOOKS + DISABLED,
    "unsloth_diffusion_norm.activation._on_unsloth": HOOKS,
    "unsloth_diffusion_norm.report.warn_once": SWITCH + BROKEN,
    "unsloth_diffusion_norm.activation.disable": DISABLED,
    "unsloth_diffusion_norm.activation._accept_flags_only": DISABLED,
    "unsloth_diffusion_norm.activation._broken": BROKEN,
    "unsloth_diffusion_norm.activation._install_hint": BROKEN,
    "unsloth_diffusion_norm.activation.apply": HOOKS + BROKEN,
    # What it may import (nothing while no trainer is alive) shows in a fresh interpreter; and mutmut maps only
    # new tests to functions, so a function added after its stats were collected needs its tests named.
    "unsloth_diffusion_norm.report._asked_by_trainers": HOOKS[:1] + [LOWER_VARIANCE_STATUS],
    "unsloth_diffusion_norm.construction.flags_only": DISABLED,
    "unsloth_diffusion_norm.construction._refuse_flags": DISABLED,
    "unsloth_diffusion_norm.window.data_parallel_rule": RANKS,
    "unsloth_diffusion_norm.window.counting_rule": RANKS,
    "unsloth_diffusion_norm.window.trainer_counting": RANKS,  # (one process: no replicas, whatever it reads)
    "unsloth_diffusion_norm.window.Window.noise": RANKS,
    "unsloth_diffusion_norm.window.Window.divide": RANKS,
    "unsloth_diffusion_norm.per_sample.DataOrder.tag": RANKS,
    # The flags' annotations are made as config is imported, before mutmut's server forks; the samples reach
    # TensorBoard's writer and W&B's run only where a run reports to them.
    "unsloth_diffusion_norm.config._annotation": [
        "tests/unit/test_config.py::test_each_flag_is_one_record_and_everything_that_lists_flags_derives_from_it",
        *EXAMPLE,
        *DISABLED[:1],
    ],
    "unsloth_diffusion_norm.samples._callback_class": EXAMPLE,
    # What ranks hand each other at a log or an evaluation's end, where they hold different steps or nothing; a
    # run's own metrics records (made per trainer, with its accelerator and count rule) under DDP.
    "unsloth_diffusion_norm.metrics.OwnSteps.*": GATHERED,
    "unsloth_diffusion_norm.metrics._row": GATHERED,
    "unsloth_diffusion_norm.metrics.EvalScores.size": GATHERED,
    "unsloth_diffusion_norm.metrics.EvalScores.vector": GATHERED,
    "unsloth_diffusion_norm.metrics.EvalScores.named": GATHERED,
    "unsloth_diffusion_norm.metrics.EvalScores.add": GATHERED,
    "unsloth_diffusion_norm.evaluation.EvalOrder.finish": GATHERED,
    "unsloth_diffusion_norm.metrics.observer": RANKS,
    "unsloth_diffusion_norm.metrics._kept": RANKS,
    "unsloth_diffusion_norm.metrics.own_steps": RANKS,
}
# mutmut's class-method separator: `module.xǁClassǁmethod__mutmut_N`.
CLASS = "ǁ"


def qualified(name):
    """mutmut's name of a mutant or function (or an fnmatch pattern of one) -> ours, the source's own names:
    `pkg.mod.x_f__mutmut_3` -> `pkg.mod.f#3`, `pkg.mod.xǁCǁm` -> `pkg.mod.C.m`."""
    function, mutant, number = name.partition("__mutmut_")
    module, _, function = function.rpartition(".")
    if function.startswith("x" + CLASS):
        function = function[2:].replace(CLASS, ".", 1)
    elif function.startswith("x_"):
        function = function[2:]
    else:
        raise ValueError(f"not mutmut's name of a function: {name}")
    return f"{module}.{function}" + (f"#{number}" if mutant else "")


def mangled(name):
    """Ours -> mutmut's (qualified's inverse). A method's name is one whose part before the last is not a module
    of the tree but the part before that is: `pkg.mod.C.m#3` -> `pkg.mod.xǁCǁm__mutmut_3`."""

    def is_module(parts):
        path = os.path.join(ROOT, *parts)
        return bool(parts) and (os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py")))

    function, mutant, number = name.partition("#")
    *module, function = function.split(".")
    if not is_module(module) and is_module(module[:-1]):
        function = f"{CLASS}{module.pop()}{CLASS}{function}"
    else:
        function = "_" + function
    return ".".join(module) + f".x{function}" + (f"__mutmut_{number}" if mutant else "")


def mutmut_results():
    """{mutant: exit code} from mutmut's own files under mutants/."""
    found = {}
    for folder, _, files in os.walk(os.path.join(WORK, "mutants", "unsloth_diffusion_norm")):
        for name in files:
            if name.endswith(".py.meta"):
                codes = json.load(open(os.path.join(folder, name)))["exit_code_by_key"]
                found.update((qualified(m), c) for m, c in codes.items())
    return found


def fate_of(code):
    """mutmut's exit code -> fate; None: mutmut never ran it (stopped, or not asked), which is not a kill."""
    if code is None:
        return "not run"
    return KILLED.get(code, "survived" if code == 0 else "no tests" if code == 33 else f"exit {code}")


def function_of(mutant):
    return mutant.partition("#")[0]


def order(mutant):
    """Sorts a function's mutants in mutmut's order (#2 before #10)."""
    return function_of(mutant), int(mutant.partition("#")[2])


def fresh_tests(mutant):
    tests = []
    for pattern, names in FRESH.items():
        if fnmatch.fnmatchcase(function_of(mutant), pattern):
            tests += [n for n in names if n not in tests]
    return tests


def run_fresh(python, mutant, tests):
    """Pass 2 for one mutant (mutmut's name, or "fail": every mutated function fails): pytest in a fresh
    interpreter in mutants/, the mutant switched on."""
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


def changed_functions(base):
    """The core's functions and methods (ours: module.function, module.Class.method) whose code differs from
    commit `base`'s, or that it lacks: what a report stamped at `base` has not mutated."""

    def at_base(path):
        shown = subprocess.run(["git", "show", f"{base}:{path}"], cwd=ROOT, capture_output=True, text=True)
        return shown.stdout if shown.returncode == 0 else ""

    then = function_code(at_base)
    return [function for function, code in function_code().items() if then.get(function) != code]


def run(args):
    global WORK
    WORK = os.path.abspath(args.workdir or ROOT)
    python = args.python or sys.executable
    if args.changed_since:  # their mutants by exact name where mutmut has made them (so --go-on can skip decided)
        functions = set(changed_functions(args.changed_since))
        exact = sorted((m for m in mutmut_results() if function_of(m) in functions), key=order)
        args.mutants = (args.mutants or []) + (exact or sorted(functions))
    env = {**os.environ, **SINGLE_THREADED, "UNSLOTH_ALLOW_CPU": "1"}
    started = time.time()
    names = []
    out = os.path.join(RESULTS, f"results-{args.label}.json")
    before = json.load(open(out))["mutants"] if (args.again or args.mutants) and os.path.exists(out) else {}
    # Ours (a function's name: all of its mutants) or mutmut's own patterns -> mutmut's, as mutmut matches them.
    patterns = [
        p if "__mutmut_" in p or CLASS in p else mangled(p if "#" in p else p + "#*") for p in args.mutants or ()
    ]

    def changed(mutant):  # of a function that changed since the last run: its old verdicts say nothing now
        return any(fnmatch.fnmatchcase(mangled(mutant), pattern) for pattern in patterns)

    before = {m: r for m, r in before.items() if not changed(m)}
    said = reasons()
    if args.mutants:  # these, the rest as the last run found them
        print(f"pass 1 on {args.label}: {' '.join(args.mutants)}", flush=True)
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
            and (r["fate"] in ("no tests", "not run") or function_of(m) in SHAPE_SPECIFIC)
        )
        print(f"pass 1 on {args.label}: the {len(names)} mutants left alive there", flush=True)
    selection = patterns or [mangled(m) for m in names]
    if args.go_on:  # a stopped --mutants run: mutmut reruns every mutant it is named, decided or not
        decided = {mangled(m) for m, code in mutmut_results().items() if code is not None}
        selection = [p for p in selection if p not in decided]
        print(f"going on: {len(selection)} of them not decided yet in {os.path.relpath(WORK, ROOT)}", flush=True)
    # Going on with nothing left undecided: no pass 1 (mutmut named nothing runs every mutant it has not decided,
    # those of the functions that did not change included), straight to pass 2.
    stopped = False
    if selection or not args.go_on:
        command = [python, os.path.abspath(__file__), "mutmut", "run", "--max-children", str(args.jobs), *selection]
        stopped = _mutmut_run(command, env, args.minutes)
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
    # (After a stopped pass 1 there is none: `run --again` goes on with what it left, pass 2 included.)
    todo = (
        {}
        if stopped
        else {
            m: fresh_tests(m)
            for m, r in results.items()
            if r["fate"] in ("survived", "no tests")
            and m not in said
            and fresh_tests(m)
            and (changed(m) or not args.mutants)
        }
    )
    groups = sorted({tuple(t) for t in todo.values()})
    for tests in groups:
        missing = [t for t in tests if not os.path.exists(os.path.join(WORK, "mutants", t.partition("::")[0]))]
        if missing:  # (pytest's usage error would read as a kill)
            sys.exit(f"pass 2: mutmut's copy lacks {missing}: run pass 1 again, which copies the tests")
        if tests != tuple(RANKS) and run_fresh(python, "fail", list(tests))[0] == 0:
            sys.exit(f"pass 2 cannot see mutants: {tests} pass with every mutated function failing")
    print(f"pass 2 on {args.label}: {len(todo)} mutants in fresh interpreters / launched ranks", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for mutant, (code, seconds) in zip(todo, pool.map(lambda m: run_fresh(python, mangled(m), todo[m]), todo)):
            fate = "killed" if code not in (0, 5) else "survived"
            results[mutant] = {"pass": 2, "code": code, "fate": fate, "seconds": seconds}
            print(f"  {fate:8} {mutant} ({seconds} s)", flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    json.dump(
        {
            "label": args.label,
            "pass1_seconds": round(first),
            "seconds": round(time.time() - started),
            **({"stopped": f"after {args.minutes} minutes of pass 1; `run --again` goes on"} if stopped else {}),
            "mutants": results,
        },
        open(out, "w"),
        indent=1,
        sort_keys=True,
    )
    print(f"wrote {os.path.relpath(out, ROOT)} ({round(time.time() - started)} s)")


def _mutmut_run(command, env, minutes):
    """Pass 1 in its own process group; with `minutes`, stopped whole when they are up. True if stopped: mutmut
    keeps each verdict under mutants/ as it comes, so what it decided by then is recorded and the rest is
    'not run'."""
    process = subprocess.Popen(command, cwd=WORK, env=env, start_new_session=True)
    try:
        code = process.wait(timeout=minutes * 60 if minutes else None)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
        print(f"pass 1 stopped after {minutes} minutes", flush=True)
        return True
    if code != 0:
        sys.exit(f"mutmut run failed (exit {code})")
    return False


# The other code shapes, each on its leg of scripts/matrix.py: the mutants the first run left alive (above
# all the dense loss and the native patch set, which no test reaches on 2026.10.6) run there.
LEGS = ["unsloth-2026.10.4-transformers-5.17.0-trl-1.15.0", "unsloth-2026.10.9-transformers-5.17.0-trl-1.15.0"]
FIRST = "unsloth-2026.10.6"  # `make mutation`'s run in .venv
# Functions whose code runs only on another shape: a survivor of the first run may die there. (Any other
# survivor would survive a leg too: the same code under the same tests.)
SHAPE_SPECIFIC = {
    "unsloth_diffusion_norm.activation.apply",
    "unsloth_diffusion_norm.native.release_patches",
    "unsloth_diffusion_norm.native._trainer_init",
    "unsloth_diffusion_norm.native.trainer_patches",
    "unsloth_diffusion_norm.native._profile_loss",
    "unsloth_diffusion_norm.native._loss",
    "unsloth_diffusion_norm.native._per_sample_noise",
    "unsloth_diffusion_norm.native._fetch_undrawn_patch",
    "unsloth_diffusion_norm.native._keyed_prepare_batch",
    "unsloth_diffusion_norm.native._tagged_batch_samples",
    "unsloth_diffusion_norm.native._fetch_undrawn",
    "unsloth_diffusion_norm.native._loss_drawn_at_first_step",
    "unsloth_diffusion_norm.loss.dense_cross_entropy",
    "unsloth_diffusion_norm.config.upstream_normalization_for",
    "unsloth_diffusion_norm.config.plugin_draws_for",
    "unsloth_diffusion_norm.evaluation._label",  # a trainer instance's patches: on a native release only
    "unsloth_diffusion_norm.evaluation.keyed_upstream_loss",
    "unsloth_diffusion_norm.native._observed_patches",  # a per-micro-batch run's observing draw: native only
    "unsloth_diffusion_norm.native._observed_loss",
    "unsloth_diffusion_norm.metrics.log_drawn",  # a window upstream drew at its fetch: native only
    "unsloth_diffusion_norm.metrics.training_accuracy",  # where the loss holds the logits: the dense shape only
    "unsloth_diffusion_norm.metrics.TrainingAccuracy.__init__",
    "unsloth_diffusion_norm.metrics.TrainingAccuracy.collected",
    "unsloth_diffusion_norm.metrics.TrainingAccuracy.counted",
    "unsloth_diffusion_norm.metrics.TrainingAccuracy.scored",
    "unsloth_diffusion_norm.metrics.TrainingAccuracy.take",
    "unsloth_diffusion_norm.window.Window.scorer",  # (a Window has a scorer on the dense shape only)
}


def legs(args):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import matrix

    for name in args.only or LEGS:
        # The matrix's own environment, reused as it is (DeepSpeed included where the leg has it: built without it,
        # the stamp would differ and the matrix's leg would be built again).
        leg = next(leg for leg in matrix.LEGS if leg.name == name)
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
        if not args.go_on:  # (going on: its mutants/ and their verdicts stay; the tracked files are refreshed)
            subprocess.run(["rm", "-rf", work], check=True)
        os.makedirs(work, exist_ok=True)
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
                # named mutants (of functions that changed): the rest keep this leg's last verdicts
                *(["--mutants", *args.mutants] if args.mutants else ["--alive-from", FIRST]),
                *(["--go-on"] if args.go_on else []),
                *(["--minutes", str(args.minutes)] if args.minutes else []),
            ]
        ).returncode
        if code != 0:
            sys.exit(f"the mutation run on {name} failed (exit {code})")


def result_files(labels=None):
    files = sorted(f for f in os.listdir(RESULTS) if f.startswith("results-") and f.endswith(".json"))
    return [json.load(open(os.path.join(RESULTS, f))) for f in files if not labels or f[8:-5] in labels]


def function_code(source_of=None):
    """{qualified name: its ast dump} of the core's functions and of its module-level classes' methods;
    `source_of(path)` gives a module's text (default: the checkout's)."""
    import ast

    found = {}
    for name in sorted(os.listdir(os.path.join(ROOT, "unsloth_diffusion_norm"))):
        if not name.endswith(".py"):
            continue
        path, stem = f"unsloth_diffusion_norm/{name}", name[: -len(".py")]
        module = "unsloth_diffusion_norm" + ("" if stem == "__init__" else "." + stem)
        source = source_of(path) if source_of else open(os.path.join(ROOT, path), encoding="utf-8").read()
        for node in ast.parse(source, path).body:
            members = [("", node)] if not isinstance(node, ast.ClassDef) else [(node.name + ".", m) for m in node.body]
            for prefix, member in members:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{module}.{prefix}{member.name}"] = ast.dump(member)
    return found


def forget(args):
    """Drop from every result file the verdicts of functions the core no longer has (moved or renamed: their
    new names' mutants run with `run --mutants NEW`), and, where the checkout's mutants/ holds the mutants of
    today's core, of mutant numbers it no longer has (a function that changed has fewer); the report then
    describes only code the core holds."""
    core = set(function_code())  # the core's functions and methods, by name
    existing = set(mutmut_results())  # every mutant of the core as mutants/ has it (empty without mutants/)
    for name in sorted(f for f in os.listdir(RESULTS) if f.startswith("results-") and f.endswith(".json")):
        path = os.path.join(RESULTS, name)
        result = json.load(open(path))
        gone = sorted({function_of(m) for m in result["mutants"]} - core)
        lost = sorted(m for m in result["mutants"] if existing and function_of(m) in core and m not in existing)
        if gone or lost:
            result["mutants"] = {m: r for m, r in result["mutants"].items() if function_of(m) in core and m not in lost}
            json.dump(result, open(path, "w"), indent=1, sort_keys=True)
            print(f"{name}: forgot the verdicts of {', '.join(gone + lost)}")


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


PINNED = "    "  # indented under an entry: that mutant's mutated lines as they were when it was judged


def reasons(path=EQUIVALENT, pinned=False):
    """{mutant: reason} of a file of named mutants (mutation/equivalent.txt, or out-of-reach.txt); pinned=True:
    {mutant: [its mutated lines as judged]}."""
    found, pins, mutant = {}, {}, None
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            if line.startswith(PINNED):
                pins.setdefault(mutant, []).append(line[len(PINNED) :].rstrip("\n"))
            elif line.strip() and not line.startswith("#"):
                mutant, _, reason = line.strip().partition(" ")
                found[mutant] = reason.strip()
    return pins if pinned else found


def pin_reasons(current, path=EQUIVALENT):
    """Hold each equivalent to the mutation it was judged on. mutmut numbers a function's mutants in order, so
    a change to the function renumbers them and an entry silently comes to name another mutation: refuse
    that, and write the mutated lines under each entry that has none yet. `current`: {mutant: [mutated lines]}."""
    pins = reasons(path, pinned=True)
    moved = {m: (pins[m], now) for m, now in current.items() if m in pins and pins[m] != now}
    if moved:
        sys.exit(
            f"mutation/{os.path.basename(path)}: these entries now name another mutation (the function changed and "
            "mutmut renumbered its mutants; find each reason's mutant anew):\n"
            + "\n".join(f"  {m}: judged on {was}, now {now}" for m, (was, now) in moved.items())
        )
    out = []
    for line in open(path, encoding="utf-8").read().splitlines():
        if line.startswith(PINNED):
            continue  # written anew below, from the checked pins or the current diff
        out.append(line)
        mutant = line.split(" ", 1)[0] if line.strip() and not line.startswith("#") else None
        out.extend(PINNED + mutated for mutated in pins.get(mutant) or current.get(mutant) or [])
    open(path, "w", encoding="utf-8").write("\n".join(out) + "\n")


def diff_of(mutant):
    """The mutated line(s), from mutmut's own diff (mutants/ here, or a leg's: the same source, mutated alike)."""
    legs = [os.path.join(ROOT, ".matrix", name + ".mutation") for name in LEGS]
    os.chdir(next((d for d in [ROOT, *legs] if os.path.isdir(os.path.join(d, "mutants"))), ROOT))
    from mutmut.__main__ import find_mutant
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(mangled(mutant), path=find_mutant(mangled(mutant)).path)
    return [line for line in diff.splitlines() if re.match(r"^[+-](?![+-])", line)]


def stamp():
    """The commit the report is written at, and whether the core or the tests differ from it (the results then
    describe code no commit holds)."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    dirty = git("status", "--porcelain", "--", "unsloth_diffusion_norm", "tests")
    return git("rev-parse", "--short", "HEAD") + (" with uncommitted changes to the core or the tests" if dirty else "")


def summary(results=None, said=None):
    """The report's figures from every result file: the score and its counts, each leg's mutants and seconds, and
    the per-module table (as report.md prints it)."""
    results = merged() if results is None else results
    said = reasons() if said is None else said
    alive = sorted((m for m, r in results.items() if not r["killed"]), key=order)
    open_ = [m for m in alive if m not in said]
    equivalent = [m for m in alive if m in said]
    killed = len(results) - len(alive)
    modules = {}
    for mutant, r in results.items():
        row = modules.setdefault(mangled(mutant).rpartition(".")[0], [0, 0, 0, 0])
        row[0] += 1
        row[1] += r["killed"]
        row[2] += mutant in said and not r["killed"]
        row[3] += not r["killed"] and mutant not in said
    return {
        "killed": killed,
        "non_equivalent": len(results) - len(equivalent),
        "score": killed / max(len(results) - len(equivalent), 1),
        "mutants": len(results),
        "equivalent": len(equivalent),
        "surviving": len(open_),
        "legs": {r["label"]: {"mutants": len(r["mutants"]), "seconds": r["seconds"]} for r in result_files()},
        "modules": {
            module: dict(zip(("mutants", "killed", "equivalent", "surviving"), row))
            for module, row in sorted(modules.items())
        },
        "open": open_,
        "equivalent_names": equivalent,
    }


def module_table(found):
    return [
        "| module | mutants | killed | equivalent | surviving |",
        "|---|---|---|---|---|",
        *(
            f"| {m} | {r['mutants']} | {r['killed']} | {r['equivalent']} | {r['surviving']} |"
            for m, r in found["modules"].items()
        ),
    ]


def write_record(counted, **where):
    """records/mutation.json: the score, its counts, each leg's mutants and seconds, the per-module counts and
    table. `where`: records.write's commit/date/where/source, for a record made from result files written before."""
    sys.path.insert(0, ROOT)
    from unsloth_diffusion_norm.tools import records

    figures = {k: v for k, v in counted.items() if k not in ("open", "equivalent_names")}
    figures["legs"] = {label.replace(".", "-"): leg for label, leg in counted["legs"].items()}  # dotted keys
    figures["modules"] = {m.replace(".", "-"): r for m, r in counted["modules"].items()}
    covers = {"the core": ["unsloth_diffusion_norm/*.py"], "the tests": ["tests/**"]}
    # The releases of the results files (each leg's own environment), not this interpreter's alone.
    found = {"unsloth": ", ".join(sorted(label.removeprefix("unsloth-") for label in counted["legs"]))}
    where.setdefault("found", found)
    return records.write(
        "mutation",
        "python scripts/mutation.py report (make mutation)",
        figures,
        covers=covers,
        tables={"modules": "\n".join(module_table(counted))},
        **where,
    )


def report(args):
    results, said = merged(), reasons()
    legs = result_files()
    stale = sorted(set(said) - set(results))
    if stale:
        sys.exit(f"mutation/equivalent.txt names mutants that no longer exist: {stale}")
    found = summary(results, said)
    open_, equivalent = found["open"], found["equivalent_names"]
    why = reasons(OUT_OF_REACH)
    if set(why) - set(open_):
        sys.exit(f"mutation/out-of-reach.txt names mutants that are not surviving: {sorted(set(why) - set(open_))}")
    mutated = {m: diff_of(m) for m in [*open_, *said]}
    pin_reasons({m: mutated[m] for m in said})
    pin_reasons({m: mutated[m] for m in why}, path=OUT_OF_REACH)
    killed, score = found["killed"], found["score"]
    lines = [
        "# Mutation testing of the core",
        "",
        "Written by `scripts/mutation.py report` (`make mutation`); do not edit. Justifications of equivalent",
        "mutants: `mutation/equivalent.txt`.",
        "",
        f"At commit {stamp()}.",
        "",
        f"**Score: {killed} killed / {len(results) - len(equivalent)} non-equivalent = {100 * score:.1f} %** "
        f"({len(results)} mutants, {len(equivalent)} equivalent, {len(open_)} surviving).",
        "",
        "Results: "
        + "; ".join(f"{r['label']} ({len(r['mutants'])} mutants; its last run {r['seconds']} s)" for r in legs)
        + ".",
        "",
        *module_table(found),
        "",
        "## Surviving (no test kills them yet; out of a CPU run's reach: mutation/out-of-reach.txt)",
        "",
        *(f"- `{m}`: `{' / '.join(mutated[m])}`" + (f" — {why[m]}" if m in why else "") for m in open_),
        *([] if open_ else ["None."]),
        "",
        "## Equivalent (behaviour cannot differ)",
        "",
        *(f"- `{m}`: `{' / '.join(mutated[m])}` — {said[m]}" for m in equivalent),
        *([] if equivalent else ["None."]),
        "",
        "## Every mutant",
        "",
        "| mutant | fate | by |",
        "|---|---|---|",
        *(
            f"| `{m}` | {'equivalent' if m in said and not r['killed'] else r['fate']} | {r['by']} |"
            for m, r in sorted(results.items(), key=lambda item: order(item[0]))
        ),
        "",
    ]
    open(REPORT, "w").write("\n".join(lines))
    write_record(found)  # records/mutation.json: the figures pages render
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
        "--go-on",
        action="store_true",
        help="with --mutants NAMES (exact names): run only those this work copy's mutants/ has no verdict for yet, "
        "as a stopped run goes on (mutmut reruns every mutant it is named); the results keep all of them",
    )
    r.add_argument(
        "--changed-since",
        metavar="REV",
        help="with --mutants or alone: every mutant of the core's functions that changed since REV (the last report's "
        "commit), e.g. `run --label L --changed-since 7c4899a --go-on` goes on with a stopped run of them",
    )
    r.add_argument(
        "--minutes",
        type=float,
        help="stop pass 1 after this long and record what it decided (the rest 'not run'; `--again` goes on)",
    )
    r.add_argument(
        "--mutants",
        nargs="+",
        help="only these mutants: module.function#N or module.Class.method#N (fnmatch patterns; a bare function "
        "or method name: all of its mutants, e.g. of one that changed, whose mutants are renumbered; mutmut's own "
        "spelling is taken too); the rest keep this label's last verdicts",
    )
    g = sub.add_parser("legs", help="the other code shapes' legs (built as in scripts/matrix.py)")
    g.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    g.add_argument("--only", nargs="+", choices=LEGS, help="these legs only")
    g.add_argument(
        "--mutants",
        nargs="+",
        help="as `run --mutants`, on each leg: these mutants (or a function's: all of them), the rest of the leg's "
        "verdicts kept (by default the leg runs what the first run left alive, and its results file holds only those)",
    )
    g.add_argument("--go-on", action="store_true", help="with --mutants: as `run --go-on`, in the leg's kept copy")
    g.add_argument("--minutes", type=float, help="as `run --minutes`")
    p = sub.add_parser("report", help="mutation/report.md and records/mutation.json from every result file")
    p.add_argument("--min-score", type=float, default=0.95)
    sub.add_parser("forget", help="drop the verdicts of functions the core no longer has from every result file")
    args = parser.parse_args(argv)
    return {"run": run, "legs": legs, "report": report, "forget": forget}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())

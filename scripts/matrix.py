"""The version matrix: one virtual environment per leg, the whole test suite in each, one table.

    python3 scripts/matrix.py [--legs NAME ...] [--page docs/compatibility.md] [--results matrix/results.json]

Each leg pins an Unsloth release with a transformers / TRL pair (the newest this project develops with,
or the oldest that release still trains with). A leg's environment lives in .matrix/<leg>/ and is built
once (torch pinned to the CPU wheel, torchvision removed, the plugin installed from this checkout). The
tests themselves know which mode each release must get; each leg runs the tiers that tell releases apart
(`Leg.select`, `Leg.paths`). Results go to a JSON file, and the compatibility table (docs/compatibility.md) is written
from it, never by hand. Every run (--table-only too) also writes the record records/matrix.json from the results
(`records.write`: each leg's versions, mode, counts, result and seconds, and the table as tables.compatibility);
--no-record writes none.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE_START, TABLE_END = "<!-- compatibility table: start -->", "<!-- compatibility table: end -->"


@dataclass
class Leg:
    unsloth: str
    transformers: str
    trl: str
    note: str
    # Which tiers this leg runs (a pytest -m expression, and paths): the tiers that tell releases apart.
    # `make test` runs everything on 2026.10.6 / 5.17 / 1.15 but the three-rank and two-node launches (three_ranks,
    # multi_node: the other shapes'); the launched-rank tier (multiprocess) runs again on one leg per other code
    # shape, the DeepSpeed / FSDP2 one (sharded) on the native leg, and our release-independent tooling checks
    # (once) nowhere else.
    select: str = "not multiprocess and not once"
    paths: tuple = ()
    # Left out of `paths`: what another leg already runs on the same code shape (files, or tests by node id).
    leaves_out: tuple = ()
    # How pytest-xdist hands out the tests: whole files (a file's launch or fixtures run once), or one test at a
    # time where the leg is one file of fresh interpreters (both workers busy).
    dist: str = "loadfile"
    sharded: bool = False  # install DeepSpeed (the `sharded` extra) into this leg
    notebook: bool = False  # install Jupyter's kernel and client (and matplotlib): the notebook runs in this leg
    # Installed past Unsloth's caps on purpose (uv's --override): these requirements, with the leg's transformers
    # and TRL, replace what Unsloth's metadata asks for. Where Unsloth itself then fails to import, the leg is
    # skipped with that one line; where the plugin fails, it fails.
    past_caps: tuple = ()

    @property
    def name(self):
        return f"unsloth-{self.unsloth}-transformers-{self.transformers}-trl-{self.trl}"


# tests/unit imports no Unsloth: on transformers 5.17 / TRL 1.15 it is `make test`'s own run again, so the legs on
# that stack run the integration tiers alone (the old-stack legs run it: their transformers and TRL differ).
INTEGRATION = ("tests/integration",)
# What the oldest transformers / TRL change on either shape: training, parsing, activation, the release.
OLD_STACK = (
    "tests/unit",
    "tests/integration/test_release.py",
    "tests/integration/test_activation.py",
    "tests/integration/test_field.py",
    "tests/integration/test_oracle_cases.py",
    "tests/integration/test_noise.py",
    "tests/integration/test_fuzz.py",
)
# The dense shape on the oldest stack (tests/unit imports no Unsloth, and the fuzzer's bad input exercises the
# stack's parsers, not the shape: on that stack the chunked-shape leg runs both).
DENSE_OLD_STACK = tuple(path for path in OLD_STACK if path not in ("tests/unit", "tests/integration/test_fuzz.py")) + (
    "tests/integration/test_fuzz.py::test_a_random_configuration_trains_as_the_oracle_says",
)

# The newest Unsloth with the newest transformers and TRL, past its caps: the stack its next release will pin.
# A newer release of any of the three moves the leg with one edit here.
NEWEST = {"unsloth": "2026.10.9", "transformers": "5.25.0", "trl": "1.16.0"}
NEWEST_NEEDS = ("huggingface-hub>=2.4", "kernels")  # what that transformers asks for beyond Unsloth's caps
# Trainer's inner loop, which is what moves between transformers releases: the oracle cases, data parallel,
# evaluation and metrics, resume (noise), the example script (field), and the patches recognised by feature
# (activation, doctor).
# (The release's recognition, test_release, is the 2026.10.9 leg's: the same Unsloth files.)
TRAINER_LOOP = (
    "tests/integration/test_activation.py",
    "tests/integration/test_doctor.py",
    "tests/integration/test_oracle_cases.py",
    "tests/integration/test_evaluation.py",
    "tests/integration/test_noise.py",
    "tests/integration/test_field.py",
    "tests/integration/multiprocess/test_data_parallel.py",
)

LEGS = [
    Leg(
        "2026.10.3",
        "5.17.0",
        "1.13.0",
        "before masked diffusion: unsupported, nothing patched",
        paths=("tests/integration/test_release.py",),
        dist="load",
    ),
    Leg(
        "2026.10.4",
        "5.17.0",
        "1.15.0",
        "dense cross-entropy shape: launched ranks (two nodes too), evaluation, the families (its other tiers: the "
        "oldest stack)",
        # The node dimension (multi_node) and three ranks exercise the counting rule and the per-sample keys, which
        # the dense shape shares with the chunked one (make test leaves both launches to this leg and the native
        # one). What the 4.56 leg below runs on this shape runs there only: on 5.17 / 1.15 the patched Trainer
        # loop is `make test`'s.
        select="not sharded and not once and not notebook",
        paths=INTEGRATION,
        leaves_out=DENSE_OLD_STACK,
    ),
    # The oldest transformers / TRL on the dense shape: what their Trainer and parsers change (the command
    # line and doctor on the old stack run on the chunked-shape leg below).
    Leg(
        "2026.10.4",
        "4.56.0",
        "0.18.2",
        "dense shape, oldest working transformers / TRL: training and parsing",
        paths=DENSE_OLD_STACK,
    ),
    # The same diffusion files as 2026.10.4: the release recognised as a whole (its patches, fuzzer share and
    # everything else on these files are the 2026.10.4 legs').
    Leg(
        "2026.10.5",
        "5.17.0",
        "1.15.0",
        "dense shape (files identical to 2026.10.4): recognition",
        paths=(
            "tests/integration/test_release.py::"
            "test_import_alone_imports_neither_torch_nor_unsloth_and_apply_then_imports_and_patches",
        ),
    ),
    Leg(
        "2026.10.6",
        "5.17.0",
        "1.15.0",
        "chunked cross-entropy shape (the README's `make test`: every tier but three ranks and two nodes, the other "
        "shapes')",
        select="not three_ranks and not multi_node and not notebook",  # as `make test` (Makefile)
        sharded=True,  # as `make test` installs it: the DeepSpeed engines run here too
    ),
    # The oldest transformers / TRL on the chunked shape: what their Trainer, parsers and command line change.
    # The own-model fixtures, bench and impact's counts (TRL 1.x's preparation) run on the 5.17 legs.
    Leg(
        "2026.10.6",
        "4.56.0",
        "0.18.2",
        "chunked shape, oldest working transformers / TRL",
        paths=(
            *OLD_STACK,
            "tests/integration/test_evaluation.py",
            "tests/integration/test_cli.py",
            "tests/integration/test_doctor.py",
            "tests/integration/test_reproduce.py",
        ),
    ),
    Leg(
        "2026.10.9",
        "5.17.0",
        "1.15.0",
        "fixed upstream: native, Unsloth's own loss and the oracle cases; multi-node and sharded ranks, the "
        "families, the fuzzer (Trainer's loop: the newest stack)",
        select="not once and not notebook",
        paths=INTEGRATION,
        # What the 5.25 leg below runs on this shape runs there only, but for the oracle cases: the native claim on
        # the stack users run (the patched Trainer loop on 5.17 / 1.15 is `make test`'s).
        leaves_out=tuple(path for path in TRAINER_LOOP if path != "tests/integration/test_oracle_cases.py"),
        sharded=True,
    ),
    Leg(
        NEWEST["unsloth"],
        NEWEST["transformers"],
        NEWEST["trl"],
        "past its caps: the newest Unsloth with the newest transformers and TRL (Trainer's loop, doctor, the notebook)",
        select="not once",
        paths=(*TRAINER_LOOP, "tests/integration/test_notebook.py"),
        notebook=True,
        # the import order's bookkeeping, as test_release: the same Unsloth files as the 5.17 leg
        leaves_out=(
            "tests/integration/test_field.py::test_unpatch_before_unsloth_is_remembered_until_apply",
            "tests/integration/test_field.py::test_a_missing_dependency_is_named_as_a_broken_installation",
        ),
        past_caps=NEWEST_NEEDS,
    ),
]
# `make test` is the 2026.10.6 / 5.17 / 1.15 leg's own run: CI skips that leg in the matrix (.ci/run --skip).


def run(command, log, **kwargs):
    with open(log, "a") as f:
        f.write("$ " + " ".join(command) + "\n")
        f.flush()
        return subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, **kwargs).returncode


def pinned(*names):
    """`name==version` for these packages, as requirements-dev.txt pins them (one place for the test tools)."""
    lines = [line.split("#")[0].strip() for line in open(os.path.join(ROOT, "requirements-dev.txt"))]
    found = {line.split("==")[0]: line for line in lines if "==" in line}
    return [found[name] for name in names]


def torch_wheel(log):
    """The pinned torch as a wheel file, fetched once by pip: pip reads this machine's configuration (here a
    local CPU wheel), uv does not. Every leg installs this file, so each gets the same torch."""
    where = os.path.join(ROOT, ".matrix", "wheels")
    found = [f for f in os.listdir(where) if f.startswith("torch-")] if os.path.isdir(where) else []
    if not found:
        if (
            run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "-d",
                    where,
                    "-c",
                    os.path.join(ROOT, "constraints.txt"),
                    "torch==2.13.0",
                ],
                log,
            )
            != 0
        ):
            return None
        found = [f for f in os.listdir(where) if f.startswith("torch-")]
    return os.path.join(where, found[0])


def build(leg, where, log):
    """The leg's environment, built with uv (next to this interpreter: `make matrix` runs from .venv); reused
    when it was built before with the same pins."""
    stamp = os.path.join(where, "installed.json")
    pins = [
        f"unsloth=={leg.unsloth}",
        f"unsloth_zoo=={leg.unsloth}",
        f"transformers=={leg.transformers}",
        f"trl=={leg.trl}",
        "torch==2.13.0",
        *pinned("wrapt", "pytest", "pytest-xdist", "hypothesis"),
        *(pinned("nbclient", "nbformat", "ipykernel", "matplotlib") if leg.notebook else ()),
    ]
    sharded = os.path.join(ROOT, "requirements-sharded.txt")
    overrides = [f"transformers=={leg.transformers}", f"trl=={leg.trl}", *leg.past_caps] if leg.past_caps else []
    stamped = pins + ([open(sharded).read()] if leg.sharded else []) + overrides
    if os.path.exists(stamp) and json.load(open(stamp)) == stamped:
        return True
    shutil.rmtree(where, ignore_errors=True)
    os.makedirs(where)
    wheel = torch_wheel(log)
    if wheel is None:
        return False
    # --compile-bytecode: as pip does; without it every fresh process compiles transformers and Unsloth again
    # where PYTHONDONTWRITEBYTECODE is set.
    binary, python = os.path.join(os.path.dirname(sys.executable), "uv"), os.path.join(where, "bin", "python")

    def uv(command, *args):  # the options go after the subcommand
        return [binary, "pip", command, "--quiet", "--python", python, *args]

    constraints = ["-c", os.path.join(ROOT, "constraints.txt")]
    if overrides:  # past Unsloth's caps: the overrides replace its requirements on these packages
        with open(os.path.join(where, "overrides.txt"), "w") as f:
            f.write("\n".join(overrides) + "\n")
        constraints += ["--override", os.path.join(where, "overrides.txt")]
        pins += list(leg.past_caps)
    steps = [
        [sys.executable, "-m", "venv", "--without-pip", where],
        uv("install", "--compile-bytecode", wheel),
        uv("install", "--compile-bytecode", *constraints, *pins),
        # unsloth pulls torchvision, which cannot load beside the CPU torch and breaks `import unsloth`.
        uv("uninstall", "torchvision"),
        # --no-deps: the 2026.10.3 leg installs the plugin beside a release it does not support.
        uv("install", "--no-deps", "-e", ROOT),
    ]
    if leg.sharded:  # DeepSpeed builds against the torch just installed: no build isolation
        steps.append(uv("install", "--compile-bytecode", "--no-build-isolation", *constraints, "-r", sharded))
    for step in steps:
        if run(step, log) != 0:
            return False
    json.dump(stamped, open(stamp, "w"))
    return True


def installed(python, log):
    code = (
        "import json; from importlib.metadata import version as v; print(json.dumps({n: v(n) for n in "
        "('unsloth', 'unsloth_zoo', 'transformers', 'trl', 'accelerate', 'peft', 'torch')}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def mode(python, env):
    """The mode `status` reports, in a process of its own (an `import unsloth`): where no test wrote it."""
    out = subprocess.run(
        [python, "-m", "unsloth_diffusion_norm.tools.cli", "status"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    # Unsloth prints banners on import; the report line is ours.
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("unsloth_diffusion_norm: mode=")), "")
    return line.split("mode=")[1].split(",")[0] if line else "?"


def junit_mode(junit):
    """The mode the leg's tests ran in: tests/integration/conftest.py writes it into each test's junit entry."""
    if not os.path.exists(junit):
        return None
    found = ElementTree.parse(junit).getroot().find(".//testcase/properties/property[@name='plugin_mode']")
    return found.get("value") if found is not None else None


# Unsloth on its own, before the plugin: what a leg past Unsloth's caps needs of it to be worth testing.
UNSLOTH_ALONE = "import unsloth; from unsloth.models.diffusion_trainer import DiffusionConfig, DiffusionTrainer"


def unsloth_fails(python, env):
    """The one line that says Unsloth itself fails on this stack (its import or its trainer's), or None."""
    out = subprocess.run([python, "-c", UNSLOTH_ALONE], capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode == 0:
        return None
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    return f"Unsloth itself fails here ({UNSLOTH_ALONE}): {lines[-1] if lines else f'exit {out.returncode}'}"


def test(leg, where, log):
    python = os.path.join(where, "bin", "python")
    env = {**os.environ, "UNSLOTH_ALLOW_CPU": "1"}  # the plugin itself never sets it
    junit = os.path.join(where, "junit.xml")
    started = time.time()
    tier = ["-m", leg.select] if leg.select else []
    tier += [("--deselect=" if "::" in path else "--ignore=") + path for path in leg.leaves_out]
    workers = ["-n", os.environ.get("WORKERS", "2"), "--dist", leg.dist]  # as `make test` runs the suite
    code = run(
        [
            python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--durations=5",
            *workers,
            *tier,
            f"--junitxml={junit}",
            *leg.paths,
        ],
        log,
        env=env,
        cwd=ROOT,
    )
    seconds = time.time() - started
    # Past Unsloth's caps, a failing run is first asked whether Unsloth itself fails there (an import of its own,
    # paid only then): that is a one-line skip, not a failure of the plugin.
    if leg.past_caps and code != 0 and (why := unsloth_fails(python, env)):
        with open(log, "a") as f:
            f.write(why + "\n")
        versions = installed(python, log)
        return {
            "mode": "?",
            "versions": versions,
            "passed": 0,
            "failed": 0,
            "skipped": 0,
            "exit": 0,
            "unsloth_fails": why,
        }
    counts, failures = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}, []
    if os.path.exists(junit):
        suite = ElementTree.parse(junit).getroot()
        suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
        counts = {k: int(suite.get(k, 0)) for k in counts}
        failures = failed_tests(suite)
    failed = counts["failures"] + counts["errors"]
    return {
        "mode": junit_mode(junit) or mode(python, env),
        "versions": installed(python, log),
        "passed": counts["tests"] - failed - counts["skipped"],
        "failed": failed,
        "skipped": counts["skipped"],
        "exit": code,
        "test_seconds": round(seconds),
        "failures": failures,
    }


def failed_tests(suite, most=12):
    """'test id: the first line of its error' for each failed test of a junit suite (at most `most`): what a CI
    log that keeps only its tail still shows."""
    out = []
    for case in suite.iter("testcase"):
        for bad in [*case.findall("failure"), *case.findall("error")]:
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            out.append(f"{case.get('classname')}::{case.get('name')}: {message[0][:300] if message else '?'}")
    return out[:most]


def table(results):
    lines = [
        "| Unsloth | transformers | TRL | mode | tests | result | leg |",
        "|---|---|---|---|---|---|---|",
    ]
    notes = {leg.name: leg.note for leg in LEGS}  # a leg's description is the code's, also for saved results
    for r in results:
        v = r.get("versions") or {}
        result = "pass" if r.get("exit") == 0 else "**FAIL**"
        if r.get("unsloth_fails"):
            result = f"skipped: {r['unsloth_fails']}"
        tests = f"{r.get('passed', 0)} passed, {r.get('skipped', 0)} skipped, {r.get('failed', 0)} failed"
        lines.append(
            f"| {v.get('unsloth', r['unsloth'])} | {v.get('transformers', r['transformers'])} | "
            f"{v.get('trl', r['trl'])} | `{r.get('mode', '?')}` | {tests} | {result} | {notes.get(r['name'], r['note'])} |"
        )
    return "\n".join(lines)


def figures(results):
    """The record's figures of a matrix run: per leg (by its name, and as a list in the table's order) the versions,
    mode, test counts, result, seconds and minutes; the counts of legs and the run's minutes."""
    legs = []
    for r in results:
        v = r.get("versions") or {}
        legs.append(
            {
                "name": r["name"],
                "unsloth": v.get("unsloth", r["unsloth"]),
                "transformers": v.get("transformers", r["transformers"]),
                "trl": v.get("trl", r["trl"]),
                "torch": v.get("torch"),
                "mode": r.get("mode"),
                "passed": r.get("passed", 0),
                "skipped": r.get("skipped", 0),
                "failed": r.get("failed", 0),
                "result": "skipped" if r.get("unsloth_fails") else "pass" if r.get("exit") == 0 else "fail",
                "build_seconds": r.get("build_seconds"),
                "test_seconds": r.get("test_seconds"),
                "minutes": round(((r.get("build_seconds") or 0) + (r.get("test_seconds") or 0)) / 60, 1),
            }
        )
    return {
        "legs": {leg["name"].replace(".", "-"): leg for leg in legs},  # a dotted key's part has no dots
        "list": legs,
        "count": len(legs),
        "passing": sum(leg["result"] == "pass" for leg in legs),
        "minutes": round(sum(leg["minutes"] for leg in legs), 1),  # the run, every leg built and tested
    }


def write_record(results, command, **where):
    """records/matrix.json: `figures` and tables.compatibility (the table this script writes)."""
    sys.path.insert(0, ROOT)
    from unsloth_diffusion_norm.tools import records

    found = {}
    for r in results:  # every leg's stack, joined where legs differ
        for name, version in (r.get("versions") or {}).items():
            found.setdefault(name, [])
            if version not in found[name]:
                found[name].append(version)
    versions = {name: ", ".join(each) for name, each in found.items()}
    covers = {"the plugin": ["unsloth_diffusion_norm/**"], "the tests": ["tests/**"]}
    return records.write(
        "matrix",
        command,
        figures(results),
        covers=covers,
        tables={"compatibility": table(results)},
        found=where.pop("found", versions),
        **where,
    )


def write_page(path, results):
    text = open(path).read()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    generated = f"\n<!-- written by scripts/matrix.py from {os.path.relpath(ARGS.results, ROOT)}; do not edit -->\n"
    open(path, "w").write(text[:start] + generated + table(results) + "\n" + text[end:])


def main(argv=None):
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--legs", nargs="+", help="leg names (default: all); see --list")
    parser.add_argument("--skip", nargs="+", default=[], help="leg names not to run (their saved results stay)")
    parser.add_argument("--list", action="store_true", help="print the legs and exit")
    parser.add_argument("--results", default=os.path.join(ROOT, "matrix", "results.json"))
    parser.add_argument("--page", help="rewrite the compatibility table in this markdown page from the results")
    parser.add_argument("--table-only", action="store_true", help="rewrite the table from saved results, run nothing")
    parser.add_argument(
        "--build-only", action="store_true", help="build the legs' environments (.matrix/<leg>/), test nothing"
    )
    parser.add_argument(
        "--no-record",
        action="store_true",
        help="write no record (by default every run, --table-only too, writes records/matrix.json from the results)",
    )
    parser.add_argument(
        "--remove-after", action="store_true", help="delete each leg's environment once tested (CI: ~3 GB a leg)"
    )
    ARGS = parser.parse_args(argv)
    unknown = sorted((set(ARGS.legs or []) | set(ARGS.skip)) - {leg.name for leg in LEGS})
    if unknown:  # (a misspelt leg would run nothing and rewrite the record from the saved results)
        parser.error(f"no leg named {', '.join(unknown)} (python scripts/matrix.py --list)")
    if ARGS.list:
        print("\n".join(leg.name for leg in LEGS))
        return 0
    if ARGS.table_only:
        results = json.load(open(ARGS.results))
    else:
        legs = [leg for leg in LEGS if (not ARGS.legs or leg.name in ARGS.legs) and leg.name not in ARGS.skip]
        results, started = [], time.time()
        for leg in legs:
            where = os.path.join(ROOT, ".matrix", leg.name)
            log = os.path.join(ROOT, ".matrix", leg.name + ".log")
            os.makedirs(os.path.dirname(log), exist_ok=True)
            open(log, "w").close()
            t = time.time()
            result = {**leg.__dict__, "name": leg.name}
            if ARGS.build_only:
                built = build(leg, where, log)
                print(f"{leg.name}: {'built' if built else 'build failed'} ({round(time.time() - t)} s; log {log})")
                if not built:
                    return 1
                continue
            if build(leg, where, log):
                result.update(build_seconds=round(time.time() - t), **test(leg, where, log))
            else:
                result.update(exit="build failed")
            if ARGS.remove_after:
                shutil.rmtree(where, ignore_errors=True)
            print(
                f"{leg.name}: {result.get('mode')} exit={result['exit']} "
                f"{result.get('passed')} passed {result.get('skipped')} skipped {result.get('failed')} failed "
                f"({round(time.time() - t)} s; log {os.path.relpath(log, ROOT)})",
                flush=True,
            )
            results.append(result)
        if ARGS.build_only:
            return 0
        print(f"matrix: {len(results)} legs in {round(time.time() - started)} s")
        if (ARGS.legs or ARGS.skip) and os.path.exists(ARGS.results):  # a partial run updates its legs only
            fresh = {r["name"]: r for r in results}
            saved = [r for r in json.load(open(ARGS.results)) if r["name"] in {leg.name for leg in LEGS}]
            results = [fresh.pop(r["name"], r) for r in saved] + list(fresh.values())
            results.sort(key=lambda r: [leg.name for leg in LEGS].index(r["name"]))
        os.makedirs(os.path.dirname(ARGS.results), exist_ok=True)
        json.dump(results, open(ARGS.results, "w"), indent=1)
    print(table(results))
    for r in results:  # last, where a log cut to its tail keeps them
        for line in r.get("failures") or ():
            print(f"FAILED ({r['name']}) {line}")
    if ARGS.page:
        write_page(ARGS.page, results)
    if not ARGS.no_record:
        write_record(results, "python scripts/matrix.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    return 0 if all(r.get("exit") == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

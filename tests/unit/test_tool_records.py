"""The measuring scripts write their figures as records of the results store (records.write): the release matrix
(scripts/matrix.py, from matrix/results.json), mutation testing (scripts/mutation.py report) and the fuzzer
(scripts/fuzz.py). Each record has every required field and holds what the tool's own result says. Plain text:
the scripts are loaded without running them (neither Unsloth nor mutmut)."""

import collections
import importlib.util
import json
import os

import pytest

from unsloth_diffusion_norm.tools import records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIRED = ("name", "command", "commit", "date", "machine", "versions", "covers", "figures", "tables")


def script(name):
    spec = importlib.util.spec_from_file_location(f"{name}_script", os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "STORE", str(tmp_path))
    return tmp_path


def test_a_matrix_run_writes_its_record_with_the_table_it_writes(store):
    matrix = script("matrix")
    with open(os.path.join(ROOT, "matrix", "results.json")) as f:
        results = json.load(f)
    args = ["--table-only", "--results", os.path.join(ROOT, "matrix", "results.json")]
    assert matrix.main(args) == 0
    record = json.loads((store / "matrix.json").read_text())
    assert all(field in record for field in REQUIRED) and record["command"].startswith("python scripts/matrix.py")
    assert record["tables"]["compatibility"] == matrix.table(results)
    first = results[0]
    leg = record["figures"]["legs"][first["name"].replace(".", "-")]
    assert (leg["passed"], leg["skipped"], leg["failed"]) == (first["passed"], first["skipped"], first["failed"])
    assert [leg["name"] for leg in record["figures"]["list"]] == [r["name"] for r in results]
    assert record["figures"]["count"] == len(results) and record["versions"]["unsloth"].count(",") >= 1
    os.remove(store / "matrix.json")
    assert matrix.main([*args, "--no-record"]) == 0 and not (store / "matrix.json").exists()


def test_the_leg_past_unsloths_caps_overrides_its_pins_and_a_failing_unsloth_is_a_one_line_skip():
    """The newest stack's leg installs transformers and TRL over Unsloth's caps (uv's --override, with what that
    transformers asks for); where Unsloth itself fails there, the table and the record say so in one line, and
    the leg is not a failure."""
    matrix = script("matrix")
    (leg,) = [leg for leg in matrix.LEGS if leg.past_caps]
    assert (leg.unsloth, leg.transformers, leg.trl) == tuple(matrix.NEWEST.values())
    assert leg.name == f"unsloth-{leg.unsloth}-transformers-{leg.transformers}-trl-{leg.trl}"
    why = "Unsloth itself fails here (import unsloth): ImportError: cannot import name 'X' from 'transformers'"
    result = {"name": leg.name, "unsloth": leg.unsloth, "transformers": leg.transformers, "trl": leg.trl}
    result.update(note=leg.note, mode="?", passed=0, failed=0, skipped=0, exit=0, unsloth_fails=why)
    (row,) = [line for line in matrix.table([result]).splitlines() if line.startswith(f"| {leg.unsloth} ")]
    assert f"| skipped: {why} |" in row and "\n" not in why
    assert matrix.figures([result])["list"][0]["result"] == "skipped"


def test_a_failed_leg_names_its_failed_tests_and_their_first_error_line():
    """What a CI log cut to its tail keeps: each failed test of a leg's junit file, with its error's first line."""
    from xml.etree import ElementTree

    matrix = script("matrix")
    suite = ElementTree.fromstring(
        '<testsuite tests="3" failures="1" errors="1"><testcase classname="tests.a" name="test_ok"/>'
        '<testcase classname="tests.a" name="test_bad"><failure message="AssertionError: 1 != 2&#10;more"/></testcase>'
        '<testcase classname="tests.b" name="test_launch"><error>RuntimeError: torchrun failed</error></testcase>'
        "</testsuite>"
    )
    assert matrix.failed_tests(suite) == [
        "tests.a::test_bad: AssertionError: 1 != 2",
        "tests.b::test_launch: RuntimeError: torchrun failed",
    ]


def test_the_mutation_reports_record_holds_its_score_counts_and_module_table(store):
    mutation = script("mutation")
    results = {  # two modules' mutants: one killed, one equivalent, one surviving
        "unsloth_diffusion_norm.window.f#1": {"killed": True, "fate": "killed", "by": "x pass 1"},
        "unsloth_diffusion_norm.window.f#2": {"killed": False, "fate": "survived", "by": "x pass 1"},
        "unsloth_diffusion_norm.loss.g#1": {"killed": False, "fate": "survived", "by": "x pass 1"},
    }
    found = mutation.summary(results, {"unsloth_diffusion_norm.window.f#2": "a reason"})
    assert (found["killed"], found["equivalent"], found["surviving"], found["non_equivalent"]) == (1, 1, 1, 2)
    assert found["score"] == 0.5 and found["open"] == ["unsloth_diffusion_norm.loss.g#1"]
    mutation.write_record(found)
    record = json.loads((store / "mutation.json").read_text())
    assert all(field in record for field in REQUIRED) and "open" not in record["figures"]
    assert record["figures"]["modules"]["unsloth_diffusion_norm-window"] == dict(
        mutants=2, killed=1, equivalent=1, surviving=0
    )
    assert record["tables"]["modules"].splitlines()[2] == "| unsloth_diffusion_norm.loss | 1 | 0 | 0 | 1 |"


def test_the_mutation_record_in_the_store_is_the_reports():
    with open(os.path.join(ROOT, "mutation", "report.md"), encoding="utf-8") as f:
        report = f.read()
    record = records.load("mutation")
    assert record["tables"]["modules"] in report
    figures = record["figures"]
    assert f"**Score: {figures['killed']} killed / {figures['non_equivalent']} non-equivalent" in report
    assert (
        f"({figures['mutants']} mutants, {figures['equivalent']} equivalent, {figures['surviving']} surviving)"
        in report
    )
    assert f"At commit {record['commit']}" in report


def test_a_fuzzing_runs_record_counts_every_kind_and_the_totals():
    from unsloth_diffusion_norm.proof import tables

    counts = collections.Counter(
        {"configurations tried": 30, "family configurations tried": 20, "rank cases tried": 10, "bad inputs tried": 600}
    )
    counts["configurations failed"] = 1
    figures = tables.fuzz_figures(counts, 1, 3.02, 41, 1, "patched", "2026.10.6")
    assert figures["configurations"] == {"tried": 30, "failed": 1, "tracebacks": 0}
    assert (figures["tried"], figures["divergences"], figures["tracebacks"]) == (660, 1, 0)
    assert figures["seeds"] == {"first": 41, "last": 41} and figures["minutes"] == 3.02
    table = tables.fuzz_table(figures)
    assert "| bad inputs | 600 | 0 | 0 |" in table and "| configurations | 30 | 1 | 0 |" in table


def test_a_leg_name_the_matrix_does_not_have_is_refused_before_anything_runs_or_is_written(store, capsys):
    matrix = script("matrix")
    for flag in ("--legs", "--skip"):
        with pytest.raises(SystemExit) as refused:
            matrix.main([flag, "unsloth-2026.10.99", "--table-only"])
        assert refused.value.code == 2 and "no leg named unsloth-2026.10.99" in capsys.readouterr().err
    assert not (store / "matrix.json").exists()


def test_a_legs_mode_is_read_from_its_junit_report_where_its_tests_wrote_it(tmp_path):
    matrix = script("matrix")
    case = '<testcase classname="tests.integration.test_release" name="{name}">{properties}</testcase>'
    written = '<properties><property name="plugin_mode" value="native" /></properties>'
    junit = tmp_path / "junit.xml"
    junit.write_text(
        f'<testsuites><testsuite name="pytest" tests="2">{case.format(name="a", properties="")}'
        f"{case.format(name='b', properties=written)}</testsuite></testsuites>"
    )
    assert matrix.junit_mode(str(junit)) == "native"
    junit.write_text(
        f'<testsuites><testsuite name="pytest" tests="1">{case.format(name="a", properties="")}</testsuite></testsuites>'
    )
    assert matrix.junit_mode(str(junit)) is None  # no test ran in the package's tier: the leg asks `status`
    assert matrix.junit_mode(str(tmp_path / "absent.xml")) is None


def test_the_make_test_leg_selects_what_make_test_runs():
    """The 2026.10.6 / 5.17 / 1.15 leg is `make test` (.ci/run skips it for that): its marker expression is the
    Makefile's, so that the launches make test leaves to other legs are left out of it alike."""
    import re

    matrix = script("matrix")
    (leg,) = [
        leg for leg in matrix.LEGS if (leg.unsloth, leg.transformers, leg.trl) == ("2026.10.6", "5.17.0", "1.15.0")
    ]
    with open(os.path.join(ROOT, "Makefile")) as f:
        (selected,) = re.findall(r'-m "([^"]+)"', f.read())
    assert leg.select == selected and not leg.paths

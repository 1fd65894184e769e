"""The GPU check's record (records/gpu-check.json) is the run's own: its figures and tables read back from the files
scripts/gpu_check.sh wrote (kept under docs/gpu-check/), and the writer the script runs last makes a record with
every required field, taking the commit from the kit where the copy has no git history. Plain text only."""

import json
import pathlib
import re
import shutil
import xml.etree.ElementTree as ET

import pytest

from unsloth_diffusion_norm.tools import bench_report, records

RUN = pathlib.Path(__file__).parents[2] / "docs" / "gpu-check"
REQUIRED = ("name", "command", "commit", "date", "machine", "versions", "covers", "figures", "tables")


def suites():
    """{suite name: (passed, skipped, failed, largest error / tolerance or None)} from the run's JUnit XML."""
    found = {}
    for suite in ET.parse(RUN / "junit.xml").getroot():
        outcomes, worst = [], []
        for case in suite.iter("testcase"):
            outcomes.append(next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed"))
            worst += [
                float(p.get("value")) for p in case.iter("property") if p.get("name") == "worst_error_over_tolerance"
            ]
        failed = sum(o in ("failure", "error") for o in outcomes)
        found[suite.get("name")] = (
            outcomes.count("passed"),
            outcomes.count("skipped"),
            failed,
            max(worst, default=None),
        )
    return found


def test_the_records_tier_counts_are_the_junit_xml():
    tier = records.load("gpu-check")["figures"]["tier"]
    for name, (passed, skipped, failed, worst) in suites().items():
        release, _, part = name.removeprefix("cuda-").partition("-")
        found = tier[release.replace(".", "-")][part.replace("-", "_")]
        assert (found["passed"], found["skipped"], found["failed"]) == (passed, skipped, failed), name
        assert found["worst_error_over_tolerance"] == worst, name


def test_the_records_bench_table_and_timings_are_the_runs_own():
    record = records.load("gpu-check")
    table = [line for line in (RUN / "bench.md").read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    assert record["tables"]["bench"].splitlines() == table and len(table) == 5
    parts = json.loads((RUN / "bench.json").read_text())
    plugin = next(r for r in parts[0]["rows"] if r["variant"] == "plugin")
    assert record["figures"]["bench"]["2026-10-6-plugin"]["ratio"] == plugin["step_ms"] / parts[0]["rows"][0]["step_ms"]
    log = (RUN / "gpu_check.log").read_text(encoding="utf-8")
    done = re.search(r"^== \[(\d+) s\] done: exit (\d+)$", log, re.M)
    assert record["figures"]["seconds"]["all"] == int(done.group(1)) and record["figures"]["exit"] == int(done.group(2))
    assert record["machine"] == "NVIDIA H200" and record["versions"]["torch"].endswith("+cu130")


def test_the_record_is_what_the_writer_reads_from_the_files_now():
    figures, tables = bench_report.gpu_check_figures(str(RUN))
    record = records.load("gpu-check")
    assert record["figures"] == json.loads(json.dumps(figures)) and record["tables"] == tables


@pytest.mark.parametrize("cuda", [True, False], ids=["on-a-gpu", "a-rehearsal"])
def test_the_checks_last_step_writes_the_record_with_the_kits_commit(tmp_path, monkeypatch, cuda):
    out = tmp_path / "out"
    shutil.copytree(RUN, out)
    if not cuda:
        log = out / "gpu_check.log"
        log.write_text(log.read_text().replace("), NVIDIA H200\n", "), NO CUDA DEVICE\n"))
    (tmp_path / "COMMIT").write_text("abc1234\ndirty\n")
    store = tmp_path / "records"
    store.mkdir()
    monkeypatch.setattr(records, "STORE", str(store))
    monkeypatch.setattr(records, "_git", lambda *args: None)  # a copy without git history
    assert bench_report.main(["gpu-check", str(out), "--kit-commit", str(tmp_path / "COMMIT"), "--exit", "0"]) == 0
    written = json.loads((out / "gpu-check.json").read_text())
    assert all(field in written for field in REQUIRED)
    assert written["commit"] == "abc1234" and "uncommitted changes" in written["source"]
    assert written["figures"]["tests"]["failed"] == 0 and written["figures"]["exit"] == 0
    if cuda:
        assert written["machine"] == "NVIDIA H200" and json.loads((store / "gpu-check.json").read_text()) == written
    else:  # no measurement of a GPU: never in the store
        assert written["machine"].startswith("CPU") and not (store / "gpu-check.json").exists()

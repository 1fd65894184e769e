"""docs/gpu.md's figures are the GPU run's own: records/gpu-check.json against the JUnit XML, the bench table and
the log that scripts/gpu_check.sh wrote (kept under docs/gpu-check/), and the page rendering its figures from that
record (tests/unit/test_records.py holds each rendered figure to it). Plain text only."""

import pathlib
import re
import xml.etree.ElementTree as ET

from unsloth_diffusion_norm.tools import records

DOCS = pathlib.Path(__file__).parents[2] / "docs"
PAGE = (DOCS / "gpu.md").read_text(encoding="utf-8")
RUN = DOCS / "gpu-check"
RECORD = records.load("gpu-check")


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


def test_the_record_is_the_junit_xml_and_the_page_renders_its_totals():
    runs = suites()
    tier = RECORD["figures"]["tier"]
    for release in ("2026.10.4", "2026.10.6", "2026.10.9"):
        for part, suite in (("oracle_cases", "oracle-cases"), ("rest", "rest")):
            passed, skipped, failed, worst = runs[f"cuda-{release}-{suite}"]
            held = tier[release.replace(".", "-")][part]
            assert (held["passed"], held["skipped"], held["failed"]) == (passed, skipped, failed), (release, part)
            assert held["worst_error_over_tolerance"] == worst, (release, part)
    totals = RECORD["figures"]["tests"]
    assert totals["passed"] == sum(r[0] for r in runs.values()) and totals["failed"] == 0
    assert totals["skipped"] == sum(r[1] for r in runs.values())
    assert totals["worst_error_over_tolerance"] == max(r[3] for r in runs.values() if r[3] is not None)
    for key in ("passed", "skipped", "failed", "worst_error_over_tolerance"):
        assert f"<!--r gpu-check.tests.{key}" in PAGE, key


def test_the_bench_table_is_the_runs_own():
    table = [line for line in (RUN / "bench.md").read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    assert len(table) == 5
    assert RECORD["tables"]["bench"].strip().splitlines() == table
    assert "<!-- record: gpu-check.bench -->" in PAGE


def test_the_run_exited_0_at_the_stated_time():
    log = (RUN / "gpu_check.log").read_text(encoding="utf-8")
    done = re.search(r"^== \[(\d+) s\] done: exit (\d+)$", log, re.M)
    assert done and done.group(2) == "0"
    assert (RECORD["figures"]["exit"], RECORD["figures"]["seconds"]["all"]) == (0, int(done.group(1)))
    assert "<!--r gpu-check.exit" in PAGE and "<!--r gpu-check.seconds.all" in PAGE
    assert RECORD["commit"] == "e0445c8" and RECORD["machine"] == "NVIDIA H200"
    assert "at commit e0445c8, on an NVIDIA H200" in " ".join(PAGE.split())

"""docs/gpu.md's figures are the GPU run's own: its tables against the JUnit XML and the bench table that
scripts/gpu_check.sh wrote (kept under docs/gpu-check/). Plain text only."""

import pathlib
import re
import xml.etree.ElementTree as ET

DOCS = pathlib.Path(__file__).parents[2] / "docs"
PAGE = (DOCS / "gpu.md").read_text(encoding="utf-8")
RUN = DOCS / "gpu-check"


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


def test_the_tier_table_is_the_junit_xml():
    runs = suites()
    assert all(failed == 0 for _, _, failed, _ in runs.values())
    for release in ("2026.10.4", "2026.10.6", "2026.10.9"):
        passed, _, _, worst = runs[f"cuda-{release}-oracle-cases"]
        rest_passed, rest_skipped, _, _ = runs[f"cuda-{release}-rest"]
        row = next(line for line in PAGE.splitlines() if line.startswith(f"| {release} ("))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == f"{passed} passed", row
        assert cells[2].startswith(f"{rest_passed} passed" + (f", {rest_skipped} skipped" if rest_skipped else "")), row
        assert float(cells[3]) == round(worst, 3), row


def test_the_bench_table_is_the_runs_own():
    table = [line for line in (RUN / "bench.md").read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    assert len(table) == 5
    for line in table:
        assert line in PAGE, line


def test_the_run_exited_0_at_the_stated_time():
    log = (RUN / "gpu_check.log").read_text(encoding="utf-8")
    done = re.search(r"^== \[(\d+) s\] done: exit (\d+)$", log, re.M)
    assert done and done.group(2) == "0"
    assert f"exited 0 after {done.group(1)} s" in PAGE.replace("\n", " ")

"""The reproduction command: its table and exit code (real run, same process), and the README's block of it
(scripts/docs_outputs.py) held to what it prints now."""

import importlib.metadata
import pathlib
import re

import pytest

import unsloth_diffusion_norm
from unsloth_diffusion_norm import registry
from unsloth_diffusion_norm.tools import cli


def readme_block():
    """The README's reproduction block: (its stamp's Unsloth version, its lines under the stamp)."""
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    body = re.search(r"^<!-- output: reproduce -->\n```[^\n]*\n(.*?)^```$", readme, re.M | re.S).group(1)
    stamp, *lines = body.splitlines()
    return re.search(r"· Unsloth (\S+) ·", stamp).group(1), lines


def cells(lines, row):
    return [cell.strip() for cell in next(line for line in lines if line.startswith(row)).split("|")[2:6]]


def test_reproduce_prints_the_table_the_readme_shows_and_succeeds(capsys, plugin):
    """One run: its table and verdicts by mode; and, where the README's block is from this release, everything
    of it but the last digits of round-off: the counts, the tolerance, every verdict exactly; the losses to 1e-5
    (they are printed to 1e-6, and round-off moves the last digit between machines)."""
    assert cli.main(["reproduce", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "| loss" in out and "unpatched" in out and "plugin" in out and "reference" in out
    within = next(line for line in out.splitlines() if line.startswith("| within tolerance"))
    unpatched, ours, native = (cell.strip() for cell in within.split("|")[2:5])
    if unsloth_diffusion_norm.status().mode == registry.NATIVE:
        assert (unpatched, ours, native) == ("—", "—", "yes")
    else:
        assert (unpatched, ours, native) == ("NO", "yes", "—")
    version, documented = readme_block()
    if version != importlib.metadata.version("unsloth"):
        pytest.skip(f"the README's block is from Unsloth {version}")
    printed = out.splitlines()
    printed = printed[next(i for i, line in enumerate(printed) if line.startswith("Unsloth ")) :]
    assert printed[0] == documented[0]
    assert cells(printed, "| within tolerance") == cells(documented, "| within tolerance")
    for now, then in zip(cells(printed, "| loss"), cells(documented, "| loss")):
        assert now == then or float(now) == pytest.approx(float(then), rel=1e-5)

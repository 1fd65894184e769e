"""The reproduction command: its table and exit code (real run, same process)."""

import unsloth_diffusion_norm
from unsloth_diffusion_norm import registry
from unsloth_diffusion_norm.tools import cli


def test_reproduce_prints_the_table_and_succeeds(capsys, plugin):
    assert cli.main(["reproduce", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "| loss" in out and "unpatched" in out and "plugin" in out and "reference" in out
    within = next(line for line in out.splitlines() if line.startswith("| within tolerance"))
    unpatched, ours, native = (cell.strip() for cell in within.split("|")[2:5])
    if unsloth_diffusion_norm.status().mode == registry.NATIVE:
        assert (unpatched, ours, native) == ("—", "—", "yes")
    else:
        assert (unpatched, ours, native) == ("NO", "yes", "—")

"""The reproduction command: its table and exit code (real run, same process)."""

from unsloth_diffusion_norm import cli


def test_reproduce_prints_the_table_and_succeeds(capsys, plugin):
    assert cli.main(["reproduce", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "| loss" in out and "unpatched" in out and "plugin" in out and "reference" in out
    within = next(line for line in out.splitlines() if line.startswith("| within tolerance"))
    assert within.split("|")[2].strip() == "NO" and within.split("|")[3].strip() == "yes"

"""Does the fix change the model? Part 1 of scripts/convergence.py in its quick form: batch B at GA k trains the
model batch B·k at GA 1 trains, with the plugin's window normalization, to float round-off at every AdamW step;
per-micro-batch normalization drifts away. The per-micro-batch arm is the test's own control: with the plugin's
normalization out of the way the window arm is that arm, and the assertion fails."""

import pytest

import unsloth_diffusion_norm
from unsloth_diffusion_norm import registry
from unsloth_diffusion_norm.tools import convergence

MODE = unsloth_diffusion_norm.apply().mode


@pytest.mark.once
def test_quick_part1_the_window_stays_on_the_reference_and_per_micro_batch_does_not(plugin, tmp_path):
    found, check = convergence.part1(convergence.QUICK, str(tmp_path))
    result = convergence.report(found, check)
    for k, row in result["part1"].items():
        window, per_micro_batch = row[convergence.WINDOW], row[convergence.MICROBATCH]
        assert len(window["distance_per_step"]) == convergence.QUICK.steps
        assert max(d for d in window["distance_per_step"] if d is not None) <= 1e-5, k
        assert max(d for d in per_micro_batch["distance_per_step"] if d is not None) > 1e-2, k  # misses by far
        assert abs(window["held_out"] - row["reference_held_out"]) <= 1e-5 * abs(row["reference_held_out"])
    assert convergence.within(result)
    if MODE == registry.PATCHED:  # the flag's per-micro-batch arm is the unpatched release's own run
        assert check == 0.0
    assert "| 2 |" in convergence.render(result)

"""Part 2's statistics (scripts/convergence.py): the interval of a mean over seeds and the paired difference."""

import math

import pytest

from unsloth_diffusion_norm.tools.convergence import seeds
from unsloth_diffusion_norm.tools.convergence.runs import MICROBATCH, WINDOW, Arm


def test_interval_is_students_t_at_95_percent():
    mean, low, high, sd = seeds.interval([1.0, 2.0, 3.0])
    assert (mean, sd) == (2.0, 1.0)
    assert high - mean == pytest.approx(4.303 / math.sqrt(3)) and mean - low == pytest.approx(high - mean)
    assert seeds.interval([5.0])[1:] == (None, None, None)  # one seed: no interval
    assert seeds.T95[4] == 2.776 and seeds.T95[7] == 2.365  # 5 and 8 seeds


def _arms(finals, name):
    return [
        Arm(name, 1, 8, name, seed, measured=[(0, {"objective": v, "bound": v / 2})]) for seed, v in enumerate(finals)
    ]


def test_the_paired_difference_is_taken_seed_by_seed_and_judged_against_the_seed_spread():
    window, per_micro_batch = [10.0, 12.0, 14.0, 11.0, 13.0], [10.5, 12.4, 14.6, 11.5, 13.5]
    found = {WINDOW: _arms(window, WINDOW), MICROBATCH: _arms(per_micro_batch, MICROBATCH)}
    for arm in found[WINDOW] + found[MICROBATCH]:
        arm.measured[0][1]["accuracy"] = [0.5, None, 0.5, 0.5, 0.5]
    summed = seeds.summary(found)
    difference = summed["objective"][MICROBATCH]["difference"]
    assert difference["per_seed"] == pytest.approx([0.5, 0.4, 0.6, 0.5, 0.5])
    assert difference["mean"] == pytest.approx(0.5) and difference["low"] > 0  # paired: the seeds' spread cancels
    assert summed["objective"][WINDOW]["low"] < 10.5  # unpaired, each arm's interval is wide
    assert "accuracy 0.2-0.4" in summed and summed["accuracy 0.2-0.4"] == {}  # no token fell in that bin
    (line,) = seeds.verdict(summed, seeds.NAMES)
    assert "significant at 95 % (worse than the window)" in line and "0.32 times the spread between seeds" in line


def test_a_pair_arm_is_also_judged_at_equal_forward_compute_and_every_arm_shows_its_spread():
    finals = {
        WINDOW: [10.0, 12.0, 14.0],
        seeds.COMPLEMENTARY: [9.9, 11.9, 13.9],  # better than the window, worse than twice the rows
        seeds.TWICE: [9.7, 11.7, 13.8],
        seeds.STRATIFIED: [10.0, 12.1, 14.0],
    }
    found = {name: _arms(values, name) for name, values in finals.items()}
    for arm in (arm for arms in found.values() for arm in arms):
        arm.measured[0][1]["accuracy"] = [0.5] * 5
    summed = seeds.summary(found)
    row = summed["objective"]
    assert row[seeds.COMPLEMENTARY]["equal_compute"]["per_seed"] == pytest.approx([0.2, 0.2, 0.1])
    assert "equal_compute" not in row[seeds.STRATIFIED] and "equal_compute" not in row[seeds.TWICE]
    lines = seeds.verdict(summed, seeds.NAMES)
    assert [line.split(": ")[0] for line in lines] == [
        "complementary pairs − window, held-out objective",
        "complementary pairs − window, 2× rows, at equal forward compute, held-out objective",
        "window, 2× rows − window, held-out objective",
        "stratified t − window, held-out objective",
    ]
    assert ": +0.1667 (95 % interval" in lines[1] and "significant at 95 % (worse than the window, 2× rows)" in lines[1]
    assert seeds.spread(summed, seeds.NAMES) == (
        "spread between seeds (SD of the held-out objective): window (plugin) 2.0000, complementary pairs 2.0000, "
        "window, 2× rows 2.0502, stratified t 2.0008"
    )
    assert seeds.FLAGS[seeds.BOTH] == {**seeds.FLAGS[seeds.STRATIFIED], **seeds.FLAGS[seeds.COMPLEMENTARY]}


def test_a_native_arm_is_taken_only_from_a_native_run_at_the_same_settings(tmp_path):
    import argparse
    import dataclasses
    import json

    from unsloth_diffusion_norm.tools import console, convergence

    settings = convergence.QUICK2
    row = {"seed": 0, "seconds": 1.0, "measured": [[0, {"objective": 1.0}]], "log": [], "trainer_eval_loss": 1.0}
    part = {"settings": dataclasses.asdict(settings), "per_seed": {WINDOW: [row]}}
    written = tmp_path / "native.json"
    written.write_text(json.dumps({"mode": "native", "unsloth": "2026.10.9", "part2": part}))
    (arm,) = seeds.native_arms(convergence._native(str(written)), settings)
    assert (arm.label, arm.seed, arm.measured) == ("Unsloth's fix (2026.10.9)", 0, [[0, {"objective": 1.0}]])
    with pytest.raises(console.Failure, match="differ from this run's in steps"):
        seeds.native_arms(json.loads(written.read_text()), dataclasses.replace(settings, steps=4))
    written.write_text(json.dumps({"mode": "patched", "unsloth": "2026.10.6", "part2": part}))
    with pytest.raises(argparse.ArgumentTypeError, match="not a Part 2 run with a window arm on a natively fixed"):
        convergence._native(str(written))
    assert convergence._arms("window") == (WINDOW,)
    with pytest.raises(argparse.ArgumentTypeError, match="arms are window, microbatch"):
        convergence._arms("window,native")

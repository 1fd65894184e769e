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
    with pytest.raises(argparse.ArgumentTypeError, match="not a Part 2 or 3 run with a window arm on a natively fixed"):
        convergence._native(str(written))
    assert convergence._arms("window") == (WINDOW,)
    with pytest.raises(argparse.ArgumentTypeError, match="arms are window, microbatch"):
        convergence._arms("window,native")


def _task_run(seed, accuracies, objective=1.0, digest="d"):
    """A Part 3 run as train_arm returns it: accuracy measured every 50 steps."""
    measured = [
        [50 * i, {"accuracy": a, "by_length": [a, a, None, a], "objective": objective}]
        for i, a in enumerate(accuracies)
    ]
    return {"seed": seed, "seconds": 1.0, "measured": measured, "digest": digest, "loss": 0.5}


def test_part3_report_pairs_complete_seeds_and_holds_unsloths_own_fix_to_the_window_arm():
    from unsloth_diffusion_norm.tools.convergence import task

    settings = task.QUICK3
    runs = {
        WINDOW: [
            _task_run(0, [0.0, 0.6, 0.9], 0.5, "a"),
            _task_run(1, [0.0, 0.2, 0.7], 0.7, "b"),
            _task_run(2, [0, 1, 1]),
        ],
        MICROBATCH: [_task_run(0, [0.0, 0.1, 0.8], 0.6), _task_run(1, [0.0, 0.0, 0.3], 0.9)],  # seed 2 not yet run
    }
    part = task.report(runs, settings)
    assert part["seeds"] == [0, 1]  # (seed 2 only when every arm has it)
    window, paired = part["arms"][WINDOW], part["paired"]["window_minus_microbatch"]
    assert window["per_seed"] == [0.9, 0.7] and window["steps_to_learn"] == [50, 100]
    assert part["arms"][MICROBATCH]["steps_to_learn"] == [100, None]
    assert paired["accuracy"]["mean"] == pytest.approx(0.25) and paired["objective"]["mean"] == pytest.approx(-0.15)
    assert paired["steps"] == {**paired["steps"], "mean": -50, "seeds": 1}  # (the seed where both learned)
    assert window["by_length"][2] is None and window["curve"][1] == (50, pytest.approx(0.4))
    assert "window − per-micro-batch: final accuracy +25.0 points" in task.render(part)
    native = {"unsloth": "2026.10.9", "part3": {"runs": {WINDOW: [_task_run(0, [0.0, 0.6, 0.9], 0.5, "a")]}}}
    assert task.report(runs, settings, native)["native"] == {
        "unsloth": "2026.10.9",
        "seeds": [0],
        "equal_losses": True,
        "equal_measurements": True,
    }
    native["part3"]["runs"][WINDOW][0]["digest"] = "other"
    assert "DIFFERS" in task.render(task.report(runs, settings, native))
    assert task.baselines(task.sequences(2, 256, held=True))["copy the prompt"] == pytest.approx(0.16, abs=0.01)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--add-to", "x.json"], "--add-to grows a Part 3 results file: give --part 3"),
        (["--part", "3", "--add-to", "x.json", "--json", "y.json"], "--add-to writes its own file"),
        (["--part", "3", "--seeds", "0"], "argument --seeds: must be a whole number of at least 1, not '0'"),
        (["--part", "3", "--workers", "two"], "argument --workers: must be a whole number of at least 1, not 'two'"),
        (["--part", "3", "--add-to", "x.json", "--minutes", "-1"], "argument --minutes: a number of minutes above 0"),
        (["--part", "4"], "argument --part: invalid choice: 4"),
        (["--gpu", "--part", "1"], "--gpu is Part 2's or Part 3's preset: leave out --part 1"),
        (["--registered", "--replicate", "24"], "--replicate runs a registered study on fresh seeds: give"),
        (["--registered", "--replicate", "7", "--add-to", "x.json"], "seeds 0-23 are the registered ones: give 24"),
        (["--block-study", "--part", "3"], "--block-study is its own study: leave out --registered, --part"),
        (["--block-study", "--replicate", "1010", "--add-to", "x.json"], "seeds 1010-1033 meet the registered"),
        (["--block-study", "--replicate", "2000"], "--replicate runs a registered study on fresh seeds: give"),
    ],
)
def test_part3_flags_refused_in_one_line(argv, says, capsys):
    from unsloth_diffusion_norm.tools import convergence

    with pytest.raises(SystemExit) as stopped:
        convergence.main(argv)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert stopped.value.code == 2 and says in error, error


def test_the_page_shows_the_pilot_as_its_results_file_renders_now_and_unsloths_own_fix_equal():
    """docs/convergence.md names the pilot's results file, and its record's table is that file rendered by the
    report as it is now (a change of the report shows here): 8 seeds every arm ran, with Unsloth's own fix bitwise
    the window arm."""
    import json
    import pathlib

    from unsloth_diffusion_norm.tools import records
    from unsloth_diffusion_norm.tools.convergence import figures

    docs = pathlib.Path(__file__).parents[2] / "docs"
    result = json.loads((docs / "convergence-task.json").read_text())
    assert records.load("convergence-task")["tables"]["arms"] == figures.tables(result)["part3"]["arms"]
    assert "`docs/convergence-task.json`" in (docs / "convergence.md").read_text()  # (the pilot's, linked)
    part = result["part3"]
    assert part["seeds"] == list(range(8)) and set(part["arms"]) == {WINDOW, MICROBATCH, *seeds.LOWER_VARIANCE} - {
        seeds.BOTH
    }
    assert part["native"] == {"unsloth": "2026.10.9", "seeds": [0], "equal_losses": True, "equal_measurements": True}


def test_every_part3_difference_reads_its_direction_from_its_name():
    """task.report names each paired difference "a_minus_b"; its value, seed by seed, is a − b (a difference
    computed the other way round, or printed under the other order, fails here)."""
    from unsloth_diffusion_norm.tools.convergence import task

    finals = {seeds.WINDOW: (0.9, 0.7), seeds.MICROBATCH: (0.4, 0.6), seeds.COMPLEMENTARY: (0.5, 0.5)}
    finals[seeds.TWICE] = (0.8, 0.2)

    def run(seed, accuracy, steps):
        measured = [(0, {"accuracy": 0.0, "by_length": [0.0] * 4, "objective": 2.0})]
        measured += [(50, {"accuracy": accuracy, "by_length": [accuracy] * 4, "objective": 1 - accuracy})]
        return {"seed": seed, "seconds": 1.0, "measured": measured, "digest": "", "loss": 0.0}

    runs = {name: [run(seed, value, 50) for seed, value in enumerate(values)] for name, values in finals.items()}
    part = task.report(runs, task.QUICK3)
    assert sorted(part["paired"]) == sorted(
        ["window_minus_microbatch", "window_minus_complementary", "window_minus_twice", "twice_minus_complementary"]
    )
    printed = task.render(part)
    for name, difference in part["paired"].items():
        ours, theirs = task.minus(name)
        wanted = sum(a - b for a, b in zip(finals[ours], finals[theirs])) / 2
        assert difference["accuracy"]["mean"] == pytest.approx(wanted), name
        assert difference["objective"]["mean"] == pytest.approx(-wanted), name
        label = " − ".join("window" if arm == seeds.WINDOW else task.NAMES[arm] for arm in (ours, theirs))
        assert f"{label}" in printed and f"final accuracy {100 * wanted:+.1f} points" in printed, name


def test_part3s_equal_compute_difference_is_named_by_its_sign_the_twice_arm_minus_the_pairs():
    """task.report's equal-compute difference is _paired(twice, complementary): the window at twice the rows minus
    the pairs. The report says so, and the record names it twice_minus_pairs (issue 53: it was printed as pairs
    minus twice the rows)."""
    from unsloth_diffusion_norm.tools.convergence import figures, task

    def run(seed, accuracy):
        return {"seed": seed, "seconds": 1.0, "measured": [(50, {"accuracy": accuracy, "objective": 1 - accuracy})]}

    part = {
        "arms": {
            name: {
                "label": task.NAMES[name],
                "accuracy": dict(mean=0.5, low=None, high=None, sd=None),
                "objective": dict(mean=0.5, low=None, high=None, sd=None),
                "by_length": [],
                "steps_to_learn": [],
                "curve": [(50, 0.5)],
            }
            for name in (seeds.COMPLEMENTARY, seeds.TWICE)
        },
        "paired": {"twice_minus_complementary": task._paired([run(0, 0.9), run(1, 0.8)], [run(0, 0.5), run(1, 0.6)])},
        "bins": [],
        "baselines": {},
    }
    assert part["paired"]["twice_minus_complementary"]["accuracy"]["mean"] == pytest.approx(0.3)  # twice − pairs
    line = next(line for line in task.render(part).splitlines() if "equal forward compute" in line)
    assert line.startswith("window, 2× rows − complementary pairs (equal forward compute): final accuracy +30.0 points")
    named = figures.part3({**part, "seeds": [0, 1], "settings": {}, "arms": {}})["paired"]
    assert list(named) == ["twice_minus_pairs"] and named["twice_minus_pairs"]["exact_match"]["mean"] == pytest.approx(
        0.3
    )


def test_a_runs_records_hold_its_summary_figures_and_tables_and_no_curves(tmp_path, monkeypatch):
    """Each part of a --json run becomes a record (figures.write through records.write): the summary figures the
    report prints, its tables, every required field; the per-step curves stay in the run's JSON."""
    import json

    from unsloth_diffusion_norm.tools import records
    from unsloth_diffusion_norm.tools.convergence import figures

    window, pairs = _arms([1.0, 2.0, 4.0], WINDOW), _arms([1.5, 2.5, 4.5], seeds.COMPLEMENTARY)
    found = {WINDOW: window, seeds.COMPLEMENTARY: pairs}
    for arm in (*window, *pairs):
        arm.log = [{"step": 1, "loss": 1.0, "grad_norm": 1.0, "learning_rate": 0.0}]
        arm.measured[0][1]["accuracy"] = [0.5] * 5
    result = {"part2": seeds.report(found, 1000, seeds.QUICK2), "mode": "patched", "unsloth": "x", "seconds": 9.5}
    monkeypatch.setattr(records, "STORE", str(tmp_path))
    assert figures.write(result, "convergence-test", "python scripts/convergence.py --json x.json") == [
        "convergence-test"
    ]
    record = json.loads((tmp_path / "convergence-test.json").read_text())
    assert all(record[field] for field in ("command", "commit", "date", "machine", "versions", "covers", "figures"))
    assert "the convergence study" in record["covers"]
    paired = record["figures"]["paired"]["complementary_minus_window"]["objective"]
    assert paired["mean"] == pytest.approx(0.5) and paired["seeds"] == 3
    assert record["figures"]["arms"][WINDOW]["objective"]["mean"] == pytest.approx(7 / 3)
    assert record["figures"]["run_seconds"] == 9.5 and record["figures"]["seeds"] == len(seeds.QUICK2.seeds)
    assert "| objective |" in record["tables"]["summary"] and "verdict:" in record["tables"]["report"]
    assert "curve" not in json.dumps(record["figures"]) and "per_seed" not in json.dumps(record["figures"])
    assert figures.default_name("docs/convergence-task.json") == "convergence-task"
    import dataclasses

    from unsloth_diffusion_norm.tools.convergence import QUICK

    part1 = {"part1": {}, "microbatch_flag_vs_unpatched": None, "settings": dataclasses.asdict(QUICK)}
    both = figures.records_of({**result, **part1}, "convergence")
    assert [name for name, _, _ in both] == ["convergence-part1", "convergence-part2"]


def test_the_registered_tests_are_the_exact_sign_test_its_median_interval_and_holm():
    """The registered analysis's statistics, against values worked by hand: the sign test's p (ties set aside),
    the order-statistic interval it inverts (n = 24: the 7th and the 18th), Holm's step-down adjustment, the
    design's power (at no effect: the test's size, under the level)."""
    from unsloth_diffusion_norm.tools.convergence import registered

    assert registered.sign_test([100, 200, 300, 400], [200, 200, 400, 500]) == (3, 0, 1, 0.25)
    assert registered.sign_test([1] * 24, [2] * 24)[3] == pytest.approx(2 / 2**24)
    median, (low, high) = registered.median_interval(list(range(24)))
    assert (median, low, high) == (11.5, 6, 17)
    assert registered.holm([0.04, 0.01]) == [0.04, 0.02] and registered.holm([0.03, 0.04]) == [0.06, 0.06]
    assert registered.power(24, 0.5) < registered.LEVEL < registered.power(24, 0.8)
    assert registered.mcnemar([True, True, False], [False, True, True]) == (1, 1, 1.0)


def test_the_registered_analysis_counts_a_run_that_never_learned_as_later_and_tests_only_at_24_seeds():
    """Steps to 50 % censored at the last step (a run that never learned is later than every run that did); the
    tests, and the verdict, only once every arm at both layouts has the registered seeds; its sign from the
    window's side."""
    from unsloth_diffusion_norm.tools.convergence import registered

    settings = {"steps": 100, "every": 50}

    def run(seed, learned_at):
        curve = [(0, 0.0), (50, 1.0 if learned_at == 50 else 0.0), (100, 0.0 if learned_at is None else 1.0)]
        measured = [(s, {"accuracy": a, "by_length": [a] * 4, "palindromes": a, "objective": 1 - a}) for s, a in curve]
        return {"seed": seed, "measured": measured}

    def study(seeds, first=0):
        runs = {}
        for layout in registered.LAYOUTS.values():
            runs[registered.unit("window", layout)] = [run(s, 50) for s in range(first, first + seeds)]
            theirs = [run(s, None if s % 2 else 100) for s in range(first, first + seeds)]
            runs[registered.unit("microbatch", layout)] = theirs
        return {"settings": {**settings, "seeds": list(range(first, first + 24))}, "runs": runs}

    assert registered.censored(run(0, None), settings) == 150
    early = registered.analysis(study(23))
    assert not early["registered"] and "Registered study, progress: 23 of 24 seeds" in registered.render(study(23))
    found = registered.analysis(study(24))
    h1 = found["hypotheses"]["H1"]
    assert found["registered"] and h1["primary"]["earlier"] == 24 and h1["primary"]["significant"]
    assert h1["learned"] == {"window": 24, "microbatch": 12, "p": pytest.approx(2 / 2**12)}
    assert h1["median_difference"]["mean"] < 0 and h1["final"]["mean"] == pytest.approx(0.5)
    assert "the window learns the task sooner" in registered.render(study(24))
    # A replication (--replicate 24): the same protocol on fresh seeds, its table labelled as one.
    assert registered.replication(registered.SETTINGS, 24).seeds == tuple(range(24, 48))
    again = registered.render(study(24, first=24))
    assert again.startswith("Replication on fresh seeds 24–47: 24 seeds") and "sooner" in again
    assert registered.render(study(3, first=100)).startswith("Replication on fresh seeds 100–123, progress: 3 of 24")


def test_the_block_diffusion_study_tests_block_decoding_only_at_24_seeds_and_labels_a_replication():
    """The registered block-diffusion study's analysis: steps to 50 % censored, the sign test block_diff against
    bidirectional under block-by-block decoding (primary) and over the whole canvas (secondary), the test and its
    verdict only at 24 seeds; fresh seeds for a replication, its table titled one; the quick form's checks."""
    from unsloth_diffusion_norm.tools.convergence import block_study as study

    def run(seed, block_at, canvas_at, seconds):
        curve = [(0, 0.0, 0.0), (50, float(block_at == 50), float(canvas_at == 50)), (100, 1.0, 1.0)]
        measured = [(s, {"accuracy": a, "canvas_accuracy": c}) for s, a, c in curve]
        return {"seed": seed, "measured": measured, "seconds": seconds}

    def found(seeds, first=study.FIRST):
        runs = {
            study.BLOCK_DIFF: [run(s, 50, 100, 2.0) for s in range(first, first + seeds)],
            study.BIDIRECTIONAL: [run(s, 100, 100, 1.0) for s in range(first, first + seeds)],
        }
        settings = {"steps": 100, "every": 50, "seeds": list(range(first, first + study.SEEDS))}
        return {"settings": settings, "runs": runs}

    early = study.analysis(found(23))
    assert not early["registered"] and not early["decodings"]["block"]["test"]["significant"]
    assert study.render(found(23)).startswith("Block-diffusion study (seeds 1000–1023), progress: 23 of 24 seeds")
    result = study.analysis(found(24))
    block, canvas = result["decodings"]["block"], result["decodings"]["canvas"]
    assert block["test"] == {"earlier": 24, "later": 0, "ties": 0, "p": pytest.approx(2 / 2**24), "significant": True}
    assert canvas["test"]["ties"] == 24 and "significant" not in canvas["test"]
    assert block["median_difference"]["mean"] == -50 and result["seconds_ratio"] == pytest.approx(2.0)
    assert "learns the task sooner than the one trained bidirectionally" in study.render(found(24))
    assert study.render(found(24, first=2000)).startswith("Replication (seeds 2000–2023): 24 seeds")
    assert study.fresh(2000) is None and "meet the registered seeds" in study.fresh(990)
    # the quick form's checks: both terms in the block arm's loss, none in the other, block decoding not the canvas's
    step0 = {"decoded": "a", "canvas_decoded": "b"}
    runs = {
        study.BLOCK_DIFF: [{"terms": [(2.0, 1.0)], "loss": study.ALPHA * 2.0 + 1.0, "measured": [(0, step0)]}],
        study.BIDIRECTIONAL: [{"terms": [(None, None)], "loss": 3.0, "measured": [(0, step0)]}],
    }
    assert study.check(runs) == []
    runs[study.BLOCK_DIFF][0]["loss"] = study.ALPHA * 2.0  # the AR term dropped
    runs[study.BIDIRECTIONAL][0]["measured"] = [(0, {"decoded": "a", "canvas_decoded": "a"})]  # the canvas decoded
    assert [line.split(":")[0] for line in study.check(runs)] == [study.BLOCK_DIFF, study.BIDIRECTIONAL]

"""Does the fix change the model? scripts/convergence.py in its quick form.

Part 1: batch B at GA k trains the model batch B·k at GA 1 trains, with the plugin's window normalization, to
float round-off at every AdamW step; per-micro-batch normalization drifts away. The per-micro-batch arm is the
test's own control: with the plugin's normalization out of the way the window arm is that arm, and the
assertion fails. Part 2: paired seeds at GA 2 with global noise; the held-out draws are the trainer's own fixed
evaluation noise, and both arms of a seed start from the same model and measure it alike."""

import pytest

import unsloth_diffusion_norm
from unsloth_diffusion_norm import registry
from unsloth_diffusion_norm.tools import convergence
from unsloth_diffusion_norm.tools.convergence import seeds

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


@pytest.mark.once
def test_quick_part2_paired_seeds_measured_on_the_trainers_own_fixed_evaluation_noise(plugin, tmp_path):
    settings = convergence.QUICK2
    found, size, (train_rows, tokenizer_folder) = convergence.part2(settings, str(tmp_path))
    assert size > 0 and len(train_rows) == settings.train_rows
    for window, per_micro_batch in zip(found[convergence.WINDOW], found[convergence.MICROBATCH]):
        assert window.seed == per_micro_batch.seed
        assert [s for s, _ in window.measured] == list(range(settings.steps + 1))
        assert window.measured[0] == per_micro_batch.measured[0]  # one initialization, the same held-out draws
        assert window.measured[-1][1]["objective"] != per_micro_batch.measured[-1][1]["objective"]
        for arm in (window, per_micro_batch):  # HeldOut's draws are diffusion_eval_noise="fixed"'s, as evaluated
            measured = arm.measured[-1][1]["eval_loss"]
            assert abs(arm.held_out - measured) <= 1e-5 * abs(measured), (arm.label, arm.held_out, measured)
        assert len(window.log) == settings.steps and all("grad_norm" in entry for entry in window.log)
    part = seeds.report(found, size, settings)
    assert part["per_seed"][convergence.WINDOW][0]["trainer_eval_loss"] == found[convergence.WINDOW][0].held_out
    objective = part["summary"]["objective"]
    difference = objective[convergence.MICROBATCH]["difference"]
    assert difference["per_seed"] == [
        b.measured[-1][1]["objective"] - a.measured[-1][1]["objective"]
        for a, b in zip(found[convergence.WINDOW], found[convergence.MICROBATCH])
    ]
    assert difference["low"] <= difference["mean"] <= difference["high"]
    part["impact"] = seeds.impact_beside(train_rows, tokenizer_folder, settings, str(tmp_path), settings.seeds[0])
    assert 0 < part["impact"]["share"] < 1
    table = seeds.render(part)
    assert "| objective |" in table and "verdict: per-micro-batch − window" in table and "impact on the same" in table


@pytest.mark.once
def test_quick_lower_variance_arms_train_with_their_fields_from_the_window_arms_model(plugin, tmp_path):
    settings = convergence.QUICK2
    arms = (convergence.WINDOW, seeds.BOTH, seeds.TWICE)
    found, _, _ = convergence.part2(settings, str(tmp_path), arms=arms)
    window, both, twice = (found[name][0] for name in arms)
    assert both.flags == seeds.FLAGS[seeds.BOTH] and (both.ga, twice.ga) == (settings.ga, 2 * settings.ga)
    assert window.measured[0] == both.measured[0] == twice.measured[0]  # one initialization, one held-out draw
    assert len({window.measured[-1][1]["objective"], both.measured[-1][1]["objective"]}) == 2
    assert all(len(arm.log) == settings.steps for arm in (window, both, twice))
    part = seeds.report(found, 0, settings)
    assert "verdict: stratified + pairs − window, 2× rows, at equal forward compute" in seeds.render(part)


@pytest.mark.once
def test_quick_part3_the_task_is_learned_and_the_arms_train_apart(plugin, tmp_path):
    """Part 3 in its quick form (one seed, batch 4 x GA 2): the window arm learns the reversal task far above the
    trivial answers, by answer length too; the per-micro-batch arm, trained over the first steps only (the steps
    a run of any length shares), starts from the same model and trains apart from the window's first steps (with
    the window arm trained under per-micro-batch normalization they would be one run, and the last assertion
    fails)."""
    import dataclasses

    from unsloth_diffusion_norm.tools.convergence import task

    settings = task.QUICK3
    window = task.train_arm(settings, 0, convergence.WINDOW, str(tmp_path))
    first = dataclasses.replace(settings, steps=task.EARLY, every=task.EARLY)
    per_micro_batch = task.train_arm(first, 0, convergence.MICROBATCH, str(tmp_path))
    part = task.report({convergence.WINDOW: [window]}, settings)
    assert [s for s, _ in window["measured"]] == [0, 350, 700] and window["measured"][0] == per_micro_batch["measured"][
        0
    ]
    # Learned: past its jump (near 0 % at step 350 in the runs we measured, 92-100 % at 700, with 1 thread or 2;
    # the longest answers come last), far above the trivial answers; the held-out objective fell.
    best_trivial = max(part["baselines"].values())
    assert window["measured"][-1][1]["accuracy"] >= 0.75 > best_trivial + 0.5
    assert window["measured"][-1][1]["objective"] < window["measured"][0][1]["objective"] / 2
    assert part["arms"][convergence.WINDOW]["by_length"][0] >= 0.8
    assert part["arms"][convergence.WINDOW]["steps_to_learn"] == [task.steps_to_learn(window)]
    assert per_micro_batch["digest"] == per_micro_batch["early"]  # (its whole run is the first steps)
    assert window["early"] != per_micro_batch["early"]
    assert "| window (plugin) |" in task.render(part) and "copy the prompt" in task.render(part)


@pytest.mark.once
def test_a_results_file_grows_a_run_at_a_time_and_counts_the_seeds_every_arm_has(plugin, tmp_path):
    """The GPU form's chunks (--add-to), here on CPU at a few steps: each chunk adds what the file lacks, seeds in
    order; a seed counts once every arm has it; a run trained in a chunk is the run a whole study trains; a file
    of other settings is refused and left as it was."""
    import dataclasses
    import json

    from unsloth_diffusion_norm.tools import console
    from unsloth_diffusion_norm.tools.convergence import task

    settings = dataclasses.replace(task.QUICK3, steps=4, every=2, train_rows=64, held_rows=8)
    path, arms = str(tmp_path / "grown.json"), (convergence.WINDOW, convergence.MICROBATCH)
    grow = lambda: task.grow(path, settings, str(tmp_path), 1e-6, lambda _: None, arms, "CPU")  # noqa: E731
    first = grow()
    assert [run["seed"] for run in first["part3"]["runs"][convergence.WINDOW]] == [0]
    assert first["part3"]["runs"][convergence.MICROBATCH] == [] and first["part3"]["seeds"] == []
    second = grow()
    assert second["part3"]["seeds"] == [0] and [c["runs"] for c in second["chunks"]] == [1, 1]
    as_written = json.loads(json.dumps(second))  # (the file's JSON: tuples as lists)
    assert second["chunks"][0]["device"] == "CPU" and json.loads((tmp_path / "grown.json").read_text()) == as_written
    alone = task.part3(settings, str(tmp_path / "alone"), lambda _: None, arms)
    assert [r["digest"] for r in second["part3"]["runs"][convergence.WINDOW]] == [
        alone[convergence.WINDOW][0]["digest"]
    ]
    with pytest.raises(console.Failure, match="holds a Part 3 run at other settings"):
        task.grow(path, dataclasses.replace(settings, steps=6), str(tmp_path), 1e-6, lambda _: None, arms, "CPU")
    assert json.loads((tmp_path / "grown.json").read_text()) == as_written


@pytest.mark.once
def test_the_registered_study_grows_by_whole_seeds_and_tests_nothing_before_its_registered_count(plugin, tmp_path):
    """A chunk of the registered study (here at a few steps, as a replication on fresh seeds from 24) adds whole
    seeds: every arm at both layouts; the table is progress, with no test, until the registered seed count; a file
    of other settings is refused."""
    import dataclasses
    import json

    from unsloth_diffusion_norm.tools import console
    from unsloth_diffusion_norm.tools.convergence import registered

    settings = dataclasses.replace(registered.SETTINGS, steps=4, every=2, train_rows=64, held_rows=8)
    settings = registered.replication(settings, 24)
    path = str(tmp_path / "registered.json")
    found = registered.grow(path, settings, str(tmp_path), 1e-6, lambda _: None, 1, "CPU", "abc1234")
    assert {key: [run["seed"] for run in runs] for key, runs in found["runs"].items()} == {
        key: [24] for key, _, _ in registered.UNITS
    }
    assert [c["seeds"] for c in found["chunks"]] == [[24]] and found["chunks"][0]["commit"] == "abc1234"
    assert set(found["impact"]) == set(registered.LAYOUTS) and all(
        0 <= i["share"] < 1 for i in found["impact"].values()
    )
    one, four = (found["runs"][registered.unit(registered.WINDOW, layout)][0] for layout in registered.LAYOUTS.values())
    assert one["digest"] != four["digest"]  # (batch 1 x GA 8 and batch 4 x GA 2 train apart)
    result = registered.analysis(found)
    assert result["seeds"] == 1 and not result["registered"]
    assert not any(h["primary"]["significant"] for h in result["hypotheses"].values())
    assert registered.render(found).startswith("Replication on fresh seeds 24–47, progress: 1 of 24 seeds")
    assert json.loads((tmp_path / "registered.json").read_text()) == json.loads(json.dumps(found))
    with pytest.raises(console.Failure, match="holds the study at other settings"):
        registered.grow(path, dataclasses.replace(settings, steps=6), str(tmp_path), 1e-6, lambda _: None)


def test_quick_block_study_trains_both_terms_and_decodes_block_by_block(plugin, capsys):
    """The block-diffusion study's quick form (one seed, a few steps, both arms through the real trainer): its
    checks hold (the block arm's loss alpha · diffusion + AR, the other arm neither term, the held-out answers
    decoded block by block not the whole canvas's); each check fails on its planted defect
    (tests/unit/test_convergence_statistics.py)."""
    from unsloth_diffusion_norm.tools import convergence

    assert convergence.main(["--block-study", "--quick"]) == 0
    assert "quick form: every check holds" in capsys.readouterr().out

"""`unsloth-diffusion-norm doctor`: the right status and exit code in each case, with a real self-check."""

import json
import os
import subprocess
import sys

import pytest

import unsloth_diffusion_norm
from unsloth_diffusion_norm import registry
from unsloth_diffusion_norm.proof import fixtures, oracle
from unsloth_diffusion_norm.tools import cli

MODE = unsloth_diffusion_norm.apply().mode


def doctor_json(capsys):
    code = cli.main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["exit"] == code
    return report


def test_fixed_stack_passes_its_self_check(plugin, capsys):
    report = doctor_json(capsys)
    assert report["mode"] == MODE and report["exit"] == 0
    check = report["self_check"]
    assert check["passed"] and len(set(check["counts"])) > 1  # a window the bug would show in
    assert set(report["versions"]) >= {"unsloth", "unsloth_zoo", "transformers", "trl", "accelerate", "torch"}


def test_the_verdict_names_what_the_release_still_gets_wrong_and_what_the_plugin_does(plugin):
    from unsloth_diffusion_norm.tools import doctor

    verdict = doctor.examine(self_check=False)["verdict"]
    if MODE == registry.NATIVE:  # right by itself on the loss; not on a resume, nor on data-parallel variety
        release = unsloth_diffusion_norm.status().unsloth_version
        assert verdict == (
            f"Unsloth {release} normalizes by the window natively, but it draws each window's noise while fetching "
            "it, before a resumed run restores the RNG, so a resumed run trains on other masks than the "
            "uninterrupted one; and every data-parallel rank, seeded alike, draws the same noise levels; the plugin "
            "draws Unsloth's own noise at each window's first step by default, so a resumed run is exact (an "
            "uninterrupted one is bitwise Unsloth's), and diffusion_noise='per_sample' (or the model config's "
            "dp_varying_mask_ratio=True) gives each example its own. On every release evaluation draws its noise "
            "from the global RNG, so each evaluation moves every training draw after it (a seeded run trains another "
            "model when eval_steps changes) and two evaluations of the same weights disagree; the plugin keeps those "
            "draws by default, and diffusion_eval_noise='fixed' keys them (the same weights give the same eval loss, "
            "and evaluating leaves training as it was)."
        )
    else:
        assert "the plugin's fix is active" in verdict and "diffusion_eval_noise='fixed' keys them" in verdict


@pytest.mark.fresh_interpreter
def test_disabled_plugin_on_an_affected_release_exits_1_and_the_self_check_shows_why(tmp_path):
    env = {**os.environ, **fixtures.CPU_ENVIRONMENT, "UNSLOTH_DIFFUSION_NORM": "0"}
    run_config = tmp_path / "train.yaml"
    # a field the switched-off plugin cannot honour, in a run that is affected without it (two micro-batches a step;
    # at Trainer's default batch 8 x GA 1 one micro-batch per step is right either way, and the check passes)
    run_config.write_text(
        "diffusion_loss_normalization: window\nper_device_train_batch_size: 1\ngradient_accumulation_steps: 2\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "unsloth_diffusion_norm.tools.cli", "doctor", "--json", "--config", str(run_config)],
        capture_output=True,
        text=True,
        env=env,
    )
    report = json.loads(done.stdout[done.stdout.index("{") :])
    assert report["mode"] == registry.DISABLED and done.returncode == report["exit"]
    if MODE == registry.NATIVE:  # Unsloth itself is right there, on the loss (the exit code says so)
        assert done.returncode == 0 and report["self_check"]["passed"]
        assert "a resumed run trains on other masks" in report["verdict"]
        assert "the plugin is disabled, so nothing fixes either." in report["verdict"]
    else:
        assert done.returncode == 1 and not report["self_check"]["passed"]
        assert report["self_check"]["worst_error_over_tolerance"] > oracle.CONTROL_FACTORS["fp32"]
    assert "the plugin is disabled, so nothing fixes that." in report["verdict"]
    if MODE != registry.NATIVE:
        assert "The run in the config (batch 1 x GA 2 per process) is affected" in report["verdict"]
    assert report["fields"] == {"diffusion_loss_normalization": "window"}
    assert report["verdict"].endswith("with the plugin turned off a DiffusionTrainer refuses them at construction.")


def test_unrecognised_internals_exit_2_without_a_self_check(capsys, drifted):
    with pytest.raises(RuntimeError):
        unsloth_diffusion_norm.apply()
    report = doctor_json(capsys)
    assert report["exit"] == 2 and report["mode"] == registry.UNSUPPORTED and "self_check" not in report
    assert "not supported" in report["verdict"]

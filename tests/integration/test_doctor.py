"""`unsloth-diffusion-norm doctor`: the right status and exit code in each case, with a real self-check."""

import json
import os
import subprocess
import sys

import pytest

import unsloth_diffusion_norm
from unsloth_diffusion_norm import config, registry
from unsloth_diffusion_norm.proof import fixtures, oracle
from unsloth_diffusion_norm.tools import cli, doctor

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
    lines = short(doctor.render(report).splitlines())  # the text of that report: its summary
    assert lines[1].startswith("Plugin: disabled; patches: ")
    assert lines[-2] == (
        "Run config sets: diffusion_loss_normalization='window' (refused while the plugin is disabled); batch 1 x GA 2"
    )
    if MODE != registry.NATIVE:
        release = report["versions"]["unsloth"]
        assert lines[2] == (
            f"Verdict: AFFECTED - Unsloth {release} normalizes per micro-batch and the plugin is disabled "
            "(UNSLOTH_DIFFUSION_NORM=0)"
        )
        assert lines[3] == (
            "  window normalization: AFFECTED in Unsloth; the plugin is disabled; at batch 1 x GA 2: affected"
        )
    assert all(line.endswith("not fixed (the plugin is disabled)") for line in lines[5:7]), lines


def test_unrecognised_internals_exit_2_without_a_self_check(capsys, drifted):
    with pytest.raises(RuntimeError):
        unsloth_diffusion_norm.apply()
    report = doctor_json(capsys)
    assert report["exit"] == 2 and report["mode"] == registry.UNSUPPORTED and "self_check" not in report
    assert "not supported" in report["verdict"]
    lines = short(doctor.render(report).splitlines())
    release = report["versions"]["unsloth"]
    assert lines[1:] == [
        f"Plugin: unsupported ({report['reason']})",
        f"Verdict: Unsloth {release} is not supported; nothing was patched and diffusion losses are Unsloth's own.",
    ]


# --- the text: ten lines at most by default, the whole report with --verbose, --json as it was ---

# What the summary's lines start with, in order (docs_outputs.py picks some of them); with --config the Flags line
# is "Run config sets: ", and with --model a "Model: " line comes before the self-check.
SUMMARY = (
    "Installed: ",
    "Plugin: ",
    "Verdict: ",
    "  window normalization: ",
    "  resume: ",
    "  evaluation noise: ",
    "  data-parallel noise levels: ",
    "Flags: ",
    "Self-check (",
)
# Every key --json prints for a check of the installed stack, as before the summary existed.
JSON_KEYS = {"versions", "device", "mode", "shape", "reason", "defaults", "patches", "displaced", "verdict"}


def doctor_text(capsys, *options):
    code = cli.main(["doctor", *options])
    return code, capsys.readouterr().out.rstrip("\n").splitlines()


def short(lines):
    """The summary's shape on any report: ten lines at most, each short but the versions and the self-check."""
    assert len(lines) <= 10, "\n".join(lines)
    # (a config's values are its own: as long as they are)
    long = [line for line in lines[1:] if len(line) > 120 and not line.startswith(("Self-check", "Run config sets: "))]
    assert long == [], lines
    assert lines[0].startswith("Installed: ") and lines[1].startswith("Plugin: ") and lines[2].startswith("Verdict: ")
    assert not any(line.startswith(("  patched: ", "  defaults: ", "Device: ")) for line in lines), lines
    return lines


def class_level(names):
    """The patches on classes: a live trainer's own (2026.10.7+: 'DiffusionTrainer at 0x...: ...') come and go with
    the trainers this process has built, the self-check's among them."""
    return [name for name in names if " at 0x" not in name]


def test_the_default_output_is_a_verdict_of_ten_lines_at_most(plugin, capsys):
    code, lines = doctor_text(capsys)
    short(lines)
    assert code == 0 and [line[: len(prefix)] for line, prefix in zip(lines, SUMMARY)] == list(SUMMARY)
    assert len(lines) == len(SUMMARY)
    assert lines[-2] == "Flags: all at their defaults (--config FILE checks your run's)"
    assert lines[-1].startswith("Self-check (cpu, tiny model, GA 2, masked tokens ") and ": PASS - " in lines[-1]
    assert lines[2].startswith("Verdict: OK - Unsloth ")
    # the patches, one count per owner, adding up to status()'s
    counted = lines[1].split("; patches: ")[1].removesuffix("; --verbose lists them").split(", ")
    owners = {part.split(" on ", 1)[1]: int(part.split(" on ", 1)[0]) for part in counted}
    assert sum(owners.values()) == len(class_level(name for name, _ in unsloth_diffusion_norm.status().patches))
    fields = 3 * len(config.FIELDS) + 1  # each flag's field, annotation, default; __init__
    assert owners["DiffusionConfig (flags)"] == fields
    window = lines[3]
    if MODE == registry.NATIVE:
        assert window.endswith("right in Unsloth (it divides by the window's masked tokens itself)")
        assert lines[4].endswith("; fixed by the plugin (drawn at the first step)")
    else:
        assert window.endswith("affected in Unsloth, fixed by the plugin")
        assert lines[4].endswith("right in Unsloth (noise drawn at the training step); the plugin keeps it so")
    assert lines[5].endswith("diffusion_eval_noise='fixed' keys it")
    assert lines[6].endswith("diffusion_noise='per_sample' varies them")


def test_verbose_prints_every_patch_the_defaults_and_the_whole_verdict(plugin, capsys):
    state = unsloth_diffusion_norm.status()
    code, lines = doctor_text(capsys, "--verbose")
    assert code == 0
    assert [line.removeprefix("  patched: ") for line in lines if line.startswith("  patched: ")] == [
        name for name, _ in state.patches
    ]
    assert f"  defaults: {state.defaults}" in lines and lines[1].startswith("Device: ")
    assert lines[2] == f"Plugin: mode={state.mode}, shape {state.shape}"
    verdict = next(line for line in lines if line.startswith("Verdict: "))
    assert verdict == "Verdict: " + doctor.examine(self_check=False)["verdict"]
    assert lines[-1].startswith("Self-check (cpu, tiny model, GA 2, masked tokens ")


def test_json_is_the_report_as_it_was_and_both_texts_render_from_it(plugin, capsys):
    report = doctor_json(capsys)
    assert set(report) == JSON_KEYS | {"self_check", "exit"}
    state = unsloth_diffusion_norm.status()
    assert (report["mode"], report["shape"], report["reason"], report["defaults"]) == (
        state.mode,
        state.shape,
        state.reason,
        state.defaults,
    )
    assert class_level(report["patches"]) == class_level(name for name, _ in state.patches)
    assert report["displaced"] == []
    assert report["verdict"] == doctor.examine(self_check=False)["verdict"]  # the whole verdict, not the summary
    assert not any(key in report for key in ("lines", "summary", "defects", "verbose"))
    # the text is made from the report alone: what --json holds is all either text needs
    # The self-check's seconds differ between runs, and so do the live trainers' own patches (2026.10.7+).
    timing = lambda lines: [line.rsplit(" (", 1)[0] for line in lines if " at 0x" not in line]  # noqa: E731
    for options, verbose in (((), False), (("--verbose",), True)):
        _, printed = doctor_text(capsys, *options)
        assert timing(printed) == timing(doctor.render(report, verbose=verbose).splitlines())


def test_doctor_help_names_verbose(capsys):
    with pytest.raises(SystemExit):
        cli.main(["doctor", "--help"])
    assert "--verbose" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "--verbose: every patch" in capsys.readouterr().out


def test_a_config_and_its_run_are_in_the_summary_of_at_most_ten_lines(plugin, capsys, tmp_path):
    run_config = tmp_path / "train.yaml"
    run_config.write_text(
        "diffusion_loss_normalization: window\ndiffusion_eval_noise: fixed\ndiffusion_noise: per_sample\n"
        "per_device_train_batch_size: 1\ngradient_accumulation_steps: 2\n"
    )
    code, lines = doctor_text(capsys, "--config", str(run_config))
    short(lines)
    assert code == 0 and len(lines) == 9
    assert lines[-2] == (
        "Run config sets: diffusion_loss_normalization='window', diffusion_noise='per_sample', "
        "diffusion_eval_noise='fixed'; batch 1 x GA 2"
    )
    if MODE != registry.NATIVE:
        assert lines[3].endswith("fixed by the plugin; at batch 1 x GA 2: fixed")
    assert lines[5].endswith("keyed by the config's diffusion_eval_noise='fixed'")
    assert lines[6].endswith("varied by the config's diffusion_noise='per_sample'")


def family_check(check):
    """An opt-in family's self-check (reproduce.family_checks' keys) made of a plain one's figures."""
    figures = {key: check[key] for key in ("loss", "reference_loss", "grad_error", "param_error", "counts")}
    figures["worst_error_over_tolerance"] = check["worst_error_over_tolerance"]
    settings = {
        "default": {},
        "window": {"diffusion_loss_normalization": "window"},
        "window_per_sample": {"diffusion_loss_normalization": "window", "diffusion_noise": "per_sample"},
    }
    checks = {
        name: {"settings": s, "normalization": "window", "passed": True, **figures} for name, s in settings.items()
    }
    checks["default"]["same_as_release"] = True
    checks["window_per_sample"] = {"settings": settings["window_per_sample"], "passed": False, "error": "TypeError: x"}
    objective = {"shift": True, "normalization": "masked_tokens", "eps": 1e-3}
    return {"objective": objective, "checks": checks, "passed": False, "seconds": 1.0, "device": "cpu"}


MODEL = {
    "dir": "/models/some-checkpoint",
    "model_type": "llada",
    "class": "LLaDAModelLM",
    "profile": "llada",
    "changes": {"num_hidden_layers": [32, 2], "hidden_size": [4096, 64]},
}


def test_every_case_stays_ten_lines_at_most(plugin):
    """The installed release's real report, with everything a run can add to it at once: a config's fields and
    shape, a model of an opt-in family, displaced patches; and the plugin switched off (unpatched())."""
    report = doctor.examine()
    fields = {config.NORMALIZATION.name: "window", config.T_SAMPLER.name: "stratified"}
    everything = {
        **report,
        "fields": fields,
        "shape_of_run": {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1},
        "model": MODEL,
        "self_check": family_check(report["self_check"]),
        "displaced": report["patches"][:2],
        "exit": 1,
    }
    lines = short(doctor.render(everything).splitlines())
    assert len(lines) == 10 and lines[-2].startswith("Model: /models/some-checkpoint: LLaDAModelLM (profile llada)")
    assert lines[-1].startswith("Self-check (cpu, tiny random LLaDAModelLM, GA 2; the family's objective: ")
    assert lines[-1].endswith(": FAIL - default PASS, window PASS, window+per_sample FAIL (it could not run) (1.0 s)")
    assert lines[3] == (
        "  window normalization: LLaDAModelLM (llada) keeps its own unless a run sets "
        "diffusion_loss_normalization='window'"
    )
    assert lines[2].endswith("; 2 patches displaced: the fix is not whole")
    one_step = {**report, "shape_of_run": {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}}
    lines = short(doctor.render(one_step).splitlines())
    assert MODE == registry.NATIVE or lines[3].endswith("; at batch 8 x GA 1: fixed (needed on several processes)")
    failed = {**report, "self_check": {"passed": False, "error": "RuntimeError: boom", "seconds": 0.1}, "exit": 1}
    lines = short(doctor.render(failed).splitlines())
    assert lines[2].startswith("Verdict: FAILED (the self-check) - ") and lines[-1].startswith("Self-check: FAIL")
    with unsloth_diffusion_norm.unpatched():
        # one micro-batch a step: right on one process, affected on several (the longest line a run gives it)
        off = doctor.examine(shape={"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1})
    lines = short(doctor.render(off).splitlines())
    assert lines[1].startswith("Plugin: unpatched (unpatch() was called")
    if MODE == registry.NATIVE:
        assert lines[2].startswith("Verdict: OK - ") and "not fixed (the plugin is unpatched)" in lines[4]
    else:
        assert lines[2].startswith("Verdict: AFFECTED - ") and lines[3] == (
            "  window normalization: AFFECTED in Unsloth; the plugin is unpatched; at batch 8 x GA 1: affected on "
            "several processes"
        )
    assert lines[5].endswith("not fixed (the plugin is unpatched)")

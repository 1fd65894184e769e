"""`doctor --model DIR` / `reproduce --model DIR`: the self-check on a tiny random copy of a checkpoint's own
architecture. Two remote-code architectures that are not our tiny model (tests/integration/fixtures, full-size configs, in
the on-disk format of a hub checkpoint) pass on a fixed stack and fail where the fix is off on an affected
release; the weight files are never read; a directory the check cannot run on is one line and exit 2. A
Dream-shaped and a LLaDA-shaped checkpoint, which the plugin changes only when a run opts in, are checked by
their own family's objective: the default bitwise the release's own, the opt-ins by the window oracle."""

import importlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, strategies

import unsloth_diffusion_norm
from unsloth_diffusion_norm import registry
from unsloth_diffusion_norm.proof import fuzz, judging, oracle
from unsloth_diffusion_norm.tools import cli, doctor, own_model, reproduce

PROG = "unsloth-diffusion-norm"
CLI = [sys.executable, "-m", "unsloth_diffusion_norm"]
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
MODE = unsloth_diffusion_norm.apply().mode
# Random configurations per family in the suite (test_fuzz's share; `make fuzz` draws more).
FAMILY_CONFIGURATIONS = int(os.environ.get("UDN_FUZZ_FAMILY_CONFIGURATIONS", "3"))
# Each fixture: the class its own code builds, and the copy's config against the full-size one.
ARCHITECTURES = {
    # Llama-style: grouped-query attention, rotary buffer, untied plain `lm_head` (the fused-head loss path).
    "nemotron_gqa_rope": (
        "NemotronDiffusionModel",
        {
            "num_hidden_layers": [32, 2],
            "hidden_size": [4096, 64],
            "num_attention_heads": [32, 4],
            "num_key_value_heads": [8, 2],
            "head_dim": [128, 16],
            "intermediate_size": [14336, 128],
            "torch_dtype": ["bfloat16", "float32"],
        },
    ),
    # OLMo/LLaDA-style names, fused qkv, logits from the tied input embedding (dense-logit path), dropout on.
    "nemotron_tied_fused_qkv": (
        "DiffusionLMModel",
        {
            "n_layers": [28, 2],
            "d_model": [3072, 64],
            "n_heads": [24, 4],
            "n_kv_heads": [8, 2],
            "mlp_hidden_size": [8192, 128],
            "attention_dropout": [0.1, 0.0],
            "residual_dropout": [0.1, 0.0],
            "torch_dtype": ["bfloat16", "float32"],
        },
    ),
}
# Each family fixture: the class its own code builds, its Unsloth profile, the copy's config against the full one.
FAMILIES = {
    # Qwen2.5-style Dream-v0: ROPE_INIT_FUNCTIONS["default"], shifted logits, generation_config.json required.
    "dream_shifted_logits": (
        "DreamModel",
        "dream",
        {
            "num_hidden_layers": [28, 2],
            "hidden_size": [3584, 64],
            "num_attention_heads": [28, 4],
            "intermediate_size": [18944, 128],
            "num_key_value_heads": [4, 2],
            "torch_dtype": ["bfloat16", "float32"],
        },
    ),
    # OLMo-style LLaDA-8B: registers "llada" at import, read-only hidden_size, ignores attention_mask.
    "llada_answer_length": (
        "LLaDAModelLM",
        "llada",
        {
            "n_layers": [32, 2],
            "d_model": [4096, 64],
            "n_heads": [32, 4],
            "mlp_hidden_size": [12288, 128],
            "n_kv_heads": [32, 4],
            "torch_dtype": ["bfloat16", "float32"],
        },
    ),
}
GARBAGE = b"not safetensors: the self-check must never read this file\n"
WEIGHTS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json")


def garbage(path, size=8 << 30):
    """A weight file that no loader can read (sparse: no disk), its access time set before its modification
    time, so that reading it moves the access time even under relatime."""
    with open(path, "wb") as f:
        f.write(GARBAGE)
        f.truncate(size)
    mtime = os.stat(path).st_mtime_ns
    os.utime(path, ns=(mtime - 10**12, mtime))


def hub_checkpoint(where, name, edit=None):
    """Fixture `name` as downloaded from a hub: config, code and tokenizer, plus 16 GiB of garbage weights.
    `edit(directory)` changes it further (a broken checkpoint)."""
    directory = where / name
    shutil.copytree(os.path.join(FIXTURES, name), directory, ignore=shutil.ignore_patterns("__pycache__"))
    for weight in WEIGHTS:
        garbage(directory / weight, size=len(GARBAGE) if weight.endswith(".json") else 8 << 30)
    if edit is not None:
        edit(directory)
    return directory


def access_times(directory):
    return {name: os.stat(directory / name).st_atime_ns for name in WEIGHTS}


def edit_config(**changes):
    def edit(directory):
        config = json.loads((directory / "config.json").read_text())
        config.update(changes)
        (directory / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))

    return edit


def replace_in(filename, old, new):
    def edit(directory):
        text = (directory / filename).read_text()
        assert old in text
        (directory / filename).write_text(text.replace(old, new))

    return edit


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    where = tmp_path_factory.mktemp("hub")
    return {name: hub_checkpoint(where, name) for name in [*ARCHITECTURES, *FAMILIES]}


def run(args, tmp_path, env=None):
    """The command line in its own process, with a fresh working and temporary directory."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", **(env or {})}
    done = subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert os.listdir(cwd) == [] and os.listdir(tmp) == []  # the copy lived in the scratch directory
    return done


def one_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PROG), err[-3000:]
    return lines[0]


# --- the fixture architectures pass on a fixed stack, fail with the fix off, and their weights stay unread ---


def test_a_read_would_show_in_the_access_time(tmp_path):
    """The control for the weight files' check: on this filesystem reading such a file moves its atime."""
    garbage(tmp_path / "control.safetensors")
    before = os.stat(tmp_path / "control.safetensors").st_atime_ns
    with open(tmp_path / "control.safetensors", "rb") as f:
        f.read(8)
    assert os.stat(tmp_path / "control.safetensors").st_atime_ns != before


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_doctor_model_passes_on_a_fixed_stack_and_never_reads_a_weight_file(name, checkpoints, plugin, capsys):
    directory = checkpoints[name]
    before = access_times(directory)
    code = cli.main(["doctor", "--json", "--trust-remote-code", "--model", str(directory)])
    report = json.loads(capsys.readouterr().out)
    assert code == report["exit"] == 0, report
    check, model = report["self_check"], report["model"]
    assert check["passed"] and len(set(check["counts"])) > 1, check  # a window the bug would show in
    assert model["profile"] == "nemotron_labs_diffusion" and model["dir"] == str(directory)
    assert (model["class"], model["changes"]) == ARCHITECTURES[name]
    assert access_times(directory) == before  # garbage, 16 GiB: loaded, it would have failed the run anyway


# One architecture (a fresh process each, ~15 s): the other passes on a fixed stack above with the same check.
@pytest.mark.parametrize("name", ["nemotron_gqa_rope"])
def test_with_the_switch_off_doctor_model_fails_where_the_release_is_affected(name, checkpoints, tmp_path):
    # HF_HUB_OFFLINE: the whole check runs without the network (everything it loads is local).
    done = run(
        ["doctor", "--json", "--trust-remote-code", "--model", str(checkpoints[name])],
        tmp_path,
        {"UNSLOTH_DIFFUSION_NORM": "0", "HF_HUB_OFFLINE": "1"},
    )
    report = json.loads(done.stdout)
    assert report["mode"] == registry.DISABLED and done.returncode == report["exit"], done.stderr[-3000:]
    check = report["self_check"]
    assert report["model"]["class"] == ARCHITECTURES[name][0] and len(set(check["counts"])) > 1
    if MODE == registry.NATIVE:  # Unsloth itself is right there
        assert done.returncode == 0 and check["passed"]
    else:
        assert done.returncode == 1 and not check["passed"]
        assert check["worst_error_over_tolerance"] > oracle.CONTROL_FACTORS["fp32"]


def test_the_fixtures_take_both_loss_paths_where_the_release_has_a_fused_head(checkpoints, tmp_path):
    """The untied plain lm_head takes the fused-head path, the tied embedding the dense-logit one."""
    diffusion_loss = pytest.importorskip("unsloth.models.diffusion_loss")  # 2026.10.6+; 10.4 is dense only
    from unsloth_diffusion_norm.proof.fixtures import load_model

    fused = {}
    for name in ARCHITECTURES:
        model, _ = load_model(checkpoint=own_model.prepare(checkpoints[name], workdir=tmp_path).checkpoint)
        fused[name] = diffusion_loss.fusable_head(model, model) is not None
    assert fused == {"nemotron_gqa_rope": True, "nemotron_tied_fused_qkv": False}


def test_reproduce_model_prints_the_table_for_the_copy(checkpoints, plugin, capsys):
    assert cli.main(["reproduce", "--trust-remote-code", "--model", str(checkpoints["nemotron_tied_fused_qkv"])]) == 0
    out = capsys.readouterr().out
    assert "Model: a tiny random DiffusionLMModel from " in out and "d_model 3072→64" in out
    within = next(line for line in out.splitlines() if line.startswith("| within tolerance"))
    cells = tuple(cell.strip() for cell in within.split("|")[2:5])
    assert cells == (("—", "—", "yes") if MODE == registry.NATIVE else ("NO", "yes", "—"))


def test_a_forward_that_requires_attention_mask_cannot_train_here_and_doctor_says_so(tmp_path, plugin, monkeypatch):
    """Unsloth calls the model without attention_mask (padding is EOS-filled and attended), so such a forward
    cannot train under DiffusionTrainer at all: the self-check reports that it could not run (exit 1)."""
    import tempfile

    from unsloth_diffusion_norm.tools import doctor

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the copy and the run folder: not in /tmp

    directory = hub_checkpoint(
        tmp_path,
        "nemotron_tied_fused_qkv",
        replace_in(
            "modeling_diffusion_lm.py",
            "def forward(self, input_ids, attention_mask=None,",
            "def forward(self, input_ids, attention_mask,",
        ),
    )
    report = doctor.examine(model=str(directory))
    assert report["exit"] == 1 and not report["self_check"]["passed"]
    assert "attention_mask" in report["self_check"]["error"]


# --- Dream and LLaDA: the default is the release's own, the opt-ins match the window oracle ---


@pytest.mark.parametrize("name", FAMILIES)
def test_doctor_model_checks_dream_and_llada_by_their_own_objective(name, checkpoints, plugin, capsys):
    directory = checkpoints[name]
    before = access_times(directory)
    code = cli.main(["doctor", "--json", "--trust-remote-code", "--model", str(directory)])
    report = json.loads(capsys.readouterr().out)
    assert code == report["exit"] == 0, report
    model, check = report["model"], report["self_check"]
    assert (model["class"], model["profile"], model["changes"]) == FAMILIES[name]
    objective = oracle.OBJECTIVES[model["profile"]]
    assert check["passed"] and check["objective"]["normalization"] == objective.normalization
    default, window, per_sample = (check["checks"][k] for k in ("default", "window", "window_per_sample"))
    assert default["normalization"] == objective.normalization and default["same_as_release"]  # bitwise
    assert window["settings"] == {"diffusion_loss_normalization": "window"} and window["normalization"] == "window"
    assert per_sample["settings"] == {"diffusion_loss_normalization": "window", "diffusion_noise": "per_sample"}
    assert all(c["passed"] and c["worst_error_over_tolerance"] <= 1 for c in (default, window, per_sample))
    assert len(set(window["counts"])) > 1 and window["counts"] == default["counts"]  # the same masks
    assert window["control_worst_error_over_tolerance"] > oracle.CONTROL_FACTORS["fp32"]
    assert access_times(directory) == before
    text = doctor.render(report, verbose=True).splitlines()  # each check on a line of its own
    assert text[-4].startswith(f"Self-check (cpu, tiny random {model['class']}, GA 2; the family's objective: ")
    assert [line.split(" - ")[0] for line in text[-3:]] == [
        "  default (no flag): PASS",
        "  diffusion_loss_normalization='window': PASS",
        "  diffusion_loss_normalization='window', diffusion_noise='per_sample': PASS",
    ]
    assert text[-3].endswith("; bitwise the release's own (an unpatched run)")
    summary = doctor.render(report).splitlines()  # by default, the checks in a word each on the self-check's line
    assert len(summary) <= 10 and summary[-2].startswith(f"Model: {directory}: {model['class']} (profile ")
    assert summary[-1].startswith(f"Self-check (cpu, tiny random {model['class']}, GA 2; the family's objective: ")
    assert ": PASS - default PASS, window PASS, window+per_sample PASS (" in summary[-1]


def test_with_the_plugin_off_the_window_check_fails_and_the_default_still_holds(checkpoints, tmp_path, monkeypatch):
    """unpatched(): the release without the plugin has no window opt-in (exit 1 on every release)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the copy and the run folders: not in /tmp
    with unsloth_diffusion_norm.unpatched():
        report = doctor.examine(model=str(checkpoints["llada_answer_length"]))
    checks = report["self_check"]["checks"]
    assert report["exit"] == 1 and report["mode"] == registry.UNPATCHED and not report["self_check"]["passed"]
    assert checks["default"]["passed"] and checks["default"]["same_as_release"]
    for name in ("window", "window_per_sample"):
        assert not checks[name]["passed"]
        assert "unexpected keyword argument 'diffusion_loss_normalization'" in checks[name]["error"]
    verbose = doctor.render(report, verbose=True)
    assert "  diffusion_loss_normalization='window': FAIL - it could not run: TypeError: " in verbose
    assert "window FAIL (it could not run), window+per_sample FAIL (it could not run)" in doctor.render(report)


@pytest.fixture(scope="module")
def family_runs(checkpoints, tmp_path_factory):
    """Each family's tiny copy, built once, and one default run of it: {name: (copy, run)}."""
    where = tmp_path_factory.mktemp("copies")
    unsloth_diffusion_norm.apply()
    copies = {name: own_model.prepare(checkpoints[name], workdir=where) for name in FAMILIES}
    return {name: (copy, reproduce.train_copy(0, copy)) for name, copy in copies.items()}


@pytest.mark.parametrize("name", FAMILIES)
def test_the_release_s_own_loss_matches_its_family_s_oracle_and_misses_it_with_the_other_rule(name, family_runs):
    """The oracle's knobs are not decoration: Dream's default run misses it unshifted, LLaDA's with Dream's
    per-micro-batch masked-token normalization instead of its answer lengths."""
    copy, run = family_runs[name]
    objective = oracle.OBJECTIVES[copy.profile]
    assert reproduce.judge_copy(run, copy).ok
    shift, normalization = (
        (False, objective.normalization) if objective.shift else (objective.shift, oracle.MASKED_TOKENS)
    )
    verdict = judging.judge(
        run,
        run.windows[0],
        judging.OracleSettings(
            eps=objective.eps, eos_id=copy.eos_id, mask_id=copy.mask_id, shift=shift, normalization=normalization
        ),
    )
    assert verdict.worst > oracle.CONTROL_FACTORS["fp32"]


@pytest.mark.parametrize("name", FAMILIES)
@fuzz.in_ci(FAMILY_CONFIGURATIONS)
@given(data=strategies.data())
def test_a_random_configuration_of_the_family_trains_as_its_oracle_says(name, family_runs, plugin, data):
    """The fuzzer's space (proof/fuzz.py: batch, GA, partial windows, answers with and without EOS, truncation, eps,
    weighting, per-sample noise, stratified levels, mask pairs, clipping, keyed evaluation) on the family's copy, at
    its own objective or opted into the window, judged by the family's oracle."""
    copy, _ = family_runs[name]
    configuration = data.draw(fuzz.configurations(copy.profile, llada_per_sample=MODE == registry.NATIVE))
    missed = fuzz.check(configuration, copy)
    assert not missed, f"{configuration.describe()}: {missed}"


@pytest.mark.parametrize("name", FAMILIES)
def test_the_family_corner_at_its_own_objective_trains_as_its_oracle_says(name, family_runs, plugin):
    """The CI share's corner for each family beside the drawn ones: its own normalization and eps, the 1/p
    weighting, clipping, a partial last window (five rows at batch 2 x GA 2)."""
    copy, _ = family_runs[name]
    rows = tuple(((10 + i, 11 + i), tuple(20 + (7 * i + k) % 60 for k in range(14 - 2 * i)), True) for i in range(5))
    corner = fuzz.Configuration(rows, batch_size=2, eps=None, max_grad_norm=1.0, family=copy.profile, seed=3)
    missed = fuzz.check(corner, copy)
    assert not missed, f"{corner.describe()}: {missed}"


def test_per_sample_noise_at_llada_s_own_normalization_or_its_refusal(family_runs, plugin):
    """LLaDA's answer-length normalization takes per-sample noise on 2026.10.7+ only: 2026.10.4-.6 refuse it at
    construction, naming the way out (Dream's per-micro-batch masked-token one takes it everywhere)."""
    copy, _ = family_runs["llada_answer_length"]
    if MODE == registry.PATCHED:
        with pytest.raises(ValueError) as refused:
            reproduce.train_copy(0, copy, diffusion_noise="per_sample")
        assert str(refused.value) == (
            "unsloth_diffusion_norm: diffusion_noise='per_sample' with 'llada''s own 'answer_length' normalization "
            "is not available on this release; set diffusion_loss_normalization='window' or leave diffusion_noise "
            "at None."
        )
        return
    run = reproduce.train_copy(0, copy, diffusion_noise="per_sample")
    assert run.windows[0].batches[0]["keys"] and reproduce.judge_copy(run, copy).ok


@pytest.mark.parametrize("name", FAMILIES)
def test_a_fixed_evaluation_is_the_family_oracles_loss_with_the_keyed_masks_realized(name, family_runs, plugin):
    """Dream (shifted, its own masked tokens) and LLaDA (answer lengths) evaluate with keyed noise by their own
    objective: two draws per example, the same loss twice; the release's own draws miss the keyed oracle."""
    from unsloth_diffusion_norm.proof import experiment

    copy, _ = family_runs[name]
    objective = oracle.OBJECTIVES[copy.profile]
    settings = judging.OracleSettings(
        eps=objective.eps,
        eos_id=copy.eos_id,
        mask_id=copy.mask_id,
        shift=objective.shift,
        normalization=objective.normalization,
    )
    keyed = {"diffusion_eval_noise": "fixed", "diffusion_eval_draws": 2}
    run = reproduce.train_copy(0, copy, eval_examples=copy.examples, **keyed)
    run.reference_model.load_state_dict(run.trainer.model.state_dict())
    loss, seen = experiment.evaluate(run.trainer, seed=None)
    expected = judging.expected_fixed_evaluation_loss(
        run.reference_model, judging.keyed_evaluation(seen, 0, draws=2), settings
    )
    assert abs(loss - expected) <= oracle.tolerance(expected) and loss == experiment.evaluate(run.trainer, seed=None)[0]
    run.trainer.args.diffusion_eval_noise, run.trainer.args.diffusion_eval_draws = None, 1
    own, _ = experiment.evaluate(run.trainer)
    assert abs(own - expected) > 100 * oracle.tolerance(expected)


def test_reproduce_model_on_a_family_shows_the_window_opt_in_against_the_release_s_own(checkpoints, plugin, capsys):
    assert cli.main(["reproduce", "--trust-remote-code", "--model", str(checkpoints["llada_answer_length"])]) == 0
    out = capsys.readouterr().out
    assert "The plugin changes the llada profile only on opt-in: unpatched = the release's own normalization" in out
    within = next(line for line in out.splitlines() if line.startswith("| within tolerance"))
    assert tuple(cell.strip() for cell in within.split("|")[2:5]) == ("NO", "yes", "—")


def _plain_import(tmp_path, name, module):
    """A fixture's code imported as an ordinary package: without Unsloth's remote-code loader in between."""
    package = tmp_path / f"plain_{name}"
    package.mkdir()
    (package / "__init__.py").touch()
    for entry in os.listdir(os.path.join(FIXTURES, name)):
        if entry.endswith(".py"):
            shutil.copyfile(os.path.join(FIXTURES, name, entry), package / entry)
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(f"plain_{name}.{module}")
    finally:
        sys.path.remove(str(tmp_path))


def test_the_family_fixtures_carry_the_published_quirks(family_runs, tmp_path, monkeypatch):
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    dream = _plain_import(tmp_path, "dream_shifted_logits", "modeling_dream")
    config = dream.DreamConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    if int(transformers.__version__.split(".")[0]) >= 5:  # 5.x dropped "default"; Unsloth's loader supplies it
        with pytest.raises(KeyError, match="default"):
            dream.DreamRotaryEmbedding(config)
    else:
        dream.DreamRotaryEmbedding(config)
    copy = tmp_path / "no_generation_config"
    shutil.copytree(family_runs["dream_shifted_logits"][0].checkpoint, copy)
    os.remove(copy / "generation_config.json")
    with pytest.raises(OSError, match="generation_config.json"):
        transformers.AutoModel.from_pretrained(str(copy), trust_remote_code=True, local_files_only=True)

    monkeypatch.setitem(CONFIG_MAPPING._extra_content, "llada", None)  # what the import registers, put back after
    llada = _plain_import(tmp_path, "llada_answer_length", "modeling_llada")
    assert CONFIG_MAPPING["llada"] is llada.LLaDAConfig  # registered by the import
    config = llada.LLaDAConfig(
        d_model=64, n_heads=4, n_kv_heads=4, n_layers=1, mlp_hidden_size=128, vocab_size=300, embedding_size=300
    )
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (64, 4, 1)
    with pytest.raises(AttributeError):
        config.hidden_size = 32  # read-only: derived from d_model
    with torch.random.fork_rng(devices=[]):  # a later test draws its masks from the global generator as it is
        model = llada.LLaDAModelLM(config).eval()
    tokens = torch.arange(10, 18)[None]
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, model(tokens, attention_mask=torch.zeros_like(tokens)).logits)


# --- what the self-check cannot run on: one line, exit 2 ---


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    where = tmp_path_factory.mktemp("broken")
    no_config = where / "no_config"
    no_config.mkdir()
    garbage(no_config / "model.safetensors", size=1 << 20)
    return {
        "no config.json": (str(no_config), f"no config.json in '{no_config}': not a checkpoint directory"),
        "no remote code": (
            str(hub_checkpoint(where, "nemotron_gqa_rope", edit_config(auto_map=None))),
            "has no remote code (config.json has no auto_map)",
        ),
        "code missing": (
            str(hub_checkpoint(where, "nemotron_tied_fused_qkv", lambda d: os.remove(d / "modeling_diffusion_lm.py"))),
            "auto_map names 'modeling_diffusion_lm.DiffusionLMModel', but modeling_diffusion_lm.py is not in",
        ),
    }


HUB_ID = "nvidia/Nemotron-Labs-Diffusion-8B"


@pytest.mark.parametrize("case", ["hub id", "no such directory", "no config.json", "no remote code", "code missing"])
def test_a_directory_that_is_no_checkpoint_is_refused_before_unsloth_is_imported(case, broken, tmp_path):
    directory, says = {
        "hub id": (HUB_ID, f"'{HUB_ID}' is not a local directory (a Hub id?); this command never downloads"),
        "no such directory": ("/nonexistent/checkpoint", "no directory '/nonexistent/checkpoint'"),
        **broken,
    }[case]
    command = "reproduce" if case == "no remote code" else "doctor"
    done = run([command, "--model", directory], tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert says in one_line(done.stderr).removeprefix(f"{PROG} {command}: ")


@pytest.mark.parametrize("command", ["doctor", "reproduce"])
def test_without_trust_remote_code_nothing_of_the_directory_is_imported_and_it_exits_2(command, tmp_path):
    """Like transformers (trust_remote_code=True) and vLLM (--trust-remote-code): a directory's code runs only
    when asked. Its configuration file here writes a marker when imported: without the flag no marker."""
    marker = tmp_path / "imported"

    def plant(directory):
        code = directory / "configuration_nemotron_diffusion.py"
        code.write_text(f"open({str(marker)!r}, 'w').close()\n" + code.read_text())

    directory = hub_checkpoint(tmp_path, "nemotron_gqa_rope", plant)  # (sparse weights: copytree would fill them)
    (tmp_path / "plain").mkdir()
    (tmp_path / "json").mkdir()
    done = run([command, "--model", str(directory)], tmp_path / "plain")
    assert done.returncode == 2 and done.stdout == "" and not marker.exists()
    assert one_line(done.stderr) == (
        f"{PROG} {command}: --model {directory}: the self-check imports and runs this directory's own Python code "
        "(configuration_nemotron_diffusion.py, modeling_nemotron_diffusion.py); if you trust it, add --trust-remote-code"
    )
    done = run(["doctor", "--json", "--model", str(directory)], tmp_path / "json")
    assert done.returncode == json.loads(done.stdout)["exit"] == 2 and not marker.exists()


def test_set_needs_model_and_key_value(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    done = run(["doctor", "--set", "a=1"], tmp_path / "a")
    assert done.returncode == 2 and "--set is for the tiny copy of --model DIR" in one_line(done.stderr)
    (tmp_path / "c").mkdir()
    done = run(["doctor", "--trust-remote-code"], tmp_path / "c")
    assert done.returncode == 2 and "--trust-remote-code is for the code of --model DIR" in one_line(done.stderr)
    done = run(["doctor", "--model", "x", "--set", "novalue"], tmp_path / "b")
    assert done.returncode == 2 and "expected key=value, not 'novalue'" in one_line(done.stderr)


@pytest.mark.parametrize("case", ["no masked-diffusion profile", "another profile", "does not build", "no mask id"])
def test_a_checkpoint_the_self_check_cannot_run_on_is_one_line_and_exit_2(case, tmp_path, capsys, plugin):
    architecture = "nemotron_gqa_rope"
    edit, settings, says = {
        "no masked-diffusion profile": (
            lambda d: [
                replace_in(f, '"nemotron_labs_diffusion"', '"my_causal_lm"')(d)
                for f in ("config.json", "configuration_nemotron_diffusion.py")
            ],
            [],
            "has no masked-diffusion profile for model_type 'my_causal_lm' (architectures ['NemotronDiffusionModel'])",
        ),
        "another profile": (
            lambda d: [
                replace_in(f, '"nemotron_labs_diffusion"', '"sdar"')(d)
                for f in ("config.json", "configuration_nemotron_diffusion.py")
            ],
            [],
            "to its 'sdar' profile; the self-check's oracle knows the nemotron_labs_diffusion, dream, llada "
            "objectives, the ones this plugin changes",
        ),
        "does not build": (
            None,
            ["--set", "num_key_value_heads=3"],
            "does not build: ValueError: num_attention_heads (4) must be a multiple of "
            "num_key_value_heads (3) (shrunk: num_hidden_layers 32→2",
        ),
        "no mask id": (edit_config(mask_token_id=None), [], "no [MASK] token id in "),
    }[case]
    directory = hub_checkpoint(tmp_path, architecture, edit)
    before = access_times(directory)
    for json_flag in ([], ["--json"]):
        code = cli.main(["doctor", *json_flag, "--trust-remote-code", "--model", str(directory), *settings])
        captured = capsys.readouterr()
        assert code == 2 and says in one_line(captured.err), captured.err
        assert captured.out == "" if not json_flag else json.loads(captured.out)["exit"] == 2
    assert "give it with --set mask_token_id=N" in captured.err or case != "no mask id"
    assert access_times(directory) == before


# --- the shrink itself ---


def test_shrink_keeps_the_attention_kind_and_the_vocabulary_and_turns_dropout_off():
    full = {
        "num_hidden_layers": 40,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "num_key_value_heads": 40,
        "intermediate_size": 13824,
        "vocab_size": 152064,
        "eos_token_id": [2, 11],
        "hidden_dropout": 0.1,
        "layer_types": ["full", "sliding"] * 20,
        "quantization_config": {"quant_method": "fp8"},
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 131072,
    }
    tiny, changes = own_model.shrink(full, [("rope_theta", 10000.0)])
    kept = {k: v for k, v in full.items() if k != "quantization_config"}  # random weights are not quantized
    assert tiny == {
        **kept,
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "hidden_dropout": 0.0,
        "layer_types": ["full", "sliding"],
        "torch_dtype": "float32",
        "rope_theta": 10000.0,
    }
    assert changes["quantization_config"] == ["present", "removed"] and changes["rope_theta"] == [None, 10000.0]
    assert own_model.shrink({"n_head": 16, "multi_query_group_num": 1})[0]["multi_query_group_num"] == 1
    assert own_model.shrink({"num_hidden_layers": 1, "hidden_size": 32})[1] == {}  # never grown
    assert own_model.parse_setting("rope_scaling=null") == ("rope_scaling", None)
    assert own_model.parse_setting("attn_implementation=sdpa") == ("attn_implementation", "sdpa")


def test_the_oracle_reads_logits_from_a_forward_that_returns_a_tuple(checkpoints, tmp_path):
    import torch
    from transformers import AutoModel

    copy = own_model.prepare(checkpoints["nemotron_tied_fused_qkv"], workdir=tmp_path)
    model = AutoModel.from_pretrained(copy.checkpoint, trust_remote_code=True, dtype=torch.float32)
    batch = {"input_ids": torch.tensor([copy.examples[0].row()["input_ids"]])}
    batch["labels"] = batch["input_ids"].clone()
    masks = oracle.replay_noise([batch], torch.get_rng_state(), 1e-3, copy.eos_id)
    losses = []
    for return_dict in (True, False):  # a ModelOutput, then the plain tuple 4.x-era code returns
        model.config.return_dict = return_dict
        losses.append(oracle.window_loss(model, masks, copy.mask_id)[0].item())
    assert isinstance(model(input_ids=batch["input_ids"]), tuple) and losses[0] == losses[1] > 0

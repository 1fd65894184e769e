"""Patches as data: they take, they come off, they apply once, and bad input gets a clear error."""

import json
import os
import subprocess
import sys
import time

import pytest
import wrapt

import unsloth_diffusion_norm
from unsloth_diffusion_norm import config, registry
from unsloth.models.diffusion_masked import MaskedDiffusionProfile
from unsloth.models.diffusion_profiles import diffusion_profiles
from unsloth.models.diffusion_trainer import DiffusionConfig, DiffusionTrainer


def nemotron():
    return next(p for p in diffusion_profiles() if p.name == "nemotron_labs_diffusion")


def test_patch_takes_and_comes_off(plugin):
    status = unsloth_diffusion_norm.status()
    assert status.mode == registry.PATCHED and status.unsloth_version
    assert isinstance(vars(DiffusionTrainer)["get_batch_samples"], wrapt.FunctionWrapper)
    assert isinstance(vars(MaskedDiffusionProfile)["compute_loss"], wrapt.FunctionWrapper)
    assert nemotron().loss_normalization == config.GLOBAL_MASKED_TOKENS
    assert config.FIELD in DiffusionConfig.__dataclass_fields__
    names = [name for name, _ in status.patches]
    assert len(names) == len(set(names)) == 8

    original_loss = vars(MaskedDiffusionProfile)["compute_loss"].__wrapped__
    unsloth_diffusion_norm.unpatch()
    assert unsloth_diffusion_norm.status().patches == ()
    assert "get_batch_samples" not in vars(DiffusionTrainer)
    assert "model_accepts_loss_kwargs" not in vars(DiffusionTrainer)
    assert vars(MaskedDiffusionProfile)["compute_loss"] is original_loss
    assert nemotron().loss_normalization == "masked_tokens"
    assert config.FIELD not in DiffusionConfig.__dataclass_fields__
    assert not hasattr(DiffusionConfig, config.FIELD)


def test_apply_is_idempotent_and_keeps_names_and_signatures(plugin):
    import inspect

    before = [(p.name, p.owner, p.attribute) for p in registry.STATE.patches]
    wrapper = vars(MaskedDiffusionProfile)["compute_loss"]
    unsloth_diffusion_norm.apply()
    unsloth_diffusion_norm.apply()
    assert [(p.name, p.owner, p.attribute) for p in registry.STATE.patches] == before
    assert vars(MaskedDiffusionProfile)["compute_loss"] is wrapper
    assert not isinstance(wrapper.__wrapped__, wrapt.FunctionWrapper)  # no stacking
    assert MaskedDiffusionProfile.compute_loss.__name__ == "compute_loss"
    assert list(inspect.signature(MaskedDiffusionProfile.compute_loss).parameters) == [
        "self", "model", "inputs", "args", "num_items_in_batch"
    ]


CPU = dict(bf16=False, use_cpu=True)


def test_config_field_validates_and_round_trips(plugin, tmp_path):
    assert DiffusionConfig(output_dir=str(tmp_path), **CPU).diffusion_loss_normalization is None
    for value in ("window", "microbatch"):
        args = DiffusionConfig(output_dir=str(tmp_path), diffusion_loss_normalization=value, **CPU)
        assert args.to_dict()[config.FIELD] == value
        assert json.loads(args.to_json_string())[config.FIELD] == value
    with pytest.raises(ValueError, match="'window', 'microbatch' or None"):
        DiffusionConfig(output_dir=str(tmp_path), diffusion_loss_normalization="global", **CPU)


def test_window_flag_on_a_non_masked_profile_is_refused_at_construction(plugin, tmp_path):
    from datasets import Dataset

    from unsloth_diffusion_norm import experiment

    block = next(p for p in diffusion_profiles() if not isinstance(p, MaskedDiffusionProfile))
    model, tokenizer = experiment.load_model()
    args = DiffusionConfig(
        output_dir=str(tmp_path), diffusion_loss_normalization="window", bf16=False, use_cpu=True,
        report_to=[], max_length=None,
    )
    data = Dataset.from_list([experiment.Example([10], [20]).row()])
    with pytest.raises(ValueError, match="window normalization is implemented for the masked-diffusion"):
        DiffusionTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                         diffusion_profile=block)


def test_drifted_unsloth_gets_a_clear_error_and_nothing_patched(caplog):
    unsloth_diffusion_norm.unpatch()
    token_ids = MaskedDiffusionProfile._token_ids
    del MaskedDiffusionProfile._token_ids
    try:
        with pytest.raises(RuntimeError, match=r"Unsloth 2026\.10\.\d+: .*MaskedDiffusionProfile\._token_ids"):
            unsloth_diffusion_norm.apply()
        status = unsloth_diffusion_norm.status()
        assert status.mode == registry.UNSUPPORTED and "_token_ids" in status.reason
        assert status.patches == () and "get_batch_samples" not in vars(DiffusionTrainer)
        assert nemotron().loss_normalization == "masked_tokens"
    finally:
        MaskedDiffusionProfile._token_ids = token_ids
        registry.STATE.mode = registry.PENDING
        unsloth_diffusion_norm.apply()
    assert unsloth_diffusion_norm.status().mode == registry.PATCHED


def _python(code, **env):
    environment = {**os.environ, "UNSLOTH_ALLOW_CPU": "1", **env}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_import_alone_imports_neither_torch_nor_unsloth():
    line = _python(
        "import sys, time; t = time.perf_counter(); import unsloth_diffusion_norm as u; "
        "ms = (time.perf_counter() - t) * 1000; "
        "print(u.status().mode, 'torch' in sys.modules, 'unsloth' in sys.modules, round(ms, 1))"
    )
    mode, torch_loaded, unsloth_loaded, _ms = line.split()
    assert (mode, torch_loaded, unsloth_loaded) == ("pending", "False", "False")


def test_import_after_unsloth_patches_and_env_switch_disables():
    after = _python(
        "import unsloth, unsloth_diffusion_norm as u; from unsloth.models.diffusion_trainer import "
        "DiffusionTrainer as T; print(u.status().mode, 'get_batch_samples' in vars(T))"
    )
    assert after == "patched True"
    disabled = _python(
        "import unsloth_diffusion_norm as u, unsloth; from unsloth.models.diffusion_trainer import "
        "DiffusionTrainer as T; print(u.status().mode, 'get_batch_samples' in vars(T))",
        UNSLOTH_DIFFUSION_NORM="0",
    )
    assert disabled == "disabled False"

"""The rooms: the core (what runs inside a user's training step) never imports the proof or the tools, and the
oracle never imports the patches or the loss code it judges. Each checked in a fresh interpreter."""

import json
import os
import subprocess
import sys
import textwrap

from unsloth_diffusion_norm.proof import fixtures


def _modules_after(code, cwd, **env):
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(code) + "\nimport sys, json\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('unsloth_diffusion_norm'))))",
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **fixtures.CPU_ENVIRONMENT, **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


TRAIN_ONE_STEP = """
    import contextlib, io
    import unsloth_diffusion_norm
    with contextlib.redirect_stdout(io.StringIO()):
        from unsloth import FastModel
    import torch
    from datasets import Dataset
    from unsloth.models.diffusion_trainer import DiffusionConfig, DiffusionTrainer
    unsloth_diffusion_norm.apply()
    model, tokenizer = FastModel.from_pretrained("checkpoint", trust_remote_code=True, dtype=torch.float32,
                                                 device_map={"": "cpu"})
    rows = [{"input_ids": [10 + i, 11, 20, 21, 22, 0], "completion_mask": [0, 0, 1, 1, 1, 1]} for i in range(2)]
    args = DiffusionConfig(output_dir="out", per_device_train_batch_size=1, gradient_accumulation_steps=2,
                           max_steps=1, bf16=False, use_cpu=True, report_to=[], save_strategy="no",
                           max_length=None, disable_tqdm=True)
    with contextlib.redirect_stdout(io.StringIO()):
        DiffusionTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer).train()
"""


def test_the_core_never_imports_the_proof_or_the_tools(tmp_path):
    from unsloth_diffusion_norm.proof.tiny_model import write_tiny_checkpoint

    write_tiny_checkpoint(str(tmp_path / "checkpoint"))  # its own remote code, as a user's checkpoint has
    loaded = _modules_after(TRAIN_ONE_STEP, tmp_path)
    assert "unsloth_diffusion_norm.activation" in loaded
    assert [m for m in loaded if m.startswith(("unsloth_diffusion_norm.proof", "unsloth_diffusion_norm.tools"))] == []


def test_the_oracle_never_imports_what_it_judges(tmp_path):
    loaded = _modules_after("import unsloth_diffusion_norm.proof.oracle", tmp_path)
    judged = {
        f"unsloth_diffusion_norm.{name}"
        for name in (
            "patches",
            "patched",
            "native",
            "construction",
            "wrappers",
            "loss",
            "noise",
            "window",
            "per_sample",
            "evaluation",
            "batch_keys",
        )
    }
    assert "unsloth_diffusion_norm.proof.oracle" in loaded and not judged & set(loaded)

"""What every proof run starts from: examples, the tiny checkpoint and its loader, the settings and the
CPU environment of our own runs - each defined here once. Imports neither torch nor Unsloth (the command
line reads it before it knows whether they are installed)."""

import atexit
import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass

from .tiny_model import EOS_ID, MASK_ID, write_tiny_checkpoint  # noqa: F401 - the ids are part of this room's vocabulary

# Our own runs on a CPU-only host (the tests, the CLI, launched ranks); the plugin never sets these.
CPU_ENVIRONMENT = {
    "UNSLOTH_ALLOW_CPU": "1",  # `import unsloth` refuses a host without an accelerator otherwise
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    # Nothing of ours downloads. Without it, a fresh process that loads a checkpoint by a relative path asks
    # the Hub for an adapter config (Unsloth's loader, through peft) and, on a host without network, waits
    # out ~45 s of retries before it goes on.
    "HF_HUB_OFFLINE": "1",
}


def import_unsloth(banners=None):
    """Import the plugin, then Unsloth, as users do; Unsloth's banners go to `banners` (a text stream), or
    nowhere."""
    import io

    import unsloth_diffusion_norm  # noqa: F401 - before unsloth, as users do

    with contextlib.redirect_stdout(banners or io.StringIO()):
        import unsloth  # noqa: F401 - the plugin's hooks act on this import


def expected_mode(version=None):
    """What the plugin must make of each release (the proof may know versions; the plugin may not)."""
    from ..detect import unsloth_version
    from ..registry import NATIVE, PATCHED, UNSUPPORTED

    release = tuple(int(part) for part in (version or unsloth_version()).split(".")[:3])
    if release < (2026, 10, 4):
        return UNSUPPORTED  # no masked-diffusion profiles
    return PATCHED if release <= (2026, 10, 6) else NATIVE


# NVIDIA's published noise floor, the Nemotron profile's default diffusion_eps: p_mask = (1-eps)·t + eps.
EPS = 1e-3

LEARNING_RATE = 0.1


@dataclass
class Example:
    prompt: list
    answer: list  # supervised tokens; the EOS that closes the answer is added unless eos=False
    eos: bool = True

    def row(self):
        answer = self.answer + ([EOS_ID] if self.eos else [])
        return {
            "input_ids": self.prompt + answer,
            "completion_mask": [0] * len(self.prompt) + [1] * len(answer),
        }


def tiny_checkpoint(**config):
    """A tiny checkpoint in a fresh temporary directory, written once per process, temporary directory and `config`
    (settings of its config: block_size=3): the command line points tempfile at a scratch directory of its own and
    removes it afterwards."""
    where = (tempfile.gettempdir(), *sorted(config.items()))
    if where not in _CHECKPOINTS:
        _CHECKPOINTS[where] = write_tiny_checkpoint(os.path.join(scratch("udn-tiny-"), "tiny"), **config)
    return _CHECKPOINTS[where]


_CHECKPOINTS = {}


def scratch(prefix):
    """A fresh directory for what a run writes and nobody keeps (the tiny checkpoint, run folders, resumed
    runs' checkpoints): inside one directory per process and temporary directory, removed when the process
    exits. Without it every test run, launched rank and fresh interpreter left its folders in /tmp."""
    where = tempfile.gettempdir()
    if where not in _SCRATCH:
        _SCRATCH[where] = tempfile.mkdtemp(prefix="udn-scratch-")
        owner = os.getpid()  # a forked child inherits the exit handler; only the process that made it removes it
        atexit.register(lambda root=_SCRATCH[where]: os.getpid() == owner and shutil.rmtree(root, ignore_errors=True))
    return tempfile.mkdtemp(prefix=prefix, dir=_SCRATCH[where])


_SCRATCH = {}


def load_model(lora=None, checkpoint=None, device="cpu"):
    """The tiny model, full fine-tuning (lora=None) or LoRA on attention and MLP with the output head
    frozen (lora="frozen-head": fused-head loss path) or trained as a saved module (lora="saved-head":
    the head is no plain nn.Linear any more, so the loss takes the dense-logit path), on `device`."""
    import torch
    from unsloth import FastModel

    model, tokenizer = FastModel.from_pretrained(
        checkpoint or tiny_checkpoint(), trust_remote_code=True, dtype=torch.float32, device_map={"": device}
    )
    if lora is not None:
        extra = {"modules_to_save": ["diffusion_head"]} if lora == "saved-head" else {}
        model = FastModel.get_peft_model(
            model, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], random_state=0, **extra
        )
        generator = torch.Generator().manual_seed(1)  # on the CPU: the same weights on every device
        for name, param in model.named_parameters():
            if "lora_B" in name:  # LoRA starts at B=0, where A gets no gradient; move off it
                drawn = torch.empty(param.shape, dtype=param.dtype).normal_(std=0.02, generator=generator)
                with torch.no_grad():
                    param.copy_(drawn)
    return model, tokenizer


@contextlib.contextmanager
def loaded_first():
    """Models loaded here are plain modules, as in a script that loads its model before it builds its
    training arguments - also while arguments with a DeepSpeed ZeRO-3 config from an earlier run are
    alive (transformers would build the model partitioned under deepspeed.zero.Init, and refuses the
    device_map Unsloth's loader is given). ZeRO-3 partitions the plain model when its engine is built."""
    try:
        from transformers.integrations import deepspeed as hf_deepspeed
    except ImportError:  # transformers without the integration: nothing to switch off
        yield
        return
    alive = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = alive


ANSWER = list(range(20, 29))  # 9 answer tokens + EOS
LONG = list(range(20, 32))  # 12 answer tokens + EOS
SHORT = [20, 21, 22]  # 3 answer tokens + EOS


def answers(tokens, n, first_prompt=10):
    """n examples with the same answer and distinct two-token prompts."""
    return [Example([first_prompt + i, 11], list(tokens)) for i in range(n)]


def equal_answers(n):
    """n equal-length answers: per-micro-batch and window normalization differ only through the masks."""
    return [Example([10 + i, 11, 12], ANSWER) for i in range(n)]


def mixed_answers(n):
    """n answers of 3, 5, 7, 9 tokens (+ EOS) in turn: padded batches, EOS tails of different lengths."""
    return [Example([10 + i, 11], list(range(30, 33 + 2 * (i % 4)))) for i in range(n)]


def unsupervised(n):
    """n examples without a supervised token: nothing to mask."""
    return [Example([10 + i, 11, 12], [], eos=False) for i in range(n)]

"""Writes a tiny Nemotron-Labs-Diffusion-shaped remote-code checkpoint that Unsloth loads like the real one.

The reproduction, the doctor self-check and the tests all load the same on-disk format a user's
checkpoint has: config.json with `auto_map`, the modeling code next to it, safetensors weights and a
word-level tokenizer with a [MASK] token. Word `wK` is one token, so answer lengths are exact.
"""

import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
CODE_FILES = ("configuration_nemotron_labs_diffusion.py", "modeling_nemotron_labs_diffusion.py")
SPECIAL_TOKENS = ("<eos>", "<pad>", "<mask>", "<unk>")
VOCAB_SIZE = 97
EOS_ID, PAD_ID, MASK_ID = 0, 1, 2


def words(*ids):
    """Text made of vocabulary words, one token each: words(3, 5) == 'w3 w5'."""
    return " ".join(f"w{i}" for i in ids)


def _write_tokenizer(directory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": len(SPECIAL_TOKENS) + i for i in range(VOCAB_SIZE - len(SPECIAL_TOKENS))})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<eos>",
        pad_token="<pad>",
        mask_token="<mask>",
        unk_token="<unk>",
    )
    tokenizer.save_pretrained(directory)


def write_tiny_checkpoint(directory, seed=0, **config_overrides):
    """Write the checkpoint into `directory` (created if needed) and return it. Deterministic in `seed`."""
    import torch
    from safetensors.torch import save_file

    from .configuration_nemotron_labs_diffusion import NemotronLabsDiffusionConfig
    from .modeling_nemotron_labs_diffusion import NemotronLabsDiffusionModel

    os.makedirs(directory, exist_ok=True)
    config = NemotronLabsDiffusionConfig(
        **{
            "vocab_size": VOCAB_SIZE,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
            "mask_token_id": MASK_ID,
            **config_overrides,  # e.g. a larger model for benchmarks (its tokenizer stays tiny)
        }
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = NemotronLabsDiffusionModel(config)
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})

    config_dict = config.to_dict()
    config_dict.update(
        architectures=["NemotronLabsDiffusionModel"],
        auto_map={
            "AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
            "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel",
        },
        torch_dtype="float32",
    )
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=2, sort_keys=True)
    for name in CODE_FILES:
        shutil.copyfile(os.path.join(HERE, name), os.path.join(directory, name))
    _write_tokenizer(directory)
    return directory

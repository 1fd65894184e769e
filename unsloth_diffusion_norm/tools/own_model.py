"""`doctor --model DIR` / `reproduce --model DIR`: the self-check on a tiny random copy of a user's own checkpoint.

DIR is a checkpoint directory as downloaded: config.json with `auto_map`, the remote-code .py files, tokenizer
files and weights. The copy keeps the architecture and its code and shrinks only the size keys; its random
weights come from the directory's own model class under a fixed seed, and Unsloth then loads the copy the
normal way (FastModel.from_pretrained, trust_remote_code). Of DIR only config.json, the code and the tokenizer
files (KEPT_FILES) are ever read: its weight files are never opened. Nothing is downloaded.
"""

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from .console import USAGE, Failure

# Size keys, in the spellings hub configs use (Llama / OLMo-LLaDA / GPT-2 / GLM). Each key found is set
# to the tiny value when that is smaller; a key not listed here is kept as is (`--set key=value` for those).
LAYERS = ("num_hidden_layers", "n_layers", "num_layers", "n_layer")
HIDDEN = ("hidden_size", "d_model", "n_embd")
HEADS = ("num_attention_heads", "n_heads", "n_head")
KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
HEAD_DIM = ("head_dim", "kv_channels")
INTERMEDIATE = ("intermediate_size", "mlp_hidden_size", "ffn_hidden_size", "n_inner")
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")
EXPERTS_PER_TOKEN = ("num_experts_per_tok", "moe_topk")
EXPERT_INTERMEDIATE = ("moe_intermediate_size", "shared_expert_intermediate_size")
TINY = {
    LAYERS: 2,
    HIDDEN: 64,
    HEADS: 4,
    HEAD_DIM: 16,
    INTERMEDIATE: 128,
    EXPERTS: 4,
    EXPERTS_PER_TOKEN: 2,
    EXPERT_INTERMEDIATE: 64,
}
VOCABULARY = ("vocab_size", "embedding_size", "padded_vocab_size")  # kept: the token ids stay valid
# What a checkpoint directory holds besides weights that loading the copy needs (config.json is rewritten).
KEPT_FILES = re.compile(
    r"(.*\.py|generation_config\.json|tokenizer.*|special_tokens_map\.json|added_tokens\.json"
    r"|vocab\..*|merges\.txt|.*\.tiktoken|chat_template\..*)"
)
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
SEED = 0  # of the copy's random weights


class Refused(Failure, ValueError):
    """DIR cannot be checked: one line saying why (the command line exits 2)."""

    code = USAGE


@dataclass
class OwnModel:
    """A tiny random copy of a checkpoint's architecture, ready for the self-check."""

    source: str  # the user's directory
    checkpoint: str  # the copy
    model_type: str
    model_class: str
    profile: str
    changes: dict  # config key -> [the checkpoint's value, the copy's]: sizes, dropout, dtype, --set
    eos_id: int
    mask_id: int
    examples: list = field(default_factory=list)
    seconds: float = 0.0  # to write the copy
    block: object = None  # a block_diff checkpoint's block_diffusion.BlockDiffusion (NVIDIA's training mode)

    def describe(self):
        return {
            "dir": self.source,
            "model_type": self.model_type,
            "class": self.model_class,
            "profile": self.profile,
            "changes": self.changes,
            "eos_token_id": self.eos_id,
            "mask_token_id": self.mask_id,
            "dlm_paradigm": "bidirectional"
            if self.block is None
            else f"block_diff (block size {self.block.block_size})",
            "build_seconds": self.seconds,
        }


def parse_setting(text):
    """`--set key=value`: the value as JSON (numbers, true/false/null, lists), else as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected key=value, not {text!r}")
    try:
        value = json.loads(value)
    except ValueError:
        pass
    return key.strip(), value


def read(source):
    """config.json of a checkpoint directory with its own code; Refused if it is not one. Reads nothing else."""
    if not os.path.isdir(source):
        if not os.path.exists(source) and HUB_ID.fullmatch(source):
            raise Refused(
                f"{source!r} is not a local directory (a Hub id?); this command never downloads: "
                f"download the checkpoint first (its weights are not needed), e.g. "
                f"`hf download {source} --local-dir DIR --exclude '*.safetensors' '*.bin'`"
            )
        raise Refused(f"{source!r} is not a directory" if os.path.exists(source) else f"no directory {source!r}")
    path = os.path.join(source, "config.json")
    if not os.path.isfile(path):
        raise Refused(f"no config.json in {source!r}: not a checkpoint directory")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as error:
        raise Refused(f"{path!r} cannot be read as JSON: {error}") from None
    if not isinstance(config, dict):
        raise Refused(f"{path!r} is not a JSON object")
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict) or not auto_map:
        raise Refused(
            f"{source!r} has no remote code (config.json has no auto_map); the self-check builds the "
            f"model from the checkpoint's own modeling code"
        )
    for reference in _code_references(auto_map):
        if "--" in reference:
            raise Refused(
                f"config.json's auto_map takes code from another repository ({reference!r}); "
                f"this command never downloads: put that code into {source!r}"
            )
        module = _module_file(reference)
        if not os.path.isfile(os.path.join(source, module)):
            raise Refused(f"config.json's auto_map names {reference!r}, but {module} is not in {source!r}")
    return config


def code_files(config):
    """The Python files of the directory that config.json's auto_map names (what loading the copy imports)."""
    return {_module_file(reference) for reference in _code_references(config["auto_map"])}


def _module_file(reference):
    """'modeling_x.ModelClass' -> 'modeling_x.py' (the file in the checkpoint directory)."""
    return reference.rsplit(".", 1)[0].replace(".", os.sep) + ".py"


def _code_references(auto_map):
    for value in auto_map.values():
        for reference in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(reference, str):
                yield reference


def shrink(config, settings=()):
    """(the tiny config, {key: [full, tiny]}): size keys shrunk, dropout off, then `settings` (key, value)."""
    tiny, changes = dict(config), {}

    def put(key, value):
        if tiny.get(key) != value:
            changes[key] = [config.get(key), value]
            tiny[key] = value

    full_layers = _first(config, LAYERS)
    for keys, value in TINY.items():
        for key in keys:
            full = config.get(key)
            if isinstance(full, int) and not isinstance(full, bool) and full > value:
                put(key, value)
    heads = _first(config, HEADS)
    for key in KV_HEADS:  # keep the attention kind: multi-head, grouped-query or multi-query
        full = config.get(key)
        if isinstance(full, int) and heads:
            put(key, 1 if full == 1 else _first(tiny, HEADS) if full == heads else 2)
    if full_layers:  # per-layer lists (layer types, windows) follow the layer count
        layers = _first(tiny, LAYERS)
        for key, value in config.items():
            if isinstance(value, list) and len(value) == full_layers and layers < full_layers:
                put(key, value[:layers])
    for key, value in config.items():  # dropout draws from the RNG the masks come from, and the oracle has none
        if isinstance(value, float) and value > 0 and ("dropout" in key or key.endswith("_pdrop")):
            put(key, 0.0)
    for key in ("torch_dtype", "dtype"):  # the copy is float32, like the self-check
        if key in config:
            put(key, "float32")
    tiny.pop("_name_or_path", None)
    if tiny.pop("quantization_config", None) is not None:  # random weights are not quantized
        changes["quantization_config"] = ["present", "removed"]
    for key, value in settings:
        put(key, value)
    return tiny, changes


def _first(config, keys):
    return next((config[k] for k in keys if isinstance(config.get(k), int)), None)


def prepare(source, settings=(), workdir=None):
    """Check `source`, write its tiny random copy into a new directory under `workdir` (default: the temporary
    directory) and return the OwnModel. Raises Refused with one line when the self-check cannot run on it."""
    from .. import block_diffusion  # (torch: not at the command line's start)

    started = time.perf_counter()
    source = os.path.abspath(source)
    config = read(source)
    tiny, changes = shrink(config, settings)
    name = re.sub(r"[^\w-]", "_", os.path.basename(source.rstrip(os.sep))) or "checkpoint"
    checkpoint = os.path.join(tempfile.mkdtemp(prefix="udn-own-", dir=workdir), f"tiny-{name}")
    os.makedirs(checkpoint)
    for entry in sorted(os.listdir(source)):
        if KEPT_FILES.fullmatch(entry) and os.path.isfile(os.path.join(source, entry)):
            shutil.copyfile(os.path.join(source, entry), os.path.join(checkpoint, entry))
    with open(os.path.join(checkpoint, "config.json"), "w") as f:
        json.dump(tiny, f, indent=2, sort_keys=True)
    config, profile, auto = _resolve(source, checkpoint)
    try:  # the training mode its config asks for; one the plugin does not train is refused here
        block = block_diffusion.of_config(config)
    except ValueError as error:
        raise Refused(str(error).removeprefix(block_diffusion.PREFIX)) from None
    eos_id, mask_id, examples = _token_ids(source, checkpoint, tiny)
    model_class = _write_weights(source, checkpoint, config, auto, changes)
    return OwnModel(
        source,
        checkpoint,
        config.model_type,
        model_class,
        profile.name,
        changes,
        eos_id,
        mask_id,
        examples,
        round(time.perf_counter() - started, 2),
        block,
    )


def _cannot_build(source, changes, error):
    shrunk = ", ".join(f"{k} {a}→{b}" for k, (a, b) in changes.items() if isinstance(b, (int, float)))
    detail = " ".join(str(error).split())[:300]
    return Refused(
        f"the tiny copy of {source!r} does not build: {type(error).__name__}: {detail} "
        f"(shrunk: {shrunk}; adjust with --set key=value)"
    )


def _resolve(source, checkpoint):
    """(config, Unsloth's profile for it, the auto class to build it with), loaded from the copy's own code."""
    import transformers
    from unsloth.models.diffusion_profiles import resolve_diffusion_profile

    from ..detect import unsloth_version
    from ..proof.oracle import OBJECTIVES

    try:
        config = transformers.AutoConfig.from_pretrained(checkpoint, trust_remote_code=True, local_files_only=True)
    except Exception as error:  # noqa: BLE001 - the user's own code: whatever it raises is one line
        raise _cannot_build(source, {}, error) from None
    profile = resolve_diffusion_profile(config)
    described = f"model_type {config.model_type!r} (architectures {getattr(config, 'architectures', None)})"
    if profile is None:
        raise Refused(f"Unsloth {unsloth_version()} has no masked-diffusion profile for {described} in {source!r}")
    if profile.name not in OBJECTIVES:
        raise Refused(
            f"Unsloth resolves {described} to its {profile.name!r} profile; the self-check's oracle knows "
            f"the {', '.join(OBJECTIVES)} objectives, the ones this plugin changes"
        )
    auto_map = getattr(config, "auto_map", None) or {}
    # The class Unsloth's profile loads: its own auto class first (AutoModel for Nemotron and Dream,
    # AutoModelForCausalLM for LLaDA), as it picks it.
    names = (getattr(profile, "auto_class", None), "AutoModelForCausalLM", "AutoModel")
    auto = next((n for n in names if n and auto_map.get(n)), None)
    if auto is None:
        raise Refused(f"config.json's auto_map in {source!r} names no AutoModel or AutoModelForCausalLM class")
    return config, profile, auto


def _write_weights(source, checkpoint, config, auto, changes):
    """Random weights for the copy from the checkpoint's own class, saved the normal way; the class name."""
    import torch
    import transformers

    weights = os.path.join(os.path.dirname(checkpoint), "weights")
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            model = getattr(transformers, auto).from_config(config, trust_remote_code=True, dtype=torch.float32)
        model.save_pretrained(weights)  # shared (tied) tensors once, safetensors
    except Exception as error:  # noqa: BLE001 - the user's own code at a size it was not written for
        raise _cannot_build(source, changes, error) from None
    for entry in os.listdir(weights):
        if entry.endswith((".safetensors", ".safetensors.index.json")):
            shutil.move(os.path.join(weights, entry), os.path.join(checkpoint, entry))
    shutil.rmtree(weights)
    return type(model).__name__


def _token_ids(source, checkpoint, config):
    """(EOS id, [MASK] id, the self-check's two examples), read from the config and tokenizer on their own,
    not from Unsloth: the oracle masks with this id, so a different choice by Unsloth shows as a failure."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=True, local_files_only=True)
    except Exception as error:  # noqa: BLE001
        raise Refused(
            f"the tokenizer in {source!r} does not load: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
        ) from None

    def first(value):
        return value[0] if isinstance(value, (list, tuple)) and value else value

    mask_id = first(config.get("mask_token_id"))
    if mask_id is None:
        mask_id = tokenizer.mask_token_id
    eos_id = first(config.get("eos_token_id"))
    if eos_id is None:
        eos_id = tokenizer.eos_token_id
    vocabulary = min((config[k] for k in VOCABULARY if isinstance(config.get(k), int)), default=None)
    for what, key, value in (("[MASK] token id", "mask_token_id", mask_id), ("EOS token id", "eos_token_id", eos_id)):
        if not isinstance(value, int):
            raise Refused(f"no {what} in {source!r} (config.json {key}, or the tokenizer); give it with --set {key}=N")
    if vocabulary is None:
        raise Refused(f"no vocabulary size in {source!r}'s config.json; give it with --set vocab_size=N")
    for role, value in (("mask_token_id", mask_id), ("eos_token_id", eos_id)):
        if not 0 <= value < vocabulary:
            raise Refused(f"{role} {value} is outside the vocabulary (size {vocabulary}) of {source!r}")
    special = set(tokenizer.all_special_ids) | {mask_id, eos_id}
    special |= {first(v) for k, v in config.items() if k.endswith("_token_id") and isinstance(first(v), int)}
    ordinary = [i for i in range(10, vocabulary) if i not in special][:18]
    if len(ordinary) < 18:
        raise Refused(f"the vocabulary of {source!r} (size {vocabulary}) is too small for the self-check")
    from ..proof.fixtures import Example

    # The default self-check's shape: prompts of 3, answers of 12 plus EOS; eos=False: EOS is this model's.
    answer = ordinary[6:] + [eos_id]
    return eos_id, mask_id, [Example(ordinary[:3], answer, eos=False), Example(ordinary[3:6], answer, eos=False)]

"""A realistic fine-tuning set built on this machine, nothing downloaded: questions about the Python
standard library's functions, classes and methods, each answered by its docstring (one-liners to
pages), and a byte-level BPE tokenizer trained on them with `tokenizers`. `impact`'s docs and benchmark
run on it; the answers' lengths spread as an instruction set's do."""

import contextlib
import importlib
import inspect
import io
import json
import os
import pkgutil
import sys
import warnings

# Modules that open windows, print on import or are test suites.
SKIP = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3", "ensurepip", "venv"}
EOS, PAD, MASK = "<|eos|>", "<|pad|>", "<|mask|>"


def _quietly(name):
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this platform cannot import is simply left out
            return None


def _modules():
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in SKIP or (module := _quietly(name)) is None:
            continue
        yield module
        for info in pkgutil.iter_modules(getattr(module, "__path__", []), name + "."):
            if not any(part.startswith("_") or part in SKIP for part in info.name.split(".")):
                if (sub := _quietly(info.name)) is not None:
                    yield sub


def rows():
    """prompt/completion rows, one per distinct docstring of at least 40 characters, in a fixed order."""
    seen, out = set(), []

    def add(name, obj):
        with warnings.catch_warnings():  # typing.io and friends warn when read
            warnings.simplefilter("ignore")
            doc = inspect.getdoc(obj)
        if doc and len(doc) >= 40 and doc not in seen:
            seen.add(doc)
            out.append({"prompt": f"What does {name} do?\n", "completion": doc})

    for module in _modules():
        for name, obj in sorted(vars(module).items()):
            kind = inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)
            if name.startswith("_") or not kind or getattr(obj, "__module__", module.__name__) != module.__name__:
                continue
            add(f"{module.__name__}.{name}", obj)
            if inspect.isclass(obj):
                for member, value in sorted(vars(obj).items()):
                    if not member.startswith("_") and (callable(value) or isinstance(value, property)):
                        add(f"{module.__name__}.{name}.{member}", value)
    return out


def write(folder, copies=1, vocab_size=4096):
    """folder/data.jsonl (the rows, `copies` times over) and folder/tokenizer (BPE trained on the rows);
    returns (data path, tokenizer folder, number of distinct rows)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    found = rows()
    os.makedirs(folder, exist_ok=True)
    data = os.path.join(folder, "data.jsonl")
    with open(data, "w") as f:
        for _ in range(copies):
            for row in found:
                f.write(json.dumps(row) + "\n")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD, MASK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator((row["prompt"] + row["completion"] for row in found), trainer=trainer)
    tokenizer_folder = os.path.join(folder, "tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS, pad_token=PAD, mask_token=MASK).save_pretrained(
        tokenizer_folder
    )
    return data, tokenizer_folder, len(found)


def checkpoint(folder, tokenizer_folder, seed=0, **config):
    """A random-initialized model of the tiny model's class at the BPE tokenizer's vocabulary (its EOS, PAD and
    MASK are ids 0, 1, 2, as the tiny model's), written to `folder` with that tokenizer; `config`: the tiny
    model's config fields (hidden_size, max_position_embeddings, ...). Returns `folder`."""
    from transformers import AutoTokenizer

    from ..proof.tiny_model import write_tiny_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    write_tiny_checkpoint(folder, seed=seed, vocab_size=len(tokenizer), **config)
    for name in os.listdir(folder):  # the tiny word-level tokenizer out, the BPE one in
        if name.startswith(("tokenizer", "special_tokens")):
            os.remove(os.path.join(folder, name))
    tokenizer.save_pretrained(folder)
    return folder

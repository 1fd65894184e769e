"""The run's rows as TRL's SFTTrainer prepares them, reduced to (length, supervised tokens) per row:
loading the rows and the tokenizer, then TRL's own preparation or a batched mirror of its rules."""

import dataclasses
import json
import os
from dataclasses import dataclass

import numpy as np

from .settings import Unusable


def load_rows(path, split="train"):
    """The run's data as an in-memory datasets.Dataset: a JSON-lines file, or a folder written by
    `save_to_disk` (a DatasetDict gives `split`). In memory, so that preparing it writes no cache files."""
    import datasets

    if not os.path.exists(path):
        raise Unusable(f"no such file or folder: {path!r}")
    if os.path.isdir(path):
        try:
            loaded = datasets.load_from_disk(path, keep_in_memory=True)
        except (FileNotFoundError, ValueError, OSError) as error:
            raise Unusable(f"{path!r} is not a folder datasets.load_from_disk reads: {error}") from None
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise Unusable(f"{path!r} has no split {split!r} (it has {', '.join(loaded)})")
            loaded = loaded[split]
        rows = loaded
    else:
        records, at = [], 0
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    at += 1
                    if line.strip():
                        record = json.loads(line)
                        if not isinstance(record, dict):
                            raise ValueError("not a JSON object")
                        records.append(record)
        except (ValueError, UnicodeDecodeError) as error:
            raise Unusable(f"{path!r} line {at}: not a JSON-lines row ({error})") from None
        except OSError as error:
            raise Unusable(f"cannot read {path!r}: {error.strerror}") from None
        if not records:
            raise Unusable(f"{path!r} has no rows")
        rows = load_rows_from_list(records, path)
    if len(rows) == 0:
        raise Unusable(f"{path!r} has no rows")
    return rows


def load_rows_from_list(records, where="the rows"):
    """Rows (dicts) as an in-memory datasets.Dataset, as TRL receives them."""
    import datasets

    try:
        return datasets.Dataset.from_list(records)
    except Exception as error:  # noqa: BLE001 - arrow's many refusals of mixed rows: one line
        raise Unusable(f"{where!r}: rows datasets cannot hold together ({type(error).__name__})") from None


def _data_format(columns, settings):
    if "input_ids" in columns:
        return "tokenized"
    if "prompt" in columns and "completion" in columns:
        return "prompt-completion"
    if "messages" in columns or "conversations" in columns:
        return "messages"
    if settings.dataset_text_field in columns:
        return "text"
    raise Unusable(
        f"the rows have columns {', '.join(sorted(columns)) or 'none'}; impact reads prompt/completion, messages, "
        f"{settings.dataset_text_field!r} (dataset_text_field) or already tokenized input_ids rows"
    )


def load_tokenizer(path):
    """A local tokenizer folder (never downloaded); it must have an EOS token, as the trainer needs."""
    if not os.path.isdir(path):
        raise Unusable(f"the tokenizer must be a local folder; {path!r} is not one")
    from transformers import AutoTokenizer

    try:
        # Never the folder's own code: a checkpoint's remote code is for its model, not its tokenizer files.
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as error:  # noqa: BLE001 - whatever transformers raises, one line
        raise Unusable(
            f"cannot load a tokenizer from {path!r}: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
        ) from None
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor: its tokenizer
    if tokenizer.eos_token is None:
        raise Unusable(f"the tokenizer in {path!r} has no EOS token (the trainer appends one to every answer)")
    return tokenizer


@dataclass
class Prepared:
    """Per training row, in the trainer's dataset order: its length and its supervised tokens (labels
    other than -100), after TRL's preparation."""

    length: np.ndarray
    supervised: np.ndarray
    route: str  # which code prepared it ("TRL's _prepare_dataset" or the batched equivalent)


def prepare(rows, tokenizer, settings):
    """TRL's SFTTrainer dataset preparation, reduced to (length, supervised) per row. Plain
    prompt/completion strings and tokenized rows take a batched route with TRL's rules (tokenizing each
    row through `Dataset.map` costs ~0.6 ms a row; tests/integration/test_impact_counts.py holds both routes
    equal); messages and text rows go through TRL's own `_prepare_dataset`."""
    _supported_trl()
    columns = set(rows.column_names)
    kind = _data_format(columns, settings)
    first = rows[0]
    only_completion = settings.completion_only_loss
    if only_completion is None:  # SFTTrainer's rule, on the dataset as given
        only_completion = "prompt" in first and "completion" in first
    if kind == "prompt-completion" and isinstance(first["prompt"], str) and settings.dataset_text_field not in columns:
        length, supervised = _prompt_completion(rows, tokenizer, only_completion)
        route = "batched"
    elif kind == "tokenized":
        length, supervised = _tokenized(rows, only_completion)
        route = "batched"
    else:
        length, supervised = _trl_route(rows, tokenizer, settings, only_completion)
        return _finish(length, supervised, settings, "TRL's _prepare_dataset", shuffled=True)
    return _finish(*_truncated(length, supervised, settings), settings, route)


TRL_FLOOR = (1, 0)  # TRL 1.x builds the labels while preparing the dataset; older ones in the collator


def _supported_trl():
    from importlib import metadata

    version = metadata.version("trl")
    if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < TRL_FLOOR:
        raise Unusable(f"impact follows TRL 1.x's dataset preparation (checked on 1.15); TRL {version} is installed")


def _finish(length, supervised, settings, route, shuffled=False):
    length, supervised = np.asarray(length, dtype=np.int64), np.asarray(supervised, dtype=np.int64)
    if settings.max_length is not None:  # TRL drops rows truncation left without a supervised token
        keep = supervised > 0
        length, supervised = length[keep], supervised[keep]
    if settings.shuffle_dataset and not shuffled:  # SFTTrainer shuffles the prepared dataset with the run's seed
        import datasets

        order = datasets.Dataset.from_dict({"i": np.arange(len(length))}).shuffle(seed=settings.seed)["i"]
        length, supervised = length[np.asarray(order)], supervised[np.asarray(order)]
    if len(length) == 0 or not supervised.any():
        raise Unusable("no usable rows: after preparation no row has a supervised (answer) token")
    return Prepared(length, supervised, route)


def _prompt_completion(rows, tokenizer, only_completion):
    """TRL's tokenize_fn for non-conversational prompt/completion rows, batched: EOS appended to the
    completion unless it ends with one; the completion starts where the tokenized prompt and the tokenized
    prompt+completion diverge (trl.data_utils.common_prefix_length)."""
    prompts, completions = list(rows["prompt"]), list(rows["completion"])
    if not all(isinstance(p, str) for p in prompts) or not all(isinstance(c, str) for c in completions):
        raise Unusable("prompt and completion must be strings in every row (or messages in every row)")
    eos = tokenizer.eos_token
    whole = [p + (c if c.endswith(eos) else c + eos) for p, c in zip(prompts, completions)]
    prompt_ids = tokenizer(prompts)["input_ids"]
    whole_ids = tokenizer(whole)["input_ids"]
    length = np.fromiter((len(ids) for ids in whole_ids), dtype=np.int64, count=len(whole_ids))
    prompt_length = np.empty_like(length)
    for i, (p, w) in enumerate(zip(prompt_ids, whole_ids)):
        n = len(p)
        if w[:n] == p:
            prompt_length[i] = n
        else:
            common = 0
            for a, b in zip(p, w):
                if a != b:
                    break
                common += 1
            prompt_length[i] = common
    if not only_completion:
        return length, length
    return length, prompt_length  # (length, prompt length): _truncated turns it into supervised counts


def _tokenized(rows, only_completion):
    """TRL's build_labels on tokenized rows: `labels` as given, otherwise input_ids masked by
    completion_mask (with completion_only_loss) and assistant_masks."""
    import pyarrow.compute as pc

    table = rows.data.table if hasattr(rows.data, "table") else rows.data
    length = np.asarray(pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False), np.int64)
    names = rows.column_names
    if "labels" in names:
        masks = [np.asarray(pc.list_flatten(table.column("labels")).to_numpy(zero_copy_only=False)) != -100]
    else:
        masks = []
        if only_completion and "completion_mask" in names:
            masks.append(np.asarray(pc.list_flatten(table.column("completion_mask")).to_numpy(zero_copy_only=False)))
        if "assistant_masks" in names:
            masks.append(np.asarray(pc.list_flatten(table.column("assistant_masks")).to_numpy(zero_copy_only=False)))
    flat = np.ones(int(length.sum()), dtype=bool)
    for mask in masks:
        if len(mask) != len(flat):
            raise Unusable("every row's masks must be as long as its input_ids")
        flat &= mask.astype(bool)
    return length, flat  # per-token supervision: _truncated counts it inside the kept slice


def _truncated(length, supervised, settings):
    """(length, supervised count) per row after TRL's max_length truncation. `supervised` is either a
    per-token flag array (tokenized rows) or, with length, the prompt length of prompt/completion rows
    (then the supervised tokens are the suffix after it)."""
    limit = settings.max_length
    kept = length if limit is None else np.minimum(length, limit)
    keep_end = settings.truncation_mode == "keep_end"
    if supervised.dtype == bool:  # per-token flags, rows concatenated
        ends = np.cumsum(length)
        starts = ends - length
        lo = ends - kept if keep_end else starts
        before = np.concatenate([[0], np.cumsum(supervised, dtype=np.int64)])
        return kept, before[lo + kept] - before[lo]
    if supervised is length:  # every token supervised
        return kept, kept
    prompt = supervised
    if keep_end:  # the last `kept` tokens: the completion's tail
        return kept, np.minimum(length - prompt, kept)
    return kept, np.maximum(kept - prompt, 0)


def _trl_route(rows, tokenizer, settings, only_completion):
    """TRL's own SFTTrainer._prepare_dataset, on an instance that holds only what it reads (no model)."""
    import types

    from trl import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    defaults = {f.name: f.default for f in dataclasses.fields(SFTConfig) if f.default is not dataclasses.MISSING}
    args = types.SimpleNamespace(**{**defaults, **dataclasses.asdict(settings)})
    args.packing = False
    holder = SFTTrainer.__new__(SFTTrainer)
    holder._tokenizer, holder.processing_class = tokenizer, tokenizer
    holder.chat_template, holder.completion_only_loss, holder.args = None, only_completion, args
    import datasets

    progress_bars = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        prepared = holder._prepare_dataset(rows, tokenizer, args, False, None, "train")
    except Exception as error:  # noqa: BLE001 - a row TRL cannot prepare (no chat template, ...): one line
        raise Unusable(
            f"TRL cannot prepare these rows: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
        ) from None
    finally:
        if progress_bars:
            datasets.enable_progress_bars()
    labels = prepared["labels"] if "labels" in prepared.column_names else None
    length = np.array([len(ids) for ids in prepared["input_ids"]], dtype=np.int64)
    if labels is None:  # an older TRL: the collator masks with completion_mask
        masks = prepared["completion_mask"] if only_completion and "completion_mask" in prepared.column_names else None
        supervised = np.array([sum(m) for m in masks]) if masks is not None else length
    else:
        supervised = np.array([sum(1 for label in row if label != -100) for row in labels], dtype=np.int64)
    return length, supervised

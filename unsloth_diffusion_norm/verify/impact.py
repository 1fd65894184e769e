"""`unsloth-diffusion-norm impact`: how much per-micro-batch normalization moved a run's loss weight, from
its data and settings alone (no model).

In one optimizer step (k micro-batches per rank, W ranks) micro-batch g on rank r has N realized masked
tokens. Per-micro-batch normalization (Unsloth 2026.10.4-.6: Trainer divides by k, DDP averages over W)
gives a masked token the weight (1/p) / (k·W·N); the window (NVIDIA's) gives (1/p) / ΣN. Their ratio is
ρ = N̄ / N, and the share of the step's loss weight that lands elsewhere is the total-variation distance
½ Σ |1/(k·W) − N/ΣN| (a micro-batch without a masked token loses its whole 1/(k·W)).

The counts follow the release's pipeline: TRL's dataset preparation (EOS appended, completion mask,
max_length truncation, rows left without a supervised token dropped), the Trainer's seeded sampler and
accelerate's round-robin deal of micro-batches to ranks, right padding to the micro-batch's longest row,
and the response mask plus the EOS tail of rows that have a response (unsloth_diffusion_norm/noise.py).
On one rank, or with per-sample noise, a row's t and per-token draws are its own, so its count is
Binomial(maskable, (1-eps)·t + eps) given t, and the Monte Carlo draws t and that binomial. With W > 1
ranks under the global RNG the ranks draw from generators seeded alike, so the Monte Carlo draws one
uniform stream and reads it as the ranks do on the run's device (stream_reads): on CPU every rank walks one
stream from the same start; on CUDA (torch's Philox) draw c of every rank reads the same block at the same
indices. `exact_share` gives the expectation for equal-length answers by a sum over binomial counts with
Gauss-Legendre quadrature over t, which the tests hold the estimate to.
"""

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

Z95 = 1.959963984540054  # two-sided 95 % normal quantile: the printed confidence interval
NOISE_BINS = 10  # equal-width bins of t over [0, 1)
PERCENTILES = (1, 5, 25, 50, 75, 95, 99)
DRAWS = 20_000  # at least this many optimizer steps are drawn (whole passes over the epoch's steps)


class Unusable(ValueError):
    """Input impact cannot work from; the message is one line for the user."""


# ----------------------------------------------------------------------------------------- settings


@dataclass
class Settings:
    """The run's settings that decide the counts. Defaults are the trainer's own: transformers'
    TrainingArguments (batch 8, accumulation 1, seed 42), TRL's SFTConfig (max_length 1024, keep_start),
    the Nemotron profile's diffusion_eps (1e-3)."""

    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    world_size: int = 1
    diffusion_eps: float = 1e-3
    max_length: int | None = 1024
    seed: int = 42
    data_seed: int | None = None
    truncation_mode: str = "keep_start"
    completion_only_loss: bool | None = None
    assistant_only_loss: bool = False
    dataset_text_field: str = "text"
    pad_to_multiple_of: int | None = None
    shuffle_dataset: bool = False
    dataloader_drop_last: bool = False
    train_sampling_strategy: str = "random"
    dataset_num_proc: int | None = None

    def check(self):
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise Unusable(f"{name} must be a whole number of at least 1, not {value!r}")
        for name in ("max_length", "pad_to_multiple_of"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise Unusable(f"{name} must be a whole number of at least 1 (or none), not {value!r}")
        eps = self.diffusion_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < 1:
            raise Unusable(f"diffusion_eps must be a number in [0, 1), not {eps!r}")
        if self.truncation_mode not in ("keep_start", "keep_end"):
            raise Unusable(f"truncation_mode must be 'keep_start' or 'keep_end', not {self.truncation_mode!r}")
        if self.train_sampling_strategy not in ("random", "sequential"):
            raise Unusable(
                f"train_sampling_strategy={self.train_sampling_strategy!r} is not modelled "
                "(impact knows 'random', the default, and 'sequential')"
            )
        return self


# The keys of a training YAML (examples/train.yaml) impact reads; every other key is the script's business.
CONFIG_KEYS = {f.name for f in dataclasses.fields(Settings)} | {
    "dataset_name",
    "dataset_train_split",
    "model_name_or_path",
    "tokenizer_name_or_path",
}


def read_config(path):
    """The keys impact reads from a training YAML (or JSON) config, as a dict."""
    import yaml

    try:
        with open(path) as f:
            loaded = yaml.safe_load(f)
    except OSError as error:
        raise Unusable(f"cannot read the config {path!r}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise Unusable(f"the config {path!r} is not YAML: {' '.join(str(error).split())}") from None
    if not isinstance(loaded, dict):
        raise Unusable(f"the config {path!r} is not a mapping of settings")
    return {k: v for k, v in loaded.items() if k in CONFIG_KEYS}


# ---------------------------------------------------------------------------------------------- data


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
    row through `Dataset.map` costs ~0.6 ms a row; tests/integration/test_impact.py holds both routes
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
    except Unusable:
        raise
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


# ------------------------------------------------------------------------------------------ batching


def micro_batches(count, settings):
    """The epoch's micro-batches of every rank, as lists of row indices: the Trainer's sampler
    (accelerate's SeedableRandomSampler, seeded with data_seed or seed; epoch 0) cut into
    per_device_train_batch_size batches and dealt round-robin to the ranks by accelerate's
    BatchSamplerShard (rank r gets global batches r, r+W, ...; the last ones filled from the start)."""
    import torch
    from accelerate.data_loader import BatchSamplerShard, SeedableRandomSampler
    from torch.utils.data import BatchSampler, SequentialSampler

    indices = range(count)
    if settings.train_sampling_strategy == "sequential":
        sampler = SequentialSampler(indices)
    else:
        seed = settings.seed if settings.data_seed is None else settings.data_seed
        sampler = SeedableRandomSampler(indices, generator=torch.Generator(), data_seed=seed)
    batches = BatchSampler(sampler, settings.per_device_train_batch_size, settings.dataloader_drop_last)
    if settings.world_size == 1:
        return [list(batches)]
    order = list(batches)  # one pass of the seeded sampler, as every rank makes it

    class Again:  # the same pass for every rank's shard
        batch_size, drop_last = batches.batch_size, batches.drop_last

        def __iter__(self):  # copies: the shard completes the last batch in place
            return (list(batch) for batch in order)

        def __len__(self):
            return len(order)

    return [
        list(BatchSamplerShard(Again(), num_processes=settings.world_size, process_index=r, even_batches=True))
        for r in range(settings.world_size)
    ]


@dataclass
class Layout:
    """The epoch's rows as the steps see them. Rows: maskable count, answer (supervised) length, the
    micro-batch they sit in and their position in it. Micro-batches, in (step, position in the window,
    rank) order: their step, rank and padded length P. Steps: micro-batches per rank (k, the last window
    may be partial)."""

    maskable: np.ndarray
    answer: np.ndarray
    micro_batch: np.ndarray
    position: np.ndarray
    step_of_micro_batch: np.ndarray
    rank: np.ndarray
    padded: np.ndarray
    k: np.ndarray
    world_size: int
    batch_size: int
    accumulation: int

    @property
    def steps(self):
        return len(self.k)


def layout(prepared, settings, batches=None):
    """Rows grouped into micro-batches and optimizer steps, with each row's maskable count: its
    supervised tokens plus, when it has any, the padding tail up to the micro-batch's longest row
    (rounded up to pad_to_multiple_of): EOS-filled, attended and maskable."""
    batches = micro_batches(len(prepared.length), settings) if batches is None else batches
    accumulation, world = settings.gradient_accumulation_steps, len(batches)
    per_rank = len(batches[0])
    if per_rank == 0:
        raise Unusable("no usable rows: not one full micro-batch (dataloader_drop_last drops them all)")
    steps = -(-per_rank // accumulation)
    k = np.array([min(accumulation, per_rank - s * accumulation) for s in range(steps)], dtype=np.int64)
    maskable, answer, micro_batch, position, ids, ranks, padded_lengths = [], [], [], [], [], [], []
    multiple = settings.pad_to_multiple_of or 1
    for r, rank_batches in enumerate(batches):
        for at, rows in enumerate(rank_batches):
            rows = np.asarray(rows, dtype=np.int64)
            length, supervised = prepared.length[rows], prepared.supervised[rows]
            padded = -(-int(length.max()) // multiple) * multiple
            maskable.append(np.where(supervised > 0, supervised + padded - length, 0))
            answer.append(supervised)
            index = at * world + r  # micro-batches ordered step by step, then by position, then by rank
            micro_batch.append(np.full(len(rows), index))
            position.append(np.arange(len(rows)))
            ids.append(index)
            ranks.append(r)
            padded_lengths.append(padded)
    order = np.argsort(ids)  # the dense order of _dense
    return Layout(
        maskable=np.concatenate(maskable),
        answer=np.concatenate(answer),
        micro_batch=_dense(np.concatenate(micro_batch)),
        position=np.concatenate(position),
        step_of_micro_batch=np.repeat(np.arange(steps), k * world),
        rank=np.asarray(ranks, dtype=np.int64)[order],
        padded=np.asarray(padded_lengths, dtype=np.int64)[order],
        k=k,
        world_size=world,
        batch_size=settings.per_device_train_batch_size,
        accumulation=accumulation,
    )


def _dense(ids):
    """Micro-batch ids renumbered 0..M-1 in their (step, position, rank) order."""
    _, dense = np.unique(ids, return_inverse=True)
    return dense


# ------------------------------------------------------------------------------------------ the math


def rho(count, total, k, world):
    """ρ of a micro-batch with `count` masked tokens in a step with `total` over k·world micro-batches:
    its per-micro-batch weight (1/p)/(k·W·N) over the window's (1/p)/ΣN. Inf where count is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return total / (k * world * count)


def moved_share(count, total, k, world, rho=rho):
    """Per step: ½ Σ |1/(k·W) − N/ΣN| over its micro-batches, written through ρ (the per-micro-batch weight
    of a micro-batch's tokens is ρ·N/ΣN; an empty micro-batch loses its 1/(k·W)); 0 for a step with no
    masked token. Arrays over micro-batches; returns the per-micro-batch terms (summed by the caller)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        window = np.where(total > 0, count / total, 0.0)
        r = rho(count, total, k, world)
        per_micro_batch = np.where(count > 0, r * window, 0.0)
        lost = np.where((count == 0) & (total > 0), 1.0 / (k * world), 0.0)
    return 0.5 * (np.abs(per_micro_batch - window) + lost)


@dataclass
class Estimate:
    share: float
    low: float
    high: float
    draws: int  # optimizer steps drawn
    percentiles: dict  # ρ over masked tokens
    noise_bins: list  # rows: (low t, high t, E[ρ], window share, per-micro-batch share, masked tokens per step)
    length_bins: list  # the same by answer length
    distinct_global: float  # noise levels per optimizer step (mean): every rank alike
    distinct_per_sample: float
    steps: int
    micro_batches_per_step: int
    notes: list = field(default_factory=list)  # one line each, printed before the verdict
    settings: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)

    def verdict(self):
        pct = 100 * self.share
        if self.micro_batches_per_step == 1:
            return "one micro-batch per step: both normalizations are the same; nothing moved, no need to retrain."
        worst = max(self.noise_bins, key=lambda b: b[2]) if self.noise_bins else None
        where = (
            f"; tokens at noise level {worst[0]:.1f}-{worst[1]:.1f} got {worst[2]:.2f}x their weight" if worst else ""
        )
        if pct < 1:
            words = (
                "negligible: the run is close to what NVIDIA's normalization trains; retraining is unlikely to matter"
            )
        elif pct < 5:
            words = "small: a mild re-weighting; retrain only if you need the reference recipe exactly"
        elif pct < 15:
            words = "noticeable: the run trained with a different time and length weighting; consider retraining"
        else:
            words = "large: a substantially different objective; retrain with the plugin (window normalization)"
        return f"{pct:.1f} % of each step's loss weight moved ({words}){where}."


def _chunks(total, size):
    while total > 0:
        yield min(total, size)
        total -= size


GATHER = 4_000_000  # stream values gathered at once: bounds the memory of the global-RNG draws


DEVICES = ("cuda", "cpu")  # where the run drew its noise: the device input_ids live on
# CUDA's Philox kernel moves the offset by 4 for a draw of at most 4 values x threads per SM x SMs (884,736 on
# an A100, 1,081,344 on an H100); a larger draw moves it further, which the CUDA model does not follow.
CUDA_ONE_OFFSET = 884_736


def stream_reads(layout, device="cuda"):
    """Where each row reads the global generator's stream under the global RNG, for `device`'s generator.
    transformers seeds every rank alike and each rank draws, per micro-batch (B rows, padded length P) in its
    own order, t = rand(B) then u = rand(B, P).
    CPU: one stream of uniforms, a draw of n values taking the next n; every rank starts at 0, so micro-batch
    at offset o reads t = stream[o : o+B], u = stream[o+B : o+B+B·P] row by row and moves o on by B·(1+P).
    CUDA (torch's Philox, DistributionTemplates.h): a draw of up to ~1M values moves the offset by 4 whatever
    its size and its value at flat index e depends only on (seed, offset, e), so draw c of every rank reads
    one block X_c at the same index: the stream is the blocks end to end, each as long as the largest draw
    of its call over the ranks (t of the micro-batch at rank position g is call 2g, u call 2g+1).
    Returns, per row, the index of its t and the end of its u row, and the stream's length.
    A row's maskable positions are the last `maskable` of its u row: the answer is the suffix of the kept
    tokens and the EOS tail follows it (exact for prompt/completion rows; a multi-turn completion mask is
    treated as a suffix of the same size)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
    n_mb = len(layout.padded)
    rows = np.bincount(layout.micro_batch, minlength=n_mb)
    order = np.lexsort((np.arange(n_mb), layout.rank))  # by rank, then in the rank's own order
    ranks = layout.rank[order]
    first = np.searchsorted(ranks, ranks)  # each rank's first micro-batch in `order`
    mb, i = layout.micro_batch, layout.position
    if device == "cpu":
        used = rows * (1 + layout.padded)
        before = np.cumsum(used[order]) - used[order]
        offset = np.empty(n_mb, dtype=np.int64)
        offset[order] = before - before[first]  # from 0 on every rank
        t_block, length = rows, int(np.bincount(layout.rank, weights=used).max())
    else:
        position = np.empty(n_mb, dtype=np.int64)
        position[order] = np.arange(n_mb) - first  # the micro-batch's place in its rank's order
        t_calls = np.zeros(position.max() + 1, dtype=np.int64)  # X_2g's length: the largest B at g
        u_calls = np.zeros_like(t_calls)  # X_2g+1's: the largest B·P at g
        np.maximum.at(t_calls, position, rows)
        np.maximum.at(u_calls, position, rows * layout.padded)
        both = t_calls + u_calls
        starts = np.cumsum(both) - both
        offset, t_block, length = starts[position], t_calls[position], int(both.sum())
    t_at = offset[mb] + i
    u_end = offset[mb] + t_block[mb] + (i + 1) * layout.padded[mb]
    return t_at, u_end, length


def stream_counts(layout, stream, eps, reads=None, device="cuda"):
    """Each row's t and masked count, #(u < (1-eps)·t + eps) over its maskable positions, exactly as the
    ranks draw them on `device` from one uniform `stream` (1-D; or [draws, n], one stream a row) laid out
    as stream_reads says (`reads`, its result, saves recomputing it). p is computed in the stream's
    precision, as torch computes it in float32."""
    t_at, u_end, _ = stream_reads(layout, device) if reads is None else reads
    stream = np.asarray(stream)
    stack = np.atleast_2d(stream)
    one = stack.dtype.type
    t = stack[:, t_at]
    p = one(1 - eps) * t + one(eps)
    counts = np.zeros(t.shape, dtype=np.int64)
    m = layout.maskable
    rows = np.flatnonzero(m > 0)
    ends = np.cumsum(m[rows])
    per = max(1, GATHER // len(stack))
    lo = 0
    while lo < len(rows):  # rows in chunks of about GATHER/draws gathered values
        hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + per, side="right")))
        chunk, width = rows[lo:hi], m[rows[lo:hi]]
        segment = np.cumsum(width) - width  # each row's first value in the gathered block
        at = np.arange(int(width.sum())) - np.repeat(segment, width) + np.repeat(u_end[chunk] - width, width)
        hit = stack[:, at] < np.repeat(p[:, chunk], width, axis=1)
        counts[:, chunk] = np.add.reduceat(hit, segment, axis=1, dtype=np.int64)
        lo = hi
    return (t[0], counts[0]) if stream.ndim == 1 else (t, counts)


def estimate(layout, eps, draws=DRAWS, seed=0, global_rng=True, rho=rho, progress=None, device="cuda"):
    """Monte Carlo over whole passes of the epoch's steps (at least `draws` steps). With W > 1 under the
    global RNG every pass draws a fresh uniform stream and reads every row's t and u from it as the ranks
    do on `device` (stream_reads, stream_counts): on CPU in-sync ranks share noise and ranks whose earlier
    shapes differed do not; on CUDA every rank's row in the same slot shares its t, and u values are shared
    at equal flat indices, whatever the shapes. Otherwise t ~ U(0, 1) per row and its count ~
    Binomial(maskable, (1-eps)·t + eps), exact in distribution there on both devices: one rank reads every
    t and u at distinct stream indices, and per-sample noise gives each row its own."""
    rng = np.random.default_rng(seed)
    steps, world = layout.steps, layout.world_size
    passes = max(1, -(-draws // steps))
    mb_step = layout.step_of_micro_batch
    n_mb = len(mb_step)
    k_of_mb = layout.k[mb_step]
    reads = stream_reads(layout, device)
    shared = global_rng and world > 1
    notes = []
    largest = int((np.bincount(layout.micro_batch, minlength=n_mb) * layout.padded).max())
    if shared and device == "cuda" and largest > CUDA_ONE_OFFSET:
        notes.append(
            f"a micro-batch draws {largest:,} values (B x P) at once, over the {CUDA_ONE_OFFSET:,} up to which CUDA's "
            "generator moves by one fixed step on any GPU: the shared-noise model is approximate there"
        )
    answer_edges = _length_edges(layout.answer[layout.maskable > 0])
    answer_bin = np.clip(np.searchsorted(answer_edges, layout.answer, side="right") - 1, 0, len(answer_edges) - 2)
    sums = {name: 0.0 for name in ("share", "share2")}
    noise = np.zeros((4, NOISE_BINS))  # Σ N·ρ, Σ N, Σ window weight, Σ per-micro-batch weight
    length = np.zeros((4, len(answer_edges) - 1))
    rho_values, rho_weights = [], []
    chunk = max(1, 2_000_000 // max(1, len(layout.maskable)))
    if shared:
        chunk = max(1, min(chunk, GATHER // reads[2]))
    done = 0
    for size in _chunks(passes, chunk):
        if shared:  # float32: torch's CPU uniforms are float32 too
            t, counts = stream_counts(layout, rng.random((size, reads[2]), dtype=np.float32), eps, reads)
        else:
            t = rng.random((size, len(layout.maskable)))
            counts = rng.binomial(layout.maskable, (1 - eps) * t + eps)
        mb_counts = _sum_by(counts, layout.micro_batch, n_mb)
        totals = _sum_by(mb_counts, mb_step, steps)
        per_mb_total = totals[:, mb_step]
        terms = moved_share(mb_counts, per_mb_total, k_of_mb, world, rho=rho)
        step_share = _sum_by(terms, mb_step, steps)
        sums["share"] += step_share.sum()
        sums["share2"] += (step_share**2).sum()
        r = rho(mb_counts, per_mb_total, k_of_mb, world)
        nonempty = mb_counts > 0
        rho_values.append(r[nonempty])
        rho_weights.append(mb_counts[nonempty])
        row_rho = np.where(counts > 0, r[:, layout.micro_batch], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            row_window = np.where(counts > 0, counts / per_mb_total[:, layout.micro_batch], 0.0)
        row_per_mb = row_rho * row_window
        tbin = np.minimum((t * NOISE_BINS).astype(np.int64), NOISE_BINS - 1)
        for table, bins in ((noise, tbin), (length, np.broadcast_to(answer_bin, t.shape))):
            nb = table.shape[1]
            flat = bins.ravel()
            for row, values in enumerate((counts * row_rho, counts, row_window, row_per_mb)):
                table[row] += np.bincount(flat, weights=values.ravel(), minlength=nb)[:nb]
        done += size
        if progress is not None:
            progress(done, passes)
    count = passes * steps
    mean = sums["share"] / count
    variance = max(0.0, sums["share2"] / count - mean**2) * count / max(1, count - 1)
    half = Z95 * math.sqrt(variance / count)
    values, weights = np.concatenate(rho_values), np.concatenate(rho_weights)
    return Estimate(
        share=mean,
        low=mean - half,
        high=mean + half,
        draws=count,
        percentiles=_weighted_percentiles(values, weights),
        noise_bins=_bins(noise, np.linspace(0, 1, NOISE_BINS + 1), count),
        length_bins=_bins(length, answer_edges, count),
        distinct_global=_distinct(layout, reads[0], True),
        distinct_per_sample=_distinct(layout, reads[0], False),
        steps=steps,
        micro_batches_per_step=int(layout.accumulation * world),
        notes=notes,
    )


def _sum_by(values, groups, count):
    """values [draws, n] summed over columns by `groups` (length n) into [draws, count]."""
    draws = values.shape[0]
    flat = (np.arange(draws)[:, None] * count + groups[None, :]).ravel()
    return np.bincount(flat, weights=values.ravel().astype(float), minlength=draws * count).reshape(draws, count)


def _length_edges(answers):
    """Answer-length bins at powers of two (1, 2-3, 4-7, ...), up to the longest answer."""
    top = int(answers.max()) if len(answers) else 1
    edges = [1]
    while edges[-1] <= top:
        edges.append(edges[-1] * 2)
    return np.array(edges, dtype=np.int64)


def _bins(table, edges, draws):
    rows = []
    for i in range(table.shape[1]):
        if table[1, i] > 0:
            rows.append(
                (
                    float(edges[i]),
                    float(edges[i + 1]),
                    table[0, i] / table[1, i],
                    table[2, i] / draws,
                    table[3, i] / draws,
                    table[1, i] / draws,
                )
            )
    return rows


def _weighted_percentiles(values, weights):
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(weights[order])
    out = {}
    for q in PERCENTILES:
        at = np.searchsorted(cumulative, q / 100 * cumulative[-1], side="left")
        out[q] = float(values[min(at, len(values) - 1)])
    return out


def _distinct(layout, t_at, global_rng):
    """Mean number of distinct noise levels the masked tokens of an optimizer step come from: one per row
    with a maskable token; under the global RNG, one per distinct stream index of those rows' t (on CPU ranks
    in sync share them, ranks out of sync do not; on CUDA the index is the slot, position in the rank's order
    and row, so every rank's row in the same slot shares it)."""
    has = layout.maskable > 0
    keys = t_at[has] if global_rng else np.flatnonzero(has)
    row_step = layout.step_of_micro_batch[layout.micro_batch]
    pairs = np.unique(np.stack([row_step[has], keys]), axis=1)
    return float(np.bincount(pairs[0], minlength=layout.steps).mean())


def exact_share(k, world, maskable, eps, global_rng=True):
    """E[½ Σ |1/(k·W) − N/ΣN|] for one step of k micro-batches per rank on W ranks, batch size 1, every
    row of the same length with `maskable` maskable tokens; t ~ U(0, 1) per micro-batch and
    N | t ~ Binomial(maskable, (1-eps)·t + eps).
    Under the global RNG every rank draws the same shapes from the same seed, so on CPU (one stream from 0)
    and on CUDA (the same blocks at the same offsets) every rank draws the same t and u: identical masks,
    N_{g,r} = N_g, and the share is the one-rank value. Per-sample noise: k·W independent micro-batches.
    Exact up to round-off: the binomial pmf is a polynomial of degree `maskable` in t and Gauss-Legendre
    with Q nodes integrates degree 2Q-1 exactly. By symmetry the sum is n times the term of one micro-batch,
    whose count a comes with the rest b, the sum of the other n-1 independent counts."""
    n = k * (1 if global_rng else world)
    nodes, weights = np.polynomial.legendre.leggauss(max(8, maskable // 2 + 2))
    t, w = (nodes + 1) / 2, weights / 2
    a = np.arange(maskable + 1)
    p = ((1 - eps) * t + eps)[:, None]
    choose = np.array([math.comb(maskable, i) for i in a], dtype=float)
    one = w @ (choose * p**a * (1 - p) ** (maskable - a))  # a micro-batch's count, t integrated out
    rest = np.array([1.0])
    for _ in range(n - 1):
        rest = np.convolve(rest, one)
    b = np.arange(len(rest))[None, :]
    a = a[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.where(a + b > 0, np.abs(1 / n - a / (a + b)), 0.0)
    return 0.5 * n * float((one[:, None] * rest[None, :] * term).sum())


# ---------------------------------------------------------------------------------------- reporting


def render(found):
    e, s = found, found.settings
    lines = [
        f"data: {e.data.get('rows')} rows ({e.data.get('route')}), {e.data.get('examples')} training examples, "
        f"answers {e.data.get('answer_min')}-{e.data.get('answer_max')} tokens (median {e.data.get('answer_median')}); "
        f"batch {s['per_device_train_batch_size']} x accumulation {s['gradient_accumulation_steps']} x world "
        f"{s['world_size']}, eps {s['diffusion_eps']}, max_length {s['max_length']}, seed {s['seed']}, "
        f"noise drawn on {s.get('device', 'cuda')}",
        f"{e.steps} optimizer steps per epoch, {e.micro_batches_per_step} micro-batches each; "
        f"{e.draws} steps drawn ({e.data.get('noise')} noise)",
        "",
        f"share of loss weight moved per optimizer step: {100 * e.share:.2f} % "
        f"(95 % CI {100 * e.low:.2f} - {100 * e.high:.2f} %)",
        "",
        "ρ = per-micro-batch weight / window weight, over masked tokens:",
        "",
    ]
    from .tables import markdown

    lines += markdown([f"p{q}" for q in PERCENTILES], [[f"{e.percentiles[q]:.3f}" for q in PERCENTILES]])
    header = ["E[ρ]", "weight share, window", "weight share, per micro-batch", "masked tokens per step"]
    lines += ["", "By noise level t (the run's effective time weighting):", ""]
    lines += markdown(
        ["t"] + header,
        [[f"{lo:.1f}-{hi:.1f}", f"{r:.3f}", f"{w:.4f}", f"{m:.4f}", f"{c:.1f}"] for lo, hi, r, w, m, c in e.noise_bins],
    )
    lines += ["", "By answer length in tokens (the run's effective length weighting):", ""]
    lines += markdown(
        ["answer"] + header,
        [
            [f"{int(lo)}-{int(hi) - 1}", f"{r:.3f}", f"{w:.4f}", f"{m:.4f}", f"{c:.1f}"]
            for lo, hi, r, w, m, c in e.length_bins
        ],
    )
    if s["world_size"] > 1:
        shared = (
            "every rank's row in the same slot shares its t on CUDA"
            if s.get("device", "cuda") == "cuda"
            else "on CPU ranks share them while their micro-batches' shapes have matched"
        )
        lines += [
            "",
            f"distinct noise levels per optimizer step: {e.distinct_global:.2f} under the global RNG ({shared}), "
            f"{e.distinct_per_sample:.2f} with per-sample noise (diffusion_noise='per_sample')",
        ]
    lines += [""] + [f"note: {note}" for note in e.notes] + ["verdict: " + e.verdict()]
    return "\n".join(lines)


def as_json(found):
    out = dataclasses.asdict(found)
    out["percentiles"] = {f"p{q}": v for q, v in found.percentiles.items()}
    keys = ("low", "high", "rho", "window_share", "per_micro_batch_share", "masked_tokens_per_step")
    out["noise_bins"] = [dict(zip(keys, row)) for row in found.noise_bins]
    out["length_bins"] = [dict(zip(keys, row)) for row in found.length_bins]
    out["verdict"] = found.verdict()
    return out


def plot(found, path):
    """Two panels: the share of a step's loss weight by noise level and by answer length, under both
    normalizations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(9, 3.4), dpi=90)
    for axis, bins, label, ticks in (
        (axes[0], found.noise_bins, "noise level t", lambda lo, hi: f"{lo:.1f}"),
        (axes[1], found.length_bins, "answer length (tokens)", lambda lo, hi: f"{int(lo)}"),
    ):
        x = np.arange(len(bins))
        axis.bar(x - 0.2, [b[3] for b in bins], 0.4, label="window (NVIDIA)", color="#4c72b0")
        axis.bar(x + 0.2, [b[4] for b in bins], 0.4, label="per micro-batch (2026.10.4-.6)", color="#dd8452")
        axis.set_xticks(x, [ticks(b[0], b[1]) for b in bins], fontsize=7)
        axis.set_xlabel(label)
        axis.set_ylabel("share of a step's loss weight")
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{100 * found.share:.1f} % of the loss weight moved per step", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def run(data, tokenizer, settings, draws=DRAWS, seed=0, global_rng=True, split="train", log=None, device="cuda"):
    """Everything `impact` does, from the paths to the Estimate; `device` is where the run drew its noise."""
    settings.check()
    say = log or (lambda line: None)
    rows = load_rows(data, split)
    _data_format(set(rows.column_names), settings)  # rows it cannot read: refused before the slow steps
    say(f"read {len(rows)} rows; loading the tokenizer")
    tok = load_tokenizer(tokenizer)
    say("preparing the rows as the trainer does (tokenizing)")
    prepared = prepare(rows, tok, settings)
    say(f"{len(prepared.length)} training examples; dealing micro-batches")
    plan = layout(prepared, settings)
    say(f"drawing noise over {plan.steps} optimizer steps")
    found = estimate(plan, settings.diffusion_eps, draws=draws, seed=seed, global_rng=global_rng, device=device)
    answers = prepared.supervised
    found.settings = {**dataclasses.asdict(settings), "device": device}
    found.data = {
        "rows": len(rows),
        "examples": len(answers),
        "route": prepared.route,
        "answer_min": int(answers.min()),
        "answer_max": int(answers.max()),
        "answer_median": float(np.median(answers)),
        "noise": "global-RNG" if global_rng else "per-sample",
    }
    return found

"""The epoch's rows as the optimizer steps see them: the Trainer's sampler, accelerate's deal of
micro-batches to the ranks, and the `Layout` with each row's maskable count after padding."""

from dataclasses import dataclass

import numpy as np

from .settings import Unusable


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

"""Per-sample noise (opt-in, `diffusion_noise="per_sample"`): each example's noise level `t` and per-token
draws come from its own generator, keyed by (args.seed, epoch, the example's position in the global
data order) - as NVIDIA's SFT recipe derives each sample's corruption from its global index.

So an example gets the same masks on its own tokens whatever the layout (1 rank x GA 4, 2 ranks x GA 2,
1 rank x batch 4), different examples and ranks get independent noise, and a resumed run draws exactly
what the uninterrupted run drew, because nothing depends on the global RNG or on when the draw happens.

Positions: accelerate deals the global batches round-robin, so rank r's m-th micro-batch of an epoch is
global batch m·W + r, and its row j sits at position (m·W + r)·B + j (B = per-device batch size).
"""

import hashlib
import math

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import has_length

from . import config, registry
from .batch_keys import ROWS


class Rows:
    """A micro-batch's per-sample noise: each row's generator seed, and with diffusion_t_sampler="stratified"
    each row's (stratum, the number of strata n) of its window. (A plain object: Trainer's _prepare_inputs
    rebuilds lists and tuples, and passes anything else as it is.)"""

    __slots__ = ("keys", "strata")

    def __init__(self, keys, strata=None):
        self.keys, self.strata = keys, strata


def sample_key(seed, epoch, position):
    """A 63-bit generator seed for one example; distinct inputs give unrelated seeds."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def uniforms(keys, attention_mask, length, device):
    """(t per row, one uniform per token): each row from its own generator, its own tokens first and in
    order, then its padding - so the draws on an example's own tokens do not depend on how far its
    batch was padded. Drawn on the CPU generator (the same numbers on every device), moved once."""
    rows = len(keys)
    t = torch.empty(rows)
    u = torch.empty(rows, length)
    own = torch.ones(rows, length, dtype=torch.bool) if attention_mask is None else attention_mask.bool().cpu()
    for row, key in enumerate(keys):
        generator = torch.Generator().manual_seed(key)
        t[row] = torch.rand(1, generator=generator)
        count = int(own[row].sum())
        u[row, own[row]] = torch.rand(count, generator=generator)
        u[row, ~own[row]] = torch.rand(length - count, generator=generator)
    return t.to(device), u.to(device)


def window_strata(seed, epoch, window, n):
    """The strata of one optimizer step's n examples, by their place in it: a permutation of range(n) drawn from
    a generator keyed by (seed, epoch, window). Every rank computes the same one, whatever the layout, and no
    example's stratum depends on the others' draws, so each example's level keeps the release's law."""
    generator = torch.Generator().manual_seed(sample_key(seed, epoch, f"window {window}"))
    return torch.randperm(n, generator=generator).tolist()


def stratified(t, strata):
    """Each row's own uniform draw moved into its stratum: (stratum + t) / n."""
    stratum, n = (torch.tensor(column, dtype=t.dtype, device=t.device) for column in zip(*strata))
    return (stratum + t) / n


class DataOrder(TrainerCallback):
    """Where the next micro-batch of this rank sits in the epoch's global data order (a Trainer
    callback: it learns the epoch, and on a resumed run how many micro-batches were skipped, at
    on_epoch_begin)."""

    def __init__(self):
        self.epoch = 0
        self.next_batch = 0  # this rank's micro-batch index within the epoch
        self.epochs_begun = 0  # in this train() call

    def on_train_begin(self, args, state, control, **kwargs):
        self.epochs_begun = 0

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):
        if has_length(train_dataloader):
            per_rank = len(train_dataloader)
            steps = max(math.ceil(per_rank / args.gradient_accumulation_steps), 1)
            self.epoch = state.global_step // steps
            self.next_batch = (state.global_step % steps) * args.gradient_accumulation_steps
        else:
            # Streaming data has no length: Trainer runs epoch after epoch until max_steps, and a resumed
            # run skips global_step windows of its first epoch (the same rule Trainer applies to the data).
            first = self.epochs_begun == 0
            self.epoch = 0 if first else self.epoch + 1
            skipped = 0 if args.ignore_data_skip else state.global_step * args.gradient_accumulation_steps
            self.next_batch = skipped if first else 0
        self.epochs_begun += 1

    def tag(self, args, batches):
        """Yield each fetched micro-batch with its Rows under batch_keys.ROWS: its rows' generator seeds, and with
        diffusion_t_sampler="stratified" each row's stratum."""
        stratified = config.T_SAMPLER.of(args) == config.STRATIFIED
        for batch in batches:
            rows = batch["input_ids"].shape[0]
            first = (self.next_batch * args.world_size + args.process_index) * args.per_device_train_batch_size
            self.next_batch += 1
            keys = [sample_key(args.seed, self.epoch, first + j) for j in range(rows)]
            if not stratified:
                yield {**batch, ROWS: Rows(keys)}
                continue
            n = config.examples_per_step(args)  # a step's examples: consecutive positions of the global order
            windows = {}
            strata = []
            for position in range(first, first + rows):
                window = windows.get(position // n) or window_strata(args.seed, self.epoch, position // n, n)
                windows[position // n] = window
                strata.append((window[position % n], n))
            yield {**batch, ROWS: Rows(keys, strata)}


def data_order(trainer):
    """The trainer's DataOrder, registered with it on first use (unpatch() takes it out again)."""
    kept = registry.per_trainer(trainer)
    if kept.order is None:
        kept.order = DataOrder()
        trainer.add_callback(kept.order)
    return kept.order

"""The window normalization, whole: whether a run has it, one optimizer step's micro-batches collected, their
noise drawn together and their masked tokens counted (summed across ranks where asked), each micro-batch's loss
divided by that count and scaled for data parallel by the `Window` that owns both, and Trainer's own division by
the accumulation steps switched off."""

import torch

from . import config
from .batch_keys import SLOT


def uses_window(trainer):
    """Does this trainer's run divide by the window's masked tokens (config.normalization_for)?"""
    profile = getattr(trainer, "diffusion_profile", None)
    args = getattr(trainer, "args", None)
    return profile is not None and config.normalization_for(profile, args) == config.WINDOW


class Window:
    """Noise for every micro-batch is drawn together when the first of them is trained on - after the
    Trainer restored a checkpoint's RNG state, before any forward - in micro-batch order, so the draws
    are the release's own. Only the inputs and their noise are kept until the window ends."""

    def __init__(self, batches, reduce_count, loss_scale, observe=None, accuracy=None, block=None):
        self.batches = batches
        self.reduce_count = reduce_count
        self.loss_scale = loss_scale
        self.observe = observe  # metrics.observer's (the counts and the metrics), or None: no metrics logged
        self.accuracy = accuracy  # metrics.TrainingAccuracy, where the loss holds the logits and metrics are on
        self.block = block  # the run's block_diffusion.BlockDiffusion, or None (bidirectional)
        self.noises = None
        self.count = None  # realized masked tokens of the window (summed across ranks when asked)
        self.supervised = None  # a block-diffusion window's AR count: its supervised tokens (ditto)
        self.metrics = None

    def noise(self, index, draw):
        """Micro-batch `index`'s noise; at the first call, `draw(batch)` for every micro-batch, the count (and a
        block-diffusion window's supervised count, in the same collective), and the window's metrics where the run
        logs them."""
        if self.noises is None:
            self.noises = [draw(batch) for batch in self.batches]
            counts = torch.stack([noise.masked.sum() for noise in self.noises])
            supervised = None
            if self.block is not None:
                supervised = torch.stack([noise.maskable.sum() for noise in self.noises]).sum()
            if self.observe is not None:  # the counts travel with the metrics: still one collective per window
                self.count, self.metrics, self.supervised = self.observe(self.noises, counts, supervised)
            elif supervised is None:
                self.count = self.reduce_count(counts.sum())
            else:  # both counts in one collective
                self.count, self.supervised = self.reduce_count(torch.stack([counts.sum(), supervised]))
            if self.accuracy is not None:
                self.accuracy.counted(self.count)
        return self.noises[index]

    def scorer(self):
        """`score(logits, tokens, masked)` for a loss that holds the logits, or None where nothing is kept."""
        if self.accuracy is None:
            return None
        return lambda logits, tokens, masked: self.accuracy.scored(logits, tokens, masked, self.count)

    def logged(self, index, result):
        """A micro-batch's (loss, outputs, metrics) with the window's metrics added to the first micro-batch's:
        the release logs the mean of each metric's values, so the window's count once per window."""
        if index != 0 or self.metrics is None or not (isinstance(result, tuple) and len(result) == 3):
            return result  # (a release whose loss returns another shape keeps it: metrics only observe)
        loss, outputs, said = result
        return loss, outputs, {**(said or {}), **self.metrics}

    def divide(self, loss_of):
        """`loss_of(denominator)`, the release's (loss, outputs, metrics) of a micro-batch divided by the window's
        count, then scaled: DDP averages gradients over ranks, and a count summed over ranks needs a summed
        numerator."""
        result = loss_of(self.count)
        if self.loss_scale != 1:
            result = (result[0] * self.loss_scale, *result[1:])
        return result


def collect(trainer, epoch_iterator, num_batches, rule, observer=None, accuracy=None, block=None):
    """(the window's micro-batches, its Window) for `rule` = (reduce_count, loss_scale); ([], None) when the
    data is spent, as Trainer's own fetch returns. The Window stands in for Trainer's num_items_in_batch: not None,
    so Trainer does not divide by the accumulation steps again, and its count is known once its noise is drawn.
    `observer(slots)`: the window's metrics.observer, or None; `accuracy`: the run's metrics.TrainingAccuracy,
    or None; `block`: the run's block_diffusion.BlockDiffusion, or None."""
    batches = fetch(trainer, epoch_iterator, num_batches)
    if not batches:
        return batches, None
    if accuracy is not None:
        accuracy.collected()
    observe = observer(num_batches) if observer else None
    return batches, Window(batches, *rule, observe=observe, accuracy=accuracy, block=block)


def fetch(trainer, epoch_iterator, num_batches):
    """The window's micro-batches, prepared for the device and tagged with their slot. Nothing is drawn."""
    batches = []
    for _ in range(num_batches):
        try:
            inputs = next(epoch_iterator)
        except StopIteration:
            break
        batches.append({**trainer._prepare_inputs(inputs), SLOT: len(batches)})
    return batches


def trainer_counting(trainer, upstream=False):
    """`counting_rule`'s (replicas, loss_scale) for this trainer's arguments and accelerator."""
    args, accelerator = trainer.args, trainer.accelerator
    return counting_rule(
        args.average_tokens_across_devices,
        args.world_size,
        accelerator.num_processes,
        getattr(accelerator, "parallelism_config", None),
        upstream,
    )


def data_parallel_rule(trainer, upstream=False):
    """(reduce_count, loss_scale) for this trainer: `counting_rule` bound to its accelerator. `upstream`:
    for the native opt-in path, which keeps upstream's compute_loss and so must keep its count."""
    accelerator = trainer.accelerator
    replicas, loss_scale = trainer_counting(trainer, upstream)
    if replicas is None:
        return (lambda count: count), loss_scale
    # One collective per window: every rank's local count (or counts: a 1-d tensor), gathered once when the noise
    # is drawn.
    return (
        lambda count: accelerator.gather(count.reshape(1, -1)).sum(dim=0).reshape(count.shape) // replicas
    ), loss_scale


def counting_rule(average_tokens_across_devices, world_size, num_processes, parallelism_config, upstream=False):
    """(replicas, loss_scale): how a window's count is combined across processes, and the loss factor.

    replicas is None for a rank-local count (one process, or average_tokens_across_devices=False, as
    the user asked). Otherwise the counts of all processes are summed and divided by `replicas`, the
    number of processes holding the same batch (tensor / context / sequence parallel ranks), so no
    data is counted twice. DDP then averages gradients over the ranks that hold different data, so the
    loss is multiplied by their number to leave the gradient of sum(S) / sum(N). Both numbers mirror
    transformers' own Trainer (get_batch_samples and compute_loss, 5.x) for token-counted losses.

    The factor holds for every engine Trainer drives, none of which needs its own: DDP and FSDP2 average
    gradients over the data-parallel ranks (fully_shard: over shard x replicate groups), and so do DeepSpeed
    ZeRO-1/2/3, whose own division by the accumulation steps Trainer switches off (scale_wrt_gas=False).

    `upstream`: Unsloth 2026.10.7+'s own rule (all processes' counts summed, the loss multiplied by all
    processes; a replicated batch is in both, so it cancels), which its compute_loss applies."""
    if not (average_tokens_across_devices and world_size > 1):
        return None, 1
    if upstream:
        return 1, num_processes
    if parallelism_config is None:
        return 1, num_processes
    return parallelism_config.non_data_parallel_size, num_processes // parallelism_config.tp_size


# Trainer divides a loss by the accumulation steps unless the model "accepts loss kwargs"; DiffusionTrainer
# (2026.10.4-.6) says it does not. Under window normalization the loss already carries the whole window's
# denominator, so the class-level property says True for such a run, and the trainer's own value otherwise.
def _accepts_loss_kwargs(trainer):
    return uses_window(trainer) or trainer.__dict__.get("model_accepts_loss_kwargs", False)


def _set_accepts_loss_kwargs(trainer, value):
    trainer.__dict__["model_accepts_loss_kwargs"] = value


ACCEPTS_LOSS_KWARGS = property(_accepts_loss_kwargs, _set_accepts_loss_kwargs)

"""One optimizer step's micro-batches, their noise, and the masked-token count that normalizes them."""

import torch

SLOT = "_diffusion_norm_slot"  # key in a micro-batch's inputs: its index in the window


class Window:
    """Noise for every micro-batch is drawn together when the first of them is trained on - after the
    Trainer restored a checkpoint's RNG state, before any forward - in micro-batch order, so the draws
    are the release's own. Only the inputs and their noise are kept until the window ends."""

    def __init__(self, batches, reduce_count, loss_scale):
        self.batches = batches
        self.reduce_count = reduce_count
        self.loss_scale = loss_scale
        self.noises = None
        self.count = None  # realized masked tokens of the window (summed across ranks when asked)

    def noise(self, index, draw):
        if self.noises is None:
            self.noises = [draw(batch) for batch in self.batches]
            local = torch.stack([noise.masked.sum() for noise in self.noises]).sum()
            self.count = self.reduce_count(local)
        return self.noises[index]


def data_parallel_rule(trainer):
    """(reduce_count, loss_scale) for this trainer.

    With average_tokens_across_devices and several ranks, the count is summed across ranks in one
    collective per window; DDP then averages gradients over ranks, so each rank's loss is multiplied by
    the number of ranks to leave the gradient of sum(S) / sum(N). Without it, each rank keeps its own
    count (rank-local normalization, as asked)."""
    args = trainer.args
    if args.average_tokens_across_devices and args.world_size > 1:
        accelerator = trainer.accelerator
        return (lambda count: accelerator.gather(count).sum()), accelerator.num_processes
    return (lambda count: count), 1

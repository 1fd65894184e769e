"""What a window's draws say about the run, logged with the release's own metrics (so every `report_to`
integration and trainer_state.json receive them): the window's masked tokens (the normalization's
denominator), the mean and spread of the noise levels its examples drew, and the share of its loss weight
that per-micro-batch normalization would have moved.

Computed from the drawn masks alone (no RNG, no forward), so observing never changes training. Where the
window's count is summed across data-parallel ranks the quantities are global: each rank's part (`summary`)
is gathered once, when the window's noise is drawn; where it is rank-local, so are they."""

import torch

from . import config, window

# The logged names, as they appear in the Trainer's log (training: as written; evaluation has none).
COUNT, LEVEL_MEAN, LEVEL_SPREAD, MOVED = (
    "window_masked_tokens",
    "noise_level_mean",
    "noise_level_std",
    "moved_weight_share",
)
NAMES = (COUNT, LEVEL_MEAN, LEVEL_SPREAD, MOVED)
ABSENT = -1.0  # a slot of the window this rank has no micro-batch in (the epoch's last window)


def summary(noises, counts, slots):
    """This rank's part, one float64 vector: the masked tokens of each of the window's `slots` micro-batches
    (ABSENT where it has none), then the sum of its rows' noise levels, of their squares, and the rows.
    (Float64 holds every count exactly; a row's level is its mask probability p = (1 - eps)·t + eps.)"""
    levels = torch.cat([noise.p_mask[:, 0] for noise in noises]).double()
    per_slot = torch.full((slots,), ABSENT, dtype=torch.float64, device=counts.device)
    per_slot[: len(counts)] = counts.double()
    rows = torch.tensor([float(levels.numel())], dtype=torch.float64, device=counts.device)
    return torch.cat([per_slot, levels.sum().reshape(1), (levels * levels).sum().reshape(1), rows])


def of(everyone, slots, count):
    """{name: 0-dim float tensor} of the window, from every rank's summary. A rank that holds the same batch
    as another (tensor / context parallel) repeats its micro-batches and rows, which leaves every quantity
    where it is: the moved share and the levels' mean and spread are unchanged by repeating all of them."""
    counts = everyone[:, :slots].flatten()
    present = counts != ABSENT  # (masked, not indexed: no wait for the device)
    level_sum, square_sum, rows = everyone[:, slots:].sum(dim=0)
    mean = level_sum / rows
    spread = (square_sum / rows - mean * mean).clamp_min(0).sqrt()
    total = torch.where(present, counts, 0).sum()
    # Per micro-batch normalization gives each of the n micro-batches 1/n of the step; the window gives each
    # its share of the masked tokens. Half the L1 distance is the weight that lands elsewhere (0: none masked).
    distance = torch.where(present, (1 / present.sum() - counts / total.clamp_min(1)).abs(), 0).sum()
    moved = torch.where(total > 0, 0.5 * distance, 0.0)
    return {
        COUNT: count.float(),
        LEVEL_MEAN: mean.float(),
        LEVEL_SPREAD: spread.float(),
        MOVED: moved.float(),
    }


def observer(trainer, upstream=False):
    """`observer(slots)` for this trainer's windows (`upstream`: counted as window.data_parallel_rule counts for
    Unsloth's own loss): for a window of `slots` micro-batches, `observe(noises, counts)` gives its count, the
    same as the rule's reduction gives, and its metrics, from one gather of every rank's `summary` (no
    collective where the count is rank-local). None where the run turned them off (diffusion_metrics=False)."""
    if not config.METRICS.of(trainer.args):
        return None
    accelerator = trainer.accelerator
    replicas, _ = window.trainer_counting(trainer, upstream)

    def observer_of(slots):
        def observe(noises, counts):
            local = summary(noises, counts, slots)[None]
            if replicas is None:
                count = counts.sum()
                return count, of(local, slots, count)
            everyone = accelerator.gather(local)
            count = (everyone[:, :slots].clamp_min(0).sum() // replicas).to(counts.dtype)
            return count, of(everyone, slots, count)

        return observe

    return observer_of

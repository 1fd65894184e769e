"""What a window's draws say about the run, logged with the release's own metrics (so every `report_to`
integration and trainer_state.json receive them): the window's masked tokens (the normalization's
denominator), the mean and spread of the noise levels its examples drew, and the share of its loss weight
that per-micro-batch normalization would have moved; where the loss holds the logits (the dense loss of
2026.10.4-.5), the windows' masked-token accuracy (`TrainingAccuracy`). The same numbers of a run at a
per-micro-batch normalization, whose release draws inside its loss (`OwnSteps`). And of a keyed evaluation
(`EvalScores`): its masked-token accuracy and its loss in each noise-level bucket, read from the forward the
release's loss already made.

Computed from the drawn masks (no forward; a per-micro-batch run's draw made again under a forked RNG), so
observing never changes training. Where the window's count is summed across data-parallel ranks the quantities
are global: each rank's part (`summary`) is gathered once, when the window's noise is drawn (the accuracy and a
per-micro-batch run's steps: at each log); where it is rank-local, so are they."""

import contextlib

import torch
import torch.nn.functional as F

from . import config, noise, registry, window
from .batch_keys import UNSLOTH_PREPARED
from .wrappers import log_arguments

# The logged names, as they appear in the Trainer's log (training: as written; evaluation has none).
COUNT, LEVEL_MEAN, LEVEL_SPREAD, MOVED = (
    "window_masked_tokens",
    "noise_level_mean",
    "noise_level_std",
    "moved_weight_share",
)
NAMES = (COUNT, LEVEL_MEAN, LEVEL_SPREAD, MOVED)
ACCURACY = "masked_token_accuracy"  # training's as written; evaluation's after its prefix: eval_masked_token_accuracy
CHUNK = 512  # masked tokens scored at a time: a chunk's fp32 logits are CHUNK x vocabulary
ABSENT = -1.0  # a slot of the window this rank has no micro-batch in (the epoch's last window)


def summary(noises, counts, slots, supervised=None):
    """This rank's part, one float64 vector: the masked tokens of each of the window's `slots` micro-batches
    (ABSENT where it has none), then the sum of its rows' noise levels, of their squares, and the rows; then,
    for a block-diffusion window, its `supervised` tokens (the AR term's count, gathered in the same collective).
    (Float64 holds every count exactly; a row's level is its mask probability p = (1 - eps)·t + eps.)"""
    levels = torch.cat([noise.p_mask[:, 0] for noise in noises]).double()
    per_slot = torch.full((slots,), ABSENT, dtype=torch.float64, device=counts.device)
    per_slot[: len(counts)] = counts.double()
    rows = torch.tensor([float(levels.numel())], dtype=torch.float64, device=counts.device)
    parts = [per_slot, levels.sum().reshape(1), (levels * levels).sum().reshape(1), rows]
    if supervised is not None:
        parts.append(supervised.double().reshape(1))
    return torch.cat(parts)


def of(everyone, slots, count):
    """{name: 0-dim float tensor} of the window, from every rank's summary. A rank that holds the same batch
    as another (tensor / context parallel) repeats its micro-batches and rows, which leaves every quantity
    where it is: the moved share and the levels' mean and spread are unchanged by repeating all of them."""
    counts = everyone[:, :slots].flatten()
    present = counts != ABSENT  # (masked, not indexed: no wait for the device)
    level_sum, square_sum, rows = everyone[:, slots : slots + 3].sum(dim=0)
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
    Unsloth's own loss): for a window of `slots` micro-batches, `observe(noises, counts, supervised=None)` gives
    its count, the same as the rule's reduction gives, its metrics, and its `supervised` tokens counted alike (a
    block-diffusion window's; None otherwise), from one gather of every rank's `summary` (no collective where the
    count is rank-local). None where the run turned them off (diffusion_metrics=False)."""
    if not config.METRICS.of(trainer.args):
        return None
    accelerator = trainer.accelerator
    replicas, _ = window.trainer_counting(trainer, upstream)

    def observer_of(slots):
        def observe(noises, counts, supervised=None):
            local = summary(noises, counts, slots, supervised)[None]
            if replicas is None:
                count = counts.sum()
                return count, of(local, slots, count), supervised
            everyone = accelerator.gather(local)
            count = (everyone[:, :slots].clamp_min(0).sum() // replicas).to(counts.dtype)
            if supervised is not None:
                supervised = (everyone[:, slots + 3].sum() // replicas).to(counts.dtype)
            return count, of(everyone, slots, count), supervised

        return observe

    return observer_of


def log_drawn(trainer, batches, slots):
    """A window Unsloth 2026.10.7+ drew at its fetch (per-sample noise: upstream's get_batch_samples draws through
    the plugin's keyed prepare_batch and counts): its metrics from the drawn masks, appended to the release's own
    metrics as its compute_loss appends them, so its log() averages them with the rest. Counted as upstream
    counts; under data parallel one gather of their own (upstream's count is gathered apart)."""
    observe = observer(trainer, upstream=True)
    sink = getattr(trainer, "_diffusion_metrics", None)
    prepared = [batch.get(UNSLOTH_PREPARED) for batch in batches]
    if observe is None or sink is None or not prepared or any(p is None for p in prepared):
        return  # (metrics off, another release's trainer, or a window upstream did not draw: nothing to say)
    drawn = [noise.Noise(*p) for p in prepared]
    _, found, _ = observe(slots)(drawn, torch.stack([d.masked.sum() for d in drawn]))
    for name, value in found.items():
        sink[f"train/{name}"].append(value.detach().float().reshape(()))


def hit(logits, tokens):
    """Is each token's logit the highest of its position (a tie at the top counts)? Not argmax(): on a CPU its
    kernel takes 15 times as long as amax's, which made the accuracy cost 7 % of the bench's training step."""
    return logits.gather(-1, tokens[..., None])[..., 0] >= logits.amax(dim=-1)


class TrainingAccuracy:
    """The masked-token accuracy of the training windows since the last log, where the loss holds the logits:
    each window's hits (the token's logit the highest) over its masked tokens (every rank's, where its count is
    summed across ranks), the mean over the windows that masked a token, as the release averages its metrics.

    Each rank adds hits / count as its micro-batches go (tensors: no wait for the device); the ranks' sums are
    gathered once per log, at the Trainer's log, which every rank calls where Trainer gathers its own loss."""

    def __init__(self, accelerator, replicas):
        self.accelerator = accelerator
        self.replicas = replicas  # window.trainer_counting's: None where the count is rank-local
        self.windows = 0  # windows collected since the last log: the same number on every rank
        self.share = 0.0  # sum of each micro-batch's hits / its window's count (a device tensor once added to)
        self.masking = 0.0  # windows that masked a token (ditto)

    def collected(self):
        self.windows += 1

    def counted(self, count):
        """The window's count is known (at its first micro-batch on this rank)."""
        self.masking = self.masking + (count > 0).double()

    def scored(self, logits, tokens, masked, count):
        """A micro-batch's logits, tokens and mask, for its window of `count` masked tokens. (Every position's
        `hit`, then the masked ones: no copy of the masked logits.)"""
        with torch.no_grad():
            hits = (hit(logits, tokens) & masked).sum().double()
        self.share = self.share + hits / count.clamp_min(1).double()

    def take(self, device):
        """The accuracy since the last log (a float), or None where no window masked a token; starts afresh.
        Collective where the count is summed across ranks and a window was collected since the last log."""
        if self.windows == 0:
            return None
        local = torch.stack(
            [torch.as_tensor(v, dtype=torch.float64, device=device) for v in (self.share, self.masking)]
        )
        self.windows, self.share, self.masking = 0, 0.0, 0.0
        if self.replicas is None:
            share, windows = local[0], local[1]
        else:  # (a rank with no micro-batch in a window did not count it: the most any rank counted)
            everyone = self.accelerator.gather(local[None])
            share, windows = everyone[:, 0].sum() / self.replicas, everyone[:, 1].max()
        return float(share / windows) if windows > 0 else None


def _kept(trainer, name, make):
    """The trainer's `name` record (PerTrainer), `make(accelerator, replicas)` at first use; None where the run's
    metrics are off."""
    if not config.METRICS.of(trainer.args):
        return None
    kept = registry.per_trainer(trainer)
    if getattr(kept, name) is None:
        replicas, _ = window.trainer_counting(trainer)
        setattr(kept, name, make(trainer.accelerator, replicas))
    return getattr(kept, name)


def training_accuracy(trainer):
    """The trainer's TrainingAccuracy, made at its first window; None where the run's metrics are off."""
    return _kept(trainer, "accuracy", TrainingAccuracy)


class OwnSteps:
    """A run at a per-micro-batch normalization (a profile's own, or 'microbatch'), whose release draws each
    micro-batch's noise inside its loss: each training micro-batch's draw, reduced at once to a few numbers of its
    optimizer step (its masked tokens in its slot, its rows' level sums), and at the Trainer's log the metrics of
    the steps since the last log, each step's as `of` gives a window's, their mean as the release averages its
    own. Where counts are summed across ranks the steps' numbers are gathered there, at the log every rank calls."""

    def __init__(self, accelerator, replicas, slots):
        self.accelerator = accelerator
        self.replicas = replicas  # window.trainer_counting's: None where the count is rank-local
        self.slots = slots  # micro-batches per optimizer step (the accumulation steps)
        self.steps = {}  # optimizer step (the global_step it trains from) -> [counts], level sum, square sum, rows

    def drawn(self, step, drawn):
        levels = drawn.p_mask[:, 0].double()
        kept = self.steps.setdefault(step, [[], 0.0, 0.0, 0.0])
        kept[0].append(drawn.masked.sum().double())
        kept[1:] = kept[1] + levels.sum(), kept[2] + (levels * levels).sum(), kept[3] + levels.numel()

    def take(self, device):
        """{name: float} of the steps drawn since the last take (their mean), or {} where none; starts afresh."""
        rows = []
        for step, (counts, level_sum, square_sum, total) in sorted(self.steps.items()):
            per_slot = torch.full((self.slots,), ABSENT, dtype=torch.float64, device=device)
            per_slot[: len(counts)] = torch.stack(counts).to(device)
            sums = torch.tensor([float(level_sum), float(square_sum), total], dtype=torch.float64, device=device)
            rows.append(torch.cat([torch.tensor([float(step)], dtype=torch.float64, device=device), per_slot, sums]))
        self.steps = {}
        local = torch.stack(rows) if rows else torch.zeros((0, self.slots + 4), dtype=torch.float64, device=device)
        if self.replicas is None:
            everyone = local[None]
        else:  # (ranks may hold different steps: a rank with no micro-batch in one; padded rows have step -1)
            padded = self.accelerator.pad_across_processes(local, dim=0, pad_index=-1)
            everyone = self.accelerator.gather(padded[None])
        found = {}
        steps = sorted({int(step) for step in everyone[:, :, 0].flatten().tolist() if step >= 0})
        for step in steps:
            parts = torch.stack([_row(rank, step, self.slots) for rank in everyone])
            count = parts[:, 1 : 1 + self.slots].clamp_min(0).sum() // (self.replicas or 1)
            for name, value in of(parts[:, 1:], self.slots, count).items():
                found.setdefault(name, []).append(float(value))
        return {name: sum(values) / len(values) for name, values in found.items()}


def _row(rank, step, slots):
    """A rank's row of `step`; for a step it had no micro-batch in, every slot absent and no rows."""
    found = rank[rank[:, 0] == step]
    if len(found):
        return found[0]
    row = torch.zeros(rank.shape[1], dtype=rank.dtype, device=rank.device)
    row[1 : 1 + slots] = ABSENT
    return row


def own_steps(trainer):
    """The trainer's OwnSteps, made at its first training micro-batch; None where the run's metrics are off."""
    slots = trainer.args.gradient_accumulation_steps
    return _kept(trainer, "own_steps", lambda accelerator, replicas: OwnSteps(accelerator, replicas, slots))


def observe_own_draw(trainer, model, device, draw):
    """A training micro-batch of a per-micro-batch run, before its release draws and trains on it: `draw()` is the
    release's own draw of it on `device` (its input_ids'), made here under a forked RNG (so the release then draws
    the same noise from the same state), kept as numbers of its step. Nothing where the metrics are off or the
    model is evaluating."""
    steps = own_steps(trainer) if model.training else None
    if steps is None:
        return
    with torch.no_grad(), torch.random.fork_rng(devices=[device.index] if device.type == "cuda" else []):
        drawn = draw()
    steps.drawn(trainer.state.global_step, drawn)


def logged(wrapped, trainer, pos, kwargs):
    """The release's log(), wrapped: `before_log` first."""
    before_log(trainer, log_arguments(*pos, **kwargs))
    return wrapped(*pos, **kwargs)


def before_log(trainer, logs):
    """Before the release's log() averages its training metrics: the training accuracy since the last log, and the
    metrics of a per-micro-batch run's steps, where the run has them, put among them. (An evaluation's log leaves
    them for the next training log.)"""
    kept = trainer.__dict__.get(registry.PER_TRAINER)
    sink = getattr(trainer, "_diffusion_metrics", None)
    if kept is None or sink is None or any(key.startswith("eval_") for key in logs):
        return
    if kept.accuracy is not None:
        found = kept.accuracy.take(trainer.args.device)
        if found is not None:
            sink[f"train/{ACCURACY}"] = [found]
    if kept.own_steps is not None:
        for name, value in kept.own_steps.take(trainer.args.device).items():
            sink[f"train/{name}"] = [value]


# --- a keyed evaluation's accuracy and masked CE by noise level ------------------------------------------------------


def bucket_name(prefix, k, buckets):
    """The logged name of bucket k of `buckets` equal noise-level buckets: eval_masked_ce_noise_0.2-0.4."""
    return f"{prefix}_masked_ce_noise_{k / buckets:g}-{(k + 1) / buckets:g}"


@contextlib.contextmanager
def forward_output(model):
    """[the model's last forward output] inside the block: a forward hook, removed on the way out, that only looks."""
    seen = [None]

    def hook(module, args, output):
        seen[0] = output

    handle = model.register_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def row_scores(output, head, drawn, shift):
    """Per row of a drawn batch, float64: its masked tokens' cross-entropy sum, hits, and masked tokens,
    from the forward's output - its logits, or where the loss fused the head (`head` not None) the hidden states,
    scored through the head CHUNK tokens at a time. `shift`: position i's output predicts token i + 1."""
    scores = output.logits if hasattr(output, "logits") else output[0]
    if shift:
        scores = torch.cat([scores[:, :1], scores[:, :-1]], dim=1)
    masked = drawn.masked
    rows = masked.nonzero()[:, 0]
    chosen, targets = scores[masked], drawn.input_ids[masked]
    ce = torch.empty(len(targets), dtype=torch.float64, device=targets.device)
    hits = torch.empty(len(targets), dtype=torch.float64, device=targets.device)
    with torch.no_grad():
        for start in range(0, len(targets), CHUNK):
            part, wanted = chosen[start : start + CHUNK], targets[start : start + CHUNK]
            logits = (part if head is None else F.linear(part, head.weight, head.bias)).float()
            ce[start : start + CHUNK] = F.cross_entropy(logits, wanted, reduction="none").double()
            hits[start : start + CHUNK] = hit(logits, wanted).double()
    zeros = torch.zeros(masked.shape[0], dtype=torch.float64, device=targets.device)
    return zeros.index_add(0, rows, ce), zeros.index_add(0, rows, hits), masked.sum(dim=1).double()


class EvalScores:
    """An evaluation's keyed draws, scored: per noise-level bucket (of the row's mask probability p) the sum of
    its rows' masked cross-entropy and their masked tokens; over every row the hits (metrics.hit) and masked tokens. Kept
    as one float64 vector, gathered once. (Unweighted, as the release's masked_ce: the 1/p weights would let a
    bucket's lowest levels speak for it, and eval_loss is the weighted whole already.)"""

    def __init__(self, buckets):
        self.buckets = buckets
        self.sums = None

    def add(self, output, head, drawn, shift):
        ce, hits, masked = row_scores(output, head, drawn, shift)
        bucket = (drawn.p_mask[:, 0].double() * self.buckets).long().clamp(0, self.buckets - 1)
        empty = torch.zeros(self.buckets, dtype=torch.float64, device=ce.device)
        part = torch.cat(
            [empty.index_add(0, bucket, ce), empty.index_add(0, bucket, masked), hits.sum()[None], masked.sum()[None]]
        )
        self.sums = part if self.sums is None else self.sums + part

    def size(self):
        return 2 * self.buckets + 2

    def vector(self, device):
        """This rank's sums (zeros where it scored nothing: every rank joins the one gather)."""
        return torch.zeros(self.size(), dtype=torch.float64, device=device) if self.sums is None else self.sums

    def named(self, total, prefix):
        """{name: float} from every rank's summed vector: the accuracy, and the masked CE of each bucket that holds
        a masked token (an empty bucket has nothing to give, and under keyed draws it is empty at every evaluation)."""
        losses, counts = total[: self.buckets], total[self.buckets : 2 * self.buckets]
        hits, masked = total[-2:]
        found = {f"{prefix}_{ACCURACY}": float(hits / masked)} if masked > 0 else {}
        for k in range(self.buckets):
            if counts[k] > 0:
                found[bucket_name(prefix, k, self.buckets)] = float(losses[k] / counts[k])
        return found

"""The share of a step's loss weight per-micro-batch normalization moves: ρ and the moved share, the Monte
Carlo `estimate` over the epoch's steps, and the `exact_share` for equal-length answers the tests hold it to."""

import math
from dataclasses import dataclass, field

import numpy as np

from .rng_stream import CUDA_ONE_OFFSET, GATHER, stream_counts, stream_reads

Z95 = 1.959963984540054  # two-sided 95 % normal quantile: the printed confidence interval
NOISE_BINS = 10  # equal-width bins of t over [0, 1)
PERCENTILES = (1, 5, 25, 50, 75, 95, 99)
DRAWS = 20_000  # at least this many optimizer steps are drawn (whole passes over the epoch's steps)


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
    defaulted: dict = field(default_factory=dict)  # settings the trainer's defaults gave, not the user's run
    configured: bool = True  # read from the run's training config (--config)

    def verdict(self):
        return self._finding() + self._caveat()

    def _caveat(self):
        if not self.configured and self.defaulted:
            assumed = ", ".join(f"{name}={value}" for name, value in self.defaulted.items())
            return (
                f" No --config was given: this is a run with the trainer's defaults {assumed}, not necessarily "
                "yours; give your training config (--config) or these options to measure your run."
            )
        if "world_size" in self.defaulted:  # a launch setting: a training config never holds it
            return " It assumes one process: give --world-size N for a run launched on N processes."
        return ""

    def _finding(self):
        pct = 100 * self.share
        if self.micro_batches_per_step == 1:
            return "one micro-batch per step: both normalizations are the same; nothing moved, no need to retrain."
        worst = max(self.noise_bins, key=lambda b: b[2]) if self.noise_bins else None
        where = (
            f"; tokens at noise level {worst[0]:.1f}-{worst[1]:.1f} got {worst[2]:.2f}x their weight" if worst else ""
        )
        # The bands are a rule of thumb: one measurement (docs/convergence.md) cannot place their edges.
        if pct < 1:
            words = "negligible, by a rule of thumb: retraining is unlikely to matter"
        elif pct < 5:
            words = "small, by a rule of thumb: retrain only if you need the reference recipe exactly"
        elif pct < 15:
            words = "noticeable, by a rule of thumb: the run trained with another time and length weighting; consider retraining"
        else:
            words = "large, by a rule of thumb: a substantially different objective; retraining with the plugin is the safe choice"
        return f"{pct:.1f} % of each step's loss weight moved ({words}){where}."


def _chunks(total, size):
    while total > 0:
        yield min(total, size)
        total -= size


def estimate(layout, eps, draws=DRAWS, seed=0, global_rng=True, rho=rho, device="cuda"):
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
    reads = stream_reads(layout, device)
    shared = global_rng and world > 1
    notes = _approximations(layout, shared, device)
    answer_edges = _length_edges(layout.answer[layout.maskable > 0])
    sums = _Sums(layout, answer_edges)
    chunk = max(1, 2_000_000 // max(1, len(layout.maskable)))
    if shared:
        chunk = max(1, min(chunk, GATHER // reads[2]))
    for size in _chunks(passes, chunk):
        if shared:  # float32: torch's CPU uniforms are float32 too
            t, counts = stream_counts(layout, rng.random((size, reads[2]), dtype=np.float32), eps, reads)
        else:
            t = rng.random((size, len(layout.maskable)))
            counts = rng.binomial(layout.maskable, (1 - eps) * t + eps)
        sums.add(t, counts, rho)
    count = passes * steps
    mean = sums.share / count
    variance = max(0.0, sums.share2 / count - mean**2) * count / max(1, count - 1)
    half = Z95 * math.sqrt(variance / count)
    values, weights = np.concatenate(sums.rho_values), np.concatenate(sums.rho_weights)
    return Estimate(
        share=mean,
        low=mean - half,
        high=mean + half,
        draws=count,
        percentiles=_weighted_percentiles(values, weights),
        noise_bins=_bins(sums.noise, np.linspace(0, 1, NOISE_BINS + 1), count),
        length_bins=_bins(sums.length, answer_edges, count),
        distinct_global=_distinct(layout, reads[0], True),
        distinct_per_sample=_distinct(layout, reads[0], False),
        steps=steps,
        micro_batches_per_step=int(layout.accumulation * world),
        notes=notes,
    )


def _approximations(layout, shared, device):
    """The estimate's notes: where the shared-noise model is approximate (a micro-batch's draw too large for
    CUDA's generator to move by its one fixed step)."""
    notes = []
    n_mb = len(layout.step_of_micro_batch)
    largest = int((np.bincount(layout.micro_batch, minlength=n_mb) * layout.padded).max())
    if shared and device == "cuda" and largest > CUDA_ONE_OFFSET:
        notes.append(
            f"a micro-batch draws {largest:,} values (B x P) at once, over the {CUDA_ONE_OFFSET:,} up to which CUDA's "
            "generator moves by one fixed step on any GPU: the shared-noise model is approximate there"
        )
    return notes


class _Sums:
    """What the estimate adds up over its passes: every step's share and its square, ρ over the masked
    tokens with their counts as weights, and the tables by noise level and by answer length."""

    def __init__(self, layout, answer_edges):
        self.layout = layout
        self.mb_step = layout.step_of_micro_batch
        self.k_of_mb = layout.k[self.mb_step]
        self.answer_bin = np.clip(
            np.searchsorted(answer_edges, layout.answer, side="right") - 1, 0, len(answer_edges) - 2
        )
        self.share = self.share2 = 0.0
        self.noise = np.zeros((4, NOISE_BINS))  # Σ N·ρ, Σ N, Σ window weight, Σ per-micro-batch weight
        self.length = np.zeros((4, len(answer_edges) - 1))
        self.rho_values, self.rho_weights = [], []

    def add(self, t, counts, rho):
        """One chunk of passes: each row's t and masked count, [passes, rows]."""
        layout, mb_step, k_of_mb = self.layout, self.mb_step, self.k_of_mb
        steps, world = layout.steps, layout.world_size
        mb_counts = _sum_by(counts, layout.micro_batch, len(mb_step))
        totals = _sum_by(mb_counts, mb_step, steps)
        per_mb_total = totals[:, mb_step]
        terms = moved_share(mb_counts, per_mb_total, k_of_mb, world, rho=rho)
        step_share = _sum_by(terms, mb_step, steps)
        self.share += step_share.sum()
        self.share2 += (step_share**2).sum()
        r = rho(mb_counts, per_mb_total, k_of_mb, world)
        nonempty = mb_counts > 0
        self.rho_values.append(r[nonempty])
        self.rho_weights.append(mb_counts[nonempty])
        row_rho = np.where(counts > 0, r[:, layout.micro_batch], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            row_window = np.where(counts > 0, counts / per_mb_total[:, layout.micro_batch], 0.0)
        row_per_mb = row_rho * row_window
        tbin = np.minimum((t * NOISE_BINS).astype(np.int64), NOISE_BINS - 1)
        for table, bins in ((self.noise, tbin), (self.length, np.broadcast_to(self.answer_bin, t.shape))):
            nb = table.shape[1]
            flat = bins.ravel()
            for row, values in enumerate((counts * row_rho, counts, row_window, row_per_mb)):
                table[row] += np.bincount(flat, weights=values.ravel(), minlength=nb)[:nb]


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

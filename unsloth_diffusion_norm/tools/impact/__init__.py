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

The modules, one idea each:
- `settings`: the run's settings that decide the counts, the keys of a training config impact reads, and
  `Unusable`, the one-line refusal of input impact cannot use;
- `preparation`: the rows and the tokenizer loaded, and TRL's dataset preparation mirrored, to (length,
  supervised tokens) per row;
- `batching`: the Trainer's sampler and accelerate's deal of micro-batches to the ranks, as a `Layout` with
  each row's maskable count;
- `rng_stream`: where every row reads its t and u in the global RNG's stream on CPU and on CUDA, and the
  masked counts read from one stream;
- `arithmetic`: ρ and the moved share, the Monte Carlo `estimate` and the `exact_share` it is held to;
- `report`: `run`, from the paths to the Estimate, and its table, JSON and plot.
"""

from .arithmetic import (
    DRAWS,
    NOISE_BINS,
    PERCENTILES,
    Z95,
    Estimate,
    estimate,
    exact_share,
    moved_share,
    rho,
)
from .batching import Layout, layout, micro_batches
from .preparation import TRL_FLOOR, Prepared, load_rows, load_rows_from_list, load_tokenizer, prepare
from .preparation import _trl_route as _trl_route  # tests/integration/test_impact_counts.py calls TRL's route alone
from .report import as_json, plot, render, run
from .rng_stream import CUDA_ONE_OFFSET, DEVICES, GATHER, stream_counts, stream_reads
from .settings import CONFIG_KEYS, Settings, Unusable, from_command_line, read_config

__all__ = [
    "CONFIG_KEYS",
    "CUDA_ONE_OFFSET",
    "DEVICES",
    "DRAWS",
    "GATHER",
    "NOISE_BINS",
    "PERCENTILES",
    "TRL_FLOOR",
    "Z95",
    "Estimate",
    "Layout",
    "Prepared",
    "Settings",
    "Unusable",
    "from_command_line",
    "as_json",
    "estimate",
    "exact_share",
    "layout",
    "load_rows",
    "load_rows_from_list",
    "load_tokenizer",
    "micro_batches",
    "moved_share",
    "plot",
    "prepare",
    "read_config",
    "render",
    "rho",
    "run",
    "stream_counts",
    "stream_reads",
]

"""What `impact` hands the user: `run`, from the paths to the Estimate, and its table, JSON and plot."""

import dataclasses

import numpy as np

from ..console import pyplot
from .arithmetic import DRAWS, PERCENTILES, estimate
from .batching import layout
from .preparation import _data_format, load_rows, load_tokenizer, prepare


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
    from ...proof.tables import markdown

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
    if e.defaulted:
        whose = (
            "the trainer's defaults, as a run with this config has them" if e.configured else "the trainer's defaults"
        )
        lines += ["", f"not given, so {whose}: " + ", ".join(f"{k}={v}" for k, v in e.defaulted.items())]
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
    normalizations. The command line refuses --plot without matplotlib before any work."""
    plt = pyplot()
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

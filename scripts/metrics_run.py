"""What a run's metrics look like: python scripts/metrics_run.py [--plot docs/metrics.png] [--json FILE]

A short real run on the docstring data set (built here, nothing downloaded; a random-initialized model of the
tiny model's class at the tokenizer's vocabulary): batch 4, GA 2, AdamW with warm-up and cosine, clipping at 1.0,
keyed evaluation (diffusion_eval_noise="fixed", 2 draws) of 32 held-out rows every 32 steps, every metric logged
at every step, and the first 3 eval answers decoded at each evaluation (diffusion_eval_samples=3). Prints each
evaluation's metrics, the last evaluation's samples, and what evaluating cost with the run's metrics and samples
on and off (the same run again with diffusion_metrics=False, no samples); --plot draws the loss, the window's masked tokens and noise level,
and the eval masked CE by noise-level bucket against the step. About a minute on 2 CPU cores.

The run's first logged step, its last evaluation and that evaluation's samples go to records/metrics-run.json
(docs/metrics.md renders them from there).
"""

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")  # CPU-only host: needed by `import unsloth`
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import unsloth_diffusion_norm  # noqa: E402
from unsloth_diffusion_norm.proof import fixtures, tables  # noqa: E402
from unsloth_diffusion_norm.tools import records  # noqa: E402

fixtures.import_unsloth()  # the plugin first, as users do

SEED = 42
RUN = dict(train_rows=512, eval_rows=32, max_length=96, batch=4, ga=2, steps=384, eval_every=32, draws=2)


def train(metrics_on=True):
    """The run's Trainer log history, its seconds (whole run, evaluating) and its samples file's lines."""
    from datasets import load_dataset
    from unsloth.models.diffusion_trainer import DiffusionConfig, DiffusionTrainer

    from unsloth_diffusion_norm.tools import docstring_data

    where = tempfile.mkdtemp(prefix="udn-metrics-")
    data, tokenizer_folder, _ = docstring_data.write(os.path.join(where, "data"))
    checkpoint = docstring_data.checkpoint(
        os.path.join(where, "model"), tokenizer_folder, max_position_embeddings=RUN["max_length"]
    )
    rows = load_dataset("json", data_files=data)["train"].shuffle(seed=SEED)
    train_rows = rows.select(range(RUN["train_rows"]))
    eval_rows = rows.select(range(RUN["train_rows"], RUN["train_rows"] + RUN["eval_rows"]))
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        model, tokenizer = fixtures.load_model(checkpoint=checkpoint)
        args = DiffusionConfig(
            output_dir=os.path.join(where, "out"),
            per_device_train_batch_size=RUN["batch"],
            per_device_eval_batch_size=RUN["batch"],
            gradient_accumulation_steps=RUN["ga"],
            max_steps=RUN["steps"],
            learning_rate=1e-2,
            lr_scheduler_type="cosine",
            warmup_steps=4,
            max_grad_norm=1.0,
            max_length=RUN["max_length"],
            eval_strategy="steps",
            eval_steps=RUN["eval_every"],
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            seed=SEED,
            bf16=False,
            fp16=False,
            use_cpu=True,
            diffusion_eval_noise="fixed",
            diffusion_eval_draws=RUN["draws"],
            diffusion_metrics=metrics_on,
            diffusion_eval_samples=3 if metrics_on else None,
        )
        trainer = DiffusionTrainer(
            model=model, args=args, train_dataset=train_rows, eval_dataset=eval_rows, processing_class=tokenizer
        )
        trainer.train()
    history = trainer.state.log_history
    seconds = round(time.perf_counter() - started, 1)
    evaluating = round(sum(e["eval_runtime"] for e in history if "eval_runtime" in e), 2)
    found = os.path.join(args.output_dir, "diffusion_samples.jsonl")
    lines = [json.loads(line) for line in open(found, encoding="utf-8")] if metrics_on else []
    return history, seconds, evaluating, lines


def draw(history, path):
    from unsloth_diffusion_norm.tools.console import NO_PLOT, pyplot

    plt = pyplot()
    if plt is None:
        print(NO_PLOT, file=sys.stderr)
        return
    steps = [e for e in history if "loss" in e and "window_masked_tokens" in e]
    evals = [e for e in history if "eval_loss" in e]
    figure, ((loss, count), (level, bucket)) = plt.subplots(2, 2, figsize=(10, 6.5), sharex=True)
    loss.plot([e["step"] for e in steps], [e["loss"] for e in steps], lw=0.8, label="loss")
    loss.plot([e["step"] for e in evals], [e["eval_loss"] for e in evals], marker="o", label="eval_loss")
    loss.set_title("loss (train, and keyed eval)")
    loss.legend()
    count.plot([e["step"] for e in steps], [e["window_masked_tokens"] for e in steps], lw=0.8)
    count.set_title("window_masked_tokens (the loss's denominator)")
    level.plot([e["step"] for e in steps], [e["noise_level_mean"] for e in steps], lw=0.8, label="noise_level_mean")
    level.plot([e["step"] for e in steps], [e["noise_level_std"] for e in steps], lw=0.8, label="noise_level_std")
    level.plot([e["step"] for e in steps], [e["moved_weight_share"] for e in steps], lw=0.8, label="moved_weight_share")
    level.set_title("noise levels; weight per-micro-batch would move")
    level.set_xlabel("optimizer step")
    level.legend(fontsize=8)
    names = sorted({n for e in evals for n in e if n.startswith("eval_masked_ce_noise_")})
    for name in names:
        bucket.plot(
            [e["step"] for e in evals if name in e], [e[name] for e in evals if name in e], marker=".", label=name
        )
    bucket.set_title("eval masked CE by noise level (keyed draws)")
    bucket.set_xlabel("optimizer step")
    bucket.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def _table(title, logged):
    """One logged entry as a two-column table, the metrics in the log's order."""
    return "\n".join(tables.markdown(["metric", title], [[f"`{n}`", f"{v:.4g}"] for n, v in logged.items()]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plot", help="draw the run's metrics into this PNG")
    parser.add_argument("--json", help="write the run's log history and timings here")
    args = parser.parse_args(argv)
    status = unsloth_diffusion_norm.apply()
    print(f"Unsloth {status.unsloth_version}, plugin mode {status.mode}\n")
    history, seconds, evaluating, lines = train()
    plain, plain_seconds, plain_evaluating, _ = train(metrics_on=False)
    evals = [e for e in history if "eval_loss" in e]
    names = ["eval_loss", "eval_loss_stderr", "eval_masked_token_accuracy"]
    names += sorted({n for e in evals for n in e if n.startswith("eval_masked_ce_noise_")})
    print(
        "\n".join(
            tables.markdown(
                ["step", *names], [[e["step"], *(f"{e.get(n, float('nan')):.4f}" for n in names)] for e in evals]
            )
        )
    )
    last = [line for line in lines if line["step"] == lines[-1]["step"]]
    print(f"\nsamples at step {last[0]['step']} (diffusion_samples.jsonl):")
    for line in last:
        print(json.dumps({name: line[name] for name in ("step", "index", "prompt", "sample", "reference")}))
    same = [e["loss"] for e in history if "loss" in e] == [e["loss"] for e in plain if "loss" in e]
    print(
        f"\nmetrics and samples on: {seconds} s in all, {evaluating} s evaluating; off: {plain_seconds} s, "
        f"{plain_evaluating} s "
        f"evaluating (ratio {evaluating / plain_evaluating:.3f}); the training losses of the two runs are "
        f"{'bitwise equal' if same else 'NOT equal'}"
    )
    if args.plot:
        draw(history, args.plot)
    first = next(e for e in history if "loss" in e and "window_masked_tokens" in e)
    shown = {name: value for name, value in first.items() if name not in ("epoch", "learning_rate", "step")}
    evaluation = {
        name: value for name, value in evals[-1].items() if name.startswith("eval_") and "runtime" not in name
    }
    evaluation.pop("eval_samples_per_second", None)
    evaluation.pop("eval_steps_per_second", None)
    records.write(
        "metrics-run",
        " ".join(["python scripts/metrics_run.py", *(argv if argv is not None else sys.argv[1:])]),
        {
            "mode": status.mode,
            "run": RUN,
            "first_step": first,
            "last_evaluation": evals[-1],
            "samples": last,
            "seconds": [seconds, plain_seconds],
            "evaluating": [evaluating, plain_evaluating],
            "losses_bitwise_equal": same,
        },
        tables={
            "step": _table(f"step {first['step']}", shown),
            "evaluation": _table(f"evaluation at step {evals[-1]['step']}", evaluation),
            "samples": "\n".join(
                [
                    "```json",
                    *(json.dumps({n: line[n] for n in ("index", "prompt", "sample", "reference")}) for line in last),
                    "```",
                ]
            ),
        },
    )
    print("\nrecords/metrics-run.json written")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "unsloth": status.unsloth_version,
                    "run": RUN,
                    "history": history,
                    "seconds": [seconds, plain_seconds],
                    "evaluating": [evaluating, plain_evaluating],
                    "samples": lines,
                },
                f,
                indent=1,
            )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

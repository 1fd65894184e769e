"""Evaluation noise, measured: python scripts/eval_noise.py [--curve] [--plot eval-noise.png] [--json FILE]

1. The two defects of the release's own evaluation draws, and diffusion_eval_noise="fixed": the tiny checkpoint,
   8 equal-length examples, batch 1, GA 2, 4 AdamW steps, seed 42, 4 held-out examples. For each setting: the
   eval loss of the final weights, evaluated twice, and the largest parameter difference between the run that
   evaluates after every step and the same run without evaluation.
2. --curve: an eval-loss curve over a short real run on the docstring data set (built here, nothing downloaded;
   a random-initialized model of the tiny model's class at the tokenizer's vocabulary), with the field unset,
   with "fixed", and with "fixed" and 4 draws per example; --plot draws it. Takes a few minutes on 2 CPU cores.

The tables go to records/eval-noise.json (docs/noise.md renders them from there).
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

fixtures.import_unsloth()  # the plugin first, as users do
from unsloth_diffusion_norm.proof import experiment  # noqa: E402
from unsloth_diffusion_norm.proof.fixtures import Example, equal_answers  # noqa: E402
from unsloth_diffusion_norm.tools import records  # noqa: E402

SEED = 42
TRAIN = equal_answers(8)
HELD = [Example([60 + i, 61], list(range(40 + i, 47 + i))) for i in range(4)]
ADAMW = {"optim": "adamw_torch", "learning_rate": 1e-2}
SETTINGS = [
    ("unset (the release's own draws)", {}),
    ('"fixed"', {"diffusion_eval_noise": "fixed"}),
    ('"fixed", 4 draws', {"diffusion_eval_noise": "fixed", "diffusion_eval_draws": 4}),
    ("per-sample training, eval unset", {"diffusion_noise": "per_sample"}),
    ('per-sample training, "fixed"', {"diffusion_noise": "per_sample", "diffusion_eval_noise": "fixed"}),
]


def defects():
    rows = []
    for label, flags in SETTINGS:
        with contextlib.redirect_stdout(io.StringIO()):
            plain = experiment.train(TRAIN, seed=SEED, eval_examples=HELD, **ADAMW, **flags)
            evaluated = experiment.train(
                TRAIN, seed=SEED, eval_examples=HELD, eval_strategy="steps", eval_steps=1, **ADAMW, **flags
            )
            first, second = (experiment.evaluate(plain.trainer, seed=None)[0] for _ in range(2))
        rows.append(
            {
                "setting": label,
                "first": first,
                "second": second,
                "difference": experiment.final_difference(plain, evaluated),
            }
        )
    return rows


def render(rows):
    header = [
        "diffusion_eval_noise",
        "eval loss",
        "the same weights again",
        "max abs param difference, with vs without evaluation",
    ]
    body = [[r["setting"], f"{r['first']:.4f}", f"{r['second']:.4f}", f"{r['difference']:.3g}"] for r in rows]
    return "\n".join(tables.markdown(header, body))


# --- the curve on the docstring data set ---------------------------------------------------------------------

CURVE = dict(train_rows=512, eval_rows=32, max_length=96, batch=4, ga=2, steps=64, eval_every=4)
ARMS = [
    ("unset", {}),
    ("fixed", {"diffusion_eval_noise": "fixed"}),
    ("fixed, 4 draws", {"diffusion_eval_noise": "fixed", "diffusion_eval_draws": 4}),
]


def _docstring_checkpoint(where):
    """The docstring rows and a random-initialized model of the tiny model's class at their BPE vocabulary."""
    from unsloth_diffusion_norm.tools import docstring_data

    data, tokenizer_folder, _ = docstring_data.write(os.path.join(where, "data"))
    model = os.path.join(where, "model")
    return data, docstring_data.checkpoint(model, tokenizer_folder, max_position_embeddings=CURVE["max_length"])


def curve():
    from datasets import load_dataset
    from unsloth.models.diffusion_trainer import DiffusionConfig, DiffusionTrainer

    where = tempfile.mkdtemp(prefix="udn-eval-noise-")
    data, checkpoint = _docstring_checkpoint(where)
    rows = load_dataset("json", data_files=data)["train"].shuffle(seed=SEED)
    train_rows = rows.select(range(CURVE["train_rows"]))
    eval_rows = rows.select(range(CURVE["train_rows"], CURVE["train_rows"] + CURVE["eval_rows"]))
    found = {}
    for label, flags in ARMS:
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            model, tokenizer = fixtures.load_model(checkpoint=checkpoint)
            args = DiffusionConfig(
                output_dir=os.path.join(where, "out"),
                per_device_train_batch_size=CURVE["batch"],
                per_device_eval_batch_size=CURVE["batch"],
                gradient_accumulation_steps=CURVE["ga"],
                max_steps=CURVE["steps"],
                learning_rate=3e-3,
                lr_scheduler_type="cosine",
                warmup_steps=4,
                max_grad_norm=1.0,
                max_length=CURVE["max_length"],
                eval_strategy="steps",
                eval_steps=CURVE["eval_every"],
                logging_steps=CURVE["eval_every"],
                save_strategy="no",
                report_to=[],
                disable_tqdm=True,
                seed=SEED,
                bf16=False,
                fp16=False,
                use_cpu=True,
                **flags,
            )
            trainer = DiffusionTrainer(
                model=model, args=args, train_dataset=train_rows, eval_dataset=eval_rows, processing_class=tokenizer
            )
            trainer.train()
        history = trainer.state.log_history
        found[label] = {
            "steps": [e["step"] for e in history if "eval_loss" in e],
            "eval_loss": [e["eval_loss"] for e in history if "eval_loss" in e],
            "seconds": round(time.perf_counter() - started, 1),
            "eval_seconds": round(sum(e["eval_runtime"] for e in history if "eval_runtime" in e), 2),
        }
        print(f"  {label}: {found[label]['seconds']} s, evaluating {found[label]['eval_seconds']} s", file=sys.stderr)
    return found


def draw(found, path):
    from unsloth_diffusion_norm.tools.console import NO_PLOT, pyplot

    plt = pyplot()
    if plt is None:
        print(NO_PLOT, file=sys.stderr)
        return
    figure, axes = plt.subplots(figsize=(7, 4))
    for label, arm in found.items():
        axes.plot(arm["steps"], arm["eval_loss"], marker="o", label=label)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("eval loss")
    axes.set_title("Evaluation on 32 held-out docstring rows, diffusion_eval_noise")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--curve", action="store_true", help="also the eval-loss curve on the docstring data set")
    parser.add_argument("--plot", help="draw the curve into this PNG (with --curve)")
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args(argv)
    status = unsloth_diffusion_norm.apply()
    print(f"Unsloth {status.unsloth_version}, plugin mode {status.mode}\n")
    rows = defects()
    shown = {"defects": render(rows)}
    print(shown["defects"])
    report = {"unsloth": status.unsloth_version, "defects": rows}
    if args.curve:
        report["curve"] = found = curve()
        shown["curve"] = "\n".join(
            tables.markdown(
                ["diffusion_eval_noise", *(f"step {s}" for s in next(iter(found.values()))["steps"])],
                [[label, *(f"{v:.3f}" for v in arm["eval_loss"])] for label, arm in found.items()],
            )
        )
        shown["seconds"] = "\n".join(
            tables.markdown(
                ["diffusion_eval_noise", "seconds evaluating (all evaluations)", "whole run"],
                [[label, f"{arm['eval_seconds']:.2f}", f"{arm['seconds']:.1f}"] for label, arm in found.items()],
            )
        )
        print("\n" + shown["curve"] + "\n\n" + shown["seconds"])
        if args.plot:
            draw(found, args.plot)
    command = " ".join(["python scripts/eval_noise.py", *(argv if argv is not None else sys.argv[1:])])
    records.write("eval-noise", command, {**report, "mode": status.mode}, tables=shown)
    print("\nrecords/eval-noise.json written")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

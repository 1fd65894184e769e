"""Does the fix change the model? Part 1, accumulation invariance: python scripts/convergence.py [--quick]

Batch B·k at GA 1 is the reference; batch B at GA k must train the same model. The layout makes both see the
same tokens and the same masks: per-sample noise (each example keyed by its place in the data order, which does
not depend on how a window is cut), every row padded to max_length (the EOS tail does not depend on the batch),
the same seeded order of examples. Then window normalization gives the reference's gradient up to float
round-off at every step, and per-micro-batch normalization does not. Each arm is the real DiffusionTrainer and
Trainer.train() with what a user runs: AdamW, warm-up then cosine, clipping at 1.0, fp32 on CPU. The model is a
random-initialized model of the tiny model's class at the docstring tokenizer's vocabulary, the data the
docstring data set (built here, nothing downloaded), split into train and held-out rows by a fixed seed.
"""

import contextlib
import dataclasses
import io
import os
import time

from . import console

# The arms of Part 1, by the flag they set: the plugin's window normalization and the per-micro-batch one.
WINDOW, MICROBATCH = "window", "microbatch"
FLOOR = "floor"  # the window at another cut (batch B/2, GA 2k): how far float round-off alone moves a run


@dataclasses.dataclass(frozen=True)
class Part1:
    """Part 1's settings; the defaults are the documented run, QUICK the test's."""

    ks: tuple = (2, 4, 8)
    batch: int = 2  # B: rows per micro-batch of the accumulated arms
    steps: int = 64
    train_rows: int = 1024
    held_rows: int = 64
    max_length: int = 64
    hidden: int = 64
    layers: int = 2
    learning_rate: float = 3e-3
    warmup_steps: int = 2
    eval_draws: int = 4
    seed: int = 0
    floor: bool = True  # also the window at batch B/2, GA 2k (B even)


QUICK = Part1(ks=(2, 4), steps=4, train_rows=64, held_rows=8, max_length=32, hidden=32, eval_draws=1, floor=False)


@dataclasses.dataclass
class Arm:
    """One run: its layout, its parameters after every step (flattened), its held-out loss."""

    label: str
    batch: int
    ga: int
    normalization: str
    params: list = None
    held_out: float = None
    seconds: float = None


def build_data(where, settings):
    """(train rows, held-out rows, checkpoint directory): the docstring set split by a fixed seed,
    and a random-initialized model of the tiny model's class at its tokenizer's vocabulary."""
    from datasets import load_dataset

    from . import docstring_data

    data, tokenizer_folder, _ = docstring_data.write(os.path.join(where, "data"))
    rows = load_dataset("json", data_files=data)["train"].shuffle(seed=settings.seed)
    held = rows.select(range(settings.held_rows))
    train = rows.select(range(settings.held_rows, settings.held_rows + settings.train_rows))
    checkpoint = docstring_data.checkpoint(
        os.path.join(where, "model"),
        tokenizer_folder,
        seed=settings.seed,
        hidden_size=settings.hidden,
        intermediate_size=2 * settings.hidden,
        num_hidden_layers=settings.layers,
        max_position_embeddings=settings.max_length,
    )
    return train, held, checkpoint


def _recorder(arm):
    from transformers import TrainerCallback

    class Parameters(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            arm.params = [_flat(model)]

        def on_step_end(self, args, state, control, model=None, **kw):
            arm.params.append(_flat(model))

    return Parameters()


def _flat(model):
    import torch

    return torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters() if p.requires_grad])


def train(arm, data, settings, workdir, noise="per_sample", evaluate=True):
    """One arm through the real DiffusionTrainer; fills arm.params, arm.held_out (`evaluate`) and arm.seconds."""
    train_rows, held, checkpoint = data
    started = time.perf_counter()
    _train(arm, train_rows, held, checkpoint, settings, workdir, noise, evaluate)
    arm.seconds = round(time.perf_counter() - started, 1)
    return arm


def _train(arm, train_rows, held, checkpoint, settings, workdir, noise, evaluate):
    from unsloth.models.diffusion_trainer import DiffusionConfig, DiffusionTrainer

    from ..proof.fixtures import load_model

    flags = {} if arm.normalization == WINDOW else {"diffusion_loss_normalization": arm.normalization}
    if noise is not None:
        flags["diffusion_noise"] = noise
    if evaluate:  # held-out loss under evaluation noise that holds still
        flags.update(diffusion_eval_noise="fixed", diffusion_eval_draws=settings.eval_draws)
    with contextlib.redirect_stdout(io.StringIO()):
        model, tokenizer = load_model(checkpoint=checkpoint)
        args = DiffusionConfig(
            output_dir=os.path.join(workdir, "out"),
            per_device_train_batch_size=arm.batch,
            per_device_eval_batch_size=8,
            gradient_accumulation_steps=arm.ga,
            max_steps=settings.steps,
            optim="adamw_torch",
            learning_rate=settings.learning_rate,
            lr_scheduler_type="cosine",
            warmup_steps=settings.warmup_steps,
            max_grad_norm=1.0,
            max_length=settings.max_length,
            pad_to_multiple_of=settings.max_length,  # every row as long: the EOS tail does not depend on the batch
            seed=settings.seed,
            bf16=False,
            fp16=False,
            use_cpu=True,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            **flags,
        )
        trainer = DiffusionTrainer(
            model=model, args=args, train_dataset=train_rows, eval_dataset=held, processing_class=tokenizer
        )
        trainer.add_callback(_recorder(arm))
        trainer.train()
        arm.held_out = trainer.evaluate()["eval_loss"] if evaluate else None


def distances(arm, reference):
    """Per step: ||θ_arm − θ_ref|| / ||θ_ref − θ_0||, the distance to the reference relative to how far the
    reference has moved; None where it has not moved yet (the warm-up's first step has learning rate 0)."""
    origin = reference.params[0]
    found = []
    for a, r in zip(arm.params[1:], reference.params[1:]):
        moved = (r - origin).norm().item()
        found.append((a - r).norm().item() / moved if moved > 0 else None)
    return found


def _worst(values):
    return max(v for v in values if v is not None)


def part1(settings, workdir, progress=None):
    """{k: {"reference": Arm, "window": Arm, "microbatch": Arm}} and the release check (microbatch flag vs the
    unpatched release, global noise: their largest parameter difference)."""
    data = build_data(os.path.join(workdir, "data"), settings)
    floor = settings.floor and settings.batch % 2 == 0
    found = {}
    for k in settings.ks:
        arms = {
            "reference": Arm(f"batch {settings.batch * k}, GA 1", settings.batch * k, 1, WINDOW),
            # Another cut of the same window, batch B/2 at GA 2k: the same arithmetic, other summation orders.
            FLOOR: Arm(f"batch {settings.batch // 2}, GA {2 * k}, window", settings.batch // 2, 2 * k, WINDOW),
            WINDOW: Arm(f"batch {settings.batch}, GA {k}, window (plugin)", settings.batch, k, WINDOW),
            MICROBATCH: Arm(f"batch {settings.batch}, GA {k}, per-micro-batch", settings.batch, k, MICROBATCH),
        }
        if not floor:
            del arms[FLOOR]
        for name, arm in arms.items():
            train(arm, data, settings, workdir)
            if progress is not None:
                progress(f"k={k} {name}: {arm.seconds} s")
        found[k] = arms
    return found, release_check(data, settings, workdir)


def release_check(data, settings, workdir):
    """The 'microbatch' flag against the unpatched release itself (global noise: the release has no per-sample
    noise), batch B at GA 2 for the run's steps: their largest parameter difference (0: the same run)."""
    import unsloth_diffusion_norm

    from ..registry import PATCHED

    if unsloth_diffusion_norm.status().mode != PATCHED:
        return None  # a natively fixed release has no per-micro-batch path of its own to compare with
    flagged = train(Arm("flag", settings.batch, 2, MICROBATCH), data, settings, workdir, noise=None, evaluate=False)
    with unsloth_diffusion_norm.unpatched():
        own = train(Arm("unpatched", settings.batch, 2, WINDOW), data, settings, workdir, noise=None, evaluate=False)
    return max((a - b).abs().max().item() for a, b in zip(flagged.params, own.params))


def report(found, check):
    """The JSON of Part 1: per k, the distance to the reference after every step, and the held-out losses."""
    rows = {}
    for k, arms in found.items():
        reference = arms["reference"]
        rows[k] = {
            "reference_held_out": reference.held_out,
            **{
                name: {
                    "distance_per_step": distances(arms[name], reference),
                    "held_out": arms[name].held_out,
                    "seconds": arms[name].seconds,
                }
                for name in (WINDOW, MICROBATCH, FLOOR)
                if name in arms
            },
        }
    return {"part1": rows, "microbatch_flag_vs_unpatched": check}


def render(result):
    """Part 1's table: per k, the largest and the last relative distance to the reference of the window arm,
    of the per-micro-batch arm and of the round-off floor (the window at batch B/2, GA 2k), and the held-out losses."""
    from ..proof import tables

    header = ["k", "window: max / last", "per-micro-batch: max / last", "window at B/2, GA 2k: max / last"]
    header += ["held-out: reference", "window", "per-micro-batch"]
    body = []
    for k, row in result["part1"].items():
        cells = [str(k)]
        for name in (WINDOW, MICROBATCH, FLOOR):
            found = row[name]["distance_per_step"] if name in row else None
            cells.append(f"{_worst(found):.2e} / {found[-1]:.2e}" if found else "—")
        cells += [
            f"{row['reference_held_out']:.4f}",
            f"{row[WINDOW]['held_out']:.4f}",
            f"{row[MICROBATCH]['held_out']:.4f}",
        ]
        body.append(cells)
    lines = tables.markdown(header, body)
    check = result["microbatch_flag_vs_unpatched"]
    if check is not None:
        lines += ["", f"'microbatch' flag vs the unpatched release (global noise, GA 2): max |Δθ| = {check:.3g}"]
    return "\n".join(lines)


def draw(result, path):
    plt = console.pyplot()
    if plt is None:
        raise console.Failure(console.NO_PLOT)
    figure, axes = plt.subplots(figsize=(7, 4))
    for k, row in result["part1"].items():
        for name, style in ((WINDOW, "-"), (MICROBATCH, "--"), (FLOOR, ":")):
            if name not in row:
                continue
            steps = [(i + 1, v) for i, v in enumerate(row[name]["distance_per_step"]) if v is not None]
            axes.plot([s for s, _ in steps], [v for _, v in steps], style, label=f"k={k}, {name}")
    axes.set_yscale("log")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("‖θ − θ_ref‖ / ‖θ_ref − θ₀‖")
    axes.set_title("Distance to batch B·k at GA 1, batch B at GA k")
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def within(result, bound=1e-5):
    """Part 1's verdict: every window arm within `bound` of its reference at every step, and every
    per-micro-batch arm beyond it somewhere."""
    rows = result["part1"].values()
    return all(_worst(r[WINDOW]["distance_per_step"]) <= bound for r in rows) and all(
        _worst(r[MICROBATCH]["distance_per_step"]) > bound for r in rows
    )


def main(argv=None):
    """The command line (scripts/convergence.py): Part 1's table on stdout, progress on stderr; --json FILE or
    --json alone (JSON on stdout instead of the table), --plot FILE. Exit 0 when Part 1 holds, 1 when not."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="the test's settings: k = 2 and 4, 4 steps; exit 1 unless Part 1 holds"
    )
    parser.add_argument(
        "--json", nargs="?", const="-", type=console.writable, help="write the numbers to FILE (alone: on stdout)"
    )
    parser.add_argument(
        "--plot", type=console.writable, help="draw the distance to the reference against step into this PNG"
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Part1()
    try:
        if args.plot and not console.can_plot():
            raise console.Failure(console.NO_PLOT)
        started = time.perf_counter()
        with console.scratch_space() as workdir, console.Progress("convergence") as progress:
            console.import_unsloth()
            console.refuse_unsupported()
            from .. import activation

            state = activation.status()
            progress.say(f"Unsloth {state.unsloth_version} ({state.mode}): building the data and the model")
            found, check = part1(settings, workdir, progress.say)
            result = report(found, check)
        result["settings"] = dataclasses.asdict(settings)
        result["unsloth"], result["seconds"] = state.unsloth_version, round(time.perf_counter() - started, 1)
        result["holds"] = within(result)
        if args.json == "-":
            console.print_json(result)
        else:
            print(f"Unsloth {state.unsloth_version} ({state.mode}); {describe(settings)}; {result['seconds']} s\n")
            print(render(result))
            if args.json:
                console.write_json(result, args.json)
        if args.plot:
            draw(result, args.plot)
    except console.Failure as failure:
        print(f"convergence: {failure}", file=sys.stderr)
        return failure.code
    except ValueError as error:  # a run the installed plugin refuses (switched off: the flags cannot be honoured)
        print(f"convergence: {error}", file=sys.stderr)
        return console.FAILED
    return 0 if result["holds"] or not args.quick else 1  # the default run reports what comes out


def describe(settings):
    return (
        f"Part 1: batch {settings.batch}·k at GA 1 against batch {settings.batch} at GA k, k in "
        f"{', '.join(map(str, settings.ks))}, {settings.steps} AdamW steps (lr {settings.learning_rate:g}, warm-up "
        f"{settings.warmup_steps} then cosine, clipping 1.0), per-sample noise, rows padded to {settings.max_length}, "
        f"seed {settings.seed}; held-out: {settings.held_rows} rows, fixed eval noise, {settings.eval_draws} "
        f"draw{'s' if settings.eval_draws > 1 else ''} each"
    )

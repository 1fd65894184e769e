"""One arm of the study: the docstring data set split by a fixed seed, a random-initialized model of the tiny
model's class, and a real DiffusionTrainer / Trainer.train() run with what a user runs (AdamW, warm-up then
cosine, clipping at 1.0, fp32 on CPU), recorded after every optimizer step."""

import contextlib
import dataclasses
import io
import os
import time

# The arms, by the flag they set: the plugin's window normalization and the per-micro-batch one.
WINDOW, MICROBATCH = "window", "microbatch"
SPLIT_SEED = 0  # the train / held-out split: the same rows for every seed and every arm


@dataclasses.dataclass(frozen=True)
class Training:
    """What every arm of a part shares: the data, the model's shape, the optimizer and schedule, the held-out
    evaluation, where it runs. Part 1 and Part 2 set their own defaults."""

    steps: int = 64
    train_rows: int = 1024
    held_rows: int = 64
    max_length: int = 64
    hidden: int = 64
    layers: int = 2
    intermediate: int = None  # None: 2 · hidden
    heads: int = 4
    learning_rate: float = 3e-3
    warmup_steps: int = 2
    eval_draws: int = 4  # K keyed draws per held-out row
    eval_batch: int = 8
    padded: bool = False  # every row padded to max_length
    pad_multiple: int = None  # else each batch padded to a multiple of this (its rows' EOS tails, maskable)
    schedule: str = "cosine"  # the learning-rate schedule after warm-up
    device: str = "cpu"
    bf16: bool = False  # bf16 autocast (the GPU preset); fp32 otherwise


@dataclasses.dataclass
class Arm:
    """One run: its layout and what it recorded (parameters after every step, flattened; the trainer's log;
    the held-out measurements by step; its held-out loss under the trainer's fixed evaluation noise)."""

    label: str
    batch: int
    ga: int
    normalization: str
    seed: int = 0
    flags: dict = None  # further DiffusionConfig fields of the arm (the lower-variance noise arms)
    params: list = None
    log: list = None
    measured: list = None  # [(step, {metric: value})] from a HeldOut (Part 2)
    held_out: float = None
    seconds: float = None


def split(where, settings):
    """(train rows, held-out rows, tokenizer folder): the docstring set, shuffled by SPLIT_SEED; the first
    held_rows rows held out, the next train_rows for training."""
    from datasets import load_dataset

    from .. import docstring_data

    data, tokenizer_folder, _ = docstring_data.write(os.path.join(where, "data"))
    rows = load_dataset("json", data_files=data)["train"].shuffle(seed=SPLIT_SEED)
    held = rows.select(range(settings.held_rows))
    train = rows.select(range(settings.held_rows, settings.held_rows + settings.train_rows))
    return train, held, tokenizer_folder


def model_for(where, tokenizer_folder, settings, seed):
    """The checkpoint of `seed`'s initialization (every arm of that seed starts from it)."""
    from .. import docstring_data

    return docstring_data.checkpoint(
        os.path.join(where, f"model-{seed}"), tokenizer_folder, seed=seed, **shape(settings)
    )


def shape(settings):
    """The tiny model's config fields for a Training's model."""
    return {
        "hidden_size": settings.hidden,
        "intermediate_size": settings.intermediate or 2 * settings.hidden,
        "num_hidden_layers": settings.layers,
        "num_attention_heads": settings.heads,
        "max_position_embeddings": settings.max_length,
    }


def parameter_count(checkpoint):
    import math

    from safetensors import safe_open

    with safe_open(os.path.join(checkpoint, "model.safetensors"), "pt") as weights:
        return sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())


def _flat(model):
    import torch

    return torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters() if p.requires_grad])


def _recorder(arm, record_params, held_out, every):
    from transformers import TrainerCallback

    class Record(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            arm.params = [_flat(model)] if record_params else None
            arm.measured = [(0, held_out.measure(model))] if held_out is not None else None

        def on_step_end(self, args, state, control, model=None, **kw):
            if record_params:
                arm.params.append(_flat(model))
            if held_out is not None and (state.global_step % every == 0 or state.global_step == state.max_steps):
                arm.measured.append((state.global_step, held_out.measure(model)))

    return Record()


def train(
    arm,
    train_rows,
    held,
    checkpoint,
    settings,
    workdir,
    noise="per_sample",
    evaluate=True,
    record_params=True,
    held_out=None,
    every=1,
):
    """One arm through the real DiffusionTrainer; fills arm.params (`record_params`), arm.log, arm.measured
    (`held_out`: a HeldOut measured every `every` steps), arm.held_out (`evaluate`: the trainer's evaluate()
    under fixed evaluation noise) and arm.seconds; `settings`: a Training."""
    started = time.perf_counter()
    record = (record_params, held_out, every)
    _train(arm, train_rows, held, checkpoint, settings, workdir, noise, evaluate, record)
    arm.seconds = round(time.perf_counter() - started, 1)
    return arm


def _train(arm, train_rows, held, checkpoint, settings, workdir, noise, evaluate, record):
    from unsloth.models.diffusion_trainer import DiffusionConfig, DiffusionTrainer

    from ...proof.fixtures import load_model

    flags = {} if arm.normalization == WINDOW else {"diffusion_loss_normalization": arm.normalization}
    if noise is not None:
        flags["diffusion_noise"] = noise
    flags.update(arm.flags or {})  # an arm's own fields, its noise included, over the part's
    if evaluate:  # held-out loss under evaluation noise that holds still
        flags.update(diffusion_eval_noise="fixed", diffusion_eval_draws=settings.eval_draws)
    # Every row as long (Part 1): the EOS tail, which is maskable, does not depend on which rows share a batch.
    multiple = settings.max_length if settings.padded else settings.pad_multiple
    padding = {"pad_to_multiple_of": multiple} if multiple else {}
    with contextlib.redirect_stdout(io.StringIO()):
        model, tokenizer = load_model(checkpoint=checkpoint, device=settings.device)
        args = DiffusionConfig(
            output_dir=os.path.join(workdir, "out"),
            per_device_train_batch_size=arm.batch,
            per_device_eval_batch_size=settings.eval_batch,
            gradient_accumulation_steps=arm.ga,
            max_steps=settings.steps,
            optim="adamw_torch",
            learning_rate=settings.learning_rate,
            lr_scheduler_type=settings.schedule,
            warmup_steps=settings.warmup_steps,
            max_grad_norm=1.0,
            max_length=settings.max_length,
            seed=arm.seed,
            bf16=settings.bf16,
            fp16=False,
            use_cpu=settings.device == "cpu",
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            **padding,
            **flags,
        )
        trainer = DiffusionTrainer(
            model=model, args=args, train_dataset=train_rows, eval_dataset=held, processing_class=tokenizer
        )
        record_params, held_out, every = record
        if held_out is not None:
            held_out = held_out.bind(trainer)
        trainer.add_callback(_recorder(arm, record_params, held_out, every))
        trainer.train()
        arm.log = [entry for entry in trainer.state.log_history if "loss" in entry]
        arm.held_out = trainer.evaluate()["eval_loss"] if evaluate else None

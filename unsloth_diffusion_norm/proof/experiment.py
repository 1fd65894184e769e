"""Run the real DiffusionTrainer on the tiny model and record what each window did (`judging` then holds
each window against the oracle).

Shared by `reproduce`, the tests and the scripts. Nothing here imitates Unsloth or Trainer: the run is
`Trainer.train()`, and a callback plus a pass-through view of `get_batch_samples` record the window's
clean batches, the RNG state its noise came from, the weights it started at, its gradients and the
weights after the optimizer step. The oracle replays the masks from that RNG state on its own.
"""

import contextlib
import copy
import functools
import os
from dataclasses import dataclass, field, fields

import torch

from . import fixtures, oracle
from .fixtures import LEARNING_RATE, load_model, loaded_first


def clean_inputs(batch):
    """A detached CPU copy of what the oracle needs from a micro-batch, whatever else it carries
    (with diffusion_noise="per_sample", the generator seed of each row as "keys")."""
    from ..batch_keys import ROWS

    keep = ("input_ids", "attention_mask", "labels")
    clean = {k: batch[k].detach().cpu().clone() for k in keep if k in batch}
    rows = batch.get(ROWS)
    if rows is not None:
        clean["keys"] = list(rows.keys)
        if rows.strata is not None:  # diffusion_t_sampler="stratified": each row's (stratum, strata)
            clean["strata"] = list(rows.strata)
    return clean


@dataclass
class WindowRecord:
    batches: list = None
    rng_state: torch.Tensor = None
    state_before: dict = None
    grads: dict = None
    params_after: dict = None
    logged_loss: float = None
    logs: dict = None  # what the Trainer logged at this window's step (logging_steps=1)


@dataclass
class Run:
    windows: list = field(default_factory=list)
    eval_loss: float = None
    trainer: object = None
    # A separately loaded copy of the model for the oracle: the trained model carries instance-level
    # forwards installed by the training stack, which a deepcopy would keep bound to the live model.
    reference_model: torch.nn.Module = None


@dataclass(frozen=True)
class Setup:
    """An experiment's settings, as `build` takes them (`Setup.of`: from the keywords `train` takes)."""

    # The run's shape: micro-batches per optimizer step, rows per micro-batch, the Trainer's seed.
    gradient_accumulation_steps: int = 2
    batch_size: int = 1
    seed: int = 0
    # The model: a LoRA layout (fixtures.load_model), another model directory (`checkpoint`), and where it
    # trains ("cuda" for the cuda test tier).
    lora: str = None
    checkpoint: str = None
    device: str = "cpu"
    # The data besides the training examples: examples to evaluate on; `streaming`: the training data as a
    # length-less IterableDataset (then give max_steps).
    eval_examples: list = None
    streaming: bool = False
    # What the DiffusionTrainer is given besides its arguments (None: its own).
    diffusion_profile: object = None
    compute_loss_func: object = None
    # DiffusionConfig's own settings, overriding build's (e.g. save_strategy / save_steps / output_dir for a
    # resume, max_steps, bf16).
    config: dict = field(default_factory=dict)

    @classmethod
    def of(cls, **settings):
        """The Setup of keywords: each field by its name, every other keyword a DiffusionConfig setting."""
        own = {f.name for f in fields(cls)} - {"config"}
        return cls(
            **{k: v for k, v in settings.items() if k in own},
            config={k: v for k, v in settings.items() if k not in own},
        )


def whole(tensor):
    """A detached, unsharded copy: FSDP2 holds parameters and gradients as DTensor shards."""
    tensor = tensor.detach()
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).clone()


def _recorder(run, gathered):
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kw):
            record = run.windows[-1]
            if record.rng_state is None:  # noise not drawn yet: it will be, from here (on the run's device)
                record.rng_state = oracle.rng_state(args.device)
            with gathered(model):
                record.state_before = {n: whole(p) for n, p in model.state_dict().items()}

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            if run.windows[-1].grads is not None:  # recorded by the engine's own step (DeepSpeed)
                return
            run.windows[-1].grads = {
                n: whole(p.grad) if p.grad is not None else torch.zeros_like(whole(p))
                for n, p in model.named_parameters()
                if p.requires_grad
            }

        def on_step_end(self, args, state, control, model=None, **kw):
            with gathered(model):
                run.windows[-1].params_after = {n: whole(p) for n, p in model.named_parameters() if p.requires_grad}

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs and run.windows:
                run.windows[-1].logged_loss = logs["loss"]
                run.windows[-1].logs = dict(logs)

    return Recorder()


def train(examples, before_train=None, resume_from_checkpoint=None, **settings):
    """One run of Trainer.train() (one epoch unless `settings` say otherwise) with plain SGD over
    `examples`, in order; returns the Run. `before_train(trainer)` may attach more instruments; the
    other settings go to `build` (`record`, `gathered`, `record_with` as they are, the rest as a Setup)."""
    run = _build(examples, **settings)
    if before_train is not None:
        before_train(run.trainer)
    run.trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return run


def _build(examples, record=True, gathered=contextlib.nullcontext, record_with=None, **settings):
    """`build` from keywords: the recording ones as they are, every other one into `Setup.of`."""
    return build(examples, Setup.of(**settings), record=record, gathered=gathered, record_with=record_with)


def _own_precision(settings):
    """transformers 4.56's arguments write their precision to ACCELERATE_MIXED_PRECISION and a later fp32
    run reads it back (measured: a bf16 run's autocast carried into the next fp32 run of the process); a
    run here asks for its own. transformers 5.x reads the variable without writing it."""
    if not (settings.get("bf16") or settings.get("fp16")):
        os.environ["ACCELERATE_MIXED_PRECISION"] = "no"


def _built_as_asked(args, build):
    """`build()`'s trainer, at the precision the run asked for. Unsloth's GPU path (the trainer rewrite in its
    rl.py, every supported release) trains an fp32 model that asks for neither bf16 nor fp16 under bf16
    autocast, wherever the GPU has bf16 ("Mixed precision training"). Measured on an H200: the fp32 oracle
    cases then missed by 200-500 fp32 tolerances. The same code leaves autocast off for a model it was told
    is already bf16 (UNSLOTH_MIXED_PRECISION=bfloat16): an fp32 run is built under that branch, and the bf16
    evaluation that branch also sets is put back, so the run trains and evaluates in fp32; a trainer that still
    autocasts is refused. On a CPU, and for a run that asks for bf16 or fp16, nothing changes."""
    if args.bf16 or args.fp16:
        return build()
    saved = os.environ.get("UNSLOTH_MIXED_PRECISION")
    os.environ["UNSLOTH_MIXED_PRECISION"] = "bfloat16"
    try:
        trainer = build()
    finally:
        if saved is None:
            os.environ.pop("UNSLOTH_MIXED_PRECISION", None)
        else:
            os.environ["UNSLOTH_MIXED_PRECISION"] = saved
    args.bf16_full_eval = args.fp16_full_eval = False
    if trainer.accelerator.mixed_precision != "no":
        raise RuntimeError(
            f"this run asked for fp32, but the trainer was built with {trainer.accelerator.mixed_precision} "
            "autocast: the proof cannot judge it at the fp32 tolerance"
        )
    return trainer


def build(examples, setup=None, record=True, gathered=contextlib.nullcontext, record_with=None):
    """A DiffusionTrainer over `examples` (kept in the order given), ready to train, with its recording
    instruments attached; returns the Run. `setup`: the experiment's Setup (None: the defaults);
    `record=False`: no recording and no oracle copy (benchmarks). `gathered(model)`: a context in which
    the model's parameters are whole (DeepSpeed ZeRO-3 partitions them); `record_with(trainer, run)`:
    recording an engine needs besides the callbacks (DeepSpeed's gradients live inside its step)."""
    setup = setup or Setup()
    model, tokenizer, reference_model = _models(setup, record)
    trainer = _trainer(examples, setup, model, tokenizer)
    if not record:
        return Run(trainer=trainer)
    run = Run(trainer=trainer, reference_model=reference_model)
    _record_fetched_windows(trainer, run)
    trainer.add_callback(_recorder(run, gathered))
    if record_with is not None:
        record_with(trainer, run)
    return run


def _models(setup, record):
    """(model, tokenizer, the oracle's copy of the model or None without recording)."""
    with loaded_first():
        model, tokenizer = load_model(lora=setup.lora, checkpoint=setup.checkpoint, device=setup.device)
        return model, tokenizer, _reference(setup) if record else None


def _reference(setup):
    """The oracle's copy of the model: loaded apart (the trained model gets instance-level forwards from the
    stack), once per process for each checkpoint (as its config reads), layout and device. It is never trained:
    every judgement first loads the weights it judges into it (`load_state_dict`), and the oracle takes its
    gradients with `torch.autograd.grad`, which leaves no `.grad` behind. (A load costs as much as the run it
    judges: Unsloth's remote-code loader walks every imported module several times.)"""
    checkpoint = setup.checkpoint or fixtures.tiny_checkpoint()
    with open(os.path.join(checkpoint, "config.json"), encoding="utf-8") as f:
        key = (checkpoint, f.read(), setup.lora, setup.device)
    if key not in _REFERENCES:
        _REFERENCES[key] = load_model(lora=setup.lora, checkpoint=checkpoint, device=setup.device)[0]
    return _REFERENCES[key]


_REFERENCES = {}


def _arguments(setup):
    """The DiffusionConfig of a run: plain SGD at a constant learning rate, no clipping, fp32, logging every
    step, saving nothing; `setup.config` overrides any of it."""
    from unsloth.models.diffusion_trainer import DiffusionConfig

    config = setup.config
    settings = dict(
        output_dir=config.get("output_dir") or fixtures.scratch("udn-run-"),  # made only if config names none
        per_device_train_batch_size=setup.batch_size,
        per_device_eval_batch_size=setup.batch_size,
        gradient_accumulation_steps=setup.gradient_accumulation_steps,
        num_train_epochs=1,
        learning_rate=LEARNING_RATE,
        optim="sgd",
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=0.0,
        seed=setup.seed,
        bf16=False,
        fp16=False,
        max_length=None,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=torch.device(setup.device).type == "cpu",
        completion_only_loss=True,
    )
    settings = {**settings, **config}
    _own_precision(settings)
    return DiffusionConfig(**settings)


def _trainer(examples, setup, model, tokenizer):
    """The DiffusionTrainer of a run, reading `examples` in the order given."""
    from datasets import Dataset
    from unsloth.models.diffusion_trainer import DiffusionTrainer

    args = _arguments(setup)
    train_dataset = Dataset.from_list([e.row() for e in examples])
    if setup.streaming:
        train_dataset = train_dataset.to_iterable_dataset()  # read in order, no length
    extra = {} if setup.compute_loss_func is None else {"compute_loss_func": setup.compute_loss_func}
    eval_examples = setup.eval_examples
    trainer = _built_as_asked(
        args,
        lambda: DiffusionTrainer(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=None if eval_examples is None else Dataset.from_list([e.row() for e in eval_examples]),
            processing_class=tokenizer,
            diffusion_profile=setup.diffusion_profile,
            **extra,
        ),
    )
    # Keep the data in the order given, so a case can place each micro-batch where it wants it.
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(trainer.train_dataset)
    return trainer


def _record_fetched_windows(trainer, run):
    """A window record per fetched window (its clean batches), through a pass-through view of
    `get_batch_samples`; where the release draws the noise while fetching, the RNG state it starts from."""
    fetch = trainer.get_batch_samples
    drawn_while_fetching = []  # RNG state before a natively fixed release's first prepare_batch

    def get_batch_samples(*pos, **kw):
        drawn_while_fetching.clear()
        batches, count = fetch(*pos, **kw)
        record = WindowRecord(batches=[clean_inputs(b) for b in batches])
        record.rng_state = drawn_while_fetching[0] if drawn_while_fetching else None
        if batches:  # the streaming data's end: Trainer asks once more and gets nothing
            run.windows.append(record)
        return batches, count

    trainer.get_batch_samples = get_batch_samples
    profile = trainer.diffusion_profile
    if hasattr(profile, "prepare_batch"):
        # Unsloth 2026.10.7+ draws a window's noise while fetching it (before on_step_begin): note the
        # RNG state its draws start from, through a pass-through view on this trainer's own copy.
        prepare = profile.prepare_batch
        trainer.diffusion_profile = copy.copy(profile)

        def prepare_batch(*pos, **kw):
            if not drawn_while_fetching:
                drawn_while_fetching.append(oracle.rng_state(trainer.args.device))
            return prepare(*pos, **kw)

        object.__setattr__(trainer.diffusion_profile, "prepare_batch", prepare_batch)


def evaluate(trainer, seed=1234, metrics=None):
    """trainer.evaluate() from a fixed RNG state (`seed`; None: from where the run's RNG is); returns (eval_loss, [(rng state, clean inputs)] of each
    evaluation step, seen through a pass-through view of prediction_step). `metrics`: a dict that gets all of
    evaluate()'s metrics."""
    seen = []
    own = trainer.__dict__.get("prediction_step")  # a trainer's own patch (2026.10.7+), kept under the view
    predict = trainer.prediction_step

    def prediction_step(model, inputs, *pos, **kw):
        seen.append((oracle.rng_state(trainer.args.device), clean_inputs(inputs)))
        return predict(model, inputs, *pos, **kw)

    trainer.prediction_step = prediction_step
    try:
        if seed is not None:
            torch.manual_seed(seed)
        found = trainer.evaluate()
        loss = found["eval_loss"]
        if metrics is not None:
            metrics.update(found)
    finally:
        if own is None:
            del trainer.prediction_step
        else:
            trainer.prediction_step = own
    return loss, seen


def train_per_micro_batch(examples, **kwargs):
    """The same run with the per-micro-batch normalization of Unsloth 2026.10.4-.6 - the control that
    must miss the oracle."""
    context, kwargs = per_micro_batch(kwargs)
    with context:
        return train(examples, **kwargs)


def per_micro_batch(settings):
    """(context, settings) for the per-micro-batch control of a run: the unpatched release where the
    plugin patches; the 'microbatch' flag where the release is natively fixed (there is no unfixed path
    to unpatch to) or where the run asks for a flag only the plugin provides (per-sample noise)."""
    import contextlib

    from ..activation import status, unpatched
    from ..registry import NATIVE

    if status().mode == NATIVE or settings.get("diffusion_noise") is not None:
        return contextlib.nullcontext(), {**settings, "diffusion_loss_normalization": "microbatch"}
    return unpatched(), settings


def divergence(a, b):
    """Largest |parameter difference| over every window of two runs of the same data (0.0: bitwise the same
    run); inf when they differ in their windows or in a logged loss."""
    if len(a.windows) != len(b.windows) or any(x.logged_loss != y.logged_loss for x, y in zip(a.windows, b.windows)):
        return float("inf")
    return max(
        (
            oracle.max_error(x.params_after[n], y.params_after[n])
            for x, y in zip(a.windows, b.windows)
            for n in x.params_after
        ),
        default=0.0,
    )


def final_difference(a, b):
    """Largest |parameter difference| after the last step of two runs (0.0: bitwise the same weights)."""
    last_a, last_b = a.windows[-1].params_after, b.windows[-1].params_after
    return max(oracle.max_error(last_a[name], last_b[name]) for name in last_a)


@dataclass
class Resumed:
    """An uninterrupted run, and the same run resumed from its checkpoint at step `at`."""

    full: Run
    resumed: Run
    at: int

    @property
    def difference(self):
        """Largest |parameter difference| after the last step of both runs (0.0: bitwise equal)."""
        return final_difference(self.full, self.resumed)


@functools.cache
def resumed_trainer_steps_a_partial_last_window():
    """Does the installed Trainer, resumed mid-epoch, take the optimizer step of the epoch's partial last window?
    transformers 5.x does; 4.x does not (its micro-batch counter restarts after the skipped batches, so the partial
    window never reaches its sync step; huggingface/transformers#38939 reports the same on the last checkpoint).
    Measured once, on the tiny model with the plugin off: Trainer's own behaviour, not the plugin's."""
    import unsloth_diffusion_norm

    with unsloth_diffusion_norm.unpatched():
        runs = train_and_resume(fixtures.answers(fixtures.LONG, 3), 1, gradient_accumulation_steps=2, seed=0)
    return bool(runs.resumed.windows) and runs.resumed.windows[-1].params_after is not None


def train_and_resume(examples, at, workdir=None, **kwargs):
    """Train `examples` saving a checkpoint every `at` steps; then train again from checkpoint-`at` in a
    fresh trainer, as a restarted job would (`workdir` must be shared by all ranks under DDP)."""
    workdir = workdir or fixtures.scratch("udn-resume-")
    full_dir, resumed_dir = os.path.join(workdir, "full"), os.path.join(workdir, "resumed")
    full = train(examples, output_dir=full_dir, save_strategy="steps", save_steps=at, **kwargs)
    checkpoint = os.path.join(full_dir, f"checkpoint-{at}")
    resumed = train(examples, output_dir=resumed_dir, resume_from_checkpoint=checkpoint, **kwargs)
    return Resumed(full, resumed, at)

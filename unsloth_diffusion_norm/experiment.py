"""Run the real DiffusionTrainer on the tiny model, record what each window did, and judge it by the oracle.

Shared by `reproduce`, the tests and the scripts. Nothing here imitates Unsloth or Trainer: the run is
`Trainer.train()`, and a callback plus a pass-through view of `get_batch_samples` record the window's
clean batches, the RNG state its noise came from, the weights it started at, its gradients and the
weights after the optimizer step. The oracle replays the masks from that RNG state on its own.
"""

import copy
import os
import tempfile
from dataclasses import dataclass, field

import torch

from . import oracle
from .tiny_model import EOS_ID, MASK_ID, write_tiny_checkpoint

LEARNING_RATE = 0.1


@dataclass
class Example:
    prompt: list
    answer: list  # supervised tokens; the EOS that closes the answer is added unless eos=False
    eos: bool = True

    def row(self):
        answer = self.answer + ([EOS_ID] if self.eos else [])
        return {
            "input_ids": self.prompt + answer,
            "completion_mask": [0] * len(self.prompt) + [1] * len(answer),
        }


def tiny_checkpoint():
    """A tiny checkpoint in a fresh temporary directory, written once per process and temporary directory:
    the command line points tempfile at a scratch directory of its own and removes it afterwards."""
    where = tempfile.gettempdir()
    if where not in _CHECKPOINTS:
        _CHECKPOINTS[where] = write_tiny_checkpoint(os.path.join(tempfile.mkdtemp(prefix="udn-"), "tiny"))
    return _CHECKPOINTS[where]


_CHECKPOINTS = {}


def load_model(lora=None, checkpoint=None):
    """The tiny model, full fine-tuning (lora=None) or LoRA on attention and MLP with the output head
    frozen (lora="frozen-head": fused-head loss path) or trained as a saved module (lora="saved-head":
    the head is no plain nn.Linear any more, so the loss takes the dense-logit path)."""
    from unsloth import FastModel

    model, tokenizer = FastModel.from_pretrained(
        checkpoint or tiny_checkpoint(), trust_remote_code=True, dtype=torch.float32, device_map={"": "cpu"}
    )
    if lora is not None:
        extra = {"modules_to_save": ["diffusion_head"]} if lora == "saved-head" else {}
        model = FastModel.get_peft_model(
            model, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], random_state=0, **extra
        )
        generator = torch.Generator().manual_seed(1)
        for name, param in model.named_parameters():
            if "lora_B" in name:  # LoRA starts at B=0, where A gets no gradient; move off it
                torch.nn.init.normal_(param, std=0.02, generator=generator)
    return model, tokenizer


def clean_inputs(batch):
    """A detached CPU copy of what the oracle needs from a micro-batch, whatever else it carries
    (with diffusion_noise="per_sample", the generator seed of each row as "keys")."""
    from .per_sample import KEYS

    keep = ("input_ids", "attention_mask", "labels")
    clean = {k: batch[k].detach().cpu().clone() for k in keep if k in batch}
    if KEYS in batch:
        clean["keys"] = list(batch[KEYS])
    return clean


@dataclass
class WindowRecord:
    batches: list = None
    rng_state: torch.Tensor = None
    state_before: dict = None
    grads: dict = None
    params_after: dict = None
    logged_loss: float = None


@dataclass
class Run:
    windows: list = field(default_factory=list)
    eval_loss: float = None
    trainer: object = None
    # A separately loaded copy of the model for the oracle: the trained model carries instance-level
    # forwards installed by the training stack, which a deepcopy would keep bound to the live model.
    reference_model: torch.nn.Module = None


def _recorder(run):
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kw):
            record = run.windows[-1]
            if record.rng_state is None:  # noise not drawn yet: it will be, from here
                record.rng_state = torch.get_rng_state()
            record.state_before = {n: p.detach().clone() for n, p in model.state_dict().items()}

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            run.windows[-1].grads = {
                n: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                for n, p in model.named_parameters()
                if p.requires_grad
            }

        def on_step_end(self, args, state, control, model=None, **kw):
            run.windows[-1].params_after = {
                n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad
            }

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs and run.windows:
                run.windows[-1].logged_loss = logs["loss"]

    return Recorder()


def train(examples, before_train=None, resume_from_checkpoint=None, **settings):
    """One run of Trainer.train() (one epoch unless `settings` say otherwise) with plain SGD over
    `examples`, in order; returns the Run. `before_train(trainer)` may attach more instruments; the
    other settings go to `build`."""
    run = build(examples, **settings)
    if before_train is not None:
        before_train(run.trainer)
    run.trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return run


def build(
    examples,
    gradient_accumulation_steps=2,
    batch_size=1,
    seed=0,
    lora=None,
    eval_examples=None,
    diffusion_profile=None,
    checkpoint=None,
    record=True,
    streaming=False,
    compute_loss_func=None,
    **config,
):
    """A DiffusionTrainer over `examples` (kept in the order given), ready to train, with its recording
    instruments attached; returns the Run. `config` goes to DiffusionConfig and overrides the settings
    below (e.g. save_strategy / save_steps / output_dir for a resume, max_steps, bf16). `checkpoint`:
    another model directory; `record=False`: no recording and no oracle copy (benchmarks);
    `streaming`: the data as a length-less IterableDataset (then give max_steps)."""
    from datasets import Dataset
    from unsloth.models.diffusion_trainer import DiffusionConfig, DiffusionTrainer

    model, tokenizer = load_model(lora=lora, checkpoint=checkpoint)
    settings = dict(
        output_dir=config.get("output_dir") or tempfile.mkdtemp(prefix="udn-run-"),  # made only if config names none
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        num_train_epochs=1,
        learning_rate=LEARNING_RATE,
        optim="sgd",
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=0.0,
        seed=seed,
        bf16=False,
        fp16=False,
        max_length=None,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        completion_only_loss=True,
    )
    args = DiffusionConfig(**{**settings, **config})
    train_dataset = Dataset.from_list([e.row() for e in examples])
    if streaming:
        train_dataset = train_dataset.to_iterable_dataset()  # read in order, no length
    extra = {} if compute_loss_func is None else {"compute_loss_func": compute_loss_func}
    trainer = DiffusionTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=None if eval_examples is None else Dataset.from_list([e.row() for e in eval_examples]),
        processing_class=tokenizer,
        diffusion_profile=diffusion_profile,
        **extra,
    )
    # Keep the data in the order given, so a case can place each micro-batch where it wants it.
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(trainer.train_dataset)
    if not record:
        return Run(trainer=trainer)
    run = Run(trainer=trainer, reference_model=load_model(lora=lora, checkpoint=checkpoint)[0])
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
                drawn_while_fetching.append(torch.get_rng_state())
            return prepare(*pos, **kw)

        object.__setattr__(trainer.diffusion_profile, "prepare_batch", prepare_batch)
    trainer.add_callback(_recorder(run))
    return run


@dataclass
class Verdict:
    """One window judged by the oracle. Errors are absolute; `worst` is the largest error/tolerance."""

    reference_loss: float
    logged_loss: float
    counts: list
    loss_error: float
    grad_error: float
    param_error: float
    worst: float

    @property
    def ok(self):
        return self.worst <= 1.0


def judge(run, record, eps=1e-3, inverse_t=True, learning_rate=LEARNING_RATE, ranks=None, rank_local=False,
          max_grad_norm=0.0, precision="fp32", eos_id=EOS_ID, mask_id=MASK_ID):
    """`ranks`: every data-parallel rank's (batches, rng_state) for this window; None = this process alone.
    `rank_local`: the reference for average_tokens_across_devices=False (mean of per-rank window losses).
    `max_grad_norm`: the run clips, so the reference gradient is clipped the way torch clips.
    `precision`: which of the oracle's tolerances applies (the run's compute precision).
    `eos_id`, `mask_id`: the model's own (another checkpoint than the tiny model's, see own_model).
    A window that logged no loss of its own (logging_steps > 1) is judged on gradients and parameters."""
    model = run.reference_model
    model.load_state_dict(record.state_before)
    ranks = ranks or [(record.batches, record.rng_state)]
    masks = [oracle.replay_noise(batches, state, eps, eos_id) for batches, state in ranks]
    reference = oracle.data_parallel_reference(model, masks, mask_id, inverse_t, rank_local)
    grads = oracle.clip_gradients(reference.grads, max_grad_norm) if max_grad_norm else reference.grads
    before = dict(model.named_parameters())
    ratios, grad_error, param_error = [], 0.0, 0.0
    for name, ref in grads.items():
        got = record.grads[name]
        error = oracle.max_error(got, ref)
        grad_error = max(grad_error, error)
        ratios.append(error / oracle.tolerance(ref, precision))
        expected = before[name].detach() - learning_rate * ref
        error = oracle.max_error(record.params_after[name], expected)
        param_error = max(param_error, error)
        ratios.append(error / oracle.tolerance(expected, precision))
    loss_error = None
    if record.logged_loss is not None:
        loss_error = abs(record.logged_loss - reference.loss)
        ratios.append(loss_error / oracle.tolerance(reference.loss, precision))
    return Verdict(
        reference.loss, record.logged_loss, reference.counts, loss_error, grad_error, param_error, max(ratios)
    )


def evaluate(trainer, seed=1234):
    """trainer.evaluate() from a fixed RNG state; returns (eval_loss, [(rng state, clean inputs)] of each
    evaluation step, seen through a pass-through view of prediction_step)."""
    seen = []
    predict = trainer.prediction_step

    def prediction_step(model, inputs, *pos, **kw):
        seen.append((torch.get_rng_state(), clean_inputs(inputs)))
        return predict(model, inputs, *pos, **kw)

    trainer.prediction_step = prediction_step
    try:
        torch.manual_seed(seed)
        loss = trainer.evaluate()["eval_loss"]
    finally:
        del trainer.prediction_step
    return loss, seen


def expected_evaluation_loss(model, seen, eps=1e-3):
    """The oracle's evaluation loss: each batch by its own masked count (no window), averaged."""
    losses = [
        oracle.evaluation_losses(model, oracle.replay_noise([batch], state, eps, EOS_ID), MASK_ID)[0]
        for state, batch in seen
    ]
    return sum(losses) / len(losses)


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

    from .activation import status, unpatched
    from .registry import NATIVE

    if status().mode == NATIVE or settings.get("diffusion_noise") is not None:
        return contextlib.nullcontext(), {**settings, "diffusion_loss_normalization": "microbatch"}
    return unpatched(), settings


@dataclass
class Resumed:
    """An uninterrupted run, and the same run resumed from its checkpoint at step `at`."""

    full: Run
    resumed: Run
    at: int

    @property
    def difference(self):
        """Largest |parameter difference| after the last step of both runs (0.0: bitwise equal)."""
        a, b = self.full.windows[-1].params_after, self.resumed.windows[-1].params_after
        return max(oracle.max_error(a[name], b[name]) for name in a)


def train_and_resume(examples, at, workdir=None, **kwargs):
    """Train `examples` saving a checkpoint every `at` steps; then train again from checkpoint-`at` in a
    fresh trainer, as a restarted job would (`workdir` must be shared by all ranks under DDP)."""
    workdir = workdir or tempfile.mkdtemp(prefix="udn-resume-")
    full_dir, resumed_dir = os.path.join(workdir, "full"), os.path.join(workdir, "resumed")
    full = train(examples, output_dir=full_dir, save_strategy="steps", save_steps=at, **kwargs)
    checkpoint = os.path.join(full_dir, f"checkpoint-{at}")
    resumed = train(examples, output_dir=resumed_dir, resume_from_checkpoint=checkpoint, **kwargs)
    return Resumed(full, resumed, at)


def realized(batches, rng_state, eps=1e-3):
    """The masks a window drew, replayed by the oracle (exact: the trainer's gradients match them)."""
    return oracle.replay_noise(batches, rng_state, eps, EOS_ID)


def masks_by_sample(windows):
    """{generator seed: (the example's own tokens, which of them were masked)} over (batches, rng state)
    windows run with diffusion_noise="per_sample"; padding is left out, as it depends on the layout."""
    found = {}
    for batches, state in windows:
        for batch, masks in zip(batches, realized(batches, state)):
            attention = batch.get("attention_mask")
            for row, key in enumerate(batch["keys"]):
                own = slice(None) if attention is None else attention[row].bool()
                found[key] = (masks.tokens[row][own].tolist(), masks.masked[row][own].tolist())
    return found


def noise_levels(batches, rng_state, eps=1e-3):
    """p_mask of every row of every micro-batch of a window: the noise level each example got."""
    return [masks.p_mask[:, 0].tolist() for masks in realized(batches, rng_state, eps)]

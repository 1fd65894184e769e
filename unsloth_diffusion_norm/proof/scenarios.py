"""Training the way users train: realistic DiffusionConfig settings and Trainer uses, each judged by the
oracle window by window, each beside its per-micro-batch control.

    python -m unsloth_diffusion_norm.proof.scenarios      # prints the table (docs/in-the-field.md)

Every scenario is the real DiffusionTrainer through Trainer.train(): gradient clipping, logging every few
steps, epochs cut by max_steps, streaming data, bf16 autocast, LoRA with padded mixed-length batches,
evaluation on start, a compute_loss_func, resuming a checkpoint the unpatched release wrote, two trainers
in one process, train() twice.
"""

import contextlib
import os
import sys
from dataclasses import dataclass, field

from ..activation import unpatched
from . import experiment, fixtures, judging, oracle, tables
from .fixtures import equal_answers, mixed_answers


def _ignore(outputs, labels, num_items_in_batch=None):
    raise AssertionError("DiffusionTrainer computes its own loss; compute_loss_func is never called")


@dataclass
class Scenario:
    settings: dict  # the examples and the keywords of experiment.Setup.of
    runs: str = "train"  # how the trainer(s) are driven; see `drive`
    precision: str = "fp32"
    note: str = ""

    @property
    def judged(self):
        """What the judge needs to know of the run's settings."""
        return judging.OracleSettings(max_grad_norm=self.settings.get("max_grad_norm", 0.0), precision=self.precision)


SCENARIOS = {
    "gradient clipping (max_grad_norm=1.0)": Scenario(dict(examples=equal_answers(4), max_grad_norm=1.0)),
    "logging_steps=3 (logged loss = mean of 3 windows)": Scenario(dict(examples=equal_answers(12), logging_steps=3)),
    "3 epochs cut by max_steps=5": Scenario(dict(examples=equal_answers(4), num_train_epochs=3, max_steps=5)),
    "3 epochs cut by max_steps=5, per-sample noise": Scenario(
        dict(examples=equal_answers(4), num_train_epochs=3, max_steps=5, diffusion_noise="per_sample")
    ),
    "streaming IterableDataset, max_steps=3 (2 epochs)": Scenario(
        dict(examples=equal_answers(4), streaming=True, max_steps=3)
    ),
    "streaming, per-sample noise": Scenario(
        dict(examples=equal_answers(4), streaming=True, max_steps=3, diffusion_noise="per_sample")
    ),
    "bf16 autocast, GA 1 (the bf16 floor)": Scenario(
        dict(examples=equal_answers(2), gradient_accumulation_steps=1, bf16=True), precision="bf16"
    ),
    "bf16 autocast, GA 2": Scenario(dict(examples=equal_answers(4), bf16=True), precision="bf16"),
    "LoRA, batch 2, mixed answer lengths, clipping 0.5": Scenario(
        dict(examples=mixed_answers(8), lora="frozen-head", batch_size=2, max_grad_norm=0.5)
    ),
    "eval_on_start (+ evaluation parity)": Scenario(
        dict(
            examples=equal_answers(4),
            eval_examples=mixed_answers(2),
            eval_on_start=True,
            eval_strategy="steps",
            eval_steps=1,
        ),
        runs="evaluate",
    ),
    "a trainer with compute_loss_func": Scenario(dict(examples=equal_answers(4), compute_loss_func=_ignore)),
    "resume from a checkpoint the unpatched release wrote": Scenario(
        dict(examples=equal_answers(8)), runs="resume-unpatched-checkpoint"
    ),
    "two trainers in one process (default / per-sample)": Scenario(
        dict(examples=equal_answers(4)), runs="two-trainers"
    ),
    "train() called twice": Scenario(dict(examples=equal_answers(4)), runs="train-twice"),
}


@dataclass
class Outcome:
    """One scenario's windows judged by the oracle, for the plugin and for the control."""

    name: str
    counts: list  # per window: masked tokens per micro-batch
    worst: float  # the plugin's largest error / tolerance over every window, gradient, parameter, loss
    control_worst: float  # the same for the per-micro-batch control, over windows whose counts differ
    control_counts_equal: bool  # the control drew the same masks
    logged_mean_error: float = None  # logging_steps > 1: worst |logged - mean of reference| / tolerance
    eval_error: float = None  # evaluation loss vs the oracle's, / tolerance
    unequal_windows: int = 0  # windows where per-micro-batch and window normalization differ
    notes: list = field(default_factory=list)

    @property
    def ok(self):
        checks = [self.worst <= 1.0]
        checks += [e <= 1.0 for e in (self.logged_mean_error, self.eval_error) if e is not None]
        return all(checks)


def drive(scenario, control=False, device="cpu"):
    """Run the scenario (or its per-micro-batch control) on `device`; returns the runs whose windows are judged."""
    settings = {**scenario.settings, "device": device}
    examples = settings.pop("examples")
    if scenario.runs == "two-trainers":
        # Both built before either trains: nothing of one may leak into the other.
        flag = {"diffusion_loss_normalization": "microbatch"} if control else {}
        first = experiment.build(examples, experiment.Setup.of(**settings, **flag))
        second = experiment.build(
            examples, experiment.Setup.of(**{**settings, "seed": 1, "diffusion_noise": "per_sample"}, **flag)
        )
        first.trainer.train()
        second.trainer.train()
        return [first, second]
    if scenario.runs == "resume-unpatched-checkpoint":
        workdir = fixtures.scratch("udn-resume-")
        with unpatched():
            experiment.train(
                examples, output_dir=os.path.join(workdir, "unpatched"), save_strategy="steps", save_steps=2, **settings
            )
        settings.update(
            output_dir=os.path.join(workdir, "resumed"),
            resume_from_checkpoint=os.path.join(workdir, "unpatched", "checkpoint-2"),
        )
    context, settings = experiment.per_micro_batch(settings) if control else (contextlib.nullcontext(), settings)
    with context:
        if scenario.runs == "train-twice":
            run = experiment.build(examples, experiment.Setup.of(**settings))
            run.trainer.train()
            run.trainer.train()
            return [run]
        return [experiment.train(examples, **settings)]


def examine(name, scenario, device="cpu"):
    judged = scenario.judged
    runs = drive(scenario, device=device)
    logged = _take_logged_means(runs, scenario)
    verdicts = [judging.judge(run, window, judged) for run in runs for window in run.windows]
    outcome = Outcome(name, [v.counts for v in verdicts], max(v.worst for v in verdicts), 0.0, True)
    if logged:
        outcome.logged_mean_error = max(
            abs(value - sum(v.reference_loss for v in verdicts[i - k + 1 : i + 1]) / k)
            / oracle.tolerance(value, scenario.precision)
            for i, (value, k) in logged.items()
        )
    if scenario.runs == "evaluate":
        outcome.eval_error = _evaluation_error(runs[0])
    controls = drive(scenario, control=True, device=device)
    _take_logged_means(controls, scenario)
    judged_controls = [judging.judge(run, window, judged) for run in controls for window in run.windows]
    outcome.control_counts_equal = [v.counts for v in judged_controls] == outcome.counts
    unequal = [c for v, c in zip(verdicts, judged_controls) if len(v.counts) > 1 and len(set(v.counts)) > 1]
    outcome.unequal_windows = len(unequal)
    outcome.control_worst = max((c.worst for c in unequal), default=0.0)
    return outcome


def _take_logged_means(runs, scenario):
    """With logging_steps = k > 1 a logged loss is the mean over the last k windows: take it off the
    window (the judge then checks gradients and parameters) and return {window index: (value, k)}."""
    k = scenario.settings.get("logging_steps", 1)
    if k == 1:
        return {}
    found = {}
    for i, window in enumerate(w for run in runs for w in run.windows):
        if window.logged_loss is not None:
            found[i] = (window.logged_loss, k)
            window.logged_loss = None
            window.logs = None  # (its metrics too are means over the k windows)
    return found


def _evaluation_error(run):
    trainer = run.trainer
    loss, seen = experiment.evaluate(trainer)
    model = run.reference_model
    model.load_state_dict(trainer.model.state_dict())
    expected = judging.expected_evaluation_loss(model, seen)
    return abs(loss - expected) / oracle.tolerance(expected)


def examine_all(names=None, device="cpu"):
    return [examine(name, SCENARIOS[name], device) for name in names or SCENARIOS]


def render(outcomes):
    header = [
        "configuration",
        "masked tokens per micro-batch, by window",
        "plugin: worst error / tolerance",
        "per-micro-batch control: worst error / tolerance (windows with unequal counts)",
    ]
    rows = []
    for o in outcomes:
        extra = []
        if o.logged_mean_error is not None:
            extra.append(f"logged means {o.logged_mean_error:.3g}")
        if o.eval_error is not None:
            extra.append(f"evaluation {o.eval_error:.3g}")
        worst = f"{o.worst:.3g}" + (f" ({', '.join(extra)})" if extra else "")
        control = f"{o.control_worst:.3g} ({o.unequal_windows})" if o.unequal_windows else "— (no unequal window)"
        counts = " / ".join(" ".join(map(str, c)) for c in o.counts)
        rows.append([o.name, counts, worst, control])
    return "\n".join(tables.markdown(header, rows))


def main():
    import io

    from ..activation import status as plugin_status
    from .fixtures import import_unsloth

    import_unsloth()
    with contextlib.redirect_stdout(io.StringIO()):
        outcomes = examine_all()
    status = plugin_status()
    print(
        f"Unsloth {status.unsloth_version} (mode {status.mode}); fp32 {oracle.describe_tolerance()}, "
        f"bf16 {oracle.describe_tolerance('bf16')}\n"
    )
    print(render(outcomes))
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())

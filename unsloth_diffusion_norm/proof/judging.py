"""One recorded window against the oracle: the logged loss, every gradient and every parameter after the
optimizer step, each within the oracle's tolerance - and the masks each window drew, replayed."""

import functools
import inspect
from dataclasses import dataclass

import torch

from . import oracle
from .fixtures import EOS_ID, EPS, LEARNING_RATE, MASK_ID


@functools.cache
def logged_loss_step():
    """The step of the training loss as Trainer logs it: transformers 4.x rounds it to 4 decimals (in
    `_maybe_log_save_evaluate`), 5.x logs it whole (0). Read from the installed Trainer, not its version."""
    from transformers import Trainer

    try:
        source = inspect.getsource(Trainer._maybe_log_save_evaluate)
    except (AttributeError, OSError, TypeError):
        return 0.0
    return 1e-4 if "round(tr_loss_scalar" in source else 0.0


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
    metrics_error: float = None  # the largest |logged - oracle| of the window's metrics (None: none logged)

    @property
    def ok(self):
        return self.worst <= 1.0

    def report(self):
        """The figures doctor reports for a judged window (its --json keys)."""
        return {
            "counts": self.counts,
            "loss": self.logged_loss,
            "reference_loss": self.reference_loss,
            "grad_error": self.grad_error,
            "param_error": self.param_error,
            "worst_error_over_tolerance": self.worst,
        }


@dataclass(frozen=True)
class OracleSettings:
    """How the oracle computes the window a run is held to; the defaults are the tiny model's plain runs."""

    # The objective: the noise floor `eps` of the masking schedule, whether the loss divides by p_mask
    # (`inverse_t`), the model's own `eos_id` and `mask_id` (another checkpoint than the tiny model's, see
    # own_model), and `shift`, `normalization`: the objective of the model's family (oracle.OBJECTIVES),
    # when not NVIDIA's.
    eps: float = EPS
    inverse_t: bool = True
    eos_id: int = EOS_ID
    mask_id: int = MASK_ID
    shift: bool = False
    normalization: str = oracle.WINDOW
    # The optimizer step: plain SGD at `learning_rate`; `max_grad_norm`: the run clips, so the reference
    # gradient is clipped the way torch clips.
    learning_rate: float = LEARNING_RATE
    max_grad_norm: float = 0.0
    # Which of the oracle's tolerances applies (the run's compute precision).
    precision: str = "fp32"
    # diffusion_complementary_masks=True: each row trained with its partner (oracle.replay_noise).
    complementary: bool = False
    # NVIDIA's block-diffusion mode: an oracle.BlockDiffusion (its block size and alpha), or None.
    block: oracle.BlockDiffusion = None


def judge(run, record, settings=None, ranks=None, rank_local=False):
    """`settings`: the OracleSettings the run is judged by (None: the defaults).
    `ranks`: every data-parallel rank's (batches, rng_state) for this window; None = this process alone.
    `rank_local`: the reference for average_tokens_across_devices=False (mean of per-rank window losses).
    A window that logged no loss of its own (logging_steps > 1) is judged on gradients and parameters."""
    settings = settings or OracleSettings()
    precision = settings.precision
    model = run.reference_model
    model.load_state_dict(record.state_before)
    ranks = ranks or [(record.batches, record.rng_state)]
    masks = [
        oracle.replay_noise(batches, state, settings.eps, settings.eos_id, settings.complementary, settings.block)
        for batches, state in ranks
    ]
    reference = oracle.data_parallel_reference(
        model,
        masks,
        settings.mask_id,
        settings.inverse_t,
        rank_local,
        shift=settings.shift,
        normalization=settings.normalization,
        block=settings.block,
    )
    grads = (
        oracle.clip_gradients(reference.grads, settings.max_grad_norm) if settings.max_grad_norm else reference.grads
    )
    before = dict(model.named_parameters())
    ratios, grad_error, param_error = [], 0.0, 0.0
    for name, ref in grads.items():
        got = record.grads[name]
        error = oracle.max_error(got, ref)
        grad_error = max(grad_error, error)
        ratios.append(error / oracle.tolerance(ref, precision))
        expected = before[name].detach() - settings.learning_rate * ref
        error = oracle.max_error(record.params_after[name], expected)
        param_error = max(param_error, error)
        ratios.append(error / oracle.tolerance(expected, precision))
    loss_error = None
    if record.logged_loss is not None:
        loss_error = abs(record.logged_loss - reference.loss)
        # Trainer's own rounding of the logged figure is not an error of the run
        ratios.append(max(0.0, loss_error - logged_loss_step() / 2) / oracle.tolerance(reference.loss, precision))
    metrics_error = None
    logs = record.logs or {}
    if any(name in logs for name in oracle.METRIC_NAMES):  # the window's metrics, where the run logs them
        # (a rank-local count: the metrics are this rank's own window's, as its count is)
        seen = (
            [
                oracle.replay_noise(
                    record.batches,
                    record.rng_state,
                    settings.eps,
                    settings.eos_id,
                    settings.complementary,
                    settings.block,
                )
            ]
            if rank_local
            else masks
        )
        expected = oracle.window_metrics(seen)
        errors = {name: abs(logs[name] - value) for name, value in expected.items()}  # a missing one: KeyError
        metrics_error = max(errors.values())
        # Computed from exact counts and fp32 levels, whatever the run's precision: the fp32 tolerance.
        ratios += [error / oracle.tolerance(expected[name]) for name, error in errors.items()]
        if oracle.ACCURACY_NAME in logs:  # where the loss holds the logits: the window's training accuracy
            accuracy, close = oracle.window_accuracy(
                model, seen, settings.mask_id, settings.shift, precision, settings.block
            )
            error = abs(logs[oracle.ACCURACY_NAME] - accuracy)  # (None where nothing was masked: nothing logged)
            metrics_error = max(metrics_error, error)
            # a hit within round-off of a tie may fall either way: that share of tokens is no error
            ratios.append(max(0.0, error - close) / oracle.tolerance(accuracy))
    return Verdict(
        reference.loss,
        record.logged_loss,
        reference.counts,
        loss_error,
        grad_error,
        param_error,
        max(ratios),
        metrics_error,
    )


def expected_evaluation_loss(model, seen, eps=EPS):
    """The oracle's evaluation loss: each batch by its own masked count (no window), averaged."""
    losses = [
        oracle.evaluation_losses(model, oracle.replay_noise([batch], state, eps, EOS_ID), MASK_ID)[0]
        for state, batch in seen
    ]
    return sum(losses) / len(losses)


def realized(batches, rng_state, eps=EPS):
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


def noise_levels(batches, rng_state, eps=EPS):
    """p_mask of every row of every micro-batch of a window: the noise level each example got."""
    return [masks.p_mask[:, 0].tolist() for masks in realized(batches, rng_state, eps)]


def keyed_evaluation(seen, seed, draws=1, world_size=1, rank=0, batch_size=1):
    """The batches an evaluation with diffusion_eval_noise="fixed" drew from, as the oracle replays them: per
    draw, each seen batch with its rows' generator seeds ("keys") - keyed by (seed, the row's position in the
    eval set, the draw), the m-th batch of `rank` holding positions (m·W + rank)·B + j."""
    from ..evaluation import eval_key

    keyed = []
    for m, (_, batch) in enumerate(seen):
        first = (m * world_size + rank) * batch_size
        rows = batch["input_ids"].shape[0]
        keyed.append([{**batch, "keys": [eval_key(seed, first + j, k) for j in range(rows)]} for k in range(draws)])
    return keyed


def expected_draw_spread(model, keyed, settings=None):
    """The oracle's (standard deviation between the K draws' eval losses, standard error of their mean): each
    draw k's eval loss is expected_fixed_evaluation_loss of that draw alone."""
    per_draw = [
        expected_fixed_evaluation_loss(model, [[draws[k]] for draws in keyed], settings) for k in range(len(keyed[0]))
    ]
    mean = sum(per_draw) / len(per_draw)
    spread = (sum((loss - mean) ** 2 for loss in per_draw) / (len(per_draw) - 1)) ** 0.5
    return spread, spread / len(per_draw) ** 0.5


def expected_evaluation_scores(model, keyed, settings=None, buckets=5, prefix="eval"):
    """{logged name: value} of a keyed evaluation's accuracy and masked CE by noise level, by the oracle over every
    batch and draw of `keyed` (keyed_evaluation's). The names are spelled here from their documented pattern."""
    settings = settings or OracleSettings()
    masks = [
        mask
        for draws in keyed
        for batch in draws
        for mask in oracle.replay_noise([batch], torch.get_rng_state(), settings.eps, settings.eos_id)
    ]
    accuracy, losses = oracle.evaluation_scores(model, masks, settings.mask_id, settings.shift, buckets)
    found = {} if accuracy is None else {f"{prefix}_masked_token_accuracy": accuracy}
    found.update({f"{prefix}_masked_ce_noise_{k / buckets:g}-{(k + 1) / buckets:g}": ce for k, ce in losses.items()})
    return found


def scores_error(logged, expected):
    """The largest error of the logged evaluation scores against the oracle's, in tolerances (a name logged or
    expected on one side only: inf)."""
    names = {name for name in logged if name.endswith("_masked_token_accuracy") or "_masked_ce_noise_" in name}
    if names != set(expected):
        return float("inf")
    return max((abs(logged[n] - expected[n]) / oracle.tolerance(expected[n]) for n in names), default=0.0)


def expected_fixed_evaluation_loss(model, keyed, settings=None):
    """The oracle's loss of a keyed evaluation: each batch, each draw, by the family's own normalization of one
    batch (Nemotron and Dream: its masked tokens; LLaDA: answer lengths); the mean over a batch's draws, then
    over the batches, each weighed by its rows (Trainer repeats a batch's loss once per row: a last, smaller batch
    weighs less)."""
    settings = settings or OracleSettings()
    per_batch, rows = [], []
    for draws in keyed:
        losses = []
        for batch in draws:
            # (every row keyed: the global generator's state is never read)
            masks = oracle.replay_noise([batch], torch.get_rng_state(), settings.eps, settings.eos_id)
            with torch.no_grad():
                loss, _ = oracle.window_loss(
                    model, masks, settings.mask_id, settings.inverse_t, settings.shift, settings.normalization
                )
            losses.append(loss.item())
        per_batch.append(sum(losses) / len(losses))
        rows.append(draws[0]["input_ids"].shape[0])
    return sum(loss * n for loss, n in zip(per_batch, rows)) / sum(rows)

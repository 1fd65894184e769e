"""Evaluation noise that holds still (opt-in, `diffusion_eval_noise="fixed"`).

The release evaluates with draws from the global RNG: two evaluations of the same weights disagree, and an
evaluation moves every training draw after it, so a seeded run trains another model when `eval_steps`
changes. Here each evaluation example's noise level and per-token draws come from its own generators, keyed
by (args.seed, the example's position in the eval set, the draw), and an evaluation leaves every global
generator as it found it. `diffusion_eval_draws=K` averages K such draws per example, one forward each. With the run's metrics on, each
draw's forward is also scored (metrics.EvalScores): the evaluation's masked-token accuracy and its loss by
noise level, stable from evaluation to evaluation as every bucket holds the same draws.

Positions: accelerate deals evaluation batches round-robin as it deals training ones, so rank r's m-th batch
of an evaluation is global batch m·W + r, and its row j sits at position (m·W + r)·B + j (B =
per_device_eval_batch_size): an example keeps its key whichever rank evaluates it.
"""

import contextlib
import hashlib
import random
import sys

import torch

from . import config, metrics, per_sample, registry
from .batch_keys import EVAL, UNSLOTH_PREPARED
from .loss import check_weighting
from .registry import Patch
from .wrappers import evaluation_loop_arguments, loss_arguments, prediction_arguments, replaced


def eval_key(seed, position, draw):
    """A 63-bit generator seed for one draw of one evaluation example, unrelated to every training key."""
    digest = hashlib.blake2b(f"eval:{seed}:{position}:{draw}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Keyed:
    """An evaluation batch's draws, one list of row seeds per draw; `losses`: each draw's loss, once computed;
    `scores`: the evaluation's metrics.EvalScores each draw's forward is scored into, or None. Not a list:
    Trainer's _prepare_inputs rebuilds lists, and the loss must fill in this very object."""

    def __init__(self, draws, scores=None):
        self.draws = draws
        self.losses = None
        self.scores = scores

    def __iter__(self):
        return iter(self.draws)

    def __eq__(self, other):
        return list(self.draws) == list(other)


class EvalOrder:
    """Where the next evaluation batch of this rank sits in the eval set (one per evaluation loop), and each
    draw's loss over the batches so far."""

    def __init__(self, scores=None):
        self.next_batch = 0
        self.draw_sums = None  # per draw: the sum over batches of rows x that draw's batch loss
        self.rows = 0
        self.scores = scores  # metrics.EvalScores, where the run's metrics are on

    def tag(self, args, inputs, draws):
        """`inputs` with its rows' generator seeds under batch_keys.EVAL: `draws` lists of one seed per row."""
        rows = inputs["input_ids"].shape[0]
        first = (self.next_batch * args.world_size + args.process_index) * args.per_device_eval_batch_size
        self.next_batch += 1
        keys = [[eval_key(args.seed, first + row, draw) for row in range(rows)] for draw in range(draws)]
        return {**inputs, EVAL: Keyed(keys, self.scores)}

    def record(self, keyed, rows):
        """A batch's draws' losses, weighted by its rows as Trainer weights a batch's loss in the eval loss."""
        if keyed.losses is None:
            return
        weighted = keyed.losses.double() * rows
        self.draw_sums = weighted if self.draw_sums is None else self.draw_sums + weighted
        self.rows += rows

    def finish(self, accelerator, draws, prefix):
        """{name: float} the evaluation adds to its metrics, over every rank's batches (one gather): with `draws`
        K > 1, the standard deviation between the draws' eval losses and the standard error of their mean (each
        draw k's eval loss is the rows-weighted mean of its batch losses over the eval set, so the K draws are K
        replicates of the whole evaluation); with scores, the accuracy and the masked CE by noise level."""
        spread = draws > 1
        if not spread and self.scores is None:
            return {}
        device = accelerator.device
        parts = []
        if spread:  # (a rank that evaluated nothing adds zeros, and still joins the gather)
            sums = torch.zeros(draws, dtype=torch.float64, device=device) if self.draw_sums is None else self.draw_sums
            parts += [sums.to(device), torch.tensor([float(self.rows)], dtype=torch.float64, device=device)]
        if self.scores is not None:
            parts.append(self.scores.vector(device).to(device))
        local = torch.cat(parts)
        total = accelerator.gather(local[None]).sum(dim=0) if accelerator.num_processes > 1 else local
        found = {}
        if spread:
            if total[draws] > 0:  # (no rows evaluated anywhere: no spread to give)
                deviation = (total[:draws] / total[draws]).std()  # (the unbiased estimate: K replicates)
                found[f"{prefix}_loss_draw_std"] = float(deviation)
                found[f"{prefix}_loss_stderr"] = float(deviation / draws**0.5)
            total = total[draws + 1 :]
        if self.scores is not None:
            found.update(self.scores.named(total, prefix))
        return found


def mean_of_draws(inputs, loss_of, model=None, score=None):
    """The release's (loss, outputs, metrics) of an evaluation batch, averaged over its keyed draws:
    `loss_of(inputs, keys)` gives (that result, the draw's noise), called once per draw with the batch (its draws'
    seeds taken out) and that draw's seeds (one forward each). One draw is returned as it is. Where the batch's
    Keyed carries scores, `score(scores, output, drawn)` scores each draw's forward output of `model`."""
    clean = {name: value for name, value in inputs.items() if name != EVAL}
    draws = inputs[EVAL]
    scores = getattr(draws, "scores", None) if score is not None else None
    results = []
    for keys in draws:
        with metrics.forward_output(model) if scores is not None else contextlib.nullcontext([None]) as seen:
            result, drawn = loss_of(clean, keys)
        if scores is not None:
            score(scores, seen[0], drawn)
        results.append(result)
    if isinstance(draws, Keyed) and len(results) > 1:  # for the spread between draws (EvalOrder.finish)
        draws.losses = torch.stack([torch.as_tensor(r[0]).detach().reshape(()).double() for r in results])
    if len(results) == 1:
        return results[0]
    losses, outputs, said = zip(*results)
    names = dict.fromkeys(name for found in said for name in found or {})  # (a draw with nothing masked has fewer)
    return _mean(losses), outputs[-1], {name: _mean([m[name] for m in said if name in m]) for name in names}


def patched_loss(release, profile, model, inputs, args, masked_loss):
    """2026.10.4-.6: an evaluation batch's loss over its keyed draws, each normalized as the batch's evaluation
    is without keys: its own masked tokens under window normalization, else the profile's own (LLaDA: answer
    lengths); `masked_loss`: the release shape's loss (the `loss` module)."""
    check_weighting(profile, args)

    def one_draw(clean, keys):
        drawn = release.draw(profile, model, clean, args, per_sample.Rows(keys))
        own = None if config.normalization_for(profile, args) != config.WINDOW else drawn.masked.sum()
        return masked_loss(profile, model, drawn, args, own, release.masked_module), drawn

    return mean_of_draws(inputs, one_draw, model, scorer(release, profile, model, args))


def scorer(release, profile, model, args):
    """`score(scores, output, drawn)` for this release's loss: the head it fuses (the same lookup as its loss
    makes; None where the forward returns logits) and the profile's shift."""
    module = release.masked_module
    head = None
    if hasattr(module, "fusable_head"):
        head = module.fusable_head(model, module.unwrap_diffusion_model(model))
    return lambda scores, output, drawn: scores.add(output, head, drawn, profile.shift_logits)


def _mean(values):
    if all(torch.is_tensor(v) for v in values):
        return torch.stack([v.reshape(()) for v in values]).mean()
    return sum(float(v) for v in values) / len(values)


@contextlib.contextmanager
def global_rng_held(device):
    """Every global generator an evaluation may advance (the DataLoader's base seed, a collective's RNG
    sync, a user's callback): torch's CPU generator and the run's accelerator's, Python's and NumPy's, put
    back as they were on the way out."""
    cpu = torch.get_rng_state()
    accelerator = getattr(torch, torch.device(device).type, None) if torch.device(device).type != "cpu" else None
    if accelerator is not None and not (hasattr(accelerator, "get_rng_state_all") and accelerator.is_initialized()):
        accelerator = None
    accelerated = accelerator.get_rng_state_all() if accelerator is not None else None
    python = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if accelerated is not None:
            accelerator.set_rng_state_all(accelerated)
        random.setstate(python)
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)


# --- the patches: class-level on 2026.10.4-.6, per trainer on 2026.10.7+ ---------------------------------


def _keyed_evaluation(release, trainer):
    return config.eval_noise_for(trainer.args) == config.FIXED and isinstance(
        getattr(trainer, "diffusion_profile", None), release.masked_module.MaskedDiffusionProfile
    )


def _held_evaluation_loop(release, wrapped, trainer, pos, kwargs):
    if not _keyed_evaluation(release, trainer):
        return wrapped(*pos, **kwargs)
    kept = registry.per_trainer(trainer)
    args = trainer.args
    buckets = config.EVAL_BUCKETS.of(args) if config.METRICS.of(args) else None
    kept.eval_order = EvalOrder(None if buckets is None else metrics.EvalScores(buckets))  # each from position 0
    # Nothing drawn inside comes from a global RNG, and what the loop itself advances (the DataLoader's base
    # seed) is put back: the training draws after an evaluation are those of a run without it.
    try:
        with global_rng_held(trainer.args.device):
            output = wrapped(*pos, **kwargs)
        # K draws: how far the eval loss moves between them; the run's metrics: accuracy, masked CE by noise level
        prefix = evaluation_loop_arguments(*pos, **kwargs)
        output.metrics.update(kept.eval_order.finish(trainer.accelerator, config.EVAL_DRAWS.of(args), prefix))
        return output
    finally:
        kept.eval_order = None


def _keyed_prediction_step(release, wrapped, trainer, pos, kwargs):
    if not _keyed_evaluation(release, trainer):
        return wrapped(*pos, **kwargs)
    order = registry.per_trainer(trainer).eval_order or EvalOrder()  # (outside an evaluation: from position 0)
    _, inputs = prediction_arguments(*pos, **kwargs)
    tagged = order.tag(trainer.args, inputs, config.EVAL_DRAWS.of(trainer.args))
    pos, kwargs = replaced(pos, kwargs, 1, "inputs", tagged)
    result = wrapped(*pos, **kwargs)
    order.record(tagged[EVAL], inputs["input_ids"].shape[0])
    return result


def trainer_patches(release, owner, make):
    """The two trainer methods keyed evaluation needs, on `owner` (DiffusionTrainer, or one trainer);
    `make(function)`: the Patch's make for that owner."""
    return [
        Patch(
            f"{_label(owner)}evaluation_loop",
            owner,
            "evaluation_loop",
            make(_held_evaluation_loop),
            f"{config.EVAL_NOISE.name}='fixed': each evaluation numbers its examples from 0 and leaves every "
            "global RNG as it found it",
        ),
        Patch(
            f"{_label(owner)}prediction_step",
            owner,
            "prediction_step",
            make(_keyed_prediction_step),
            f"{config.EVAL_NOISE.name}='fixed': each evaluation row's generator seeds (seed, eval position, draw)",
        ),
    ]


def _label(owner):
    return f"{owner.__name__}." if isinstance(owner, type) else ""


def keyed_upstream_loss(release, wrapped, profile, pos, kwargs):
    """2026.10.7+: an evaluation batch's loss over its keyed draws, each drawn here and handed to upstream's own
    loss (`wrapped`, the profile copy's compute_loss) as its prepared batch."""
    model, inputs, args, _ = loss_arguments(*pos, **kwargs)

    def one_draw(clean, keys):
        drawn = release.draw(profile, model, clean, args, per_sample.Rows(keys))
        call = replaced(pos, kwargs, 1, "inputs", {**clean, UNSLOTH_PREPARED: drawn.prepared()})
        return wrapped(*call[0], **call[1]), drawn

    return mean_of_draws(inputs, one_draw, model, scorer(release, profile, model, args))

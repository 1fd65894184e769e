"""The metrics' gathers across real ranks, without a model: what a run's ranks hand each other at a log or at
the end of an evaluation when they hold different steps, and when one of them holds nothing.

Each of two ranks (torchrun, Gloo, a real Accelerator) feeds the core's OwnSteps (a per-micro-batch run's
steps) and EvalOrder (a keyed evaluation's draws and scores) the draws of `DRAWS` / `EVALUATED` for its rank,
and writes what take() and finish() return. Rank 1 has no micro-batch in the last step of the first log and
none at all in the second; in the first evaluation it evaluates nothing. tests/integration/multiprocess/
test_gathered.py holds every rank's figures to the oracle's over both ranks' draws.

    python -m unsloth_diffusion_norm.proof.gathered JSON     # inside each launched rank (see `launch`)
"""

import json
import os
import sys

SLOTS = 2  # micro-batches per optimizer step
EPS = 2.0**-14  # levels this close together: their spread is a difference of nearly equal sums (float64 needed)


def _levels(*offsets):
    return [0.5 + offset * EPS for offset in offsets]


# log -> rank -> [(optimizer step, [(masked tokens, level) per row])] in the order the micro-batches come.
DRAWS = [
    {
        0: [(0, [(3, 1), (1, 2)]), (0, [(2, 3)]), (1, [(4, 4), (0, 5)]), (1, [(1, 6)]), (2, [(2, 7)])],
        1: [(0, [(5, 8)]), (0, [(1, 9), (2, 10)]), (1, [(1, 11)])],  # none in step 2: its slots are absent
    },
    {0: [(3, [(2, 12), (6, 13)])], 1: []},  # nothing at all on rank 1
]
# evaluation: (keyed draws per example, rank -> batches: (each draw's batch loss, [(token ids, masked positions,
# level) per row])). Rank 1 evaluates nothing in the first (where a level is 1: the last bucket) and the fourth;
# one draw has no spread to give; nothing evaluated: {}.
EVALUATED = [
    (2, {0: [([2.5, 3.25], [([1, 2, 3, 0], [1, 0, 1, 0], 0.3), ([3, 1, 2, 2], [1, 1, 1, 1], 1.0)])], 1: []}),
    (
        2,
        {
            0: [([1.5, 1.75], [([0, 1, 2, 3], [1, 1, 0, 0], 0.1)])],
            1: [
                ([2.0, 2.5], [([2, 2, 1, 0], [0, 1, 0, 1], 0.6), ([1, 3, 0, 2], [1, 0, 0, 0], 0.9)]),
                ([0.25, 0.5], [([2], [1], 0.45)]),  # one token
            ],
        },
    ),
    (1, {0: [([1.25], [([4, 0, 1, 1], [0, 0, 1, 1], 0.7)])], 1: [([0.5], [([3, 3, 2, 1], [1, 0, 0, 1], 0.2)])]}),
    (1, {0: [([0.75], [([1, 2, 3, 4], [0, 0, 1, 0], 0.4)])], 1: []}),  # one masked token in all
    (2, {0: [], 1: []}),
]
BUCKETS, VOCABULARY = 2, 5


def drawn(rows):
    """A drawn micro-batch of `rows` (masked tokens, level index): its masks and float32 mask probabilities, as
    long as its most masked row (one token where that is one: a row's level is read from its first position)."""
    import torch

    from ..noise import Noise

    length = max(1, *(count for count, _ in rows))
    masked = torch.tensor([[position < count for position in range(length)] for count, _ in rows])
    p_mask = torch.tensor([_levels(level) for _, level in rows], dtype=torch.float32).expand(-1, length)
    return Noise(None, None, masked, masked, p_mask)


def evaluation_batch(rows):
    """(output, drawn) of an evaluation batch: seeded logits, and its rows' tokens, masks and levels."""
    import torch

    from ..noise import Noise

    tokens = torch.tensor([ids for ids, _, _ in rows])
    masked = torch.tensor([mask for _, mask, _ in rows]).bool()
    p_mask = torch.tensor([[p] * tokens.shape[1] for _, _, p in rows], dtype=torch.float32)
    generator = torch.Generator().manual_seed(int(tokens.sum()))
    logits = torch.randn(*tokens.shape, VOCABULARY, generator=generator)
    return _Output(logits), Noise(tokens, None, masked, masked, p_mask)


class _Output:  # a forward's output as the scores read it (its logits)
    def __init__(self, logits):
        self.logits = logits


def worker(out):
    import torch
    from accelerate import Accelerator

    from .. import evaluation, metrics, window

    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    replicas, _ = window.counting_rule(True, accelerator.num_processes, accelerator.num_processes, None)
    steps = metrics.OwnSteps(accelerator, replicas, SLOTS)
    # Fed and read under a default device other than the data's, as on a GPU: nothing may land there.
    logs = []
    for log in DRAWS:
        batches = [(step, drawn(rows)) for step, rows in log[rank]]
        with torch.device("meta"):
            for step, batch in batches:
                steps.drawn(step, batch)
            logs.append(steps.take(accelerator.device))
    evaluations = []
    for draws, evaluated in EVALUATED:
        order = evaluation.EvalOrder(metrics.EvalScores(BUCKETS))
        batches = [(torch.tensor(losses), *evaluation_batch(rows), len(rows)) for losses, rows in evaluated[rank]]
        with torch.device("meta"):
            for losses, output, batch, rows in batches:
                order.scores.add(output, None, batch, shift=False)
                keyed = evaluation.Keyed([[0] * rows] * draws)
                keyed.losses = losses
                order.record(keyed, rows)
            evaluations.append(order.finish(accelerator, draws, "eval"))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"rank": rank, "replicas": replicas, "logs": logs, "evaluations": evaluations}, f)
    accelerator.end_training()


def launch(timeout=120):
    """Two ranks under torchrun; every rank's {rank, replicas, logs, evaluations}."""
    import tempfile

    from . import fixtures, processes
    from .ranks import one_node

    with tempfile.TemporaryDirectory(prefix="udn-gathered-") as scratch:
        out = os.path.join(scratch, "result")
        env = {**os.environ, **fixtures.CPU_ENVIRONMENT, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        done = processes.run(one_node("torchrun", 2) + ["-m", __name__, out], timeout, env=env, cwd=scratch)
        if done.returncode != 0:
            raise RuntimeError(
                f"the ranks failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
            )
        return [json.load(open(f"{out}.{rank}")) for rank in range(2)]


if __name__ == "__main__":
    worker(sys.argv[1])

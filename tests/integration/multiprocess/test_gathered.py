"""The metrics gathered across two real ranks that hold different steps, or nothing (proof/gathered.py): each
rank's figures are the oracle's over both ranks' draws. One launch, no model: a few seconds."""

import math

import pytest
import torch

from unsloth_diffusion_norm import metrics
from unsloth_diffusion_norm.proof import gathered, oracle

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def ranks():
    return gathered.launch()


def _close(logged, expected):
    assert set(logged) == set(expected)
    for name, value in expected.items():
        assert abs(logged[name] - value) <= oracle.tolerance(value), (name, logged[name], value)


def test_a_per_microbatch_runs_steps_are_the_oracles_over_both_ranks_and_the_mean_over_its_steps(ranks):
    """At each log, the mean over the steps since the last of each step's window metrics over both ranks'
    micro-batches: a step one rank has no micro-batch in, and a log where one rank drew nothing at all."""
    assert [rank["replicas"] for rank in ranks] == [1, 1]
    for log, draws in enumerate(gathered.DRAWS):
        steps = sorted({step for rank in draws.values() for step, _ in rank})
        per_step = [
            oracle.window_metrics([[gathered.drawn(rows) for s, rows in draws[r] if s == step] for r in draws])
            for step in steps
        ]
        expected = {name: sum(m[name] for m in per_step) / len(per_step) for name in oracle.METRIC_NAMES}
        assert expected[metrics.LEVEL_SPREAD] > 0  # the levels differ by 2**-14: float32 sums would lose it
        for rank in ranks:
            _close(rank["logs"][log], expected)


def test_a_keyed_evaluations_spread_and_scores_are_over_every_ranks_batches(ranks):
    """finish() on both ranks: the spread between the draws' eval losses and the accuracy and masked CE by noise
    level over both ranks' batches, the same on both; a rank that evaluated nothing adds nothing, one draw has no
    spread, and an evaluation of nothing gives nothing."""
    assert [rank["evaluations"][-1] for rank in ranks] == [{}, {}]
    for index, (draws, evaluated) in enumerate(gathered.EVALUATED[:-1]):
        batches = [batch for rank in sorted(evaluated) for batch in evaluated[rank]]
        expected = _scores(batches)
        if draws > 1:
            rows = sum(len(batch_rows) for _, batch_rows in batches)
            losses = [sum(len(r) * ls[k] for ls, r in batches) / rows for k in range(draws)]
            mean = sum(losses) / draws
            deviation = math.sqrt(sum((loss - mean) ** 2 for loss in losses) / (draws - 1))
            expected.update({"eval_loss_draw_std": deviation, "eval_loss_stderr": deviation / draws**0.5})
        for rank in ranks:
            _close(rank["evaluations"][index], expected)


def _scores(batches):
    """The accuracy and masked CE by noise-level bucket of these batches, from their logits (plain torch)."""
    hits = masked = 0
    ce, count = [0.0] * gathered.BUCKETS, [0] * gathered.BUCKETS
    for _, rows in batches:
        output, batch = gathered.evaluation_batch(rows)
        for row in range(len(rows)):
            bucket = min(int(float(batch.p_mask[row, 0]) * gathered.BUCKETS), gathered.BUCKETS - 1)
            for position in batch.masked[row].nonzero()[:, 0].tolist():
                logits, token = output.logits[row, position], int(batch.input_ids[row, position])
                ce[bucket] += float(torch.logsumexp(logits, 0) - logits[token])
                count[bucket] += 1
                hits += int(logits[token] == logits.max())
                masked += 1
    found = {f"eval_{metrics.ACCURACY}": hits / masked}
    found.update(
        {
            metrics.bucket_name("eval", k, gathered.BUCKETS): ce[k] / count[k]
            for k in range(gathered.BUCKETS)
            if count[k]
        }
    )
    return found

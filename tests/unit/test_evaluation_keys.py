"""Keyed evaluation noise: one generator seed per (seed, eval position, draw), positions as accelerate deals the
eval batches, the mean of K draws, an evaluation that leaves every global RNG as it found it, and the two flags'
validation (in Python and on a command line)."""

import argparse
import hashlib
import random
from types import SimpleNamespace

import pytest
import torch

from unsloth_diffusion_norm import batch_keys, config, evaluation, per_sample


def test_the_key_is_the_documented_hash_and_unrelated_to_every_training_key():
    digest = hashlib.blake2b(b"eval:42:7:1", digest_size=8).digest()
    assert evaluation.eval_key(42, 7, 1) == int.from_bytes(digest, "little") >> 1
    keys = {evaluation.eval_key(seed, position, draw) for seed in (0, 1) for position in range(32) for draw in range(4)}
    assert len(keys) == 256 and all(0 <= key < 2**63 for key in keys)
    training = {per_sample.sample_key(seed, 0, position) for seed in (0, 1) for position in range(32)}
    assert not keys & training


def test_positions_follow_accelerates_round_robin_over_ranks():
    """Rank r's m-th eval batch is global batch m·W + r: with 2 ranks and batches of 2, rank 1 holds 2, 3, 6, 7."""
    args = SimpleNamespace(seed=5, world_size=2, process_index=1, per_device_eval_batch_size=2)
    order = evaluation.EvalOrder()
    tagged = [order.tag(args, {"input_ids": torch.zeros(2, 3)}, draws=2) for _ in range(2)]
    expected = [[[evaluation.eval_key(5, p, d) for p in positions] for d in range(2)] for positions in ([2, 3], [6, 7])]
    assert [batch[batch_keys.EVAL] for batch in tagged] == expected


def test_k_draws_are_averaged_and_one_draw_is_the_release_s_result_itself():
    seen = []

    def loss_of(inputs, keys):
        assert batch_keys.EVAL not in inputs  # the draws' seeds taken out: each draw gets its own
        seen.append(keys)
        k = len(seen)
        metrics = {"masked_fraction": torch.tensor(0.1 * k)} | ({} if k == 2 else {"masked_ce": float(k)})
        return (torch.tensor(float(k)), f"outputs of draw {k}", metrics), None

    inputs = {"input_ids": torch.zeros(1, 2), batch_keys.EVAL: [[11], [12], [13]]}
    loss, outputs, metrics = evaluation.mean_of_draws(inputs, loss_of)
    assert seen == [[11], [12], [13]] and loss.item() == 2.0 and outputs == "outputs of draw 3"  # the last draw's
    assert torch.isclose(metrics["masked_fraction"], torch.tensor(0.2)) and metrics["masked_ce"] == 2.0  # (1 + 3) / 2
    single = (torch.tensor(1.5), None, {})
    assert evaluation.mean_of_draws({batch_keys.EVAL: [[1]]}, lambda inputs, keys: (single, None)) is single


def test_an_evaluation_leaves_every_global_rng_as_it_found_it():
    import numpy

    torch.manual_seed(3), random.seed(3), numpy.random.seed(3)
    with pytest.raises(RuntimeError), evaluation.global_rng_held("cpu"):
        torch.rand(5), random.random(), numpy.random.rand()
        raise RuntimeError("an evaluation that fails gives the states back too")
    after = (torch.rand(1).item(), random.random(), numpy.random.rand())
    torch.manual_seed(3), random.seed(3), numpy.random.seed(3)
    assert after == (torch.rand(1).item(), random.random(), numpy.random.rand())


def test_the_draws_flag_takes_whole_numbers_from_one_and_none_is_its_default():
    field = config.EVAL_DRAWS.name
    assert [config.validate(v, field) for v in (1, 4, None, "None")] == [1, 4, 1, 1]
    for bad in (0, -2, 2.0, True, "3"):
        with pytest.raises(ValueError, match=f"{field} must be a whole number of draws, 1 or more"):
            config.validate(bad, field)
    assert (
        config.validate("fixed", config.EVAL_NOISE.name) == "fixed"
        and config.validate("none", config.EVAL_NOISE.name) is None
    )
    with pytest.raises(ValueError, match="diffusion_eval_noise must be 'fixed' or None"):
        config.validate("random", config.EVAL_NOISE.name)


def test_k_draws_need_keyed_noise_and_the_asked_flags_leave_defaults_out():
    flags = SimpleNamespace(diffusion_eval_noise=None, diffusion_eval_draws=3)
    with pytest.raises(
        ValueError, match="diffusion_eval_draws=3 averages keyed evaluation draws; set diffusion_eval_noise='fixed'"
    ):
        config.check_together(flags)
    config.check_together(SimpleNamespace(diffusion_eval_noise="fixed", diffusion_eval_draws=3))
    defaults = SimpleNamespace(**{field: config.default(field) for field in config.FIELDS})
    assert config.asked(defaults) == {} and config.asked(flags) == {config.EVAL_DRAWS.name: 3}


def test_a_parser_converts_with_the_flags_own_rule_and_says_what_is_wrong_in_one_line():
    draws, noise = config.argument_type(config.EVAL_DRAWS.name), config.argument_type(config.NOISE.name)
    assert (draws("4"), draws("None"), noise("per_sample"), noise("None")) == (4, 1, "per_sample", None)
    parser = argparse.ArgumentParser()
    parser.add_argument("--diffusion_eval_draws", type=draws, default=1)
    assert parser.parse_args(["--diffusion_eval_draws", "3"]).diffusion_eval_draws == 3
    for bad in ("0", "two", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a whole number of draws"):
            draws(bad)


@pytest.mark.parametrize("fused_head", [False, True])
def test_an_evaluations_row_scores_are_exact_past_two_chunks_of_masked_tokens(fused_head):
    """More masked tokens than two chunks of the head (metrics.CHUNK at a time): every token scored once, as one
    cross-entropy over them all says, per row; from the logits, or the hidden states through a fused head."""
    from unsloth_diffusion_norm import metrics
    from unsloth_diffusion_norm.proof.oracle import TOLERANCES

    atol, rtol = TOLERANCES["fp32"]  # fp32 logits: the one tolerance of the project
    generator = torch.Generator().manual_seed(0)
    rows, length, vocab, hidden = 2, metrics.CHUNK + 300, 7, 5
    masked = torch.rand(rows, length, generator=generator) < 0.9  # about 1,460 masked tokens in all
    input_ids = torch.randint(vocab, (rows, length), generator=generator)
    head = torch.nn.Linear(hidden, vocab) if fused_head else None
    states = torch.randn(rows, length, hidden if fused_head else vocab, generator=generator)
    logits = head(states).detach() if fused_head else states
    output = SimpleNamespace(logits=states)
    drawn = SimpleNamespace(masked=masked, input_ids=input_ids)
    ce, hits, count = metrics.row_scores(output, head, drawn, shift=False)
    assert masked.sum() > 2 * metrics.CHUNK
    for row in range(rows):
        chosen, wanted = logits[row][masked[row]], input_ids[row][masked[row]]
        expected = torch.nn.functional.cross_entropy(chosen.double(), wanted, reduction="sum")
        torch.testing.assert_close(ce[row], expected, rtol=rtol, atol=atol)
        assert hits[row] == metrics.hit(chosen, wanted).sum() and count[row] == masked[row].sum()


def test_an_evaluations_bucket_sums_take_the_profiles_shift():
    """EvalScores.add scores with the shift it is given (Dream's: position i's logits predict token i + 1): its
    sums are those of row_scores with that shift."""
    from unsloth_diffusion_norm import metrics

    generator = torch.Generator().manual_seed(1)
    masked = torch.rand(2, 9, generator=generator) < 0.5
    drawn = SimpleNamespace(
        masked=masked, input_ids=torch.randint(6, (2, 9), generator=generator), p_mask=torch.tensor([[0.2], [0.7]])
    )
    output = SimpleNamespace(logits=torch.randn(2, 9, 6, generator=generator))
    scores = metrics.EvalScores(2)
    scores.add(output, None, drawn, True)
    ce, hits, count = metrics.row_scores(output, None, drawn, True)
    assert torch.equal(scores.sums, torch.cat([ce, count, hits.sum()[None], count.sum()[None]]))  # bucket k: row k
    assert not torch.equal(ce, metrics.row_scores(output, None, drawn, False)[0])


def test_an_evaluations_spread_is_exact_past_2_to_the_24_rows():
    """EvalOrder.finish in float64 throughout: a rank's row count past 2**24 (where float32 rounds) still divides
    each draw's sum exactly."""
    order = evaluation.EvalOrder()
    order.rows = 2**24 + 1
    order.draw_sums = torch.tensor([3.0 * order.rows, 5.0 * order.rows + 1], dtype=torch.float64)
    found = order.finish(SimpleNamespace(device=torch.device("cpu"), num_processes=1), 2, "eval")
    expected = (order.draw_sums / torch.tensor(float(order.rows), dtype=torch.float64)).std()
    assert found == {"eval_loss_draw_std": float(expected), "eval_loss_stderr": float(expected / 2**0.5)}

"""The lower-variance samplers leave the objective where it was: the mean of the window's weighted loss sum
over many keyed draws, and of its gradient, against the exact expectation computed by enumerating every mask
and integrating t exactly (proof/exact.py), for the plain keyed sampler, stratified levels and complementary
pairs. Planted biased samplers fail the same check, so the check can fail. No Unsloth: the samplers are the
plugin's own functions (per_sample, noise), the model a small one whose loss depends on its context."""

import functools

import pytest
import torch
import torch.nn.functional as F

from unsloth_diffusion_norm import noise, per_sample
from unsloth_diffusion_norm.proof import exact

EPS, MASK_ID, VOCAB, SEED = 1e-3, 1, 8, 7
DRAWS = 8_000
BOUND = 4  # standard errors
# One window: a prompt token, then answers of 1-4 equal tokens (each scored better the more of it is visible).
EXAMPLES = [torch.tensor([2] + [3 + k] * (k + 1)) for k in range(4)]
MASKABLE = [torch.arange(len(tokens)) > 0 for tokens in EXAMPLES]
N = len(EXAMPLES)
DIRECTIONS = 3  # random directions in parameter space along which the gradient is checked


@functools.cache
def keyed_uniforms(k):
    """Example k's own draws in every window d = 0..DRAWS-1 (its key: position d·N + k): (t, u)."""
    keys = [per_sample.sample_key(SEED, 0, d * N + k) for d in range(DRAWS)]
    return per_sample.uniforms(keys, None, len(EXAMPLES[k]), "cpu")


@functools.cache
def window_strata(d):
    return per_sample.window_strata(SEED, 0, d, N)


def levels_and_uniforms(k, strata):
    t, u = keyed_uniforms(k)
    if strata is not None:
        t = per_sample.stratified(t, [(strata(d)[k], N) for d in range(DRAWS)])
    return t, u


def keyed(d):
    return window_strata(d)


def by_index(d):  # planted: strata without the keyed assignment, example k always in stratum k
    return list(range(N))


def weighted_sums(model, sampler):
    """Every draw's window sum of CE/p_mask over masked tokens (a pair counts both rows): a (DRAWS,) tensor."""
    total = torch.zeros(DRAWS, dtype=torch.float64)
    for k, (tokens, maskable) in enumerate(zip(EXAMPLES, MASKABLE)):
        rows = sampler(k, tokens, maskable)
        inputs = torch.where(rows.masked, MASK_ID, rows.input_ids)
        logits = model(input_ids=inputs).logits.double()
        ce = F.cross_entropy(logits.transpose(1, 2), rows.input_ids, reduction="none")
        per_row = (ce * rows.masked / rows.p_mask.double()).sum(dim=1)
        total = total + per_row.reshape(-1, DRAWS).sum(dim=0)  # a pair: both halves of the draw
    return total


def plain_rows(k, tokens, maskable, strata=None):
    t, u = levels_and_uniforms(k, strata)
    p_mask = ((1 - EPS) * t + EPS)[:, None].expand(DRAWS, len(tokens))
    masked = (u < p_mask) & maskable
    return noise.Noise(tokens.expand(DRAWS, -1), None, maskable.expand(DRAWS, -1), masked, p_mask)


def stratified_rows(k, tokens, maskable):
    return plain_rows(k, tokens, maskable, strata=keyed)


def unkeyed_strata_rows(k, tokens, maskable):
    return plain_rows(k, tokens, maskable, strata=by_index)


def paired_rows(k, tokens, maskable):
    return noise.paired(plain_rows(k, tokens, maskable), EPS)


def paired_at_own_level_rows(k, tokens, maskable):  # planted: the complement weighted by 1/p, not 1/(1 - p)
    pair = paired_rows(k, tokens, maskable)
    first = pair.p_mask[:DRAWS]
    return noise.Noise(pair.input_ids, None, pair.maskable, pair.masked, torch.cat([first, first]))


SAMPLERS = {  # name -> (rows of one example in every draw, how many plain draws' worth a draw holds)
    "plain": (plain_rows, 1),
    "stratified": (stratified_rows, 1),
    "complementary": (paired_rows, 2),
    "stratified + complementary": (lambda k, *a: noise.paired(stratified_rows(k, *a), EPS), 2),
}
PLANTED = {
    "strata by index, not by key": (unkeyed_strata_rows, 1),
    "complement weighted by 1/p": (paired_at_own_level_rows, 2),
}


@pytest.fixture(scope="module")
def model():
    return exact.ContextModel(VOCAB, MASK_ID)


@pytest.fixture(scope="module")
def directions(model):
    generator = torch.Generator().manual_seed(0)
    return [{n: torch.randn(p.shape, generator=generator) for n, p in model.named_parameters()} for _ in range(3)]


def along(model, directions, function):
    """function(model) and its derivative along each direction (forward mode: one pass per direction)."""
    params = dict(model.named_parameters())
    call = lambda p: function(lambda **inputs: torch.func.functional_call(model, p, (), inputs))  # noqa: E731
    value = call(params).detach()
    slopes = [torch.func.jvp(call, (params,), (direction,))[1].detach() for direction in directions]
    return value, slopes


def misses(model, directions, sampler, pairs):
    """{quantity: |Monte Carlo mean - exact| in standard errors} for the loss sum and its directional slopes."""
    exact_examples = list(zip(EXAMPLES, MASKABLE))
    expected, expected_slopes = along(
        model, directions, lambda m: pairs * exact.expected_window_sum(m, exact_examples, MASK_ID, EPS)
    )
    draws, draw_slopes = along(model, directions, lambda m: weighted_sums(m, sampler))
    found = {}
    for name, want, got in [("loss sum", expected, draws)] + [
        (f"slope {i}", s, d) for i, (s, d) in enumerate(zip(expected_slopes, draw_slopes))
    ]:
        standard_error = got.std() / DRAWS**0.5
        found[name] = float((got.mean() - want).abs() / standard_error)
    return found


def test_the_model_makes_the_law_of_t_matter(model):
    """Without this no planted sampler could fail: the expected loss at a low and a high level differ."""
    tokens, maskable = EXAMPLES[-1], MASKABLE[-1]
    with torch.no_grad():
        low = exact.expected_sum(model, tokens, maskable, MASK_ID, eps=0.0)  # t ~ U(0, 1)
        high = exact.expected_sum(model, tokens, maskable, MASK_ID, eps=0.9)  # p in [0.9, 1]
    assert high > 1.5 * low


def test_exact_coefficients_integrate_polynomials_exactly():
    # ∫_0^1 p^(k-1) (1-p)^(m-k) dt with eps = 0 is the Beta function B(k, m - k + 1) = (k-1)! (m-k)! / m!
    from math import factorial

    for m in range(1, 7):
        c = exact.coefficients(m, 0.0)
        for k in range(1, m + 1):
            assert c[k] == pytest.approx(factorial(k - 1) * factorial(m - k) / factorial(m), rel=1e-12)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_each_sampler_is_unbiased_in_the_loss_and_the_gradient(name, model, directions):
    sampler, pairs = SAMPLERS[name]
    found = misses(model, directions, sampler, pairs)
    print(name, found)
    assert max(found.values()) < BOUND, found


@pytest.mark.parametrize("name", list(PLANTED))
def test_a_planted_biased_sampler_fails_the_same_check(name, model, directions):
    sampler, pairs = PLANTED[name]
    found = misses(model, directions, sampler, pairs)
    print(name, found)
    assert found["loss sum"] > 2 * BOUND, found


def test_the_pair_rule_at_its_edges_and_with_an_attention_mask():
    """The partner is the complement at 1 - p exactly where 1 - p stays in [eps, 1] (p = 1 - eps included), else
    the mask again at p (p above 1 - eps, up to 1); every tensor of the micro-batch is doubled, the forward's
    attention mask too."""
    levels = torch.tensor([0.5, 1 - EPS, 1 - EPS / 2, 1.0])
    masked = torch.tensor([[True, False, True], [True, True, False], [False, True, True], [True, True, True]])
    maskable = torch.tensor([[True, True, True], [True, True, False], [True, True, True], [True, True, True]])
    ids, attention = torch.arange(12).reshape(4, 3), torch.ones(4, 3, dtype=torch.long)
    pair = noise.paired(noise.Noise(ids, attention, maskable, masked, levels[:, None].expand(4, 3)), EPS)
    assert pair.p_mask[4:, 0].tolist() == [0.5, (1 - levels[1]).item(), levels[2].item(), 1.0]  # (in float32)
    assert pair.masked[4:].tolist() == [[False, True, False], [False, False, False], [False, True, True], [True] * 3]
    assert torch.equal(pair.forward_mask, torch.cat([attention, attention])) and torch.equal(pair.input_ids[4:], ids)
    assert torch.equal(pair.maskable, torch.cat([maskable, maskable]))
    assert noise.paired(noise.Noise(ids, None, maskable, masked, levels[:, None]), EPS).forward_mask is None


def test_strata_are_made_on_the_draws_device():  # "meta": a device other than the CPU that every host has
    t = torch.empty(2, device="meta")
    assert per_sample.stratified(t, [(0, 2), (1, 2)]).device == t.device

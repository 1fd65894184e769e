"""The exact expectation of a window's weighted loss sum under the release's noise law, for problems small
enough to enumerate: the independent reference the lower-variance samplers are held to.

For one example with m maskable tokens, the release draws t ~ U(0, 1), p = (1 - eps)·t + eps, masks each
maskable token with probability p and scores S(M) = sum over masked i of CE_i(x with M masked) / p. So

    E[S] = ∫_0^1 sum over M of p^|M| (1 - p)^(m - |M|) · sum_{i in M} CE_i(M) / p  dt,

and the integrand is a polynomial in t of degree m - 1: Gauss-Legendre quadrature with ceil(m / 2) nodes
integrates it exactly. Every mask M is enumerated (2^m - 1 of them; the empty one scores 0). The window's sum
is the sum of its examples' (linearity: true whatever couples the examples' draws). The result is a tensor of
the model's parameters, so autograd gives the exact expected gradient too.
"""

import itertools
import math
import types

import numpy
import torch
import torch.nn.functional as F


def coefficients(m, eps):
    """c[k] = ∫_0^1 p^(k-1) (1 - p)^(m - k) dt for k = 1..m (index 0 unused), in float64, exact."""
    nodes, weights = numpy.polynomial.legendre.leggauss(max(math.ceil(m / 2), 1))
    t = (nodes + 1) / 2  # [-1, 1] -> [0, 1]
    p = (1 - eps) * t + eps
    return [0.0] + [float(numpy.sum(weights / 2 * p ** (k - 1) * (1 - p) ** (m - k))) for k in range(1, m + 1)]


def expected_sum(model, tokens, maskable, mask_id, eps):
    """E[S] of one example (1-D `tokens`, boolean `maskable`) under the noise law above: a float64 tensor."""
    positions = maskable.nonzero().flatten().tolist()
    m = len(positions)
    if m == 0:
        return torch.zeros((), dtype=torch.float64)
    masks = [subset for k in range(1, m + 1) for subset in itertools.combinations(positions, k)]
    masked = torch.zeros(len(masks), tokens.shape[0], dtype=torch.bool)
    for row, subset in enumerate(masks):
        masked[row, list(subset)] = True
    # The model's device (a functional call of one, as in forward-mode checks, runs on the CPU).
    device = next(model.parameters()).device if isinstance(model, torch.nn.Module) else torch.device("cpu")
    inputs = torch.where(masked, mask_id, tokens.expand(len(masks), -1)).to(device)
    output = model(input_ids=inputs)
    logits = (output.logits if hasattr(output, "logits") else output[0]).double()
    losses = F.cross_entropy(logits.transpose(1, 2), tokens.expand(len(masks), -1).to(device), reduction="none")
    scores = (losses * masked.to(device)).sum(dim=1)  # S(M) · p: the CE summed over M
    c = coefficients(m, eps)
    weight = torch.tensor([c[len(subset)] for subset in masks], dtype=torch.float64, device=device)
    return (weight * scores).sum()


def expected_window_sum(model, examples, mask_id, eps):
    """E[sum over the window of S]: `examples` is a list of (tokens, maskable)."""
    return sum(expected_sum(model, tokens, maskable, mask_id, eps) for tokens, maskable in examples)


class ContextModel(torch.nn.Module):
    """A model whose prediction at a masked position depends strongly on how much of its context is unmasked,
    as a trained model's does: each position reads the mean embedding of the other unmasked positions. The
    tiny transformer with random weights barely does (its expected masked-token loss moves by 0.2 % between
    p = 0.05 and 0.95), so a sampler that moves the law of t would go unseen with it: there, every law of t
    gives nearly the same expectation."""

    def __init__(self, vocab, mask_id, dim=8, seed=0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.mask_id = mask_id
        self.embed = torch.nn.Parameter(torch.randn(vocab, dim, generator=generator))
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, input_ids):
        embedded = self.embed[input_ids]
        visible = (input_ids != self.mask_id).to(embedded.dtype)[..., None]
        seen = embedded * visible
        others = visible.sum(dim=1, keepdim=True) - visible
        context = (seen.sum(dim=1, keepdim=True) - seen) / others.clamp_min(1)
        return types.SimpleNamespace(logits=self.scale * context @ self.embed.T)

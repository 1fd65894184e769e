"""The noise recipe of Unsloth 2026.10.4-.9, step for step, so a seed gives the release's own masks.

EOS fills the padding, which is then attended; the maskable set is the response plus the EOS tail of
rows that have one. Exactly two RNG draws per micro-batch, in this order: `t` per row, then one uniform
per token. Only the moment of drawing moves (all of a window's draws before its first forward).
"""

from dataclasses import dataclass

import torch

from . import config, per_sample


@dataclass
class Noise:
    input_ids: torch.Tensor  # EOS-filled clean tokens
    forward_mask: object  # attention mask for the forward, or None when padding is attended
    maskable: torch.Tensor
    masked: torch.Tensor
    p_mask: torch.Tensor

    def prepared(self):
        """The tuple Unsloth 2026.10.7+ keeps under inputs[batch_keys.UNSLOTH_PREPARED]."""
        return self.input_ids, self.forward_mask, self.maskable, self.masked, self.p_mask


def draw(profile, model, inputs, args, response_mask, keys=None, strata=None):
    """The release's noise for a batch: from the global RNG, or with `keys` (per-sample noise, keyed evaluation:
    one generator seed per row) from each row's own generator, each row's level moved into its stratum where
    `strata` gives one ((stratum, n) per row: stratified levels)."""
    input_ids = inputs["input_ids"]
    attention_mask = inputs.get("attention_mask")
    batch, length = input_ids.shape
    device = input_ids.device
    _, eos_id = profile._token_ids(model, args)
    eps = float(profile.option(args, "diffusion_eps"))

    maskable = response_mask(inputs)
    forward_mask = attention_mask
    if profile.pad_with_eos and attention_mask is not None and eos_id is not None:
        padding = ~attention_mask.bool()
        input_ids = input_ids.masked_fill(padding, eos_id)
        if inputs.get("labels") is not None:
            maskable = maskable | (padding & maskable.any(dim=1, keepdim=True))
        forward_mask = None

    if keys is None:
        t = torch.rand(batch, device=device)
        p_mask = ((1 - eps) * t + eps)[:, None].expand(batch, length)
        masked = (torch.rand((batch, length), device=device) < p_mask) & maskable
    else:  # keyed (per-sample noise, keyed evaluation): the same two draws, from each row's own generator
        t, u = per_sample.uniforms(keys, attention_mask, length, device)
        if strata is not None:  # diffusion_t_sampler="stratified": t moved into the row's stratum
            t = per_sample.stratified(t, strata)
        p_mask = ((1 - eps) * t + eps)[:, None].expand(batch, length)
        masked = (u < p_mask) & maskable
    return Noise(input_ids, forward_mask, maskable, masked, p_mask)


def paired(noise, eps):
    """The micro-batch's noise with each row's partner appended (diffusion_complementary_masks=True): the
    complement of its mask within its maskable tokens at level 1 - p, where 1 - p stays in the release's range
    (p <= 1 - eps), else the same mask at the same level. So the partner's level is uniform on [eps, 1], the
    release's law, and given it the partner's mask is Bernoulli per maskable token: a draw of the release's own
    noise, unbiased on its own. Where it is the complement, the pair's two estimates are anticorrelated."""
    reflect = noise.p_mask[:, :1] <= 1 - eps  # p_mask is one level per row
    masked = torch.where(reflect, noise.maskable & ~noise.masked, noise.masked)
    p_mask = torch.where(reflect, 1 - noise.p_mask, noise.p_mask)
    twice = lambda tensor: None if tensor is None else torch.cat([tensor, tensor])  # noqa: E731
    return Noise(
        twice(noise.input_ids),
        twice(noise.forward_mask),
        twice(noise.maskable),
        torch.cat([noise.masked, masked]),
        torch.cat([noise.p_mask, p_mask]),
    )


def paired_if_asked(noise, profile, args):
    """A training micro-batch's noise, in pairs where the run asks for them (callers pass training draws only:
    a window's, or a keyed one; evaluation and direct calls keep one mask per example)."""
    if not config.COMPLEMENTARY.of(args):
        return noise
    return paired(noise, float(profile.option(args, "diffusion_eps")))

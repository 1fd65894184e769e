"""The noise recipe of Unsloth 2026.10.4-.9, step for step, so a seed gives the release's own masks.

EOS fills the padding, which is then attended; the maskable set is the response plus the EOS tail of
rows that have one. Exactly two RNG draws per micro-batch, in this order: `t` per row, then one uniform
per token. Only the moment of drawing moves (all of a window's draws before its first forward).
"""

from dataclasses import dataclass

import torch

from . import per_sample


@dataclass
class Noise:
    input_ids: torch.Tensor  # EOS-filled clean tokens
    forward_mask: object  # attention mask for the forward, or None when padding is attended
    maskable: torch.Tensor
    masked: torch.Tensor
    p_mask: torch.Tensor

    def prepared(self):
        """The tuple Unsloth 2026.10.7+ keeps under inputs["_diffusion_masked_batch"]."""
        return self.input_ids, self.forward_mask, self.maskable, self.masked, self.p_mask


def draw(profile, model, inputs, args, response_mask):
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

    keys = inputs.get(per_sample.KEYS)
    if keys is None:
        t = torch.rand(batch, device=device)
        p_mask = ((1 - eps) * t + eps)[:, None].expand(batch, length)
        masked = (torch.rand((batch, length), device=device) < p_mask) & maskable
    else:  # diffusion_noise="per_sample": the same two draws, from each example's own generator
        t, u = per_sample.uniforms(keys, attention_mask, length, device)
        p_mask = ((1 - eps) * t + eps)[:, None].expand(batch, length)
        masked = (u < p_mask) & maskable
    return Noise(input_ids, forward_mask, maskable, masked, p_mask)

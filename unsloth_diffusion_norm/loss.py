"""The masked-diffusion loss of each patched release's code shape, with its denominator passed in.

A micro-batch's loss is its weighted sum S_g divided by `denominator`: the window's realized masked tokens
(given by `window.Window.divide`), or the micro-batch's own for evaluation and direct calls. `denominator=None`
is the profile's own per-micro-batch normalization (its masked tokens, or LLaDA's answer lengths), for keyed
evaluation draws. Everything else - the forward, the fused or dense head, the 1/p_mask weighting, the metrics -
is the release's own arithmetic, op for op, so a GA=1 step is bitwise the release's.
"""

import torch

WEIGHTINGS = ("inverse_t", "none", None)


def check_weighting(profile, args):
    weighting = profile.option(args, "diffusion_time_weighting")
    if weighting not in WEIGHTINGS:
        raise ValueError(  # the release's own message, word for word: the patched path refuses what it refuses
            f"Unsloth: {profile.name} does not support diffusion_time_weighting={weighting!r}."
        )
    return weighting


def _by_answer_length(profile, denominator):
    # LLaDA's own: each example by its answer length, the mean over the batch (no count to divide by).
    return denominator is None and profile.loss_normalization == "answer_length"


def dense_cross_entropy(profile, model, noise, args, denominator, unsloth, score=None):
    """Unsloth 2026.10.4 / .5: dense logits, F.cross_entropy, an early zero when nothing is masked.
    `score(logits, tokens, masked)`: the window's training accuracy, where the run logs it (no gradient)."""
    F = unsloth.F
    weighting = check_weighting(profile, args)
    input_ids, masked, p_mask = noise.input_ids, noise.masked, noise.p_mask
    mask_id, _ = profile._token_ids(model, args)
    model_inputs = {"input_ids": torch.where(masked, mask_id, input_ids)}
    if noise.forward_mask is not None and not bool(noise.forward_mask.all()):
        model_inputs["attention_mask"] = noise.forward_mask
    logits = model(**model_inputs).logits
    if profile.shift_logits:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)

    if not bool(masked.any()):
        return logits.sum() * 0.0, None, {"masked_fraction": 0.0}

    token_loss = F.cross_entropy(logits[masked].float(), input_ids[masked], reduction="none")
    if score is not None:
        score(logits, input_ids, masked)
    if weighting == "inverse_t":
        token_loss = token_loss / p_mask[masked]
    if _by_answer_length(profile, denominator):
        batch, length = input_ids.shape
        answer_length = noise.maskable.sum(dim=1, keepdim=True).clamp_min(1).expand(batch, length)
        loss = (token_loss / answer_length[masked]).sum() / batch
    else:
        loss = token_loss.sum() / (masked.sum() if denominator is None else denominator)
    metrics = {
        "masked_fraction": (masked.sum() / noise.maskable.sum().clamp_min(1)).item(),
        "masked_ce": F.cross_entropy(logits[masked].float(), input_ids[masked]).item(),
    }
    return loss, None, metrics


def chunked_cross_entropy(profile, model, noise, args, denominator, unsloth, score=None):
    """Unsloth 2026.10.6: chunked cross-entropy, taking hidden states when the head is fusable. (No logits are
    held, so no `score`: its accuracy is evaluation's.)"""
    weighting = check_weighting(profile, args)
    input_ids, masked, p_mask = noise.input_ids, noise.masked, noise.p_mask
    device = input_ids.device
    mask_id, _ = profile._token_ids(model, args)
    model_inputs = {"input_ids": torch.where(masked, mask_id, input_ids)}
    if noise.forward_mask is not None:
        model_inputs["attention_mask"] = noise.forward_mask
    head = unsloth.fusable_head(model, unsloth.unwrap_diffusion_model(model))
    with unsloth.head_returns_hidden(head):
        hidden = model(**model_inputs).logits
    if profile.shift_logits:
        hidden = torch.cat([hidden[:, :1], hidden[:, :-1]], dim=1)

    targets = torch.where(masked, input_ids, -100)
    weights = masked.float()
    if weighting == "inverse_t":
        weights = weights / torch.where(masked, p_mask, 1.0)
    by_answer_length = _by_answer_length(profile, denominator)
    if by_answer_length:
        weights = weights / (noise.maskable.sum(dim=1, keepdim=True).clamp_min(1) * input_ids.shape[0])
    weighted, ce_sum, count = unsloth.chunked_cross_entropy(
        hidden,
        targets,
        weights,
        weight=None if head is None else head.weight,
        bias=None if head is None else head.bias,
        compiled=unsloth.compile_loss(args, device),
    )
    if by_answer_length:
        loss = weighted
    else:
        loss = weighted / torch.as_tensor(count if denominator is None else denominator, device=device).clamp_min(1)
    metrics = {
        "masked_fraction": (count / noise.maskable.sum().clamp_min(1)).detach(),
        "masked_ce": (ce_sum / count.clamp_min(1)).detach(),
    }
    return loss, None, metrics

"""An independent reference for the Nemotron-Labs-Diffusion objective over a whole window.

Written from NVIDIA's published recipe, not from Unsloth's or this plugin's loss code: EOS-filled,
attended padding; maskable = response tokens plus the EOS tail of rows that have a response;
t ~ U(0,1) per row, p_mask = (1-eps)·t + eps, then one uniform per token; cross-entropy at masked
positions divided by p_mask, summed over the window and divided by the window's masked-token count.
Micro-batches of equal length go through the model in one forward; the gradient is taken once.
The other families' published objectives (OBJECTIVES) differ in three knobs: the noise floor, whether
position i's logits predict token i + 1 (shift), and the normalization each micro-batch gets before
Trainer averages the micro-batches of a window.

NVIDIA's block-diffusion mode (`BlockDiffusion`; NeMo Automodel's SFT recipe, its HybridDiffusionLLMLoss and
its collator): each row EOS-filled to the next multiple of the block size and supervised; the model run on
`[noisy; clean]`, each half at positions 0..L-1, a noisy token seeing its own noisy block and the clean
half's earlier blocks, a clean token the clean tokens up to itself;
alpha · sum(CE/p_mask at masked tokens) / N_masked + sum(CE of the clean half's next-token logits at
supervised tokens) / N_supervised, both counts over the whole window.
"""

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# One place for the tolerance every comparison uses: the round-off of the correct computation, per tensor
# atol + rtol·max|reference|. fp32: measured ~4e-6 on embedding gradients of magnitude 3-9.
ATOL, RTOL = 1e-6, 1e-5
# bf16 autocast (Unsloth's default precision): a GA=1 run, where the per-micro-batch and the window
# normalization are the same formula, sets the floor; see tests/integration/test_field.py for the measurement.
BF16_ATOL, BF16_RTOL = 1e-4, 3e-2
TOLERANCES = {"fp32": (ATOL, RTOL), "bf16": (BF16_ATOL, BF16_RTOL)}
# A per-micro-batch control must miss the oracle by more than this many tolerances wherever a window's
# micro-batches drew unequal counts (bf16's tolerance is ~3000 times wider, its factor smaller).
CONTROL_FACTORS = {"fp32": 100, "bf16": 10}

# Normalizations: the whole window's masked tokens (NVIDIA's); each micro-batch's own masked tokens
# (Dream's); each example by its answer length, the mean over the batch (LLaDA's SFT recipe). The last two
# are per micro-batch, so a window of them is the mean of its micro-batches' losses.
WINDOW, MASKED_TOKENS, ANSWER_LENGTH = "window", "masked_tokens", "answer_length"


@dataclass(frozen=True)
class Objective:
    """A family's published masked-diffusion objective: its noise floor, its shift rule, its normalization."""

    eps: float  # p_mask = (1-eps)·t + eps
    shift: bool  # an autoregressive model adapted to diffusion: position i's logits predict token i + 1
    normalization: str


# By the name of the Unsloth profile a checkpoint resolves to.
OBJECTIVES = {
    "nemotron_labs_diffusion": Objective(1e-3, False, WINDOW),  # NVIDIA's forward_process
    "dream": Objective(0.0, True, MASKED_TOKENS),  # Dream's q_sample: t ~ U(0, 1), no floor
    "llada": Objective(1e-3, False, ANSWER_LENGTH),  # LLaDA's GUIDELINES.md SFT
}


def tolerance(reference, precision="fp32"):
    atol, rtol = TOLERANCES[precision]
    scale = reference.abs().max().item() if torch.is_tensor(reference) else abs(reference)
    return atol + rtol * scale


def describe_tolerance(precision="fp32"):
    """How every table states the tolerance it was judged by."""
    atol, rtol = TOLERANCES[precision]
    return f"tolerance per tensor {atol:g} + {rtol:g}·max|ref|"


def clip_gradients(grads, max_norm):
    """What torch.nn.utils.clip_grad_norm_ does to a set of gradients: scale all by
    min(1, max_norm / (total 2-norm + 1e-6))."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return {name: g * scale for name, g in grads.items()}


def max_error(a, b):
    return (a.detach().double() - b.detach().double()).abs().max().item() if a.numel() else 0.0


@dataclass
class Masks:
    """One micro-batch as the model saw it: clean tokens, which were masked, and their p_mask."""

    tokens: torch.Tensor
    masked: torch.Tensor
    p_mask: torch.Tensor
    maskable: torch.Tensor = None  # the positions that could be masked: an example's answer length


@dataclass
class DeviceRng:
    """The state of an accelerator's generator that a run's noise was drawn from (the CPU generator's state
    is a plain tensor): its draws are replayed on that device, since its generator is another algorithm."""

    device: str
    state: torch.Tensor


def rng_state(device="cpu"):
    """What `replay_noise` replays from: the state of the generator that draws on `device`."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.get_rng_state()
    return DeviceRng(str(device), getattr(torch, device.type).get_rng_state(device))


@contextlib.contextmanager
def _replaying(rng_state):
    """Within: the global generator `rng_state` names, at that state; the device to draw on. Restored after."""
    if not isinstance(rng_state, DeviceRng):
        rng_state = DeviceRng("cpu", rng_state)
    device = torch.device(rng_state.device)
    if device.type == "cpu":
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(rng_state.state)
            yield device
        return
    with torch.random.fork_rng(devices=[device], device_type=device.type):
        getattr(torch, device.type).set_rng_state(rng_state.state, device)
        yield device


@dataclass(frozen=True)
class BlockDiffusion:
    """NVIDIA's block-diffusion objective: its block size and the weight of the diffusion term (the recipe's
    ar_loss_alpha; the AR term's weight is 1)."""

    block_size: int
    alpha: float = 0.3
    max_length: int = None  # the run's: a row that long was clipped, and gets no fill


def block_filled(batch, block_size, eos_id, max_length=None):
    """The micro-batch as the block-diffusion collator leaves it: every row's real tokens followed by EOS up to
    the next multiple of the block size, supervised where the row has an answer; the batch padded to the
    next multiple of the block size; a row as long as `max_length` (clipped) gets none. (batch with the padding
    marked unattended, the supervised fill)"""
    tokens, labels = batch["input_ids"], batch["labels"]
    attention = batch.get("attention_mask")
    if attention is None:
        attention = torch.ones_like(tokens)
    rows, length = tokens.shape
    wide = -(-length // block_size) * block_size
    grow = lambda t, value: torch.cat([t, torch.full((rows, wide - length), value, dtype=t.dtype)], 1)  # noqa: E731
    real = attention.sum(dim=1)
    ends = -(-real // block_size) * block_size
    position = torch.arange(wide)[None, :]
    fill = (position >= real[:, None]) & (position < ends[:, None])
    has_answer = (labels != -100).any(dim=1, keepdim=True)
    if max_length is not None:
        has_answer = has_answer & (real[:, None] < max_length)
    grown = {**batch, "input_ids": grow(tokens, eos_id), "labels": grow(labels, -100)}
    grown["attention_mask"] = grow(attention, 0)
    return grown, fill & has_answer


def replay_noise(batches, rng_state, eps, eos_id, complementary=False, block=None):
    """Draw each micro-batch's masks from `rng_state` (see `rng_state`), in micro-batch order, t before the
    per-token draw; a batch that carries per-sample generator seeds ("keys") draws each row from its own
    (CPU) generator, and one that carries strata ("strata": per row (k, n), stratified levels) moves each
    row's t to (k + t) / n. `complementary`: every row is followed, in a second half of the micro-batch, by its
    partner: the complement of its mask among its maskable tokens at p_mask 1 - p where 1 - p >= eps, else
    the same mask at p. `block`: NVIDIA's block-diffusion mode (`block_filled`): the rows filled and the
    maskable tokens their answer and its fill. The masks are CPU tensors whatever device drew them."""
    masks = []
    with _replaying(rng_state) as device:
        for batch in batches:
            fill = None
            if block is not None:
                batch, fill = block_filled(batch, block.block_size, eos_id, block.max_length)
            tokens, labels = batch["input_ids"], batch["labels"]
            attention = batch.get("attention_mask")
            padding = torch.zeros_like(tokens, dtype=torch.bool) if attention is None else attention == 0
            tokens = torch.where(padding, eos_id, tokens)
            response = (labels != -100) & ~padding
            has_response = response.any(dim=1, keepdim=True)
            maskable = response | (padding & has_response) if fill is None else response | fill
            rows, length = tokens.shape
            if batch.get("keys") is None:  # the global RNG: t for every row, then every token
                t = torch.rand(rows, device=device).cpu()
                u = torch.rand(rows, length, device=device).cpu()
            else:  # per-sample: a generator per row, t, its real tokens in order, then its padding
                t, u = torch.empty(rows), torch.empty(rows, length)
                for row, key in enumerate(batch["keys"]):
                    generator = torch.Generator().manual_seed(int(key))
                    real = ~padding[row]
                    t[row] = torch.rand(1, generator=generator)[0]
                    u[row, real] = torch.rand(int(real.sum()), generator=generator)
                    u[row, ~real] = torch.rand(int((~real).sum()), generator=generator)
            if batch.get("strata") is not None:
                t = torch.tensor([(k + float(t[row])) / n for row, (k, n) in enumerate(batch["strata"])])
            p_mask = ((1 - eps) * t + eps)[:, None].expand(rows, length)
            masked = (u < p_mask) & maskable
            if complementary:
                level = p_mask[:, 0]
                complement = level <= 1 - eps
                partner_masked = torch.stack(
                    [maskable[r] & ~masked[r] if complement[r] else masked[r] for r in range(rows)]
                )
                partner_p = torch.stack([1 - p_mask[r] if complement[r] else p_mask[r] for r in range(rows)])
                tokens, maskable = torch.cat([tokens, tokens]), torch.cat([maskable, maskable])
                masked, p_mask = torch.cat([masked, partner_masked]), torch.cat([p_mask, partner_p])
            masks.append(Masks(tokens, masked, p_mask, maskable))
    return masks


@dataclass
class Reference:
    loss: float
    count: int  # masked tokens of the window
    counts: list  # per micro-batch
    grads: dict  # name -> gradient of every trainable parameter


def row_weights(masks, normalization):
    """Per micro-batch, the factor each row's CE/p_mask sum gets in a per-micro-batch normalization,
    including the 1/micro-batches of Trainer's average over the window."""
    weights = []
    for m in masks:
        rows = m.tokens.shape[0]
        if normalization == MASKED_TOKENS:
            weight = torch.full((rows,), 1.0 / (len(masks) * max(int(m.masked.sum()), 1)), dtype=torch.float64)
        elif normalization == ANSWER_LENGTH:
            weight = 1.0 / (len(masks) * rows * m.maskable.sum(dim=1).clamp_min(1).double())
        else:
            raise ValueError(f"no per-micro-batch normalization {normalization!r}")
        weights.append(weight)
    return weights


def scores(model, input_ids, shift=False):
    """The model's fp32 logits for `input_ids` (a ModelOutput's, or the first element where a forward returns a
    plain tuple); `shift`: position i's logits moved to i + 1, position 0 scored by its own."""
    output = model(input_ids=input_ids)
    logits = (output.logits if hasattr(output, "logits") else output[0]).float()
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1) if shift else logits


def hits(chosen, targets):
    """How many of the tokens `targets` have the highest logit of their row of `chosen` (a tie at the top counts)."""
    return sum(int(logit[target] >= logit.max()) for logit, target in zip(chosen, targets))


def window_loss(model, masks, mask_id, inverse_t=True, shift=False, normalization=WINDOW):
    """sum over the window of CE/p_mask at masked positions, divided by the window's masked tokens (or, for a
    per-micro-batch `normalization`, each micro-batch by its own, averaged). `shift`: the target at position i
    is scored by the logits of position i - 1 (position 0 by its own)."""
    total = sum(int(m.masked.sum()) for m in masks)
    weights = None if normalization == WINDOW else row_weights(masks, normalization)
    by_length = {}
    for m, weight in zip(masks, weights or [None] * len(masks)):
        by_length.setdefault(m.tokens.shape[1], []).append((m, weight))
    device = next(model.parameters()).device  # the model's: the oracle runs where the run it judges ran
    summed = torch.zeros((), dtype=torch.float64, device=device)
    for group in by_length.values():
        tokens = torch.cat([m.tokens for m, _ in group]).to(device)
        masked = torch.cat([m.masked for m, _ in group]).to(device)
        p_mask = torch.cat([m.p_mask for m, _ in group]).to(device)
        logits = scores(model, torch.where(masked, mask_id, tokens), shift)
        token_loss = F.cross_entropy(logits[masked], tokens[masked], reduction="none")
        if inverse_t:
            token_loss = token_loss / p_mask[masked]
        if weights is not None:
            row = torch.cat([weight for _, weight in group]).to(device)
            token_loss = token_loss.double() * row[:, None].expand(masked.shape)[masked]
        summed = summed + token_loss.sum().double()
    return (summed / max(total, 1) if weights is None else summed).float(), total


def block_diffusion_logits(model, tokens, masked, mask_id, block_size):
    """(noisy half's logits, clean half's logits) of NVIDIA's block-diffusion forward, built here from its
    description with the model's backbone and head: the sequence [noisy; clean], each half at positions 0..L-1,
    and which of its 2L tokens each one sees."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    length = tokens.shape[1]
    device = tokens.device
    sequence = torch.cat([torch.where(masked, mask_id, tokens), tokens], dim=1)
    index = torch.arange(2 * length, device=device)
    half, position = index // length, index % length  # half 0: noisy, 1: clean
    block = position // block_size
    q, k = (slice(None), None), (None, slice(None))
    sees = (
        ((half[q] == 0) & (half[k] == 0) & (block[q] == block[k]))  # its own noisy block
        | ((half[q] == 0) & (half[k] == 1) & (block[k] < block[q]))  # the clean copy of earlier blocks
        | ((half[q] == 1) & (half[k] == 1) & (position[k] <= position[q]))  # clean: causal
    )
    hidden = _backbone(base.model, sequence, torch.cat([position[:length]] * 2), sees)
    logits = base.get_output_embeddings()(hidden).float()
    return logits[:, :length], logits[:, length:]


def _backbone(backbone, tokens, positions, sees):
    """The tiny backbone's last hidden states with attention computed here, softmax(q k^T / sqrt(d)) v over the
    keys `sees` allows: the weights are the model's (LoRA's too), the attention rule is this file's, whichever
    attention the model was built with."""
    x = backbone.embed_tokens(tokens) + backbone.embed_positions(positions)[None]
    hidden_bias = torch.zeros(sees.shape, dtype=x.dtype, device=x.device).masked_fill(~sees, torch.finfo(x.dtype).min)
    for layer in backbone.layers:
        attention, h = layer.self_attn, layer.input_layernorm(x)
        heads = (*h.shape[:2], attention.heads, attention.head_dim)
        q, k, v = (
            project(h).view(heads).transpose(1, 2) for project in (attention.q_proj, attention.k_proj, attention.v_proj)
        )
        weights = (q @ k.transpose(-1, -2) / math.sqrt(attention.head_dim) + hidden_bias).softmax(-1)
        x = x + attention.o_proj((weights @ v).transpose(1, 2).reshape(*h.shape[:2], -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return backbone.norm(x)


def block_diffusion_loss(model, masks, mask_id, objective):
    """(loss, masked tokens, supervised tokens) of the window under NVIDIA's block-diffusion objective: alpha ·
    the diffusion sum over the window's masked tokens + the AR sum over its supervised tokens (each predicted
    from the clean half's logits one position before), each divided by its own count over the whole window."""
    masked_total = sum(int(m.masked.sum()) for m in masks)
    supervised_total = sum(int(m.maskable.sum()) for m in masks)
    device = next(model.parameters()).device
    diffusion = torch.zeros((), dtype=torch.float64, device=device)
    ar = torch.zeros((), dtype=torch.float64, device=device)
    for m in masks:
        tokens, masked, p_mask = m.tokens.to(device), m.masked.to(device), m.p_mask.to(device)
        noisy_logits, clean_logits = block_diffusion_logits(model, tokens, masked, mask_id, objective.block_size)
        diffusion = (
            diffusion
            + (F.cross_entropy(noisy_logits[masked], tokens[masked], reduction="none") / p_mask[masked]).sum().double()
        )
        supervised = m.maskable.to(device)[:, 1:]
        ar = ar + F.cross_entropy(clean_logits[:, :-1][supervised], tokens[:, 1:][supervised], reduction="sum").double()
    loss = objective.alpha * diffusion / max(masked_total, 1) + ar / max(supervised_total, 1)
    return loss.float(), masked_total, supervised_total


def window_reference(model, masks, mask_id, inverse_t=True, shift=False, normalization=WINDOW, block=None):
    """The window's loss and the autograd gradient of every trainable parameter. `block`: a BlockDiffusion, for
    NVIDIA's block-diffusion objective."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if block is not None:
        loss, total, _ = block_diffusion_loss(model, masks, mask_id, block)
    else:
        loss, total = window_loss(model, masks, mask_id, inverse_t, shift, normalization)
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    grads = {name: torch.zeros_like(p) if g is None else g for (name, p), g in zip(params.items(), grads)}
    return Reference(loss.item(), total, [int(m.masked.sum()) for m in masks], grads)


def data_parallel_reference(model, masks_by_rank, mask_id, inverse_t=True, rank_local=False, **objective):
    """What every rank's gradient must be after DDP's all-reduce.

    Counts summed across ranks (average_tokens_across_devices=True): the one window of all ranks' data,
    sum(S) / sum(N). Rank-local counts (False): the mean over ranks of each rank's own window loss, as
    DDP averages the rank-local gradients. `objective`: window_loss's shift and normalization (one rank)."""
    if not rank_local:
        masks = [m for masks in masks_by_rank for m in masks]
        return window_reference(model, masks, mask_id, inverse_t, **objective)
    own = {"block": objective["block"]} if objective.get("block") is not None else {}
    references = [window_reference(model, masks, mask_id, inverse_t, **own) for masks in masks_by_rank]
    ranks = len(references)
    grads = {name: sum(r.grads[name] for r in references) / ranks for name in references[0].grads}
    return Reference(
        sum(r.loss for r in references) / ranks,
        sum(r.count for r in references),
        [c for r in references for c in r.counts],
        grads,
    )


def evaluation_losses(model, masks, mask_id, inverse_t=True):
    """Evaluation keeps the single-batch denominator: each micro-batch by its own masked count."""
    with torch.no_grad():
        return [window_loss(model, [m], mask_id, inverse_t)[0].item() for m in masks]


def evaluation_scores(model, masks, mask_id, shift=False, buckets=5):
    """What a keyed evaluation logs beyond its loss, from the replayed masks of every batch and draw: the share
    of masked tokens whose logit is the highest of their position (a tie at the top counts), and per noise-level
    bucket k (a row's p_mask in [k/B, (k+1)/B), p = 1 in the last) the mean cross-entropy of its rows' masked
    tokens, unweighted.
    (accuracy or None, {k: CE} of the buckets that hold a masked token). Full logits, one row at a time."""
    hit = total = 0
    sums, counts = [0.0] * buckets, [0] * buckets
    device = next(model.parameters()).device
    with torch.no_grad():
        for m in masks:
            for row in range(m.tokens.shape[0]):
                tokens, masked = m.tokens[row : row + 1].to(device), m.masked[row : row + 1].to(device)
                logits = scores(model, torch.where(masked, mask_id, tokens), shift)
                level = float(m.p_mask[row, 0])
                k = min(int(level * buckets), buckets - 1)
                chosen, targets = logits[masked], tokens[masked]
                sums[k] += F.cross_entropy(chosen, targets, reduction="sum").item()
                counts[k] += int(masked.sum())
                hit += hits(chosen, targets)
                total += int(masked.sum())
    losses = {k: sums[k] / counts[k] for k in range(buckets) if counts[k]}
    return (hit / total if total else None), losses


def low_confidence_decode(model, prompt, length, mask_id, steps, shift=False, block=None):
    """LLaDA's greedy low-confidence remasking, written from its paper and GUIDELINES (not from the plugin): the
    answer starts all [MASK]; min(steps, length) steps unmask length // steps tokens each, one more in the first
    length % steps; each step the model scores the sequence and the still-masked positions whose top softmax
    probability is highest take their argmax token. The answer's token ids.

    `block`: in the order of NVIDIA's `generate`: the answer's blocks of `block` tokens left to right, each
    appended as [MASK]s to what is decoded so far (nothing after it) and unmasked as above in its share of the
    steps (spread evenly over the blocks, one each at least). A model built in block-diffusion mode is scored with
    bidirectional attention computed here (`decoding_scores`)."""
    if block is None:
        return _remask(model, list(prompt), length, mask_id, steps, shift)
    sizes = [min(block, length - first) for first in range(0, length, block)]
    total = max(steps, len(sizes))
    answer = []
    for i, size in enumerate(sizes):
        share = total // len(sizes) + (1 if i < total % len(sizes) else 0)
        answer += _remask(model, list(prompt) + answer, size, mask_id, share, shift)
    return answer


def _remask(model, context, length, mask_id, steps, shift):
    """`length` tokens after `context`, decoded by low-confidence remasking in min(steps, length) steps."""
    steps = max(1, min(steps, length))
    schedule = [length // steps + (1 if s < length % steps else 0) for s in range(steps)]
    answer = [None] * length
    device = next(model.parameters()).device
    with torch.no_grad():
        for take in schedule:
            ids = context + [mask_id if token is None else token for token in answer]
            logits = decoding_scores(model, torch.tensor([ids], device=device), shift)[0]
            probabilities = F.softmax(logits, dim=-1)
            open_positions = [i for i, token in enumerate(answer) if token is None]
            ranked = sorted(open_positions, key=lambda i: -probabilities[len(context) + i].max().item())
            for i in ranked[:take]:
                answer[i] = int(probabilities[len(context) + i].argmax())
    return answer


def decoding_scores(model, input_ids, shift=False):
    """What a decoder reads: the model's logits (`scores`), or for a model built in block-diffusion mode its
    weights under bidirectional attention computed here (every token sees every token: the class NVIDIA's generate
    runs), whichever attention class its layers have now."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "dlm_paradigm", None) != "block_diff":
        return scores(model, input_ids, shift)
    length = input_ids.shape[1]
    sees = torch.ones(length, length, dtype=torch.bool, device=input_ids.device)
    hidden = _backbone(base.model, input_ids, torch.arange(length, device=input_ids.device), sees)
    logits = base.get_output_embeddings()(hidden).float()
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1) if shift else logits


METRIC_NAMES = ("window_masked_tokens", "noise_level_mean", "noise_level_std", "moved_weight_share")
ACCURACY_NAME = "masked_token_accuracy"


def window_accuracy(model, masks_by_rank, mask_id, shift=False, precision="fp32", block=None):
    """A window's masked-token accuracy (every rank's micro-batches): the share of its masked tokens whose logit
    is the highest of their position (a tie at the top counts), or None where nothing is masked; and the share
    whose top two logits lie within the precision's tolerance of each other (a hit the run's own round-off may
    decide either way). Full logits, one micro-batch at a time. `block`: NVIDIA's block-diffusion mode."""
    hit = close = total = 0
    device = next(model.parameters()).device
    with torch.no_grad():
        for m in (m for masks in masks_by_rank for m in masks):
            tokens, masked = m.tokens.to(device), m.masked.to(device)
            if block is None:
                logits = scores(model, torch.where(masked, mask_id, tokens), shift)
            else:  # the noisy half's logits of the block-diffusion forward
                logits = block_diffusion_logits(model, tokens, masked, mask_id, block.block_size)[0]
            chosen, targets = logits[masked], tokens[masked]
            hit += hits(chosen, targets)
            top = chosen.topk(2, dim=-1).values
            close += sum(int(a - b <= tolerance(a, precision)) for a, b in top.tolist())
            total += len(targets)
    return (hit / total if total else None), (close / total if total else 0.0)


def window_metrics(masks_by_rank):
    """What a run logs of one window, from its replayed masks (every data-parallel rank's micro-batches): its
    masked tokens, the mean and population standard deviation of its rows' mask probabilities, and the share
    of its loss weight per-micro-batch normalization moves, 1/2 sum |1/n - N_g / sum N| over its n micro-batches
    (0 where nothing is masked). Plain Python over the masks: no code of the plugin's."""
    counts = [int(m.masked.sum()) for masks in masks_by_rank for m in masks]
    levels = [float(level) for masks in masks_by_rank for m in masks for level in m.p_mask[:, 0]]
    total = sum(counts)
    mean = sum(levels) / len(levels)
    moved = 0.5 * sum(abs(1 / len(counts) - count / total) for count in counts) if total else 0.0
    spread = (sum((level - mean) ** 2 for level in levels) / len(levels)) ** 0.5
    return dict(zip(METRIC_NAMES, (float(total), mean, spread, moved)))

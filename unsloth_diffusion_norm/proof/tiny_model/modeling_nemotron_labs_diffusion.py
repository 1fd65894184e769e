"""A tiny bidirectional transformer shaped like NVIDIA's Nemotron-Labs-Diffusion remote code.

What Unsloth relies on is kept: model_type / architecture names, an `AutoModel` entry, LoRA-able
projection names (q/k/v/o, gate/up/down), gradient checkpointing, and a plain `nn.Linear`
`diffusion_head` returned by `get_output_embeddings()` so the fused-head loss path can be taken.
No dropout: the forward never touches the RNG, so noise draws alone decide the masks.

NVIDIA's `dlm_paradigm="block_diff"` is kept as its class has it. The attention class is chosen when the model
is built: `NemotronLabsDiffusionFlexAttention`, a subclass of the bidirectional one with the same weights, whose
forward ignores the padding mask and calls the module-level `fused_flex_attention(q, k, v, block_mask=...)` with
the block-diffusion rule (`block_diff_rule`) as a FlexAttention block mask. Given labels, the forward runs the
sequence `[noisy; clean]` of twice the row's length, each half at positions 0..L-1; `logits` of the noisy half,
`causal_logits` of the clean half, and its own `(sum, count)` loss unless `skip_loss`. Without labels the rule is
applied to the single row, cut at its middle, as NVIDIA's does. FlexAttention has no backward on a CPU.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import MaskedLMOutput

from .configuration_nemotron_labs_diffusion import NemotronLabsDiffusionConfig


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        size = self.heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, size, bias=False)
        self.o_proj = nn.Linear(size, config.hidden_size, bias=False)

    def forward(self, x, attention_bias):
        batch, length, _ = x.shape

        def split(t):
            return t.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        if attention_bias is not None:
            scores = scores + attention_bias
        out = scores.softmax(-1) @ v  # bidirectional: no causal mask
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


def fused_flex_attention(q, k, v, block_mask=None):
    return flex_attention(q, k, v, block_mask=block_mask)


def block_diff_rule(block_size, q_idx, kv_idx, n):
    """NVIDIA's block-diffusion rule over a sequence whose second half (from `n`) is the clean copy: a noisy
    token sees its own block of the noisy half and the clean half's earlier blocks; a clean token sees the
    clean tokens up to itself."""
    clean_q, clean_kv = q_idx >= n, kv_idx >= n
    block_q = torch.where(clean_q, q_idx - n, q_idx) // block_size
    block_kv = torch.where(clean_kv, kv_idx - n, kv_idx) // block_size
    block_diagonal = (block_q == block_kv) & ~clean_q & ~clean_kv
    offset_block_causal = (block_q > block_kv) & clean_kv & ~clean_q
    causal = (q_idx >= kv_idx) & clean_q & clean_kv
    return block_diagonal | offset_block_causal | causal


class NemotronLabsDiffusionFlexAttention(Attention):
    def __init__(self, config):
        super().__init__(config)
        self.block_size = config.block_size
        self.block_diff_mask = None

    def compute_block_mask(self, q_len, device):
        rule = lambda b, h, q, kv: block_diff_rule(self.block_size, q, kv, q_len // 2)  # noqa: E731
        return create_block_mask(rule, B=None, H=None, Q_LEN=q_len, KV_LEN=q_len, device=device)

    def forward(self, x, attention_bias):  # the padding mask is not read: NVIDIA's block attention takes none
        batch, length, _ = x.shape

        def split(t):
            return t.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        out = fused_flex_attention(q, k, v, block_mask=self.compute_block_mask(length, x.device))
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        block = getattr(config, "dlm_paradigm", "bidirectional") == "block_diff"  # chosen once, as NVIDIA's does
        self.self_attn = (NemotronLabsDiffusionFlexAttention if block else Attention)(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, attention_bias=None):
        x = x + self.self_attn(self.input_layernorm(x), attention_bias)
        return x + self.mlp(self.post_attention_layernorm(x))


class NemotronLabsDiffusionPreTrainedModel(PreTrainedModel):
    config_class = NemotronLabsDiffusionConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DecoderLayer"]

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


class NemotronLabsDiffusionBackbone(NemotronLabsDiffusionPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids, attention_mask=None, position_ids=None, attention_rule=None):
        """`attention_mask`: (batch, length) keys to attend; `attention_rule`: instead, a boolean (query, key) rule
        (the bidirectional attention applies either; the block-diffusion one neither); `position_ids`: one position
        per token (default 0..L-1)."""
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.embed_tokens(input_ids) + self.embed_positions(position_ids)[None]
        bias = None
        if attention_mask is not None or attention_rule is not None:
            keep = attention_mask[:, None, None, :].bool() if attention_rule is None else attention_rule[None, None]
            bias = torch.zeros(keep.shape, dtype=x.dtype, device=x.device).masked_fill(~keep, torch.finfo(x.dtype).min)
        for layer in self.layers:
            x = layer(x, bias)
        return self.norm(x)


@dataclass
class BlockDiffusionOutput(MaskedLMOutput):
    causal_logits: torch.Tensor = None


class NemotronLabsDiffusionModel(NemotronLabsDiffusionPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = NemotronLabsDiffusionBackbone(config)
        self.diffusion_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.diffusion_head

    def set_output_embeddings(self, value):
        self.diffusion_head = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        labels=None,
        masked_indices=None,
        p_mask=None,
        skip_loss=False,
        **kwargs,
    ):
        if getattr(self.config, "dlm_paradigm", "bidirectional") == "block_diff":
            return self._block_diff(input_ids, labels, masked_indices, p_mask, skip_loss)
        hidden = self.model(input_ids, attention_mask)
        return MaskedLMOutput(logits=self.diffusion_head(hidden))

    def _block_diff(self, input_ids, labels, masked_indices, p_mask, skip_loss, eps=1e-3):
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        sequence = input_ids
        if labels is not None:
            if masked_indices is None:  # NVIDIA's forward_process: t per row, then one uniform per token
                t = torch.rand(input_ids.shape[0], device=input_ids.device)
                p_mask = ((1 - eps) * t + eps)[:, None].expand(-1, length)
                masked_indices = torch.rand(input_ids.shape, device=input_ids.device) < p_mask
            noisy = torch.where(masked_indices, self.config.mask_token_id, input_ids)
            sequence = torch.cat([noisy, input_ids], dim=1)
            positions = torch.cat([positions, positions])  # each half at its own positions
        logits = self.diffusion_head(self.model(sequence, position_ids=positions))
        if labels is None:
            return BlockDiffusionOutput(logits=logits)
        logits, causal_logits = logits[:, :length], logits[:, length:]
        loss = None
        if not skip_loss:  # NVIDIA's own: (diffusion sum + w * AR sum, masked + int(w * L))
            diffusion = (
                nn.functional.cross_entropy(logits[masked_indices], labels[masked_indices], reduction="none")
                / p_mask[masked_indices]
            ).sum()
            ar = nn.functional.cross_entropy(
                causal_logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), reduction="sum"
            )
            weight = self.config.ar_loss_weight
            loss = (diffusion + weight * ar, masked_indices.sum() + int(weight * length))
        return BlockDiffusionOutput(loss=loss, logits=logits, causal_logits=causal_logits)

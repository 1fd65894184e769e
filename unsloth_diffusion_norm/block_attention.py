"""The attention of NVIDIA's block-diffusion mode, as its model class has it, for the runs that need more of it
than the class gives. The class picks its attention when the model is built, from `dlm_paradigm`: in `block_diff`
mode `NemotronLabsDiffusionFlexAttention`, a subclass of the bidirectional attention (the same weights) that calls
its module's `fused_flex_attention(q, k, v, block_mask=...)` with the block-diffusion rule.

- `diffusion_paradigm` asks a built model for the other mode: its attention layers get the other class and its
  config the mode, as the recipe's override of the config at load would have built them.
- On a CPU FlexAttention has no backward: the module's `fused_flex_attention` is given the same rule, evaluated
  at every (query, key) pair, as a boolean mask through SDPA. On a GPU the model's own FlexAttention runs.
"""

import contextlib
import sys

import torch

from . import config
from .registry import Patch

FLEX_CLASS = "NemotronLabsDiffusionFlexAttention"
FLEX_FUNCTION = "fused_flex_attention"


def dense_flex_attention(q, k, v, block_mask=None, **kwargs):
    """FlexAttention's output for `block_mask` through SDPA: its rule (`mask_mod`) at every (query, key) pair as a
    boolean mask. The same scale (1/sqrt(head dim)); every query of the block-diffusion rule sees itself, so no row
    is all masked (where SDPA and FlexAttention would differ)."""
    from torch.nn.attention.flex_attention import create_mask

    mask = create_mask(block_mask.mask_mod, None, None, q.shape[-2], k.shape[-2], device=q.device)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)


def _flex_class(model):
    """NVIDIA's block-diffusion attention class, from the module of whichever of the model's classes defines it
    (the remote code's), or None."""
    for module in model.modules():
        found = getattr(sys.modules.get(type(module).__module__), "__dict__", {}).get(FLEX_CLASS)
        if isinstance(found, type):
            return found
    return None


class LayerClasses(Patch):
    """One patch for every attention layer of a model: each layer's class set to `target` (a class of the same
    weights), and back on revert. What the class's __init__ adds is set too: the block size."""

    def __init__(self, layers, target, block_size, why):
        super().__init__(f"attention layers -> {target.__name__}", layers, "__class__", None, why)
        self.target, self.block_size = target, block_size

    def apply(self):
        self.saved = [type(layer) for layer in self.owner]
        for layer in self.owner:
            layer.__class__ = self.target
            layer.block_size, layer.block_diff_mask = self.block_size, None
        self.installed = self.target

    def in_place(self):
        return self.installed is not None and all(type(layer) is self.installed for layer in self.owner)

    def revert(self):
        for layer, was in zip(self.owner, self.saved):
            layer.__class__ = was
        self.saved = self.installed = None


def patches(model, model_config, paradigm, block_size):
    """What a run of `paradigm` (the flag's, or the config's own: `block_diffusion.paradigm_of`) needs of the built
    model: its attention switched where the config says the other mode, and the CPU's stand-in for FlexAttention.
    ValueError, in one line, where the model's class has no block-diffusion attention to switch to."""
    found = []
    own = getattr(model_config, config.PARADIGM_FIELD, None) or config.BIDIRECTIONAL
    flex = _flex_class(model)
    if paradigm != own:
        asked = f"{config.PARADIGM.name}={paradigm!r}"
        if flex is None:
            raise ValueError(
                f"{config.PREFIX}{asked}: the model's class ({type(model).__name__}) has no {FLEX_CLASS} to switch "
                f"its attention to; train a Nemotron-Labs-Diffusion checkpoint, or leave {config.PARADIGM.name} None."
            )
        plain = flex.__mro__[1]  # the bidirectional attention, which the block-diffusion one extends
        source, target = (plain, flex) if paradigm == config.BLOCK_DIFF else (flex, plain)
        layers = [layer for layer in model.modules() if type(layer) is source]
        if not layers:
            raise ValueError(
                f"{config.PREFIX}{asked}: no {source.__name__} layer in the model to switch; load the checkpoint "
                f"with FastModel.from_pretrained(..., {config.PARADIGM_FIELD}={paradigm!r}) instead."
            )
        found += [
            Patch(
                f"model config .{config.PARADIGM_FIELD}",
                model_config,
                config.PARADIGM_FIELD,
                lambda current: paradigm,
                f"{asked}: the model's forward reads its mode from its config",
            ),
            LayerClasses(
                layers,
                target,
                block_size,
                f"{asked}: the attention the model's class builds for that mode, on the same weights",
            ),
        ]
    on_cpu = next(model.parameters()).device.type == "cpu"
    if paradigm == config.BLOCK_DIFF and on_cpu and flex is not None:
        module = sys.modules[flex.__module__]
        if hasattr(module, FLEX_FUNCTION):
            found.append(
                Patch(
                    f"{module.__name__.rpartition('.')[2]}.{FLEX_FUNCTION}",
                    module,
                    FLEX_FUNCTION,
                    lambda current: dense_flex_attention,
                    "FlexAttention has no backward on a CPU: the same block-diffusion rule as a boolean mask "
                    "through SDPA",
                )
            )
    return found


@contextlib.contextmanager
def bidirectional(model, model_config):
    """The model with its bidirectional attention (the same weights) and mode for the duration, where it is in
    `block_diff` mode: how its samples are decoded, block by block, as NVIDIA's generate runs the bidirectional
    class. Put back as it was on the way out; a bidirectional model is left alone."""
    own = getattr(model_config, config.PARADIGM_FIELD, None)
    size = getattr(model_config, "block_size", None)  # (kept on the layers, for their block attention after)
    switched = patches(model, model_config, config.BIDIRECTIONAL, size) if own == config.BLOCK_DIFF else []
    done = []
    try:
        for patch in switched:
            patch.apply()
            done.append(patch)
        yield model
    finally:
        for patch in reversed(done):
            patch.revert()

"""Which patch set each recognised code shape of Unsloth gets, and the mode it puts the plugin in.

- 2026.10.4-.6 (the dense and chunked shapes): `patched`, the window-normalized loss and the flags;
- 2026.10.7+ (the native shape): `native`, the flags, and what a flag asks for set up on each trainer alone;
- a disabled plugin (UNSLOTH_DIFFUSION_NORM=0, no shape of its own): `construction.flags_only`, the flags
  accepted and a set one refused.

Every wrapper, class-level or per-trainer, follows the one contract of `wrappers`. Only Unsloth's own diffusion
classes are touched (DiffusionTrainer, DiffusionConfig, MaskedDiffusionProfile and the Nemotron profile
instance), never transformers.Trainer or trl.SFTTrainer: Unsloth re-creates those methods from source text and
would drop a wrapper.
"""

from . import detect, native, patched, registry

PATCH_SETS = {
    detect.DENSE: (patched.release_patches, registry.PATCHED),
    detect.CHUNKED: (patched.release_patches, registry.PATCHED),
    detect.UPSTREAM: (native.release_patches, registry.NATIVE),
}

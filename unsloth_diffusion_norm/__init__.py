"""Window-normalized masked-diffusion loss for Unsloth's DiffusionTrainer.

    import unsloth_diffusion_norm      # before `from unsloth import FastModel`

Unsloth 2026.10.4-.6 divide each micro-batch's weighted loss by its own masked-token count; NVIDIA's
Nemotron-Labs-Diffusion training divides by the count of the whole optimizer step. Importing this
package patches those releases through post-import hooks (whether Unsloth is imported already or
not), stands down on releases that are right natively, and never imports torch or Unsloth itself.
Set UNSLOTH_DIFFUSION_NORM=0 to turn the import-time patching off.
"""

import os

from .activation import apply, status, unpatch

__all__ = ["apply", "status", "unpatch", "ENV"]
__version__ = "0.1.0"
ENV = "UNSLOTH_DIFFUSION_NORM"

if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
    from .activation import disable

    disable(f"{ENV}={os.environ[ENV]}")
else:
    from .activation import register_hooks

    register_hooks()

"""Window-normalized masked-diffusion loss for Unsloth's DiffusionTrainer.

    import unsloth_diffusion_norm      # before `from unsloth import FastModel`

Unsloth 2026.10.4-.6 divide each micro-batch's weighted loss by its own masked-token count; NVIDIA's
Nemotron-Labs-Diffusion training divides by the count of the whole optimizer step. Importing this
package patches those releases through post-import hooks (whether Unsloth is imported already or
not), stands down on releases that are right natively, and never imports torch or Unsloth itself.
Set UNSLOTH_DIFFUSION_NORM=0 to turn the import-time patching off.
"""

import os

from .activation import apply, unpatch, unpatched
from .report import status

__all__ = ["apply", "status", "unpatch", "unpatched", "ENV"]
__version__ = "0.1.0"
ENV = "UNSLOTH_DIFFUSION_NORM"
OFF, ON = ("0", "false", "no", "off"), ("1", "true", "yes", "on", "")


def _switch():
    from .activation import disable, register_hooks
    from .report import warn_once

    value = os.environ.get(ENV, "1")
    if value.strip().lower() in OFF:
        return disable(f"{ENV}={value}")
    if value.strip().lower() not in ON:
        warn_once(
            f"{ENV}={value!r} is not understood, so patching stays on; "
            f"use one of {', '.join(OFF)} to turn it off, or {', '.join(v for v in ON if v)} to keep it on."
        )
    register_hooks()


_switch()

"""What the plugin tells: status() and its `Status`, what a run gets by default in each mode, and warnings said
once per process. Imports neither torch nor Unsloth (nor dataclasses: `import unsloth_diffusion_norm` stays cheap).
"""

from . import registry
from .registry import STATE, logger

_announced = set()


def warn_once(message):
    """One warning per process for each message."""
    message = f"unsloth_diffusion_norm: {message}"
    if message not in _announced:
        _announced.add(message)
        logger.warning(message)


# Why a mode that patches is the mode it is (the other modes' reasons are set where they happen).
REASONS = {
    registry.NATIVE: (
        "this release normalizes by the window natively; its own noise is drawn while a window is fetched, "
        "before a resumed run's RNG is restored, so the plugin draws it at the window's first step instead"
    )
}
# A disabled plugin's training path is the release's, whatever the flags say.
DISABLED_DEFAULTS = (
    "the release's own training path; the DiffusionConfig flags are accepted, and a trainer whose flag "
    "is set is refused at construction"
)


def defaults(mode):
    """What a run gets unless its DiffusionConfig opts into something else, in this mode (from the flags'
    records: config.defaults_line), or None."""
    if mode == registry.DISABLED:
        return DISABLED_DEFAULTS
    if mode in (registry.PATCHED, registry.NATIVE):
        from . import config  # here, not at the top: `import unsloth_diffusion_norm` stays without dataclasses

        return config.defaults_line(mode)
    return None


class Status:
    """What status() reports; read-only by convention."""

    FIELDS = ("mode", "unsloth_version", "shape", "reason", "patches", "defaults", "displaced", "asked")

    def __init__(self, mode, unsloth_version, shape, reason, patches, defaults=None, displaced=(), asked=()):
        self.mode = mode
        self.unsloth_version = unsloth_version
        self.shape = shape
        self.reason = reason
        self.patches = patches  # (name, why) for every applied patch
        self.defaults = defaults  # what a run gets unless its DiffusionConfig opts into something else
        self.displaced = displaced  # names of applied patches that something else has replaced since
        self.asked = asked  # the per-run opt-ins (lower-variance fields) of the trainers alive in this process

    def __eq__(self, other):
        return isinstance(other, Status) and all(getattr(self, f) == getattr(other, f) for f in self.FIELDS)

    def __repr__(self):
        return "Status(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS) + ")"

    def __str__(self):
        lines = [f"unsloth_diffusion_norm: mode={self.mode}, Unsloth {self.unsloth_version or 'not imported'}"]
        if self.shape:
            lines.append(f"  recognised shape: {self.shape}")
        if self.reason:
            lines.append(f"  reason: {self.reason}")
        if self.defaults:
            lines.append(f"  defaults: {self.defaults}")
        lines += [f"  patched {name}: {why}" for name, why in self.patches]
        lines += [
            f"  DISPLACED {name}: something replaced this patch after it was applied; the fix is not in force there"
            for name in self.displaced
        ]
        if self.asked:
            lines.append(f"  a trainer in this process asked for: {', '.join(self.asked)}")
        return "\n".join(lines)


def status():
    """Unsloth version, mode (pending / patched / native / disabled / unpatched / unsupported / broken) and
    every patch."""
    return Status(
        STATE.mode,
        STATE.unsloth_version,
        STATE.shape,
        STATE.reason,
        tuple((name, patch.why) for name, patch in registry.applied()),
        defaults(STATE.mode) if STATE.patches else None,
        # Only the process-wide set: a trainer's own patches may be wrapped on that trainer by design.
        tuple(patch.name for patch in STATE.patches if not patch.in_place()),
        _asked_by_trainers(),
    )


def _asked_by_trainers():
    """Per-run fields live on each trainer's args, not in the process: those of the trainers alive now."""
    if not STATE.trainers:
        return ()
    from . import config  # here, not at the top: `import unsloth_diffusion_norm` stays without dataclasses

    return tuple(
        sorted({field for trainer in list(STATE.trainers) for field in config.lower_variance_fields(trainer.args)})
    )

"""Patches as data: each one names where it goes, what it replaces, why, and how to undo it.

The list of applied patches *is* what status() reports. A patch set applies all or nothing.
Imports neither torch nor Unsloth.
"""

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

logger = logging.getLogger("unsloth_diffusion_norm")
MISSING = object()

# Modes status() reports.
PENDING = "pending"  # Unsloth not imported yet; hooks are waiting
PATCHED = "patched"  # an affected release, fixed by our patches
NATIVE = "native"  # the release normalizes by the window itself; only the per-run flag is added
DISABLED = "disabled"  # UNSLOTH_DIFFUSION_NORM=0
UNSUPPORTED = "unsupported"  # a release or shape we do not recognise; nothing patched


@dataclass
class Patch:
    name: str
    owner: Any  # a class, an instance, or a dict when `item` is set
    attribute: str
    make: Callable[[Any], Any]  # what is there now (MISSING if nothing) -> the replacement
    why: str
    item: bool = False
    saved: Any = field(default=MISSING, repr=False)  # the owner's own value before apply

    def _own(self):
        own = self.owner if self.item else vars(self.owner)
        return own.get(self.attribute, MISSING)

    def apply(self):
        self.saved = self._own()
        current = self.saved if self.item else getattr(self.owner, self.attribute, MISSING)
        self._set(self.make(current))

    def revert(self):
        if self.saved is MISSING:
            if self.item:
                del self.owner[self.attribute]
            else:
                delattr(self.owner, self.attribute)
        else:
            self._set(self.saved)
        self.saved = MISSING

    def _set(self, value):
        if self.item:
            self.owner[self.attribute] = value
        else:
            setattr(self.owner, self.attribute, value)


@dataclass
class State:
    mode: str = PENDING
    unsloth_version: str = None
    shape: str = None  # which code shape of Unsloth was recognised
    reason: str = None  # why nothing was patched, when nothing was
    patches: list = field(default_factory=list)


STATE = State()


def apply_all(patches):
    """Apply every patch or none: on any failure, undo what was applied and re-raise."""
    done = []
    try:
        for patch in patches:
            patch.apply()
            done.append(patch)
    except Exception:
        for patch in reversed(done):
            patch.revert()
        raise
    STATE.patches = list(patches)


def revert_all():
    for patch in reversed(STATE.patches):
        patch.revert()
    STATE.patches = []

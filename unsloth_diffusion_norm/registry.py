"""Patches as data: each one names where it goes, what it replaces, why, and how to undo it.

The list of applied patches *is* what status() reports. A patch set applies all or nothing. All the plugin
keeps on a trainer sits in its one PerTrainer, so revert_all() gives every trainer back too.
Imports neither torch nor Unsloth.
"""

import logging
import weakref

logger = logging.getLogger("unsloth_diffusion_norm")
MISSING = object()

# Modes status() reports.
PENDING = "pending"  # Unsloth not imported yet; hooks are waiting
PATCHED = "patched"  # an affected release, fixed by our patches
NATIVE = "native"  # the release normalizes by the window itself; only the per-run flag is added
DISABLED = "disabled"  # UNSLOTH_DIFFUSION_NORM=0: the flags are accepted, the training path is the release's
UNPATCHED = "unpatched"  # the user called unpatch(); remembered until apply()
UNSUPPORTED = "unsupported"  # a release or shape we do not recognise; nothing patched
BROKEN = "broken"  # the plugin's own installation is incomplete (a dependency is missing); nothing patched
MODES = (PENDING, PATCHED, NATIVE, DISABLED, UNPATCHED, UNSUPPORTED, BROKEN)  # every mode, in the order above


# Plain classes, not dataclasses: `import unsloth_diffusion_norm` stays cheap (dataclasses pulls inspect).
class Patch:
    def __init__(self, name, owner, attribute, make, why, item=False):
        self.name = name
        self.owner = owner  # a class, an instance, or a dict when `item` is set
        self.attribute = attribute
        self.make = make  # what is there now (MISSING if nothing) -> the replacement
        self.why = why
        self.item = item
        self.saved = MISSING  # the owner's own value before apply
        self.installed = MISSING  # what apply put there

    def __repr__(self):
        return f"Patch({self.name!r})"

    def _own(self):
        own = self.owner if self.item else vars(self.owner)
        return own.get(self.attribute, MISSING)

    def apply(self):
        self.saved = self._own()
        current = self.saved if self.item else getattr(self.owner, self.attribute, MISSING)
        self.installed = self.make(current)
        self._set(self.installed)

    def in_place(self):
        """Is what apply() put there still there (nothing else has replaced it since)?"""
        return self.installed is not MISSING and self._own() is self.installed

    def revert(self):
        if self.saved is MISSING:
            if self.item:
                del self.owner[self.attribute]
            else:
                delattr(self.owner, self.attribute)
        else:
            self._set(self.saved)
        self.saved = self.installed = MISSING

    def _set(self, value):
        if self.item:
            self.owner[self.attribute] = value
        else:
            setattr(self.owner, self.attribute, value)


class State:
    def __init__(self):
        self.mode = PENDING
        self.unsloth_version = None
        self.shape = None  # which code shape of Unsloth was recognised
        self.reason = None  # why nothing was patched, when nothing was
        self.patches = []
        self.trainers = weakref.WeakSet()  # every trainer that carries a PerTrainer: revert_all reaches each


STATE = State()
PER_TRAINER = "_diffusion_norm"  # trainer.__dict__ key of its PerTrainer


class PerTrainer:
    """Everything the plugin keeps on one trainer."""

    def __init__(self):
        self.noise = None  # the run's noise, 'global' or 'per_sample', settled once at construction
        self.patches = []  # the trainer's own patches (native releases), listed by status() while it lives
        self.order = None  # per-sample noise: the DataOrder callback registered with the trainer
        self.eval_order = None  # diffusion_eval_noise="fixed": the running evaluation's EvalOrder
        self.accuracy = None  # the training windows' metrics.TrainingAccuracy, where the loss holds the logits
        self.own_steps = None  # a per-micro-batch run's metrics.OwnSteps: the draws its release makes in its loss


def per_trainer(trainer):
    """The trainer's PerTrainer, made and tracked on first use."""
    kept = trainer.__dict__.get(PER_TRAINER)
    if kept is None:
        kept = trainer.__dict__[PER_TRAINER] = PerTrainer()
        STATE.trainers.add(trainer)  # only now: every trainer in the set has its PerTrainer
    return kept


def _apply_each(patches):
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
    return list(patches)


def apply_all(patches):
    STATE.patches = _apply_each(patches)


def apply_to_trainer(trainer, patches):
    """Patches one trainer owns (an instance, its own copy of the profile, its model); listed by status() while
    the trainer lives, reverted with the rest. Added to those it has."""
    if patches:
        kept = per_trainer(trainer)
        kept.patches = kept.patches + _apply_each(patches)


def applied():
    """(name, patch) of every patch in force: the class-level set, then each live trainer's own."""
    found = [(patch.name, patch) for patch in STATE.patches]
    for trainer in list(STATE.trainers):
        label = f"{type(trainer).__name__} at {id(trainer):#x}:"
        found += [(f"{label} {patch.name}", patch) for patch in trainer.__dict__[PER_TRAINER].patches]
    return found


def _release_trainer(trainer):
    """The trainer as the release builds it: its own patches reverted, our callback gone, no PerTrainer."""
    kept = trainer.__dict__.pop(PER_TRAINER)
    for patch in reversed(kept.patches):
        patch.revert()
    if kept.order is not None:
        trainer.pop_callback(kept.order)  # (not remove_callback: a callback the user took out already is fine)


def revert_all():
    for trainer in list(STATE.trainers):
        _release_trainer(trainer)
    STATE.trainers = weakref.WeakSet()
    for patch in reversed(STATE.patches):
        patch.revert()
    STATE.patches = []

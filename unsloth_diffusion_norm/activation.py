"""When and whether the patch set goes on: the import hooks' callbacks, the mode transitions, and the public
apply / unpatch / unpatched. What the plugin says about it is in `report`; the import machinery in `hooks`."""

import sys

from . import hooks, registry
from .registry import STATE
from .report import REASONS, status, warn_once

TRAINER_MODULE = "unsloth.models.diffusion_trainer"
DIFFUSION_MODULES = ("unsloth.models.diffusion_masked", "unsloth.models.diffusion_profiles")
_hooks_registered = False


def register_hooks():
    """Apply once Unsloth's diffusion trainer module has run (or now, if it already has)."""
    global _hooks_registered
    if _hooks_registered:
        return
    _hooks_registered = True
    hooks.run_after_import({TRAINER_MODULE: _on_trainer_module, "unsloth": _on_unsloth})


def _on_trainer_module(module):
    # A hook that raises would make the user's `import unsloth` fail: report instead.
    try:
        if STATE.mode == registry.PENDING:
            apply()
        elif STATE.mode == registry.DISABLED and not STATE.patches:
            _accept_flags_only(module)
    except Exception as error:  # noqa: BLE001 - reported, and everything is left original
        if STATE.mode not in (registry.UNSUPPORTED, registry.BROKEN):  # already said, precisely
            _unsupported(f"the patch could not be applied ({type(error).__name__}: {error})")


def _on_unsloth(module):
    # (nothing here can raise: a handler would only call _unsupported again)
    if STATE.mode == registry.PENDING and TRAINER_MODULE not in sys.modules:
        _unsupported("it has no masked-diffusion trainer (unsloth.models.diffusion_trainer)")


def _unsupported(reason):
    from .detect import unsloth_version

    already = STATE.mode == registry.UNSUPPORTED
    STATE.mode, STATE.unsloth_version, STATE.reason = registry.UNSUPPORTED, unsloth_version(), reason
    if already:
        return  # one warning per process; status() keeps the latest reason
    warn_once(
        f"Unsloth {STATE.unsloth_version} is not supported: {reason}. Nothing was patched; diffusion losses are "
        "Unsloth's own."
    )


def _broken(shape, error):
    """The plugin's own installation lacks a module it needs: say which, how to install it, and what
    training gets meanwhile."""
    from .detect import UPSTREAM

    missing = error.name or str(error)
    STATE.mode, STATE.shape = registry.BROKEN, shape
    STATE.reason = f"broken installation: the module {missing!r} is missing ({_install_hint(missing)})"
    if shape == UPSTREAM:
        effect = (
            f"Unsloth {STATE.unsloth_version} normalizes by the window natively, so the loss is right, "
            "but the plugin's DiffusionConfig flags are unavailable"
        )
    else:
        effect = (
            f"Nothing was patched: Unsloth {STATE.unsloth_version} will train with its per-micro-batch "
            "loss normalization (the bug this plugin fixes)"
        )
    warn_once(f"{STATE.reason}. {effect}.")
    return f"unsloth_diffusion_norm: Unsloth {STATE.unsloth_version}: {STATE.reason}"


def _install_hint(module):
    """The pip command for one of our own requirements, as pyproject states it."""
    import re
    from importlib import metadata

    try:
        requirements = metadata.requires("unsloth-diffusion-norm") or []
    except metadata.PackageNotFoundError:
        requirements = []
    for requirement in requirements:
        requirement = requirement.split(";")[0].strip()
        if re.split(r"[<>=!~\[ ]", requirement, maxsplit=1)[0].lower().replace("-", "_") == module.lower():
            return f"pip install '{requirement}'"
    return f"pip install {module}"


def disable(reason):
    """UNSLOTH_DIFFUSION_NORM=0: the release's own training path. The two DiffusionConfig flags stay
    accepted (a script keeps parsing), and a trainer whose flag asks for something is refused."""
    STATE.mode, STATE.reason = registry.DISABLED, reason
    warn_once(
        f"disabled by {reason}; Unsloth's diffusion loss is left as the release has it (2026.10.4-.6: "
        "per-micro-batch normalization)."
    )
    register_hooks()


def _accept_flags_only(trainer_module):
    from .detect import unsloth_version

    STATE.unsloth_version = unsloth_version()
    trainer, config = (getattr(trainer_module, n, None) for n in ("DiffusionTrainer", "DiffusionConfig"))
    if trainer is None or not hasattr(config, "__dataclass_fields__"):
        return  # nothing that takes the flags: nothing to accept them on
    from . import construction, wrappers

    registry.apply_all(construction.flags_only(wrappers.Release(None, trainer_module, disabled_by=STATE.reason)))


def apply():
    """Recognise the installed Unsloth and apply the matching patch set (all or nothing). Idempotent.

    Returns status(). Raises RuntimeError, naming the release and what was missing, for an
    Unsloth this plugin does not recognise, or naming the missing module for a broken installation;
    nothing is patched then."""
    import importlib

    from . import detect

    STATE.unsloth_version = detect.unsloth_version()
    try:  # (Unsloth's first import runs the post-import hook: apply() again, or the flags-only set)
        trainer_module, masked_module, profiles_module = (
            importlib.import_module(name) for name in (TRAINER_MODULE, *DIFFUSION_MODULES)
        )
    except ImportError as error:
        if error.name == "unsloth":  # not installed at all: nothing to call unsupported yet
            raise RuntimeError(
                "unsloth_diffusion_norm: Unsloth is not installed; install it with: pip install 'unsloth>=2026.10.4'"
            ) from None
        reason = f"it has no masked-diffusion training ({error})"
        _unsupported(reason)
        raise RuntimeError(f"unsloth_diffusion_norm: Unsloth {STATE.unsloth_version}: {reason}") from None
    if STATE.patches and STATE.mode in (registry.PATCHED, registry.NATIVE):
        return status()  # applied already (by the hook, if this call imported Unsloth)
    registry.revert_all()  # the flags-only set of a disabled plugin, if any
    shape, missing = detect.recognise(trainer_module, masked_module, profiles_module)
    STATE.shape = shape
    if shape is None:
        reason = "unrecognised diffusion internals; missing: " + ", ".join(missing)
        _unsupported(reason)
        raise RuntimeError(f"unsloth_diffusion_norm: Unsloth {STATE.unsloth_version}: {reason}")
    try:
        from . import patches, wrappers
    except ImportError as error:
        raise RuntimeError(_broken(shape, error)) from None

    build, mode = patches.PATCH_SETS[shape]
    registry.apply_all(build(wrappers.Release(shape, trainer_module, masked_module, profiles_module)))
    STATE.mode, STATE.reason = mode, REASONS.get(mode)
    return status()


def unpatch():
    """Restore every original Unsloth object. The choice holds until apply(), also when made before
    Unsloth is imported (the import hooks then leave it alone). Returns status().

    A trainer built before the call is reverted too: its own patches, its DataOrder callback (per-sample
    noise) and everything the plugin kept on it are gone, so from then on it trains as the release has it.
    A later apply() does not set it up again: it is then a trainer built while unpatched (2026.10.4-.6: the
    class-level patches act on it again, its noise read from its diffusion_noise flag alone; 2026.10.7+:
    the release's own run)."""
    registry.revert_all()
    if STATE.mode not in (registry.UNSUPPORTED, registry.BROKEN):  # keep a diagnosis: nothing was patched
        STATE.mode, STATE.reason = registry.UNPATCHED, "unpatch() was called; apply() puts the patches back"
    return status()


class unpatched:
    """`with unsloth_diffusion_norm.unpatched():` the release's originals inside, the patches back after
    (whatever was in place before: patched, native, or the flags of a disabled plugin). A trainer built
    before the block is reverted as by unpatch() and not set up again afterwards."""

    def __enter__(self):
        self.mode, self.reason = STATE.mode, STATE.reason
        unpatch()
        return status()

    def __exit__(self, *exc):
        if self.mode in (registry.PATCHED, registry.NATIVE):
            apply()
        elif self.mode == registry.DISABLED:
            STATE.mode, STATE.reason = self.mode, self.reason
            if TRAINER_MODULE in sys.modules:
                _accept_flags_only(sys.modules[TRAINER_MODULE])
        else:
            STATE.mode, STATE.reason = self.mode, self.reason
        return False

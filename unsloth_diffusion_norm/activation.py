"""When and whether the patch set goes on: post-import hooks, apply / unpatch, and status()."""

import logging
import sys

from . import registry
from .registry import STATE, logger

TRAINER_MODULE = "unsloth.models.diffusion_trainer"
DIFFUSION_MODULES = ("unsloth.models.diffusion_masked", "unsloth.models.diffusion_profiles")
_hooks_registered = False
_announced = set()


def _log_once(level, message):
    if message not in _announced:
        _announced.add(message)
        logger.log(level, message)


def register_hooks():
    """Apply once Unsloth's diffusion trainer module has run (or now, if it already has)."""
    global _hooks_registered
    if _hooks_registered:
        return
    _hooks_registered = True
    hooks = {TRAINER_MODULE: _on_trainer_module, "unsloth": _on_unsloth}
    pending = {name: hook for name, hook in hooks.items() if name not in sys.modules}
    if pending:
        sys.meta_path.insert(0, _PostImportFinder(pending))
    for name, hook in hooks.items():
        if name not in pending:
            hook(sys.modules[name])


class _PostImportFinder:
    """Runs a hook right after a named module has executed, as wrapt.register_post_import_hook does -
    without importing wrapt at `import unsloth_diffusion_norm` (wrapt 2 pulls in asyncio: ~40 ms)."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.finding = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.hooks or name in self.finding:
            return None
        self.finding.add(name)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.finding.discard(name)
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookedLoader(spec.loader, self.hooks.pop(name))
        return spec


class _HookedLoader:
    def __init__(self, loader, hook):
        self._loader, self._hook = loader, hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name):  # get_source, get_filename, ...: Unsloth reads its own source
        return getattr(self._loader, name)


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
    _log_once(
        logging.WARNING,
        f"unsloth_diffusion_norm: Unsloth {STATE.unsloth_version} is not supported: {reason}. "
        "Nothing was patched; diffusion losses are Unsloth's own.",
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
    _log_once(logging.WARNING, f"unsloth_diffusion_norm: {STATE.reason}. {effect}.")
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
    _log_once(
        logging.WARNING,
        f"unsloth_diffusion_norm: disabled by {reason}; Unsloth's diffusion loss is left as the release has "
        "it (2026.10.4-.6: per-micro-batch normalization).",
    )
    register_hooks()


def _accept_flags_only(trainer_module):
    from .detect import unsloth_version

    STATE.unsloth_version = unsloth_version()
    trainer, config = (getattr(trainer_module, n, None) for n in ("DiffusionTrainer", "DiffusionConfig"))
    if trainer is None or not hasattr(config, "__dataclass_fields__"):
        return  # nothing that takes the flags: nothing to accept them on
    from . import patches

    registry.apply_all(patches.flags_only(patches.Release(None, trainer_module, disabled_by=STATE.reason)))


def apply():
    """Recognise the installed Unsloth and apply the matching patch set (all or nothing). Idempotent.

    Returns status(). Raises RuntimeError, naming the release and what was missing, for an
    Unsloth this plugin does not recognise, or naming the missing module for a broken installation;
    nothing is patched then."""
    import importlib

    from . import detect

    if STATE.patches and STATE.mode in (registry.PATCHED, registry.NATIVE):
        return status()
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
        return status()  # the hook has just applied them
    registry.revert_all()  # the flags-only set of a disabled plugin, if any
    shape, missing = detect.recognise(trainer_module, masked_module, profiles_module)
    STATE.shape = shape
    if shape is None:
        reason = "unrecognised diffusion internals; missing: " + ", ".join(missing)
        _unsupported(reason)
        raise RuntimeError(f"unsloth_diffusion_norm: Unsloth {STATE.unsloth_version}: {reason}")
    try:
        from . import patches
    except ImportError as error:
        raise RuntimeError(_broken(shape, error)) from None

    build, mode = patches.PATCH_SETS[shape]
    registry.apply_all(build(patches.Release(shape, trainer_module, masked_module, profiles_module)))
    STATE.mode, STATE.reason = mode, REASONS.get(mode)
    return status()


REASONS = {
    registry.NATIVE: (
        "this release normalizes by the window natively; its own noise is drawn while a window is fetched, "
        "before a resumed run's RNG is restored, so the plugin draws it at the window's first step instead"
    )
}


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


# What a run gets unless its DiffusionConfig says otherwise, per mode.
LOWER_VARIANCE = (
    "; lower-variance opt-ins: diffusion_t_sampler='stratified' (with per-sample noise), "
    "diffusion_complementary_masks=True"
)
DEFAULTS = {
    registry.PATCHED: (
        "diffusion_loss_normalization=None: each profile's own (Nemotron: window); diffusion_noise=None: "
        "'global', the release's own draws made at the window's first training step (resume-exact), or "
        "'per_sample' where the model config sets dp_varying_mask_ratio=True; opt-ins per run: 'microbatch', "
        "'window' for Dream / LLaDA, diffusion_noise='per_sample'; diffusion_eval_noise=None: the release's own "
        "evaluation draws from the global RNG (an evaluation moves the training draws after it), or 'fixed' (keyed, "
        "with diffusion_eval_draws=K draws per example)" + LOWER_VARIANCE
    ),
    registry.DISABLED: (
        "the release's own training path; the DiffusionConfig flags are accepted, and a trainer whose flag "
        "is set is refused at construction"
    ),
    registry.NATIVE: (
        "Unsloth's own loss (window-normalized natively); diffusion_noise=None: 'global', Unsloth's own draws "
        "made at the window's first training step, so a resumed run is exact and an uninterrupted one is bitwise "
        "Unsloth's, or 'per_sample' where the model config sets dp_varying_mask_ratio=True; Unsloth's own "
        "draws (a resumed run differs): UNSLOTH_DIFFUSION_NORM=0; opt-ins per run: diffusion_noise='per_sample', "
        "diffusion_loss_normalization='microbatch' or 'window'; diffusion_eval_noise=None: Unsloth's own evaluation "
        "draws from the global RNG (an evaluation moves the training draws after it), or 'fixed' (keyed, with "
        "diffusion_eval_draws=K draws per example)" + LOWER_VARIANCE
    ),
}


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
        DEFAULTS.get(STATE.mode) if STATE.patches else None,
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

"""Import-time behaviour without Unsloth: the post-import hooks, what each hook does in each mode, the
UNSLOTH_DIFFUSION_NORM switch, the flags-only set of a switched-off plugin and the message for a broken
installation. Stand-in modules take Unsloth's place; the fresh-interpreter tests (tests/integration)
show the same with the real release."""

import dataclasses
import importlib
import logging
import sys
from importlib import metadata
from types import ModuleType, SimpleNamespace

import pytest

import unsloth_diffusion_norm
from unsloth_diffusion_norm import activation, config, detect, registry
from unsloth_diffusion_norm.activation import TRAINER_MODULE
from unsloth_diffusion_norm.hooks import _HookedLoader, _PostImportFinder

# The flags-only set: DiffusionTrainer.__init__, three patches per flag, DiffusionConfig.__init__.
FLAGS_ONLY_PATCHES = 1 + 3 * len(config.FIELDS) + 1


def warnings_in(caplog):
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "unsloth_diffusion_norm"]


# --- the post-import finder ----------------------------------------------------------------------------


class LegacyFinder:
    """A finder of the old protocol (no find_spec), as some import hooks still are."""

    def find_module(self, name, path=None):
        return None


def test_a_hook_runs_once_right_after_its_module_has_executed(tmp_path, monkeypatch):
    (tmp_path / "hooked_example.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "hooked_example", raising=False)
    seen = []
    finder = _PostImportFinder({"hooked_example": lambda module: seen.append((module.__name__, module.VALUE))})
    monkeypatch.setattr(sys, "meta_path", [finder, LegacyFinder(), *sys.meta_path])
    module = importlib.import_module("hooked_example")
    assert seen == [("hooked_example", 41)] and finder.hooks == {} and finder.finding == set()
    # The loader's other methods are the original's (Unsloth reads its own source through them).
    assert module.__spec__.loader.get_source("hooked_example") == "VALUE = 41\n"
    del sys.modules["hooked_example"]
    importlib.import_module("hooked_example")
    assert len(seen) == 1  # a hook runs once


def test_the_finder_answers_only_for_hooked_modules_that_exist_and_never_for_itself(monkeypatch):
    finder = _PostImportFinder({"no_such_module_anywhere": print, "json": print})
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    assert finder.find_spec("os") is None  # not hooked: the other finders answer
    assert finder.find_spec("no_such_module_anywhere") is None and "no_such_module_anywhere" in finder.hooks
    finder.finding.add("json")  # asked again while it is itself asking the others: no recursion
    assert finder.find_spec("json") is None and "json" in finder.hooks


def test_a_spec_whose_loader_cannot_run_the_module_goes_back_unhooked(monkeypatch):
    """A loader of the old protocol (load_module only), or none (a namespace package): there is no module
    execution to hook, so the spec goes back as found and the hook keeps waiting."""
    from importlib.machinery import ModuleSpec

    class LegacyLoader:
        def load_module(self, name):
            raise ImportError(name)

    specs = {
        "legacy_example": ModuleSpec("legacy_example", LegacyLoader()),
        "namespace_example": ModuleSpec("namespace_example", None),
    }

    class Finder:
        def find_spec(self, name, path=None, target=None):
            return specs.get(name)

    finder = _PostImportFinder({name: print for name in specs})
    monkeypatch.setattr(sys, "meta_path", [finder, Finder()])
    for name, spec in specs.items():
        assert finder.find_spec(name) is spec and not isinstance(spec.loader, _HookedLoader)
    assert set(finder.hooks) == set(specs)


def test_the_hooked_loader_hands_the_spec_and_module_through():
    calls = []

    class Loader:
        def create_module(self, spec):
            calls.append(("create", spec))
            return "module"

        def exec_module(self, module):
            calls.append(("exec", module))

    loader = _HookedLoader(Loader(), lambda module: calls.append(("hook", module)))
    assert loader.create_module("spec") == "module"
    loader.exec_module("module")
    assert calls == [("create", "spec"), ("exec", "module"), ("hook", "module")]


def _fresh_hooks(monkeypatch, **present):
    monkeypatch.setattr(activation, "_hooks_registered", False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name in (TRAINER_MODULE, "unsloth"):
        if name in present:
            monkeypatch.setitem(sys.modules, name, present[name])
        else:
            monkeypatch.delitem(sys.modules, name, raising=False)


def test_hooks_wait_for_modules_not_imported_yet_and_are_registered_once(state, monkeypatch):
    _fresh_hooks(monkeypatch)
    before = list(sys.meta_path)
    activation.register_hooks()
    activation.register_hooks()
    finders = [f for f in sys.meta_path if f not in before]
    assert len(finders) == 1 and sys.meta_path[0] is finders[0]
    assert finders[0].hooks == {TRAINER_MODULE: activation._on_trainer_module, "unsloth": activation._on_unsloth}


def test_a_hook_whose_module_is_imported_already_runs_at_once(state, monkeypatch):
    state.mode = registry.PENDING
    _fresh_hooks(monkeypatch, unsloth=ModuleType("unsloth"))
    activation.register_hooks()
    assert sys.meta_path[0].hooks == {TRAINER_MODULE: activation._on_trainer_module}
    # Unsloth is there and its diffusion trainer is not: a release without masked diffusion.
    assert (state.mode, state.reason) == (
        registry.UNSUPPORTED,
        "it has no masked-diffusion trainer (unsloth.models.diffusion_trainer)",
    )


# --- what each hook does, by mode ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", [registry.PATCHED, registry.UNPATCHED, registry.DISABLED])
def test_the_unsloth_hook_leaves_a_decided_mode_alone(state, monkeypatch, mode):
    state.mode = mode
    monkeypatch.delitem(sys.modules, TRAINER_MODULE, raising=False)
    activation._on_unsloth(ModuleType("unsloth"))
    assert state.mode == mode


def test_the_unsloth_hook_finds_nothing_wrong_when_the_trainer_module_is_there(state, monkeypatch):
    state.mode = registry.PENDING
    monkeypatch.setitem(sys.modules, TRAINER_MODULE, ModuleType(TRAINER_MODULE))
    activation._on_unsloth(ModuleType("unsloth"))
    assert state.mode == registry.PENDING


def test_the_trainer_hook_applies_when_pending(state, monkeypatch):
    state.mode, applied = registry.PENDING, []
    monkeypatch.setattr(activation, "apply", lambda: applied.append(True))
    activation._on_trainer_module(ModuleType(TRAINER_MODULE))
    assert applied == [True]


def test_a_trainer_hook_that_fails_reports_instead_of_breaking_the_import(state, monkeypatch, caplog):
    def fails():
        raise ValueError("boom")

    state.mode = registry.PENDING
    monkeypatch.setattr(activation, "apply", fails)
    with caplog.at_level(logging.WARNING):
        activation._on_trainer_module(ModuleType(TRAINER_MODULE))
    assert (state.mode, state.reason) == (registry.UNSUPPORTED, "the patch could not be applied (ValueError: boom)")
    assert len(warnings_in(caplog)) == 1
    # A failure already diagnosed precisely (apply() said what was missing) keeps its diagnosis.
    state.mode, state.reason = registry.BROKEN, "the precise diagnosis"
    activation._on_trainer_module(ModuleType(TRAINER_MODULE))
    assert (state.mode, state.reason) == (registry.BROKEN, "the precise diagnosis")


def stand_in_trainer_module():
    """unsloth.models.diffusion_trainer, as far as the flags-only set needs it."""

    @dataclasses.dataclass
    class DiffusionConfig:
        diffusion_eps: float = 1e-3

    class DiffusionTrainer:
        def __init__(self, args):
            self.args = args

    return SimpleNamespace(__name__=TRAINER_MODULE, DiffusionTrainer=DiffusionTrainer, DiffusionConfig=DiffusionConfig)


def test_switched_off_the_trainer_hook_accepts_the_flags_and_refuses_a_set_one(state):
    module = stand_in_trainer_module()
    state.mode, state.reason, state.patches = registry.DISABLED, "UNSLOTH_DIFFUSION_NORM=0", []
    activation._on_trainer_module(module)
    assert state.unsloth_version == detect.unsloth_version()
    assert [p.name for p in state.patches][0] == "DiffusionTrainer.__init__" and len(
        state.patches
    ) == FLAGS_ONLY_PATCHES
    module.DiffusionTrainer(args=module.DiffusionConfig())  # flags at their defaults: the release's own run
    module.DiffusionTrainer(args=SimpleNamespace())  # arguments of another kind carry no flag to refuse
    args = module.DiffusionConfig(diffusion_noise="per_sample")
    with pytest.raises(ValueError) as refused:
        module.DiffusionTrainer(args=args)
    assert str(refused.value) == (
        "unsloth_diffusion_norm: the plugin is turned off (UNSLOTH_DIFFUSION_NORM=0), so diffusion_noise='per_sample' "
        "cannot be honoured. Unset UNSLOTH_DIFFUSION_NORM (or set it to 1) to use the flag, or leave the flag at None."
    )
    both = module.DiffusionConfig(diffusion_loss_normalization="window", diffusion_noise="global")
    with pytest.raises(ValueError, match="so diffusion_loss_normalization='window', diffusion_noise='global' cannot"):
        module.DiffusionTrainer(both)
    installed = list(state.patches)
    activation._on_trainer_module(module)  # already accepted: nothing is applied twice
    assert state.patches == installed


@pytest.mark.parametrize("missing", ["DiffusionTrainer", "DiffusionConfig"])
def test_switched_off_with_nothing_that_takes_the_flags_nothing_is_patched(state, missing):
    module = stand_in_trainer_module()
    if missing == "DiffusionTrainer":
        del module.DiffusionTrainer
    else:
        module.DiffusionConfig = type("DiffusionConfig", (), {})
    state.mode, state.patches = registry.DISABLED, []
    activation._on_trainer_module(module)
    assert state.patches == [] and state.mode == registry.DISABLED  # quietly: nothing failed on the way


def test_after_unpatch_the_trainer_hook_leaves_the_release_alone(state):
    state.mode, state.patches = registry.UNPATCHED, []
    activation._on_trainer_module(stand_in_trainer_module())
    assert state.mode == registry.UNPATCHED and state.patches == []


# --- the switch ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "false", "No", " OFF "])
def test_the_switch_turns_patching_off(state, monkeypatch, caplog, value):
    monkeypatch.setattr(activation, "_hooks_registered", True)
    monkeypatch.setenv(unsloth_diffusion_norm.ENV, value)
    state.mode = registry.PENDING
    with caplog.at_level(logging.INFO):
        unsloth_diffusion_norm._switch()
    assert (state.mode, state.reason) == (registry.DISABLED, f"UNSLOTH_DIFFUSION_NORM={value}")
    assert warnings_in(caplog) == [
        (
            logging.WARNING,
            (
                f"unsloth_diffusion_norm: disabled by UNSLOTH_DIFFUSION_NORM={value}; Unsloth's diffusion loss is left as "
                "the release has it (2026.10.4-.6: per-micro-batch normalization)."
            ),
        )
    ]


@pytest.mark.parametrize("value", [None, "", "1", "TRUE", " yes", "on"])
def test_the_switch_leaves_patching_on_quietly(state, monkeypatch, caplog, value):
    monkeypatch.setattr(activation, "_hooks_registered", True)
    if value is None:
        monkeypatch.delenv(unsloth_diffusion_norm.ENV, raising=False)
    else:
        monkeypatch.setenv(unsloth_diffusion_norm.ENV, value)
    state.mode = registry.PENDING
    with caplog.at_level(logging.INFO):
        unsloth_diffusion_norm._switch()
    assert state.mode == registry.PENDING and warnings_in(caplog) == []


def test_an_unknown_switch_value_is_named_once_and_patching_stays_on(state, monkeypatch, caplog):
    monkeypatch.setattr(activation, "_hooks_registered", True)
    monkeypatch.setenv(unsloth_diffusion_norm.ENV, "maybe")
    state.mode = registry.PENDING
    with caplog.at_level(logging.INFO):
        unsloth_diffusion_norm._switch()
        unsloth_diffusion_norm._switch()
    assert state.mode == registry.PENDING
    assert warnings_in(caplog) == [
        (
            logging.WARNING,
            (
                "unsloth_diffusion_norm: UNSLOTH_DIFFUSION_NORM='maybe' is not understood, so patching stays on; use one "
                "of 0, false, no, off to turn it off, or 1, true, yes, on to keep it on."
            ),
        )
    ]


# --- a broken installation -----------------------------------------------------------------------------


def test_the_install_hint_is_the_requirement_pyproject_states(monkeypatch):
    assert activation._install_hint("wrapt") == "pip install 'wrapt>=1.15'"
    assert activation._install_hint("WRAPT") == "pip install 'wrapt>=1.15'"
    assert activation._install_hint("pytest") == "pip install 'pytest>=8'"  # an extra: its marker dropped
    assert activation._install_hint("somemodule") == "pip install somemodule"
    requirements = ["my-package[extra]>=2 ; python_version > '3'", "other~=1.0"]
    monkeypatch.setattr(metadata, "requires", lambda name: requirements)
    assert activation._install_hint("my_package") == "pip install 'my-package[extra]>=2'"
    assert activation._install_hint("other") == "pip install 'other~=1.0'"

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "requires", not_installed)  # run from a checkout, not installed
    assert activation._install_hint("wrapt") == "pip install wrapt"
    monkeypatch.setattr(metadata, "requires", lambda name: None)  # installed without requirements
    assert activation._install_hint("wrapt") == "pip install wrapt"


@pytest.mark.parametrize("shape", [detect.CHUNKED, detect.UPSTREAM])
def test_a_broken_installation_names_the_module_the_command_and_what_training_gets(state, caplog, shape):
    state.unsloth_version = "2026.10.6"
    with caplog.at_level(logging.INFO):
        message = activation._broken(shape, ModuleNotFoundError("No module named 'wrapt'", name="wrapt"))
    reason = "broken installation: the module 'wrapt' is missing (pip install 'wrapt>=1.15')"
    assert (state.mode, state.shape, state.reason) == (registry.BROKEN, shape, reason)
    assert message == f"unsloth_diffusion_norm: Unsloth 2026.10.6: {reason}"
    effect = (
        (
            "Unsloth 2026.10.6 normalizes by the window natively, so the loss is right, but the plugin's "
            "DiffusionConfig flags are unavailable"
        )
        if shape == detect.UPSTREAM
        else (
            "Nothing was patched: Unsloth 2026.10.6 will train with its per-micro-batch loss normalization "
            "(the bug this plugin fixes)"
        )
    )
    assert warnings_in(caplog) == [(logging.WARNING, f"unsloth_diffusion_norm: {reason}. {effect}.")]
    unnamed = activation._broken(shape, ImportError("cannot import name 'x'"))
    assert unnamed.endswith("the module \"cannot import name 'x'\" is missing (pip install cannot import name 'x')")


# --- unpatched(): whatever was in place before comes back ------------------------------------------------


def test_unpatched_gives_a_switched_off_plugin_its_flags_back(state, monkeypatch):
    module = stand_in_trainer_module()
    monkeypatch.setitem(sys.modules, TRAINER_MODULE, module)
    state.mode, state.reason = registry.DISABLED, "UNSLOTH_DIFFUSION_NORM=0"
    activation._accept_flags_only(module)
    with unsloth_diffusion_norm.unpatched() as inside:
        assert inside.mode == registry.UNPATCHED and state.patches == []
    assert (state.mode, state.reason) == (registry.DISABLED, "UNSLOTH_DIFFUSION_NORM=0")
    assert len(state.patches) == FLAGS_ONLY_PATCHES and all(p.in_place() for p in state.patches)


def test_unpatched_before_the_trainer_module_is_imported_leaves_it_to_the_hook(state, monkeypatch):
    monkeypatch.delitem(sys.modules, TRAINER_MODULE, raising=False)
    state.mode, state.reason = registry.DISABLED, "UNSLOTH_DIFFUSION_NORM=0"
    with unsloth_diffusion_norm.unpatched():
        pass
    assert (state.mode, state.reason, state.patches) == (registry.DISABLED, "UNSLOTH_DIFFUSION_NORM=0", [])


@pytest.mark.parametrize("mode", [registry.PENDING, registry.UNSUPPORTED, registry.BROKEN])
def test_unpatched_keeps_a_mode_with_nothing_patched_and_its_reason(state, mode):
    state.mode, state.reason = mode, "the reason"
    with pytest.raises(KeyError):  # an error inside is the caller's, not swallowed
        with unsloth_diffusion_norm.unpatched():
            raise KeyError("inside")
    assert (state.mode, state.reason, state.patches) == (mode, "the reason", [])


def test_unpatch_says_how_to_undo_it_and_keeps_a_diagnosis(state):
    state.mode = registry.PATCHED
    assert (unsloth_diffusion_norm.unpatch().mode, state.reason) == (
        registry.UNPATCHED,
        "unpatch() was called; apply() puts the patches back",
    )
    for mode in (registry.UNSUPPORTED, registry.BROKEN):  # nothing was patched: the diagnosis stays
        state.mode, state.reason = mode, "the diagnosis"
        assert (unsloth_diffusion_norm.unpatch().mode, state.reason) == (mode, "the diagnosis")


def test_a_trainer_without_a_profile_or_arguments_yet_does_not_use_the_window():
    """Trainer reads model_accepts_loss_kwargs while it is being built, before Unsloth sets the profile."""
    from unsloth_diffusion_norm import window

    assert window.uses_window(SimpleNamespace()) is False
    assert window.uses_window(SimpleNamespace(diffusion_profile=SimpleNamespace())) is False


def test_a_status_without_patches_promises_no_defaults(state):
    state.mode, state.patches = registry.DISABLED, []  # switched off, Unsloth not imported yet
    assert activation.status().defaults is None


def test_model_accepts_loss_kwargs_is_the_trainers_own_unless_the_window_normalizes():
    from unsloth_diffusion_norm import window

    class Trainer:
        model_accepts_loss_kwargs = window.ACCEPTS_LOSS_KWARGS

    trainer = Trainer()
    assert trainer.model_accepts_loss_kwargs is False  # nothing set yet
    trainer.model_accepts_loss_kwargs = True
    assert vars(trainer)["model_accepts_loss_kwargs"] is True and trainer.model_accepts_loss_kwargs is True
    trainer.model_accepts_loss_kwargs = False
    assert trainer.model_accepts_loss_kwargs is False


def test_flags_checked_again_at_construction_and_arguments_without_them_pass():
    """A flag changed on the arguments after they were built is still refused by the trainer."""
    from unsloth_diffusion_norm import construction

    class Masked:
        name, loss_normalization = "masked", "masked_tokens"

    block = SimpleNamespace(name="block")
    construction.check_flags(SimpleNamespace(args=SimpleNamespace(), diffusion_profile=block), Masked)
    for field in ("diffusion_noise", "diffusion_loss_normalization"):
        with pytest.raises(ValueError, match=f"{field} must be"):
            construction.check_flags(
                SimpleNamespace(args=SimpleNamespace(**{field: "bogus"}), diffusion_profile=Masked()), Masked
            )
    window_by_default = SimpleNamespace(name="block", loss_normalization="global_masked_tokens")
    with pytest.raises(ValueError, match="window normalization is implemented for the masked-diffusion profiles"):
        construction.check_flags(SimpleNamespace(args=SimpleNamespace(), diffusion_profile=window_by_default), Masked)

"""Patches as data: they take, they come off, they apply once, and bad input gets a clear error."""

import importlib.metadata
import json

import pytest
import wrapt
from unsloth.models.diffusion_masked import MaskedDiffusionProfile
from unsloth.models.diffusion_profiles import diffusion_profiles
from unsloth.models.diffusion_trainer import DiffusionConfig, DiffusionTrainer

import unsloth_diffusion_norm
from unsloth_diffusion_norm import config, registry, report


def nemotron():
    return next(p for p in diffusion_profiles() if p.name == "nemotron_labs_diffusion")


MODE = unsloth_diffusion_norm.apply().mode
patched_only = pytest.mark.skipif(MODE != registry.PATCHED, reason="patches of an affected release")
native_only = pytest.mark.skipif(MODE != registry.NATIVE, reason="a natively fixed release")


@patched_only
def test_patch_takes_and_comes_off(plugin):
    status = unsloth_diffusion_norm.status()
    assert status.mode == registry.PATCHED and status.unsloth_version
    assert isinstance(vars(DiffusionTrainer)["get_batch_samples"], wrapt.FunctionWrapper)
    assert isinstance(vars(MaskedDiffusionProfile)["compute_loss"], wrapt.FunctionWrapper)
    assert nemotron().loss_normalization == config.GLOBAL_MASKED_TOKENS
    assert config.NORMALIZATION.name in DiffusionConfig.__dataclass_fields__
    names = [name for name, _ in status.patches if not name.startswith("DiffusionTrainer at ")]
    # nine of the release's own objects, then three per DiffusionConfig flag and DiffusionConfig.__init__ (and the
    # own patches of any trainer alive, e.g. a block-diffusion run's CPU attention)
    assert len(names) == len(set(names)) == 9 + 3 * len(config.FIELDS) + 1

    original_loss = vars(MaskedDiffusionProfile)["compute_loss"].__wrapped__
    unsloth_diffusion_norm.unpatch()
    assert unsloth_diffusion_norm.status().patches == ()
    assert "get_batch_samples" not in vars(DiffusionTrainer)
    assert "model_accepts_loss_kwargs" not in vars(DiffusionTrainer)
    assert vars(MaskedDiffusionProfile)["compute_loss"] is original_loss
    assert nemotron().loss_normalization == "masked_tokens"
    assert config.NORMALIZATION.name not in DiffusionConfig.__dataclass_fields__
    assert not hasattr(DiffusionConfig, config.NORMALIZATION.name)


@native_only
def test_native_release_keeps_its_training_path(plugin):
    """Only the flag is added: every object on the training path is Unsloth's / transformers' own."""
    import transformers

    def training_path():
        return {
            **{f"DiffusionTrainer.{n}": vars(DiffusionTrainer).get(n) for n in TRAINING_PATH},
            **{
                f"MaskedDiffusionProfile.{n}": vars(MaskedDiffusionProfile).get(n)
                for n in ("compute_loss", "prepare_batch")
            },
            **{f"Trainer.{n}": v for n, v in vars(transformers.Trainer).items()},
            "nemotron.loss_normalization": nemotron().loss_normalization,
        }

    patched = training_path()
    status = unsloth_diffusion_norm.status()
    process_wide = [n for n, _ in status.patches if not n.startswith("DiffusionTrainer at ")]  # not trainers' own
    assert status.mode == registry.NATIVE and process_wide == [
        "DiffusionTrainer.__init__",
        *(f"DiffusionConfig.{f} ({k})" for f in config.FIELDS for k in ("dataclass field", "annotation", "default")),
        "DiffusionConfig.__init__",
    ]
    unsloth_diffusion_norm.unpatch()
    original = training_path()
    assert all(patched[k] is original[k] for k in original), [k for k in original if patched[k] is not original[k]]
    assert original["nemotron.loss_normalization"] == config.GLOBAL_MASKED_TOKENS


TRAINING_PATH = ("compute_loss", "get_batch_samples", "training_step", "prediction_step")


def test_apply_is_idempotent_and_keeps_names_and_signatures(plugin):
    import inspect

    before = [(p.name, p.owner, p.attribute) for p in registry.STATE.patches]
    wrapper = vars(DiffusionTrainer)["__init__"]
    unsloth_diffusion_norm.apply()
    unsloth_diffusion_norm.apply()
    assert [(p.name, p.owner, p.attribute) for p in registry.STATE.patches] == before
    assert vars(DiffusionTrainer)["__init__"] is wrapper
    assert not isinstance(wrapper.__wrapped__, wrapt.FunctionWrapper)  # no stacking
    wrapped = [(DiffusionTrainer, "__init__")]
    if MODE == registry.PATCHED:
        wrapped.append((MaskedDiffusionProfile, "compute_loss"))
    for owner, name in wrapped:
        assert getattr(owner, name).__name__ == name
        assert inspect.signature(getattr(owner, name)) == inspect.signature(vars(owner)[name].__wrapped__)


CPU = dict(bf16=False, use_cpu=True)


def test_config_field_validates_and_round_trips(plugin, tmp_path):
    assert DiffusionConfig(output_dir=str(tmp_path), **CPU).diffusion_loss_normalization is None
    for value in ("window", "microbatch"):
        args = DiffusionConfig(output_dir=str(tmp_path), diffusion_loss_normalization=value, **CPU)
        assert args.to_dict()[config.NORMALIZATION.name] == value
        assert json.loads(args.to_json_string())[config.NORMALIZATION.name] == value
    with pytest.raises(ValueError, match="'window' or 'microbatch' or None"):
        DiffusionConfig(output_dir=str(tmp_path), diffusion_loss_normalization="global", **CPU)


def _construct(tmp_path, profile, positional=False, **flags):
    from datasets import Dataset

    from unsloth_diffusion_norm.proof import fixtures

    model, tokenizer = fixtures.load_model()
    args = DiffusionConfig(output_dir=str(tmp_path), bf16=False, use_cpu=True, report_to=[], max_length=None, **flags)
    data = Dataset.from_list([fixtures.Example([10], [20]).row()])
    if positional:  # DiffusionTrainer(model, args, ...), as scripts also write it
        return DiffusionTrainer(model, args, train_dataset=data, processing_class=tokenizer, diffusion_profile=profile)
    return DiffusionTrainer(
        model=model, args=args, train_dataset=data, processing_class=tokenizer, diffusion_profile=profile
    )


def test_a_trainer_built_with_positional_arguments_is_set_up_as_with_keywords(plugin, tmp_path):
    from unsloth_diffusion_norm import per_sample

    trainer = _construct(tmp_path, nemotron(), positional=True, diffusion_noise="per_sample")
    assert trainer.args.diffusion_noise == "per_sample" and trainer.diffusion_profile.name == nemotron().name
    assert any(isinstance(c, per_sample.DataOrder) for c in trainer.callback_handler.callbacks)


def test_unpatch_gives_a_trainer_built_before_it_back_to_the_release_down_to_its_log(plugin, tmp_path):
    """Its own patches (2026.10.7+), its DataOrder callback and all the plugin kept on it are gone; a later
    apply() does not set it up again, and its log (the class-level patch back) is the release's."""
    from unsloth_diffusion_norm import per_sample

    trainer = _construct(tmp_path, nemotron(), diffusion_noise="per_sample")
    kept = vars(trainer)[registry.PER_TRAINER]
    assert trainer in registry.STATE.trainers and kept.noise == config.PER_SAMPLE
    assert kept.order in trainer.callback_handler.callbacks
    own = [(patch.owner, patch.attribute, patch.saved) for patch in kept.patches]  # none on 2026.10.4-.6
    unsloth_diffusion_norm.unpatch()
    assert registry.PER_TRAINER not in vars(trainer) and trainer not in registry.STATE.trainers
    assert not any(isinstance(c, per_sample.DataOrder) for c in trainer.callback_handler.callbacks)
    assert all(vars(owner).get(attribute, registry.MISSING) is saved for owner, attribute, saved in own)  # exactly
    assert "get_batch_samples" not in vars(trainer) and unsloth_diffusion_norm.status().patches == ()
    unsloth_diffusion_norm.apply()
    assert registry.PER_TRAINER not in vars(trainer)
    assert not any(name.startswith("DiffusionTrainer at ") for name, _ in unsloth_diffusion_norm.status().patches)
    trainer.log({"loss": 1.0})  # the class-level log patch, back, finds nothing of ours on it: the release's log
    assert trainer.state.log_history[-1]["loss"] == 1.0 and registry.PER_TRAINER not in vars(trainer)


@patched_only
def test_a_direct_loss_call_draws_one_mask_per_example_where_the_run_asks_for_mask_pairs(plugin, tmp_path):
    """Mask pairs are training's draws: compute_loss called outside training (no window) draws as the release
    does, the same loss from the same RNG state with the pairs asked or not."""
    import torch

    trainer = _construct(tmp_path, nemotron(), diffusion_complementary_masks=True)
    batch = next(iter(trainer.get_train_dataloader()))
    losses = []
    for pairs in (True, False):
        trainer.args.diffusion_complementary_masks = pairs
        torch.manual_seed(0)
        losses.append(trainer.compute_loss(trainer.model, batch).detach())
    assert torch.equal(*losses)


@patched_only
@pytest.mark.parametrize("normalization", [None, "microbatch"])
def test_get_batch_samples_takes_trainers_own_keywords(plugin, tmp_path, normalization):
    """Trainer's signature, keywords included: the window (its default here), or Trainer's own answer."""
    import torch

    from unsloth_diffusion_norm.window import Window

    trainer = _construct(tmp_path, nemotron(), diffusion_loss_normalization=normalization)
    rows = [{"input_ids": torch.tensor([[10, 20]]), "labels": torch.tensor([[-100, 20]])}] * 3
    batches, count = trainer.get_batch_samples(epoch_iterator=iter(rows), num_batches=2, device=torch.device("cpu"))
    assert len(batches) == 2
    assert isinstance(count, Window) if normalization is None else count is None  # (Unsloth counts nothing)


def test_the_flags_default_to_none_on_the_class_too(plugin):
    """As a dataclass field's default would: code that reads DiffusionConfig.<flag> sees the release's default."""
    assert all(vars(DiffusionConfig)[field] == config.default(field) for field in config.FIELDS)


BLOCK = next(p for p in diffusion_profiles() if not isinstance(p, MaskedDiffusionProfile))


@pytest.mark.parametrize(
    "flags, refusal",
    [
        ({}, None),  # no flag: the release's own block-diffusion run
        ({"diffusion_loss_normalization": "microbatch"}, None),
        (
            {"diffusion_loss_normalization": "window"},
            "unsloth_diffusion_norm: diffusion_loss_normalization='window': window normalization is implemented for the "
            "masked-diffusion profiles (Nemotron-Labs-Diffusion, Dream, LLaDA), not for {name!r}. Use None or 'microbatch'.",
        ),
        (
            {"diffusion_noise": "per_sample"},
            "unsloth_diffusion_norm: diffusion_noise='per_sample' is implemented for the masked-diffusion profiles, not "
            "for {name!r}. Leave it at None.",
        ),
    ],
)
def test_a_flag_a_non_masked_profile_cannot_honour_is_refused_at_construction(plugin, tmp_path, flags, refusal):
    if refusal is None:
        assert _construct(tmp_path, BLOCK, **flags).diffusion_profile.name == BLOCK.name
        return
    with pytest.raises(ValueError) as refused:
        _construct(tmp_path, BLOCK, **flags)
    assert str(refused.value) == refusal.format(name=BLOCK.name)


@patched_only
def test_per_sample_noise_with_a_profiles_own_other_normalization_is_refused_by_name(plugin, tmp_path):
    llada = next(p for p in diffusion_profiles() if p.name == "llada")
    with pytest.raises(ValueError) as refused:
        _construct(tmp_path, llada, diffusion_noise="per_sample")
    assert str(refused.value) == (
        "unsloth_diffusion_norm: diffusion_noise='per_sample' with 'llada''s own 'answer_length' normalization is not "
        "available on this release; set diffusion_loss_normalization='window' or leave diffusion_noise at None."
    )
    assert _construct(tmp_path, llada, diffusion_noise="per_sample", diffusion_loss_normalization="window")


def test_drifted_unsloth_gets_a_clear_error_and_nothing_patched(drifted):
    owner, piece, saved = drifted
    before = (dict(vars(DiffusionTrainer)), dict(vars(MaskedDiffusionProfile)), nemotron().loss_normalization)
    with pytest.raises(RuntimeError) as refused:
        unsloth_diffusion_norm.apply()
    status = unsloth_diffusion_norm.status()
    reason = f"unrecognised diffusion internals; missing: {owner.__name__}.{piece}"
    assert str(refused.value) == f"unsloth_diffusion_norm: Unsloth {status.unsloth_version}: {reason}"
    assert status.unsloth_version == importlib.metadata.version("unsloth")  # the release is named
    assert status.mode == registry.UNSUPPORTED and status.reason == reason and status.patches == ()
    after = (dict(vars(DiffusionTrainer)), dict(vars(MaskedDiffusionProfile)), nemotron().loss_normalization)
    assert after == before  # all or nothing: not one piece was patched


@patched_only
def test_every_missing_piece_is_named(drifted, monkeypatch):
    owner, piece, _ = drifted
    monkeypatch.delattr(next(c for c in MaskedDiffusionProfile.__mro__ if "option" in vars(c)), "option")
    with pytest.raises(RuntimeError) as refused:
        unsloth_diffusion_norm.apply()
    assert str(refused.value).endswith(
        f"unrecognised diffusion internals; missing: {owner.__name__}.{piece}, MaskedDiffusionProfile.option"
    )


def test_after_a_drift_is_mended_apply_patches_again(drifted):
    owner, piece, saved = drifted
    with pytest.raises(RuntimeError):
        unsloth_diffusion_norm.apply()
    setattr(owner, piece, saved)
    status = unsloth_diffusion_norm.apply()
    assert status.mode == MODE and status.unsloth_version == importlib.metadata.version("unsloth")


def test_a_displaced_patch_is_reported_by_status_and_doctor(plugin):
    from unsloth_diffusion_norm.tools import doctor

    ours = vars(DiffusionTrainer)["__init__"]
    DiffusionTrainer.__init__ = lambda self, *pos, **kw: ours(self, *pos, **kw)  # someone else's wrapper
    try:
        status = unsloth_diffusion_norm.status()
        assert status.displaced == ("DiffusionTrainer.__init__",)
        assert "DISPLACED DiffusionTrainer.__init__" in str(status)
        report = doctor.examine(self_check=False)
        assert report["exit"] == 1 and "DiffusionTrainer.__init__" in report["verdict"]
    finally:
        DiffusionTrainer.__init__ = ours
    assert unsloth_diffusion_norm.status().displaced == ()


@native_only
def test_native_per_trainer_patches_are_listed_and_reverted(plugin):
    """At the default settings: the resume-exact draws are this trainer's own patches."""
    from unsloth_diffusion_norm.proof import experiment, fixtures

    run = experiment.build([fixtures.Example([10], [20, 21])], record=False)
    trainer = run.trainer
    label = f"DiffusionTrainer at {id(trainer):#x}: "
    own = [name for name, _ in unsloth_diffusion_norm.status().patches if name.startswith(label)]
    assert sorted(name.split(": ", 1)[1] for name in own) == [
        "diffusion_profile",
        "diffusion_profile.compute_loss",
        "get_batch_samples",
        "model_accepts_loss_kwargs",
    ]
    profile_copy = trainer.diffusion_profile
    assert profile_copy is not nemotron() and "compute_loss" in vars(profile_copy)
    unsloth_diffusion_norm.unpatch()
    assert "get_batch_samples" not in vars(trainer) and trainer.diffusion_profile is not profile_copy
    assert not any(name.startswith("DiffusionTrainer at ") for name, _ in unsloth_diffusion_norm.status().patches)


def docs_table(marker):
    """The rows of the table in docs/api.md between `<!-- {marker}: start`
    and `<!-- {marker}: end -->`, as cells with the code quotes taken off."""
    import pathlib

    text = (pathlib.Path(__file__).parents[2] / "docs" / "api.md").read_text()
    block = text[text.index(f"<!-- {marker}: start") : text.index(f"<!-- {marker}: end -->")]
    rows = [[cell.strip().strip("`") for cell in line.strip("|").split("|")] for line in block.splitlines()[3:]]
    # A run of rows naming `<flag>` is written once for all flags: each flag's rows, flag by flag, in FLAGS' order.
    group = [row for row in rows if FLAG in row[1]]
    if not group:
        return rows
    at = rows.index(group[0])
    each = [[cell.replace(FLAG, field) for cell in row] for field in config.FIELDS for row in group]
    return rows[:at] + each + rows[at + len(group) :]


FLAG = "<flag>"


def test_the_api_page_lists_every_patch_of_every_set_with_its_reason():
    """docs/api.md "Every patch, where it goes and why" is what the code builds, row for row, for each of the
    three patch sets (built here without applying them; the real release's modules are their owners)."""
    import importlib

    from unsloth_diffusion_norm import construction, detect, native, patched, wrappers
    from unsloth_diffusion_norm.activation import DIFFUSION_MODULES, TRAINER_MODULE

    rows = docs_table("patches")
    documented = {
        where: [(name, why) for w, name, why in rows if w in (where, "every one of the three")]
        for where in ("2026.10.4–.6", "2026.10.7+", "switched off")
    }
    modules = [importlib.import_module(n) for n in (TRAINER_MODULE, *DIFFUSION_MODULES)]
    built = {
        "2026.10.4–.6": patched.release_patches(wrappers.Release("<shape>", *modules)),
        "2026.10.7+": native.release_patches(wrappers.Release(detect.UPSTREAM, *modules)),
        "switched off": construction.flags_only(wrappers.Release(None, modules[0], disabled_by="test")),
    }
    assert {where: [(p.name, p.why) for p in found] for where, found in built.items()} == documented


def test_the_flags_default_on_the_class_as_a_dataclass_field_does(plugin):
    with unsloth_diffusion_norm.unpatched():  # applied afresh on the way out: what apply() builds now is checked
        pass
    for field in config.FIELDS:
        default = config.default(field)  # None, or diffusion_eval_draws' 1
        assert getattr(DiffusionConfig, field) == default == DiffusionConfig.__dataclass_fields__[field].default


@native_only
def test_the_api_page_lists_every_patch_a_flag_gives_a_trainer_on_a_native_release(plugin):
    from unsloth_diffusion_norm.proof import experiment, fixtures

    documented = {}
    for flag, name, why in docs_table("trainer patches"):
        documented.setdefault(flag, []).append((name, why))
    with unsloth_diffusion_norm.unpatched():  # applied afresh on the way out: the trainers get what apply() builds now
        pass
    for flag, rows in documented.items():
        settings = {}
        if flag != "the defaults":
            field, value = flag.split("=")
            settings = {field: value.strip('"')}
        setup = experiment.Setup.of(**settings)
        trainer = experiment.build([fixtures.Example([10], [20, 21])], setup, record=False).trainer
        label = f"DiffusionTrainer at {id(trainer):#x}: "
        own = [
            (name[len(label) :], why) for name, why in unsloth_diffusion_norm.status().patches if name.startswith(label)
        ]
        assert own == rows, flag


def test_without_unsloth_apply_says_how_to_install_it(monkeypatch):
    import sys

    for name in [n for n in sys.modules if n == "unsloth" or n.startswith("unsloth.")]:
        monkeypatch.delitem(sys.modules, name)

    class NotInstalled:  # finds no module named unsloth, as when it is not installed
        def find_spec(self, name, path=None, target=None):
            if name == "unsloth":
                raise ModuleNotFoundError("No module named 'unsloth'", name="unsloth")

    monkeypatch.setattr(sys, "meta_path", [NotInstalled(), *sys.meta_path])
    saved = (registry.STATE.mode, registry.STATE.reason, registry.STATE.patches)
    registry.STATE.patches = []  # (the process's patches stay applied; apply() must not revert them here)
    try:
        with pytest.raises(RuntimeError) as refused:
            unsloth_diffusion_norm.apply()
        assert str(refused.value) == (
            "unsloth_diffusion_norm: Unsloth is not installed; install it with: pip install 'unsloth>=2026.10.4'"
        )
    finally:
        registry.STATE.mode, registry.STATE.reason, registry.STATE.patches = saved


@native_only
def test_a_native_release_says_what_the_plugin_still_changes_there(plugin):
    unsloth_diffusion_norm.unpatch()  # (applied afresh: the reason is set by apply itself)
    assert unsloth_diffusion_norm.apply().reason == (
        "this release normalizes by the window natively; its own noise is drawn while a window is fetched, "
        "before a resumed run's RNG is restored, so the plugin draws it at the window's first step instead"
    )


@patched_only
def test_apply_twice_changes_nothing(plugin):
    before = [(p.name, p.installed) for p in registry.STATE.patches]
    assert unsloth_diffusion_norm.apply() == unsloth_diffusion_norm.status()
    assert [(p.name, p.installed) for p in registry.STATE.patches] == before


def test_status_names_the_shape_and_what_a_run_gets_by_default(plugin):
    from unsloth_diffusion_norm import detect

    status = unsloth_diffusion_norm.status()
    shapes = {registry.PATCHED: (detect.DENSE, detect.CHUNKED), registry.NATIVE: (detect.UPSTREAM,)}[MODE]
    assert status.shape in shapes and status.defaults == report.defaults(MODE)
    with unsloth_diffusion_norm.unpatched() as inside:
        assert inside.defaults is None


def test_a_release_without_the_diffusion_trainer_module_is_named_unsupported(monkeypatch):
    import sys

    from unsloth_diffusion_norm.activation import DIFFUSION_MODULES, TRAINER_MODULE

    class Missing:  # a release before masked diffusion: the module is not there
        def find_spec(self, name, path=None, target=None):
            if name == TRAINER_MODULE:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    for name in (TRAINER_MODULE, *DIFFUSION_MODULES):
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Missing(), *sys.meta_path])
    saved = (registry.STATE.mode, registry.STATE.reason, registry.STATE.patches, registry.STATE.shape)
    registry.STATE.patches = []  # (the process's patches stay applied; apply() must not revert them here)
    try:
        with pytest.raises(RuntimeError) as refused:
            unsloth_diffusion_norm.apply()
        reason = f"it has no masked-diffusion training (No module named '{TRAINER_MODULE}')"
        assert registry.STATE.reason == reason and registry.STATE.mode == registry.UNSUPPORTED
        assert str(refused.value) == f"unsloth_diffusion_norm: Unsloth {registry.STATE.unsloth_version}: {reason}"
        assert registry.STATE.unsloth_version and registry.STATE.unsloth_version.startswith("2026.")
    finally:
        registry.STATE.mode, registry.STATE.reason, registry.STATE.patches, registry.STATE.shape = saved


def test_every_patch_of_a_release_object_wraps_something_the_release_has(plugin):
    """A patch replaces one of the release's own objects and never adds a name the release lacks, but for the
    DiffusionConfig fields and one property: patching anew, every other target is there once they are off."""
    # A property over the attribute Trainer.__init__ sets on each instance: the class has no such name of its own.
    added = {"model_accepts_loss_kwargs", *config.FIELDS}
    unsloth_diffusion_norm.unpatch()
    unsloth_diffusion_norm.apply()  # (anew: every patch set is built again)
    targets = [(p.owner, p.attribute) for _, p in registry.applied() if not p.item and p.attribute not in added]
    unsloth_diffusion_norm.unpatch()
    try:
        missing = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name in targets if not hasattr(owner, name)]
    finally:
        unsloth_diffusion_norm.apply()
    assert targets and missing == []

"""Patches as data, on plain classes: apply, revert, all-or-nothing, and knowing whether they still hold."""

import pytest

from unsloth_diffusion_norm import registry
from unsloth_diffusion_norm.registry import MISSING, Patch


class Base:
    def greet(self):
        return "base"


def make_classes():
    class Owner(Base):
        value = 1

        def own(self):
            return "own"

    return Owner


def test_a_patch_replaces_and_restores_an_own_attribute():
    Owner = make_classes()
    original = vars(Owner)["own"]
    patch = Patch("Owner.own", Owner, "own", lambda current: lambda self: "patched " + current(self), "why")
    patch.apply()
    assert Owner().own() == "patched own" and patch.in_place()
    patch.revert()
    assert vars(Owner)["own"] is original and not patch.in_place()


def test_a_patch_of_an_inherited_attribute_goes_on_the_subclass_and_comes_off_again():
    Owner = make_classes()
    patch = Patch("Owner.greet", Owner, "greet", lambda current: lambda self: "sub " + current(self), "why")
    patch.apply()
    assert Owner().greet() == "sub base" and Base().greet() == "base"
    patch.revert()
    assert "greet" not in vars(Owner) and Owner().greet() == "base"


def test_an_item_patch_adds_and_removes_a_dict_entry():
    fields = {"a": 1}
    patch = Patch("fields.b", fields, "b", lambda current: 2 if current is MISSING else current, "why", item=True)
    patch.apply()
    assert fields == {"a": 1, "b": 2} and patch.in_place()
    patch.revert()
    assert fields == {"a": 1}


def test_an_instance_can_own_a_patch():
    Owner = make_classes()
    one, other = Owner(), Owner()
    patch = Patch("one.value", one, "value", lambda current: current + 1, "why")
    patch.apply()
    assert (one.value, other.value) == (2, 1)
    patch.revert()
    assert "value" not in vars(one) and one.value == 1


def test_a_patch_replaced_by_someone_else_is_no_longer_in_place():
    Owner = make_classes()
    patch = Patch("Owner.own", Owner, "own", lambda current: lambda self: "ours", "why")
    patch.apply()
    Owner.own = lambda self: "theirs"
    assert not patch.in_place()


def test_apply_all_is_all_or_nothing(monkeypatch):
    monkeypatch.setattr(registry, "STATE", registry.State())
    Owner = make_classes()

    def broken(current):
        raise RuntimeError("cannot build this one")

    first = Patch("Owner.own", Owner, "own", lambda current: lambda self: "ours", "why")
    second = Patch("Owner.value", Owner, "value", broken, "why")
    with pytest.raises(RuntimeError, match="cannot build"):
        registry.apply_all([first, second])
    assert Owner().own() == "own" and registry.STATE.patches == []

    registry.apply_all([first])
    assert registry.STATE.patches == [first] and Owner().own() == "ours"
    registry.revert_all()
    assert registry.STATE.patches == [] and Owner().own() == "own"


def test_a_patch_not_applied_yet_is_not_in_place_and_has_saved_nothing():
    class Owner:
        value = None

    patch = Patch("Owner.value", Owner, "value", lambda current: 1, "why")
    assert (patch.name, patch.why) == ("Owner.value", "why")
    assert not patch.in_place() and patch.saved is MISSING and patch.installed is MISSING


def test_an_item_patch_gets_the_current_value_and_a_missing_attribute_is_missing():
    table = {"k": 1}
    bump = Patch("table[k]", table, "k", lambda current: current + 1, "why", item=True)
    bump.apply()
    assert table == {"k": 2}
    bump.revert()
    assert table == {"k": 1}
    Owner = make_classes()
    seen = []
    Patch("Owner.new", Owner, "new", lambda current: seen.append(current), "why").apply()
    assert seen == [MISSING]


def test_a_reverted_patch_is_no_longer_in_place_even_where_the_original_is_none():
    class Owner:
        value = None

    patch = Patch("Owner.value", Owner, "value", lambda current: 1, "why")
    patch.apply()
    assert patch.in_place()
    patch.revert()
    assert Owner.value is None and not patch.in_place()


def test_a_trainers_own_patches_are_listed_with_it_and_reverted_with_the_rest(state):
    class Trainer:
        def step(self):
            return "own"

    trainer = Trainer()
    registry.apply_to_trainer(trainer, [Patch("step", trainer, "step", lambda current: lambda: "patched", "why")])
    assert trainer.step() == "patched"
    label = f"Trainer at {id(trainer):#x}:"
    assert [name for name, _ in registry.applied()] == [f"{label} step"]
    registry.revert_all()
    assert trainer.step() == "own" and registry.applied() == [] and registry.PER_TRAINER not in vars(trainer)


def test_applied_lists_the_process_wide_patches_then_each_trainers(state):
    Owner = make_classes()
    process_wide = Patch("Owner.own", Owner, "own", lambda current: current, "why")
    registry.apply_all([process_wide])
    trainer = make_classes()()
    registry.apply_to_trainer(trainer, [Patch("value", trainer, "value", lambda current: 2, "why")])
    assert [name for name, _ in registry.applied()] == ["Owner.own", f"Owner at {id(trainer):#x}: value"]


def test_every_trainer_the_plugin_keeps_something_on_is_given_back_whole_by_revert_all(state):
    """Its own patches reverted, its callback taken out, its PerTrainer gone: whether it has patches or not."""

    class Trainer:
        def __init__(self):
            self.callbacks = []

        def step(self):
            return "own"

        def pop_callback(self, callback):
            self.callbacks.remove(callback)

    noise_only, with_callback, with_patches = Trainer(), Trainer(), Trainer()
    registry.per_trainer(noise_only).noise = "global"
    order = registry.per_trainer(with_callback).order = object()
    with_callback.callbacks.append(order)
    registry.apply_to_trainer(with_patches, [Patch("step", with_patches, "step", lambda c: lambda: "patched", "w")])
    assert set(registry.STATE.trainers) == {noise_only, with_callback, with_patches}
    assert registry.per_trainer(noise_only) is vars(noise_only)[registry.PER_TRAINER]  # one, made once
    registry.revert_all()
    for trainer in (noise_only, with_callback, with_patches):
        assert registry.PER_TRAINER not in vars(trainer) and trainer.callbacks == [] and trainer.step() == "own"
    assert len(registry.STATE.trainers) == 0 and registry.applied() == []

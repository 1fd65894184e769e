"""The unit tier: no Unsloth. Tests that touch the process-wide state get it back afterwards."""

import weakref

import pytest

from unsloth_diffusion_norm import activation, registry, report


@pytest.fixture
def state(monkeypatch):
    """registry.STATE, the said-once memory and the hook flag, restored afterwards. The test starts with no
    patches listed (whatever the process has applied stays applied) and its own are reverted."""
    saved, announced = dict(vars(registry.STATE)), set(report._announced)
    monkeypatch.setattr(activation, "_hooks_registered", activation._hooks_registered)
    report._announced.clear()
    registry.STATE.patches, registry.STATE.trainers = [], weakref.WeakSet()
    yield registry.STATE
    registry.revert_all()
    vars(registry.STATE).update(saved)
    report._announced.clear()
    report._announced.update(announced)

"""Real Unsloth, transformers, TRL and torch on CPU. The plugin is imported before Unsloth, as users do."""

import os

import unsloth_diffusion_norm  # noqa: F401 - before unsloth, the documented order
from unsloth_diffusion_norm.proof import fixtures

for name, value in fixtures.CPU_ENVIRONMENT.items():
    os.environ.setdefault(name, value)
# Under pytest-xdist the workers share the cores: torch's threads per worker (set before torch is imported),
# so that they do not oversubscribe them.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault(
        "OMP_NUM_THREADS", str(max(1, os.cpu_count() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    )

import pytest  # noqa: E402

from unsloth_diffusion_norm import registry  # noqa: E402


def pytest_configure(config):
    """Unsloth imported (the plugin's hooks patch it) in each process that runs tests, before any test module;
    not in pytest-xdist's controller, which runs none: every leg's pytest would pay a serial `import unsloth`
    (seconds) before its workers start."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    import unsloth  # noqa: F401

    global MODE
    MODE = unsloth_diffusion_norm.status().mode


MODE = None  # what the plugin made of the installed release, in a process that runs tests


def pytest_itemcollected(item):
    # In the junit report of each test (scripts/matrix.py reads the leg's mode from it: no process of its own).
    item.user_properties.append(("plugin_mode", MODE))


EXPECTED_MODE = fixtures.expected_mode()
if EXPECTED_MODE == registry.UNSUPPORTED:
    # Nothing to train on such a release: only the tests about the release as a whole apply.
    collect_ignore = ["multiprocess"] + [
        n for n in os.listdir(os.path.dirname(__file__)) if n.startswith("test_") and n != "test_release.py"
    ]


# Parametrized at session scope so pytest runs every stock case first, then installs Unsloth's
# gradient-accumulation rewrite of transformers.Trainer (irreversible) and runs them all again.
@pytest.fixture(scope="session", params=["stock-trainer", "unsloth-ga-patched-trainer"])
def trainer_stack(request):
    if request.param == "unsloth-ga-patched-trainer":
        import transformers
        from unsloth.models._utils import patch_gradient_accumulation_fix

        patch_gradient_accumulation_fix(transformers.Trainer)
        assert transformers.Trainer.get_batch_samples.__name__ == "_unsloth_get_batch_samples"
    return request.param


@pytest.fixture
def plugin():
    """Patched for the test's duration, whatever an earlier test left."""
    unsloth_diffusion_norm.apply()
    yield unsloth_diffusion_norm
    unsloth_diffusion_norm.apply()


@pytest.fixture
def unpatched():
    with unsloth_diffusion_norm.unpatched() as status:
        yield status


@pytest.fixture
def drifted():
    """A drifted release: one piece this mode's patch set relies on, removed from the real class (nothing
    patched meanwhile); yields (owner, piece, saved). Afterwards the piece and the patches are back."""
    from unsloth.models.diffusion_masked import MaskedDiffusionProfile
    from unsloth.models.diffusion_trainer import DiffusionTrainer

    mode = unsloth_diffusion_norm.apply().mode
    owner, piece = (
        (DiffusionTrainer, "_uses_global_masked_tokens")
        if mode == registry.NATIVE
        else (MaskedDiffusionProfile, "_token_ids")
    )
    unsloth_diffusion_norm.unpatch()
    saved = vars(owner)[piece]
    delattr(owner, piece)
    try:
        yield owner, piece, saved
    finally:
        setattr(owner, piece, saved)
        unsloth_diffusion_norm.apply()

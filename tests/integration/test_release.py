"""The installed Unsloth release as a whole: the mode the plugin must give it, import-time behaviour,
and a clear message for a release without masked diffusion. Runs on every leg of the version matrix."""

import os
import subprocess
import sys

import pytest

import unsloth_diffusion_norm
from unsloth_diffusion_norm import config, registry
from unsloth_diffusion_norm.proof.fixtures import CPU_ENVIRONMENT, expected_mode

EXPECTED_MODE = expected_mode()


def _python(code, **env):
    environment = {**os.environ, **CPU_ENVIRONMENT, **env}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1], result.stderr


def test_the_mode_is_the_one_this_release_needs():
    status = unsloth_diffusion_norm.status()
    assert status.mode == EXPECTED_MODE, str(status)
    if EXPECTED_MODE == registry.UNSUPPORTED:
        assert status.patches == () and status.reason


# Appended to a snippet that has set `u` and `seen`: prints `seen` and the mode an explicit apply() leaves.
THEN_APPLY = (
    "try:\n    applied = u.apply().mode\nexcept RuntimeError:\n    applied = u.status().mode\nprint(*seen, applied)"
)


@pytest.mark.fresh_interpreter
def test_import_alone_imports_neither_torch_nor_unsloth_and_apply_then_imports_and_patches():
    line, _ = _python(
        "import sys, time; t = time.perf_counter(); import unsloth_diffusion_norm as u; "
        "ms = (time.perf_counter() - t) * 1000; light = 'dataclasses' not in sys.modules; "
        "seen = (u.status().mode, 'torch' in sys.modules, 'unsloth' in sys.modules, light, "
        "'dataclasses' not in sys.modules, round(ms, 1))\n" + THEN_APPLY
    )
    mode, torch_loaded, unsloth_loaded, light, still_light, _ms, applied = line.split()
    assert (mode, torch_loaded, unsloth_loaded) == ("pending", "False", "False")
    # Nor dataclasses, which pulls inspect, after the import or a status(): the import stays a few milliseconds.
    assert (light, still_light) == ("True", "True")
    # apply() before Unsloth is imported imports it; the post-import hook that runs meanwhile is no second apply.
    assert applied == EXPECTED_MODE


SEEN = (
    "import wrapt, unsloth_diffusion_norm as u; s = u.status(); "
    "T = __import__('sys').modules.get('unsloth.models.diffusion_trainer'); "
    "seen = (s.mode, len(s.patches), T is not None and isinstance(vars(T.DiffusionTrainer)['__init__'], wrapt.FunctionWrapper))"
)
REPORT = SEEN + "; print(*seen)"


@pytest.mark.fresh_interpreter
def test_import_after_unsloth_works_and_the_env_switch_disables():
    after, _ = _python("import unsloth, unsloth_diffusion_norm; " + REPORT)
    mode, patches, wrapped = after.split()
    assert mode == EXPECTED_MODE
    assert wrapped == str(EXPECTED_MODE != registry.UNSUPPORTED) and (int(patches) > 0) == (wrapped == "True")
    # (Unsloth first here: the hooks then run at registration; test_field.py switches off before Unsloth.)
    disabled, _ = _python(
        "import unsloth, unsloth_diffusion_norm; " + SEEN + "\n" + THEN_APPLY, UNSLOTH_DIFFUSION_NORM="0"
    )
    mode, patches, wrapped, applied = disabled.split()
    assert mode == "disabled"
    # Switched off, only the flags stay (accepted by DiffusionConfig, refused by the trainer when set).
    flags_only = 1 + 3 * len(config.FIELDS) + 1 if EXPECTED_MODE != registry.UNSUPPORTED else 0
    assert int(patches) == flags_only and wrapped == str(flags_only > 0)
    assert applied == EXPECTED_MODE  # an explicit apply() overrides the switch (the flags-only set goes first)


@pytest.mark.fresh_interpreter
@pytest.mark.skipif(
    EXPECTED_MODE != registry.UNSUPPORTED,
    reason="the installed release is supported; an unrecognised shape is tested in test_activation.py",
)
def test_a_release_without_masked_diffusion_gets_one_clear_warning_and_nothing_patched():
    from unsloth_diffusion_norm.detect import unsloth_version

    line, stderr = _python(
        "import unsloth_diffusion_norm as u, unsloth\n"
        "try:\n    u.apply()\nexcept RuntimeError as e:\n    print('raised', 'Unsloth ' + u.status().unsloth_version in str(e))\n"
    )
    assert line == "raised True"  # apply() says which release and what is missing
    warnings = [line for line in stderr.splitlines() if "unsloth_diffusion_norm: Unsloth" in line]
    assert len(warnings) == 1 and f"Unsloth {unsloth_version()} is not supported" in warnings[0]
    assert "Nothing was patched" in warnings[0]


@pytest.mark.fresh_interpreter
@pytest.mark.skipif(
    EXPECTED_MODE != registry.UNSUPPORTED,
    reason="the installed release is supported; doctor's exit 2 for unrecognised internals is tested in test_doctor.py",
)
def test_doctor_exits_2_on_a_release_without_masked_diffusion():
    env = {**os.environ, **CPU_ENVIRONMENT}
    done = subprocess.run(
        [sys.executable, "-m", "unsloth_diffusion_norm.tools.cli", "doctor"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2 and "is not supported" in done.stdout

"""The rooms: the oracle never imports the patches or the loss code it judges, checked in a fresh interpreter. That
the core (what runs inside a user's training step) never imports the proof or the tools is checked where a user's
run is: the example script's, trained, evaluated and watched in a fresh interpreter (test_field.py)."""

import json
import os
import subprocess
import sys
import textwrap

from unsloth_diffusion_norm.proof import fixtures


def _modules_after(code, cwd, **env):
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(code) + "\nimport sys, json\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('unsloth_diffusion_norm'))))",
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **fixtures.CPU_ENVIRONMENT, **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_oracle_never_imports_what_it_judges(tmp_path):
    loaded = _modules_after("import unsloth_diffusion_norm.proof.oracle", tmp_path)
    judged = {
        f"unsloth_diffusion_norm.{name}"
        for name in (
            "patches",
            "patched",
            "native",
            "construction",
            "wrappers",
            "loss",
            "noise",
            "window",
            "per_sample",
            "evaluation",
            "batch_keys",
        )
    }
    assert "unsloth_diffusion_norm.proof.oracle" in loaded and not judged & set(loaded)

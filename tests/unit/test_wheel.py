"""The wheel users install: built from this checkout (`make dist` builds it the same way), it holds the package
whole (every module of the three rooms, the tiny model's remote code that doctor and reproduce write out), the
licence and the metadata, the console script, and nothing of the checkout's own (tests, scripts, caches)."""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).parents[2]
CACHES = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


@pytest.mark.once  # the package's own files, the same on every release
def test_the_wheel_holds_the_package_the_licence_and_the_metadata_and_nothing_else(tmp_path):
    # (a checkout's own build/ directory imports as an empty namespace package: not the builder)
    found = importlib.util.find_spec("build")
    if found is None or found.origin is None:
        pytest.skip("make dist's builder (requirements-tools.txt) is not installed")
    # Built from a copy of what the build reads: setuptools writes build/ and the egg-info beside the sources, and
    # a `make dist` or another build running beside this test in the checkout would share them.
    source = tmp_path / "source"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "unsloth_diffusion_norm", source / "unsloth_diffusion_norm", ignore=CACHES)
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PIP_NO_CACHE_DIR": "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = {str(p.relative_to(ROOT)) for p in (ROOT / "unsloth_diffusion_norm").rglob("*.py")}
    assert package <= names and "unsloth_diffusion_norm/proof/tiny_model/modeling_nemotron_labs_diffusion.py" in names
    (info,) = {name.split("/")[0] for name in names if ".dist-info/" in name}
    assert names - package == {
        f"{info}/{leaf}"
        for leaf in ("METADATA", "WHEEL", "entry_points.txt", "top_level.txt", "RECORD", "licenses/LICENSE")
    }
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    version = next(line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Version: "))
    assert version != "0.0.0" and f"-{version}-" in wheel.name
    assert "License-Expression: AGPL-3.0-only" in metadata and "Requires-Dist: unsloth>=2026.10.4" in metadata
    assert "GNU AFFERO GENERAL PUBLIC LICENSE" in zipfile.ZipFile(wheel).read(f"{info}/licenses/LICENSE").decode()
    entry = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert "unsloth-diffusion-norm = unsloth_diffusion_norm.tools.cli:main" in entry

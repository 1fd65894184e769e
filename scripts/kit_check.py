"""The device kit, checked on a CPU host: it installs into a clean target the way scripts/gpu_check.sh installs it,
and with the GPU machine's image packages (scripts/gpu_image_packages.txt) and the kit alone visible, the tier's
stack imports and the CPU side of the cuda tier passes.

    scripts/device_kit.sh && python3 scripts/kit_check.py [--python .venv/bin/python] [--releases 2026.10.6 ...]

The install uses a Python 3.12 (`--pip-python`, or python3.12 on the PATH: the GPU machine's version; pip then
checks the wheels' tags as there), else pip's --python-version 3.12. The import runs in this checkout's environment (`--python`, which
has a CPU torch): every installed distribution not on the image's list is hidden, so what the kit lacks fails.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIT = os.path.join(ROOT, ".whl")

# Runs first in the checked interpreter: hides every distribution neither on the image's list nor in the target.
HIDE = r"""
import importlib.abc, importlib.machinery as machinery, importlib.metadata as metadata, re, sys
TARGET, LISTED = sys.argv[1], sys.argv[2]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
image = {norm(line.strip()) for line in open(LISTED) if line.strip() and not line.startswith("#")}
image.add("unsloth-diffusion-norm")  # this checkout, copied over with the kit
hidden = {top for top, dists in metadata.packages_distributions().items() if not any(norm(d) in image for d in dists)}
seen = set()

class ImageOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in hidden and path is None:  # only the target's copy, if it has one
            spec = machinery.PathFinder.find_spec(name, [TARGET])
            if spec is None and top not in seen:
                seen.add(top)
                print(f"kit_check: not on the GPU image and not in the kit: {top}", file=sys.stderr)
            return spec
        return machinery.PathFinder.find_spec(name, path, target)

    def find_distributions(self, context=metadata.DistributionFinder.Context()):
        for dist in machinery.PathFinder.find_distributions(context):
            where = str(getattr(dist, "_path", ""))
            if where.startswith(TARGET) or norm(dist.metadata["Name"] or "") in image or "site-packages" not in where:
                yield dist

    def invalidate_caches(self):
        machinery.PathFinder.invalidate_caches()

sys.meta_path[:] = [ImageOnly() if f is machinery.PathFinder else f for f in sys.meta_path]
sys.path[:0] = [TARGET, sys.argv[3]]
del sys.argv[1:4]
"""

IMPORTS = r"""
import importlib.metadata as metadata, os
import unsloth_diffusion_norm
import unsloth, unsloth_zoo, trl, datasets
from unsloth.models.diffusion_trainer import DiffusionTrainer
for name in ("unsloth", "unsloth_zoo", "trl", "datasets", "dill", "multiprocess"):
    module = __import__(name)
    print(f"  {name} {metadata.version(name)} from {os.path.dirname(module.__file__)}")
print("  mode:", unsloth_diffusion_norm.status().mode)
"""

TIER_ON_CPU = r"""
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-m", "not cuda", "tests/integration/test_cuda.py"]))
"""


def python312(given):
    """A Python 3.12 that runs pip (the GPU machine's version), or None."""
    for candidate in [given, shutil.which("python3.12")]:
        if candidate and subprocess.run([candidate, "-m", "pip", "--version"], capture_output=True).returncode == 0:
            return candidate
    return None


def install(target, release, python=None):
    wheels = [os.path.join(KIT, d, f) for d in ("common", release) for f in sorted(os.listdir(os.path.join(KIT, d)))]
    command = [python or sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    command += ["--no-cache-dir", "--target", target]
    if python is None:
        command += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    started = time.monotonic()
    subprocess.run(command + wheels, check=True)
    return f"{command[0]} -m pip install --no-index --no-deps --target {target}", time.monotonic() - started


def run_hidden(python, target, code):
    listed = os.path.join(ROOT, "scripts", "gpu_image_packages.txt")
    env = {**os.environ, "UNSLOTH_ALLOW_CPU": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env.pop("PYTHONPATH", None)
    program = "import sys\n" + HIDE + code
    return subprocess.run(
        [python, "-c", program, target, listed, ROOT], cwd=ROOT, env=env, text=True, capture_output=True
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"))
    parser.add_argument(
        "--releases",
        nargs="+",
        default=sorted(d for d in os.listdir(KIT) if d != "common" and os.path.isdir(os.path.join(KIT, d))),
    )
    parser.add_argument("--no-tier", action="store_true", help="imports only")
    parser.add_argument("--pip-python", help="a Python 3.12 to install with (default: python3.12 on the PATH)")
    args = parser.parse_args()
    failed = 0
    commit = os.path.join(KIT, "COMMIT")  # what the GPU check's record names where its copy has no git history
    if os.path.exists(commit):
        print(f"kit built at commit: {' '.join(open(commit).read().split())}")
    else:
        print(f"kit_check: no {os.path.relpath(commit, ROOT)}: the GPU check's record will name no commit without git")
    for release in args.releases:
        target = tempfile.mkdtemp(prefix=f"udn-kit-{release}-")
        try:
            how, seconds = install(target, release, python312(args.pip_python))
            print(
                f"{release}: installed into a clean target ({how}): {seconds:.1f} s, {len(os.listdir(target))} entries"
            )
            for what, code in [("imports", IMPORTS)] + (
                [] if args.no_tier else [("the cuda tier's CPU side", TIER_ON_CPU)]
            ):
                started = time.monotonic()
                done = run_hidden(args.python, target, code)
                lines = [
                    line
                    for line in (done.stdout + done.stderr).splitlines()
                    if line.startswith(("  mode:", "kit_check")) or (line.startswith("  ") and " from /" in line)
                ]
                summary = [line for line in done.stdout.splitlines() if " passed" in line or " failed" in line]
                verdict = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
                print(
                    f"{release}: {what} with only the GPU image's packages and the kit: {verdict}, {time.monotonic() - started:.0f} s"
                )
                print("\n".join(lines + summary))
                if done.returncode:
                    failed += 1
                    print((done.stdout + done.stderr)[-3000:])
        finally:
            shutil.rmtree(target, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

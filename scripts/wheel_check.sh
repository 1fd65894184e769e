#!/usr/bin/env bash
# The release as a user gets it: the wheel that `make dist` built, installed (not editable) into a fresh virtual
# environment, its commands run from a directory outside the checkout.
#
#   scripts/wheel_check.sh        # make wheel-check; CI runs it after make dist
#
# The fresh environment sees the pinned stack of .venv read-only: one path in a .pth file, so .venv's own .pth
# files (the editable install of this checkout among them) are not run and the plugin comes only from the wheel.
# The wheel goes in with --no-deps: pip's resolver also walks the requirements of installed packages, and
# unsloth's torchvision is left out of this CPU stack on purpose (it cannot load beside torch's CPU build), so a
# plain `pip install` would fetch torchvision and a CUDA torch for it. Instead the wheel's own requirements, with
# the [bench] extra's, are each checked against what is installed: pip would install nothing more for them.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
WHEEL=$(ls "$ROOT"/dist/unsloth_diffusion_norm-*.whl)
HERE=$(mktemp -d /tmp/udn-wheel-XXXX)
trap 'rm -rf "$HERE"' EXIT
started=$(date +%s)
say() { echo "== [$(($(date +%s) - started)) s] $*"; }

say "a fresh environment in $HERE/env, with the pinned stack of $VENV visible"
"$VENV/bin/python" -m venv "$HERE/env"
PY=$HERE/env/bin/python
"$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" >"$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/pinned-stack.pth"

say "install $(basename "$WHEEL") ($(stat -c %s "$WHEEL") bytes), not editable"
"$PY" -m pip install -q --no-deps --no-index "$WHEEL" 2>&1 | grep -v "is ignored: it is neither" || true
cd "$HERE" # outside the checkout: nothing of it on sys.path
"$PY" - <<'PY'
import importlib.metadata as metadata, os, sys
from packaging.requirements import Requirement

import unsloth_diffusion_norm

where = os.path.dirname(unsloth_diffusion_norm.__file__)
assert where.startswith(sys.prefix), f"the plugin was imported from {where}, not from the fresh environment"
dist = metadata.distribution("unsloth-diffusion-norm")
assert not any(f.name.startswith("__editable__") for f in dist.files or []), "an editable install"
print(f"plugin {dist.version} from {where}")
for text in dist.requires:
    requirement = Requirement(text)
    if requirement.marker and not requirement.marker.evaluate({"extra": "bench"}):
        continue
    installed = metadata.version(requirement.name)
    assert requirement.specifier.contains(installed, prereleases=True), (text, installed)
    print(f"  {text:<50} installed {installed}")
PY
export UNSLOTH_ALLOW_CPU=1 TRANSFORMERS_VERBOSITY=error
CLI=$HERE/env/bin/unsloth-diffusion-norm
for command in "--version" "status" "reproduce" "doctor"; do
  say "unsloth-diffusion-norm $command"
  # shellcheck disable=SC2086 # one word per command
  "$CLI" $command >"$HERE/out" 2>&1 || {
    status=$?
    cat "$HERE/out"
    echo "wheel_check: unsloth-diffusion-norm $command exited $status" >&2
    exit 1
  }
  grep -E "^unsloth-diffusion-norm |^unsloth_diffusion_norm: mode|^Unsloth 20|within tolerance|^Verdict|^Self-check" "$HERE/out" |
    cut -c1-160 || true
done
say "done: the wheel installs and its commands pass from outside the checkout"

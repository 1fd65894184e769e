#!/usr/bin/env bash
# The GPU verdict in one command, run on a CUDA machine without network (Python 3.12, torch with CUDA) from a
# checkout whose .whl/ holds the device kit (scripts/device_kit.sh, run first where there is network, then the
# checkout copied over with its .whl/):
#
#   OUT=<a folder> scripts/gpu_check.sh      (at most 8 minutes; 3 on an H200)
#
# 1. installs .whl/common and one release's wheels into a target per release (/tmp/udn-site/<release>);
# 2. prints the stack it got: the GPU, torch, CUDA and every package the tier uses, with where it came from;
# 3. runs the cuda tier (pytest -m cuda) on 2026.10.4 (dense), 2026.10.6 (chunked) and 2026.10.9 (native) at
#    once, each in two processes (the oracle cases; the rest): tiny models, so one GPU holds the six;
# 4. runs the GPU bench alone on the GPU: 2026.10.6 (unpatched, plugin and plugin with its metrics off, in 4
#    interleaved blocks), then 2026.10.9 (Unsloth's own native run).
# Into $OUT: gpu_check.log (all of the output), junit.xml (every tier run), bench.md and bench.json; and the
# record of them all, records/gpu-check.json (records.write; copied to $OUT/gpu-check.json).
# Every step has a time limit (LIMITS below); together they stay under 8 minutes. Exit 0: every tier passed and
# the bench ran. docs/gpu.md. A rehearsal on a CPU host (the tier skips; the bench at the tiny size):
#   PYTHON=.venv/bin/python UNSLOTH_ALLOW_CPU=1 BENCH_FLAGS=--smoke scripts/gpu_check.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
KIT=${KIT:-.whl}
SITE=${SITE:-/tmp/udn-site}
WORK=$(mktemp -d /tmp/udn-gpu-XXXX)
PYTHON=${PYTHON:-python3}
case $PYTHON in */*) PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON") ;; esac # steps cd elsewhere
# Seconds per step (install per release, stack, tier, bench on the chunked release, bench on the native one,
# table, record): at most 479 in all with three releases (docs/gpu.md).
LIMIT_INSTALL=10 LIMIT_STACK=20 LIMIT_TIER=130 LIMIT_BENCH=200 LIMIT_NATIVE=90 LIMIT_TABLE=5 LIMIT_RECORD=4
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
RELEASES=$(cd "$KIT" && ls -d 2026.* | sort | tr "\n" " ")
# The real GPU path: Unsloth's own TRL rewrites on (the tests' conftest would set UNSLOTH_ALLOW_CPU=1 otherwise).
export UNSLOTH_ALLOW_CPU=${UNSLOTH_ALLOW_CPU:-0} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export HF_DATASETS_DISABLE_PROGRESS_BARS=1
started=$(date +%s)
failed=0
say() { echo "== [$(($(date +%s) - started)) s] $*"; }

say "install the kit (${KIT}) for: $RELEASES"
for release in $RELEASES; do
  timeout -k 5 $LIMIT_INSTALL "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE/$release" "$KIT"/common/*.whl "$KIT/$release"/*.whl || failed=1
done

say "the stack"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
timeout -k 5 $LIMIT_STACK "$PYTHON" - "$SITE" $RELEASES <<'EOF' || failed=1
import importlib.metadata as metadata, os, sys
import torch
site, releases = sys.argv[1], sys.argv[2:]
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA DEVICE"
print(f"Python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), {gpu}")
names = ["unsloth", "unsloth_zoo", "transformers", "trl", "accelerate", "peft", "datasets", "dill", "multiprocess",
         "fsspec", "huggingface_hub", "triton", "wrapt", "pytest", "numpy"]
for release in releases:
    found = []
    for name in names:  # the release's target first, as its PYTHONPATH puts it
        dists = list(metadata.distributions(name=name, path=[os.path.join(site, release)] + sys.path))
        where = dists and ("kit" if str(dists[0].locate_file("")).startswith(site) else "image")
        found.append(f"{name} {dists[0].version} ({where})" if dists else f"{name} MISSING")
    print(f"{release}: " + ", ".join(found))
EOF

say "the cuda tier on every release at once (limit ${LIMIT_TIER} s)"
tier() { # release, name, pytest arguments: in a directory of its own (Unsloth's and inductor's caches)
  local release=$1 name=$2
  shift 2
  local here="$WORK/$name"
  mkdir -p "$here"
  (cd "$here" && PYTHONPATH=$SITE/$release:$ROOT UNSLOTH_FORCE_FLOAT32=1 UNSLOTH_COMPILE_LOCATION=$here/compiled \
    TORCHINDUCTOR_CACHE_DIR=$here/inductor timeout -k 5 $LIMIT_TIER "$PYTHON" -m pytest -p no:cacheprovider -q -rA \
    --rootdir "$ROOT" -c "$ROOT/pyproject.toml" -m cuda --junitxml "$here/junit.xml" \
    -o junit_suite_name="cuda-$name" "$ROOT/tests/integration/test_cuda.py" "$@" >"$here/log" 2>&1
  echo $? >"$here/rc") &
  tiers+=($!)
}
tiers=()
for release in $RELEASES; do # two processes per release: its oracle cases beside the rest
  tier "$release" "$release-oracle-cases" -k oracle_cases
  # impact's model of CUDA's generator against the real one: release-independent, under a second
  tier "$release" "$release-rest" -k "not oracle_cases" "$ROOT/tests/unit/test_impact_arithmetic.py"
done
wait "${tiers[@]}" # not a bare wait: that would wait for the log's tee too
for here in "$WORK"/2026.*; do
  echo "--- $(basename "$here"): exit $(cat "$here/rc")"
  grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|Error" "$here/log" | tail -40
  [ "$(cat "$here/rc")" = 0 ] || failed=1
done
"$PYTHON" - "$OUT/junit.xml" "$WORK"/2026.*/junit.xml <<'EOF'
import sys, xml.etree.ElementTree as ET
merged = ET.Element("testsuites")
for path in sys.argv[2:]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as error:
        print(f"no JUnit XML from {path}: {error}")
        continue
    merged.extend(root.findall("testsuite") if root.tag == "testsuites" else [root])
ET.ElementTree(merged).write(sys.argv[1], encoding="utf-8", xml_declaration=True)
print(f"{'suite':<28} {'test':<96} {'outcome':<8} {'s':>6}  worst error / tolerance")
for suite in merged:
    for case in suite.iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        worst = {p.get("name"): p.get("value") for p in case.iter("property")}.get("worst_error_over_tolerance", "")
        print(f"{suite.get('name'):<28} {case.get('name'):<96} {outcome:<8} {float(case.get('time', 0)):6.1f}  {worst}")
EOF

bench() { # release, limit, bench options
  say "GPU bench on $1 (limit $2 s)"
  (cd "$WORK" && PYTHONPATH=$SITE/$1:$ROOT UNSLOTH_COMPILE_LOCATION=$WORK/compiled-bench-$1 timeout -k 5 "$2" \
    "$PYTHON" -m unsloth_diffusion_norm.tools.bench gpu "$WORK/bench-$1.json" --checkpoints "$WORK/checkpoints" \
    "${@:3}" ${BENCH_FLAGS:-}) ||
    failed=1
}
for release in $RELEASES; do
  case $release in
  2026.10.6) bench "$release" $LIMIT_BENCH ;;
  2026.10.9) bench "$release" $LIMIT_NATIVE --first 1 ;; # upstream-native: Unsloth's own run
  esac
done
say "the bench's table"
parts=$(ls "$WORK"/bench-2026.10.6.json "$WORK"/bench-2026.10.9.json 2>/dev/null)
if [ -n "$parts" ]; then
  # shellcheck disable=SC2086 # one path per part
  PYTHONPATH=$ROOT timeout -k 5 $LIMIT_TABLE "$PYTHON" -m unsloth_diffusion_norm.tools.bench table $parts \
    --json "$OUT/bench.json" | tee "$OUT/bench.md" || failed=1
else
  failed=1
fi
say "done: exit $failed"
# The record: records/gpu-check.json (records.write) with every figure above, read back from $OUT's files, the
# GPU's name as the stack printed it (torch.cuda.get_device_name(0)) and the commit from git, or from the kit
# ($KIT/COMMIT, scripts/device_kit.sh) where this copy has no git history; a copy in $OUT. No CUDA device (a
# rehearsal): into $OUT only.
PYTHONPATH=$ROOT timeout -k 2 $LIMIT_RECORD "$PYTHON" -m unsloth_diffusion_norm.tools.bench_report gpu-check "$OUT" \
  --kit-commit "$KIT/COMMIT" --exit "$failed" --seconds $(($(date +%s) - started)) || failed=1
exec >&- 2>&-
wait # for the log's tee to write its last lines
exit $failed

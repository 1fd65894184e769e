#!/usr/bin/env bash
# The device kit: the wheels the cuda tier and the GPU bench need on the GPU machine and that its image lacks,
# downloaded here into .whl/ (ignored by git; copy it over with the checkout). That machine runs
# Python 3.12 on x86-64 with no network; its image already holds torch 2.11+cu130, transformers 5.17, accelerate,
# peft, wrapt, pytest, pyarrow, pandas, xxhash, triton (scripts/gpu_image_packages.txt). docs/gpu.md.
#
#   scripts/device_kit.sh            # download, slim, check: prints every wheel and the total (at most 64 MiB)
#
# Layout: .whl/common/ (TRL, datasets and the two packages of datasets the image lacks) and .whl/<release>/
# (unsloth + unsloth_zoo of one release: 2026.10.4 dense, 2026.10.6 chunked, 2026.10.9 native); gpu_check.sh
# installs common + one release into a target of its own. What `import unsloth` and the tier import was found by
# importing them with only the image's packages visible (scripts/kit_check.py). Left out on purpose, each
# imported by Unsloth only if present: bitsandbytes (4-bit, ~60 MiB), xformers, torchao, diffusers, cut_cross_entropy,
# hf_transfer, pydantic. The unsloth wheel also carries Unsloth Studio (studio/: a web application, ~26 MiB of
# its ~29); `import unsloth` never imports it, so it is dropped from the wheel here. Every file of the packages
# unsloth and unsloth_cli stays byte for byte, checked against the wheel's own RECORD.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${KIT:-.whl}
PYTHON=${PYTHON:-python3}
RELEASES=${RELEASES:-"2026.10.4 2026.10.6 2026.10.9"}
COMMON="trl==1.15.0 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19"
LIMIT_MIB=64
TAGS=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

download() { # folder, then requirements
  local into=$1
  shift
  "$PYTHON" -m pip download -q "${TAGS[@]}" -d "$into" "$@" 2>&1 | grep -v "is ignored: it is neither" || true
  for requirement in "$@"; do # pip's exit status is hidden by the filter: each wheel must be there
    local name=${requirement%%==*}
    ls "$into" | grep -qi "^${name//-/_}-${requirement##*==}-" || {
      echo "device_kit: no wheel for $requirement" >&2
      exit 1
    }
  done
}

rm -rf "$KIT"
mkdir -p "$KIT/common"
download "$KIT/common" $COMMON
for release in $RELEASES; do
  mkdir -p "$KIT/$release"
  download "$KIT/$release" "unsloth==$release" "unsloth_zoo==$release"
  "$PYTHON" - "$KIT/$release"/unsloth-"$release"-*.whl <<'EOF'
import base64, hashlib, os, sys, zipfile

path = sys.argv[1]
DROP = "studio/"
with zipfile.ZipFile(path) as wheel:
    record_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    record = wheel.read(record_name).decode().splitlines(keepends=True)
    expected = {line.split(",")[0]: line.split(",")[1] for line in record if line.split(",")[1]}
    kept = checked = 0
    with zipfile.ZipFile(path + ".slim", "w") as slim:
        for info in wheel.infolist():
            if info.filename.startswith(DROP):
                continue
            data = wheel.read(info)
            if info.filename == record_name:
                data = "".join(line for line in record if not line.startswith(DROP)).encode()
            elif info.filename.endswith(".dist-info/top_level.txt"):
                data = b"".join(line for line in data.splitlines(keepends=True) if line.strip() != b"studio")
            elif info.filename in expected:  # unchanged, as the wheel's own RECORD says
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                assert expected[info.filename] == f"sha256={digest}", info.filename
                checked += 1
            slim.writestr(info, data)
            kept += 1
os.replace(path + ".slim", path)
print(f"  {os.path.basename(path)}: studio/ dropped; {kept} files kept, {checked} checked against RECORD")
EOF
done

# The commit the kit was built at, for the GPU check's record where the GPU host's copy has no git history:
# the short hash, then "dirty" where the plugin had uncommitted changes.
{
  git rev-parse --short HEAD 2>/dev/null || echo unknown
  [ -z "$(git status --porcelain -- unsloth_diffusion_norm 2>/dev/null)" ] || echo dirty
} >"$KIT/COMMIT"
echo "commit: $(tr '\n' ' ' <"$KIT/COMMIT")(in $KIT/COMMIT)"

total=0
echo "device kit in $KIT (Python 3.12, x86-64):"
while read -r size file; do
  printf '  %8.2f MiB  %s\n' "$(echo "$size / 1048576" | bc -l)" "$file"
  total=$((total + size))
done < <(find "$KIT" -type f -name '*.whl' -printf '%s %P\n' | sort -k2)
printf 'total: %.2f MiB (limit %d MiB, with the working tree)\n' "$(echo "$total / 1048576" | bc -l)" "$LIMIT_MIB"
[ "$total" -le $((LIMIT_MIB * 1048576)) ] || {
  echo "device_kit: the kit is over $LIMIT_MIB MiB" >&2
  exit 1
}

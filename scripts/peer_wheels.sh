#!/usr/bin/env bash
# Downloads the optional peer's wheels (requirements-peer.txt: QuACK and CuTe DSL) for the GPU
# machine (Python 3.12, manylinux x86_64; the CUDA 13 flavour only) into .whl/peer1 and
# .whl/peer2 (ignored by git), each under 60 MiB so that one device call carries one folder:
# the one wheel over that, CuTe DSL's cu13 libraries (~88 MiB), is split into two parts, one
# per folder, with its md5 beside the second. scripts/peer_install.sh reassembles and installs
# them on the GPU machine; docs/peers.md gives the calls. Nothing here is needed by the
# tests or the main job.
#   usage: bash scripts/peer_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Packages the GPU image already has (KINDS.md's list), and the cu12 flavour the image's
# CUDA 13 driver never loads, stay behind.
SKIP='^(einops|protobuf|nvidia-cutlass-dsl-libs-cu12)=='
mapfile -t SPECS < <(grep -v -E '^\s*(#|$)' requirements-peer.txt | sed 's/\[[^]]*\]//' |
                     grep -v -E "$SKIP")
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64)
LIMIT=$((60 * 1024 * 1024))

DL=.whl/peer-download
rm -rf .whl/peer1 .whl/peer2 "$DL"
mkdir -p .whl/peer1 .whl/peer2 "$DL"
for spec in "${SPECS[@]}"; do
  echo "downloading $spec"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d "$DL" "$spec"
done

for whl in "$DL"/*.whl; do
  name=$(basename "$whl")
  if [ "$(stat -c %s "$whl")" -lt "$LIMIT" ]; then
    mv "$whl" .whl/peer2/
    continue
  fi
  (cd "$DL" && md5sum "$name") > ".whl/peer2/$name.md5"
  split -b 55M "$whl" "$DL/$name.part-"
  parts=("$DL/$name".part-*)
  if [ "${#parts[@]}" -ne 2 ]; then
    echo "peer_wheels: $name split into ${#parts[@]} parts, expected 2" >&2
    exit 1
  fi
  mv "${parts[0]}" .whl/peer1/
  mv "${parts[1]}" .whl/peer2/
  rm "$whl"
done
rmdir "$DL"

for dir in .whl/peer1 .whl/peer2; do
  size=$(du -sb "$dir" | cut -f1)
  echo "$dir: $size bytes ($((size / 1024 / 1024)) MiB)"
  ls -l "$dir" | tail -n +2 | sed 's/^/  /'
  if [ "$size" -ge "$LIMIT" ]; then
    echo "peer_wheels: $dir is over 60 MiB" >&2
    exit 1
  fi
done

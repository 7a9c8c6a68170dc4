#!/usr/bin/env bash
# Downloads the wheels of requirements-torchtitan.txt (torchtitan and the few packages its
# model code imports; no dependency trees) for the GPU machine (Python 3.12, manylinux
# x86_64; no network there) into .whl/torchtitan (ignored by git, ~7 MiB), which a device
# call carries; scripts/torchtitan_gpu_check.sh installs them there.
#   usage: bash scripts/torchtitan_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl/torchtitan
mkdir -p .whl/torchtitan
python3 -m pip download -q --no-deps -d .whl/torchtitan --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -r requirements-torchtitan.txt
du -sh .whl/torchtitan

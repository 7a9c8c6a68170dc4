#!/usr/bin/env bash
# Downloads the wheels of transformers (the version pinned in requirements-dev.txt) and its
# dependencies for the GPU machine (Python 3.12, manylinux x86_64; no network there) into
# .whl/hf (ignored by git, ~30 MiB: one device call carries it with the op library). numpy
# stays behind: the GPU image's torch has its own. On the GPU machine:
#   python3 -m pip install -q --no-index --find-links .whl/hf "$(grep '^transformers==' requirements-dev.txt)"
# then e.g. the integration's GPU tests, bench/bench_hf_step.py or the fine-tuning example.
#   usage: bash scripts/hf_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=$(grep '^transformers==' requirements-dev.txt)
rm -rf .whl/hf
mkdir -p .whl/hf
python3 -m pip download -q -d .whl/hf --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any "$SPEC"
rm -f .whl/hf/numpy-*.whl
du -sh .whl/hf

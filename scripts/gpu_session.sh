#!/usr/bin/env bash
# One call on the GPU machine (see docs/perf-notes.md, "Measuring"): checks the carried
# op library loads, runs the GPU tests, then the benchmark; results land in $OUT.
# The library is built on the dev machine (scripts/build_for_device.sh) and carried in
# python/cute_moe/lib, because the GPU machine has no network for the dependencies.
#   usage: bash scripts/gpu_session.sh [tests|bench|all] [extra bench args...]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cute_moe_out}
mkdir -p "$OUT"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, cute_moe; print('torch', torch.__version__, '| cute_moe library loaded:', cute_moe.library_loaded())" || exit 1

status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest tests/python -q -rs 2>&1 | tee "$OUT/pytest.log" | tail -25
  status=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 bench/bench_grouped_gemm.py --json "$OUT/bench.json" "$@" 2>"$OUT/bench_progress.log" | tee "$OUT/bench.txt"
fi
exit $status

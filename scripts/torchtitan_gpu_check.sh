#!/usr/bin/env bash
# Everything GPU-side of the torchtitan integration in one call on a one-GPU SM90 machine:
# installs the carried torchtitan wheels (.whl/torchtitan, from scripts/torchtitan_wheels.sh)
# into /tmp/ttsite, checks the carried op library loads, runs the integration's GPU and
# CPU tests, then the one-GPU benchmark (bench/bench_torchtitan.py: tokens/s of a
# torchtitan training step, default experts vs cute_moe, same run and weights), its table
# printed last. Logs and JSON go to $OUT (default /tmp/cute_moe_out).
# Device call (carry the wheels and the op library built by scripts/build_for_device.sh):
#   run: bash scripts/torchtitan_gpu_check.sh      carry: [".whl/torchtitan", "python/cute_moe/lib"]
# (or point CUTE_MOE_LIBRARY at a built libcute_moe_torch.so). Extra arguments go to the
# benchmark, e.g. --steps 20 --models qwen3-30b-a3b.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cute_moe_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/ttsite .whl/torchtitan/*.whl || exit 1
export PYTHONPATH=$PWD/python:/tmp/ttsite${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, cute_moe, torchtitan; print('torch', torch.__version__, '| torchtitan', torchtitan.__version__, '| cute_moe library loaded:', cute_moe.library_loaded())" || exit 1

CUTE_MOE_REQUIRE_LIBRARY=1 python3 -m pytest tests/python/test_integration_torchtitan_gpu.py \
  tests/python/test_integration_torchtitan_cpu.py -q -rs 2>&1 | tee "$OUT/torchtitan_pytest.log" | tail -15
status=${PIPESTATUS[0]}
python3 bench/bench_torchtitan.py --json "$OUT/torchtitan_1gpu.json" "$@" 2>"$OUT/torchtitan_bench_progress.log" \
  | tee "$OUT/torchtitan_1gpu.txt" || status=1
echo "tests exit status: $status (log: $OUT/torchtitan_pytest.log)"
exit $status

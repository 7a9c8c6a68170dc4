#!/usr/bin/env bash
# Everything GPU-side of the FP8 path in one call on an SM90 machine: the FP8 GPU tests
# (quantizers, the grouped GEMM, the FP8 row of the kernel table, the interim expert block),
# then the FP8 GEMM benchmark (against our bf16 GEMM and torch._scaled_grouped_mm) and the
# expert-block benchmark, their tables printed last. JSON to $OUT (default /tmp/cute_moe_out).
# Device call (carry the op library built by scripts/build_for_device.sh):
#   run: bash scripts/fp8_gpu_check.sh      carry: ["python/cute_moe/lib"]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cute_moe_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python:$PWD/bench PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
CUTE_MOE_REQUIRE_LIBRARY=1 python3 -m pytest tests/python/test_fp8_quantize_gpu.py tests/python/test_fp8_gemm_gpu.py \
  tests/python/test_fp8_ffn_gpu.py tests/python/test_kernel_table_gpu.py -k "fp8 or covered" \
  -q -p no:cacheprovider 2>&1 | tee "$OUT/fp8_pytest.log" | tail -3
status=${PIPESTATUS[0]}
python3 bench/bench_fp8_gemm.py --json "$OUT/fp8_gemm.json" 2>"$OUT/fp8_gemm_progress.log" | tee "$OUT/fp8_gemm.txt" || status=1
python3 bench/bench_fp8_block.py --json "$OUT/fp8_block.json" 2>"$OUT/fp8_block_progress.log" | tee "$OUT/fp8_block.txt" || status=1
echo "exit status: $status (logs in $OUT)"
exit $status

#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck over a slice of the GPU tests that
# launches every kernel family of the library at least once:
#   - every row of the kernel table (test_kernel_table_gpu.py: ragged-M, ragged-K bf16/fp32,
#     fused activation forward, gathered forward, fused activation backward, each tile
#     configuration, with their setup kernels);
#   - the permute gathers (gather_rows, gather_sum_rows, gather_rows_dot);
#   - the MoE layer forward + backward (router, dispatch, column sums for the bias
#     gradients, the router-probability gradient reduction, combine), both gather modes;
#   - the FP8 quantizers (the 128x1 one writing both copies, the 1x128 one with column sums)
#     and the FP8 expert block forward + backward with its weight gradients in bf16 and in FP8.
# Fails (exit 1) on any report or any test failure. Logs go to $OUT (default
# /tmp/cute_moe_sanitize). Runs on the GPU machine; the results are in docs/sanitizers.md.
#   usage: bash scripts/sanitize.sh [memcheck racecheck synccheck]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/python PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cute_moe_sanitize}
mkdir -p "$OUT"
tools=("$@")
[ ${#tools[@]} -eq 0 ] && tools=(memcheck racecheck synccheck)

SLICE=(
  tests/python/test_kernel_table_gpu.py
  "tests/python/test_permute_gpu.py::test_gather_rows[300-1201-False-264]"
  "tests/python/test_permute_gpu.py::test_gather_rows[4096-513-True-2880]"
  "tests/python/test_permute_gpu.py::test_gather_sum_rows[True-4-264]"
  "tests/python/test_permute_gpu.py::test_gather_rows_dot[8-520]"
  "tests/python/test_moe_gpu.py::test_moe_matches_reference[gpt-oss-skewed]"
  "tests/python/test_moe_gpu.py::test_moe_matches_reference[none-3d]"
  "tests/python/test_moe_gpu.py::test_fuse_gather_gives_the_same_bits[srelu-gather_pass]"
  "tests/python/test_moe_gpu.py::test_fuse_gather_gives_the_same_bits[srelu-gathered_gemm]"
  tests/python/test_fp8_quantize_gpu.py::test_quantize_1x128_128x1_is_both_quantizers
  tests/python/test_fp8_quantize_gpu.py::test_quantize_1x128_column_sums_is_both_ops
  tests/python/test_fp8_ffn_gpu.py::test_matches_quantized_reference
)

status=0
for tool in "${tools[@]}"; do
  log="$OUT/sanitize_$tool.log"
  start=$(date +%s)
  extra=()
  [ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
  compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 "${extra[@]}" \
    python3 -m pytest -q -p no:cacheprovider "${SLICE[@]}" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  tests=$(grep -E "[0-9]+ (passed|failed)" "$log" | tail -1)
  summary=$(grep -E "(ERROR|RACECHECK|SYNCCHECK|LEAK) SUMMARY" "$log" | tail -1)
  echo "sanitize $tool: exit $rc, ${secs}s; tests: ${tests:-none}; ${summary:-no summary}"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E "^========= (Invalid|Race|Barrier|Error|Program hit|.*hazard)" "$log" | sort | uniq -c | head -20
  fi
done
exit $status

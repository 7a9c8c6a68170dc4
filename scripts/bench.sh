#!/usr/bin/env bash
# The project's main job (README): on a Hopper GPU, builds everything and benchmarks our
# grouped GEMMs against torch._grouped_mm in the same run, printing a table and writing
# JSON under bench/results/. Extra arguments go to bench/bench_grouped_gemm.py.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
BUILD_DIR=${CUTE_MOE_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCUTE_MOE_BUILD_TORCH=ON -DCUTE_MOE_BUILD_TESTS=OFF \
  -DPython3_EXECUTABLE="$(command -v python3)"
CUTE_MOE_BUILD_DIR="$BUILD_DIR" python3 -m pip install -q --no-build-isolation --no-deps .
mkdir -p bench/results
out="bench/results/grouped_gemm-$(date -u +%Y%m%d-%H%M%S).json"
python3 bench/bench_grouped_gemm.py --json "$out" "$@"
echo "results written to $out"

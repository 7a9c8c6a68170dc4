#!/usr/bin/env bash
# The project's main job (README): on a Hopper GPU, builds everything, then benchmarks
# the fused MoE expert block against the torchtitan-style unfused block, and our grouped
# GEMMs against torch._grouped_mm, each in the same run on the same inputs; prints the
# tables and writes JSON under bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh --bench
BUILD_DIR=${CUTE_MOE_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCUTE_MOE_BUILD_TORCH=ON -DCUTE_MOE_BUILD_TESTS=OFF \
  -DPython3_EXECUTABLE="$(command -v python3)"
CUTE_MOE_BUILD_DIR="$BUILD_DIR" python3 -m pip install -q --no-build-isolation --no-deps .
mkdir -p bench/results
stamp=$(date -u +%Y%m%d-%H%M%S)
python3 -m cute_moe.bench --check --json "bench/results/moe-$stamp.json"
(cd bench && python3 bench_activations.py --json "results/activations-$stamp.json")
python3 bench/bench_grouped_gemm.py --json "bench/results/grouped_gemm-$stamp.json"
echo "results written to bench/results/*-$stamp.json"

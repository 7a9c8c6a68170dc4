#!/usr/bin/env bash
# Builds the op library here and places it where the GPU call picks it up
# (python/cute_moe/lib, an ignored folder named in the device call's `carry`).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${CUTE_MOE_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCUTE_MOE_BUILD_TORCH=ON -DPython3_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build "$BUILD_DIR" --target cute_moe_torch -j"$(nproc)"
mkdir -p python/cute_moe/lib
cp "$BUILD_DIR/libcute_moe_torch.so" python/cute_moe/lib/
ls -la python/cute_moe/lib

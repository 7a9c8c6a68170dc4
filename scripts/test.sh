#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs the pinned dependencies, builds
# the CUDA code for sm_90a, runs the C++ tests, installs the Python package and runs the
# Python tests. GPU tests skip themselves on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
BUILD_DIR=${CUTE_MOE_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCUTE_MOE_BUILD_TORCH=ON -DCUTE_MOE_BUILD_TESTS=ON \
  -DPython3_EXECUTABLE="$(command -v python3)"
cmake --build "$BUILD_DIR" -j"$(nproc)"
ctest --test-dir "$BUILD_DIR" --output-on-failure
# Reuses $BUILD_DIR (see setup.py), so this only packages the library built above.
CUTE_MOE_BUILD_DIR="$BUILD_DIR" python3 -m pip install -q --no-build-isolation --no-deps .
CUTE_MOE_REQUIRE_LIBRARY=1 python3 -m pytest tests/python -q -rs

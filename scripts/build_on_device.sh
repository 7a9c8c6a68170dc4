#!/usr/bin/env bash
# Runs ON the GPU machine (no network, 16 cores): builds the op library there from the
# CUTLASS headers carried in .device/cutlass (made here by `bash scripts/build_on_device.sh
# --stage`, which copies them out of the pinned nvidia-cutlass wheel), and puts it where
# the GPU scripts load it (python/cute_moe/lib): 7-8 minutes for all 71 kernels on its 16
# cores (2026-11-25), against about 50 on the 2-core dev machine. Should it outgrow one
# device call, it stops itself at BUILD_LIMIT_S (default 540 s) and says so, and the very
# next call (the machine stays warm ~30 s, build folder and all) picks it up where it stopped.
#   here:  bash scripts/build_on_device.sh --stage     # once: .device/cutlass (ignored, ~28 MB)
#   there: bash scripts/build_on_device.sh             # carry [".device"]; exit 3: call again
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --stage ]; then
  src=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))")
  rm -rf .device/cutlass && mkdir -p .device/cutlass/tools/util
  cp -r "$src/include" .device/cutlass/
  cp -r "$src/tools/util/include" .device/cutlass/tools/util/
  du -sh .device/cutlass
  exit 0
fi

BUILD_DIR=${CUTE_MOE_BUILD_DIR:-build-device}
export CUTE_MOE_CUTLASS_DIR=${CUTE_MOE_CUTLASS_DIR:-$PWD/.device/cutlass}
[ -f "$CUTE_MOE_CUTLASS_DIR/include/cutlass/cutlass.h" ] ||
  { echo "build_on_device: no CUTLASS headers in $CUTE_MOE_CUTLASS_DIR (carry .device)" >&2; exit 1; }
cmake -S . -B "$BUILD_DIR" -G Ninja -DCUTE_MOE_BUILD_TORCH=ON -DCUTE_MOE_BUILD_TESTS=OFF \
  -DPython3_EXECUTABLE="$(command -v python3)" ${CUTE_MOE_KERNELS:+-DCUTE_MOE_KERNELS=$CUTE_MOE_KERNELS} >/dev/null
start=$(date +%s)
set +e
timeout "${BUILD_LIMIT_S:-540}" cmake --build "$BUILD_DIR" --target cute_moe_torch -j"$(nproc)" \
  > "$BUILD_DIR/build.log" 2>&1
rc=$?
set -e
grep -E "spill|error" "$BUILD_DIR/build.log" | grep -v "0 bytes spill" | head -20 || true
if [ $rc -eq 124 ]; then
  echo "build_on_device: stopped after $(( $(date +%s) - start )) s at $(grep -c '^\[' "$BUILD_DIR/build.log") steps; call again at once"
  exit 3
fi
[ $rc -eq 0 ] || { tail -30 "$BUILD_DIR/build.log"; exit $rc; }
mkdir -p python/cute_moe/lib
cp "$BUILD_DIR/libcute_moe_torch.so" python/cute_moe/lib/
echo "build_on_device: built in $(( $(date +%s) - start )) s: $(ls -la python/cute_moe/lib/libcute_moe_torch.so)"

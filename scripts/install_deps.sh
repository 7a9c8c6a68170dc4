#!/usr/bin/env bash
# Installs what the build needs on a fresh machine, from the package registries only
# (Debian, PyPI), pinned. Safe to re-run: whatever is already there is kept.
#   install_deps.sh          everything for the tests (scripts/test.sh)
#   install_deps.sh --bench  only what the benchmark needs (scripts/bench.sh): no GoogleTest,
#                            no test-only Python packages, an existing torch 2.11.0 kept
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
CUTLASS_WHEEL_VERSION=4.2.0.0
mode=${1:-tests}

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
if [ "$mode" != --bench ] && [ ! -f /usr/include/gtest/gtest.h ]; then missing+=(libgtest-dev); fi
if [ ${#missing[@]} -gt 0 ]; then
  command -v ccache >/dev/null || missing+=(ccache)  # optional: faster rebuilds
  echo "install_deps: apt-get install ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

command -v nvcc >/dev/null || { echo "install_deps: nvcc (CUDA 13) must be on PATH" >&2; exit 1; }

if [ "$mode" = --bench ]; then
  # torch (pinned in requirements-dev.txt) only where it is missing or another version.
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.11.0') else 1)" 2>/dev/null ||
    "$PYTHON" -m pip install -q "$(grep '^torch==' requirements-dev.txt)"
  "$PYTHON" -m pip install -q "$(grep '^wheel==' requirements-dev.txt)"
  "$PYTHON" -m pip install -q -r requirements-bench.txt
else
  "$PYTHON" -m pip install -q -r requirements-dev.txt
  # torchtitan and the few packages its model code imports, without their dependency trees
  # (torchtitan's own would pull datasets/pyarrow and wandb): requirements-torchtitan.txt
  "$PYTHON" -m pip install -q --no-deps -r requirements-torchtitan.txt
fi
# CUTLASS/CuTe headers: the wheel carries them; --no-deps keeps its Python tooling out.
"$PYTHON" -m pip install -q --no-deps "nvidia-cutlass==${CUTLASS_WHEEL_VERSION}"
"$PYTHON" - <<'PY'
import os, cutlass_library, torch
inc = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include", "cutlass", "cutlass.h")
assert os.path.exists(inc), f"CUTLASS headers missing at {inc}"
print(f"install_deps: torch {torch.__version__}, CUTLASS headers at {os.path.dirname(os.path.dirname(inc))}")
PY

#!/usr/bin/env bash
# Installs everything the build and tests need on a fresh machine, from the package
# registries only (Debian, PyPI), pinned. Safe to re-run: present packages are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
CUTLASS_WHEEL_VERSION=4.2.0.0

missing=()
for pkg in cmake ninja-build libgtest-dev ccache; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: apt-get install ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

command -v nvcc >/dev/null || { echo "install_deps: nvcc (CUDA 13) must be on PATH" >&2; exit 1; }

"$PYTHON" -m pip install -q -r requirements-dev.txt
# CUTLASS/CuTe headers: the wheel carries them; --no-deps keeps its Python tooling out.
"$PYTHON" -m pip install -q --no-deps "nvidia-cutlass==${CUTLASS_WHEEL_VERSION}"
"$PYTHON" - <<'PY'
import os, cutlass_library, torch
inc = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include", "cutlass", "cutlass.h")
assert os.path.exists(inc), f"CUTLASS headers missing at {inc}"
print(f"install_deps: torch {torch.__version__}, CUTLASS headers at {os.path.dirname(os.path.dirname(inc))}")
PY

#!/bin/bash
# Compiles scripts/ptxas_wgmma_probe.cu's loop shapes for sm_90a and reports, for each, whether
# ptxas keeps the WGMMAs pipelined (docs/perf-notes.md, session 31; nvcc 13.0: STOCK and FLAT
# pipelined, PLAIN_TAIL and TILE_LOOP serialized). No GPU needed.
set -u
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
for v in STOCK PLAIN_TAIL TILE_LOOP FLAT; do
  log=$("$nvcc" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -cubin -D$v "$here/ptxas_wgmma_probe.cu" \
        -o "$tmp/$v.cubin" 2>&1)
  if ! [ -f "$tmp/$v.cubin" ]; then echo "$v: build failed"; echo "$log"; continue; fi
  verdict="pipelined"
  echo "$log" | grep -q C7514 && verdict="serialized (C7514)"
  echo "$log" | grep -q C7517 && verdict="$verdict, wait injected (C7517)"
  printf '%-11s %s\n' "$v" "$verdict"
done
rm -rf "$tmp"

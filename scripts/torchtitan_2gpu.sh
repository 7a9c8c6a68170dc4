#!/usr/bin/env bash
# torchtitan on 2 GPUs of one host, FSDP2 over both (bf16 parameters, fp32 reductions) with
# expert parallelism EP=2 (NCCL all-to-all around the experts): the same torchtitan MoE
# models as bench/bench_torchtitan.py, default experts and cute_moe's, from the same
# weights (one state dict, DTensor shards loaded into both) and the same per-rank batches:
# the global loss of every step (its max relative difference is the bf16-noise check) and
# tokens/s of both, in the same run (both models alive, stepped in turn: this machine pair's
# step times drift by up to 10% from one process to the next). Before it, the same models
# on one GPU trained on the same global batches (rank 0's and rank 1's rows together,
# --batches-of 2): the two-GPU run's losses are compared with those, model by model and
# experts by experts.
# Device call (kind nvidia-h100-x2; carry the wheels and the op library):
#   run: bash scripts/torchtitan_2gpu.sh      carry: [".whl/torchtitan", "python/cute_moe/lib"]
# Extra arguments go to the benchmark (e.g. --steps 20 --layers 4). Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cute_moe_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/ttsite .whl/torchtitan/*.whl || exit 1
export PYTHONPATH=$PWD/python:/tmp/ttsite${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name --format=csv,noheader
python3 -c "import torch, cute_moe; assert torch.cuda.device_count() >= 2, 'needs 2 GPUs'; print('cute_moe library loaded:', cute_moe.library_loaded())" || exit 1
CUDA_VISIBLE_DEVICES=0 python3 bench/bench_torchtitan.py --batches-of 2 --json "$OUT/torchtitan_1gpu_global.json" \
  "$@" 2>"$OUT/torchtitan_1gpu_progress.log" | tee "$OUT/torchtitan_1gpu_global.txt"
[ "${PIPESTATUS[0]}" = 0 ] || { tail -30 "$OUT/torchtitan_1gpu_progress.log"; exit 1; }
torchrun --standalone --nproc-per-node 2 bench/bench_torchtitan.py --ep 2 --interleave \
  --losses-like "$OUT/torchtitan_1gpu_global.json" --json "$OUT/torchtitan_2gpu_ep2.json" "$@" 2>"$OUT/torchtitan_2gpu_progress.log" | tee "$OUT/torchtitan_2gpu_ep2.txt"
status=${PIPESTATUS[0]}
[ "$status" = 0 ] || tail -30 "$OUT/torchtitan_2gpu_progress.log"
exit $status

#!/usr/bin/env python3
# What a dense FP8 GEMM reaches on this GPU at the expert layers' shapes (all routed rows as
# one matrix), by scaling recipe, against our FP8 GEMM on the same operands, the sides taking
# turns call by call (cute_moe.bench.runner.alternating_ms):
#   bf16 cuBLAS          a @ b.T, the bf16 ceiling
#   fp8 tensorwise       torch._scaled_mm, one scale per operand, fast accumulation
#   fp8 rowwise          torch._scaled_mm, one scale per row of a and per column of the output
#   fp8 blockwise        torch.nn.functional.scaled_mm, 1x128 blocks of a and 128x128 of b:
#                        cuBLAS on the recipe of docs/fp8.md
#   ours dense           cute_moe.fp8.grouped_mm with one group, the same quantized operands
#   ours grouped         the same rows over the layer's experts (balanced), its weights
# Ours is checked against the blockwise cuBLAS result of the same quantized inputs (a
# layout mistake there would show as a large error), and that against bf16 (the recipe's
# error); the tensorwise and rowwise sides are timed only (their scales are not the data's).
# It answers how far the recipe's scaling itself sits below the tensorwise ceiling, and where
# our GEMM stands against cuBLAS on it.
#   python bench/bench_fp8_ceiling.py [--shapes gpt-oss-20b,qwen3-30b-a3b] [--reps 30] [--json out.json]
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from bench_fp8_gemm import SHAPES
from common import import_cute_moe, print_columns, rel_error, run_meta, write_json
from cute_moe.bench.runner import alternating_ms, call_step


def gemms(s: dict):
    """(name, n, k) of the layer's GEMMs on the routed rows: the up projection (its output
    2I wide) and the down projection and input gradients (k = I or H)."""
    return [("up fprop", 2 * s["inter"], s["hidden"]), ("down fprop", s["hidden"], s["inter"]),
            ("down dgrad", s["inter"], s["hidden"])]


def blockwise_scales_for_cublas(a_scale: torch.Tensor, w_scale: torch.Tensor):
    """Our scales in the layouts torch 2.11's blockwise scaled_mm takes: a's (m, kb) with
    unit row stride, b's (kb rounded up to 4, nb) with unit row stride (zero-padded)."""
    kb = a_scale.shape[1]
    nb = w_scale.shape[0]
    kb4 = (kb + 3) // 4 * 4
    sb = torch.zeros(nb, kb4, device=w_scale.device, dtype=torch.float32)
    sb[:, :kb] = w_scale
    return a_scale.t().contiguous().t(), sb.t()


def run_shape(cute_moe, name: str, s: dict, reps: int):
    fp8 = cute_moe.fp8
    m, experts = s["tokens"] * s["topk"], s["experts"]  # the routed rows
    rows = []
    for gemm, n, k in gemms(s):
        g = torch.Generator(device="cuda").manual_seed(len(gemm))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5
        we = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5
        aq, a_scale = fp8.quantize_1x128(a)
        wq, w_scale = fp8.quantize_128x128(w.unsqueeze(0))[:2]
        weq, we_scale = fp8.quantize_128x128(we)[:2]
        one_group = torch.tensor([m], device="cuda", dtype=torch.int32)
        offs = (torch.arange(1, experts + 1, device="cuda") * (m // experts)).int()
        offs[-1] = m
        ones = torch.ones((), device="cuda")
        row_s = torch.rand(m, 1, device="cuda", generator=g) + 0.5
        col_s = torch.rand(1, n, device="cuda", generator=g) + 0.5
        sa, sb = blockwise_scales_for_cublas(a_scale, w_scale[0])
        wt = wq[0].t()  # (k, n) column-major: cuBLAS's layout for b
        sides = {
            "bf16 cuBLAS": lambda: a @ w.t(),
            "fp8 tensorwise cuBLAS": lambda: torch._scaled_mm(aq, wt, ones, ones, out_dtype=torch.bfloat16,
                                                              use_fast_accum=True),
            "fp8 rowwise cuBLAS": lambda: torch._scaled_mm(aq, wt, row_s, col_s, out_dtype=torch.bfloat16),
            "fp8 blockwise cuBLAS": lambda: F.scaled_mm(aq, wt, sa, F.ScalingType.BlockWise1x128, sb,
                                                        F.ScalingType.BlockWise128x128,
                                                        output_dtype=torch.bfloat16),
            "fp8 blockwise ours dense": lambda: fp8.grouped_mm_unchecked(
                aq, a_scale, wq.transpose(-2, -1), w_scale.transpose(-2, -1), one_group),
            f"fp8 blockwise ours, {experts} experts": lambda: fp8.grouped_mm_unchecked(
                aq, a_scale, weq.transpose(-2, -1), we_scale.transpose(-2, -1), offs),
        }
        blockwise = sides["fp8 blockwise cuBLAS"]().float()
        err = rel_error(sides["fp8 blockwise ours dense"]().float(), blockwise)
        err_bf16 = rel_error(blockwise, sides["bf16 cuBLAS"]().float())
        times = alternating_ms({side: call_step(fn) for side, fn in sides.items()}, reps, 5)
        flops = 2 * m * n * k
        for side, (ms, lo, hi) in times.items():
            rows.append(dict(shape=name, gemm=gemm, m=m, n=n, k=k, side=side, ms=ms, ms_p25=lo, ms_p75=hi,
                             tflops=flops / ms / 1e9,
                             err_vs_cublas_blockwise=err if side == "fp8 blockwise ours dense" else None,
                             err_vs_bf16=err_bf16 if side == "fp8 blockwise cuBLAS" else None))
        del a, w, we, aq, wq, weq
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="gpt-oss-20b,qwen3-30b-a3b")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cute_moe = import_cute_moe()
    rows = []
    for name in args.shapes.split(","):
        rows += run_shape(cute_moe, name, SHAPES[name], args.reps)
    lines = [["shape", "gemm", "m x n x k", "side", "ms", "TFLOP/s", "err"]]
    for r in rows:
        err = ""
        if r["err_vs_cublas_blockwise"] is not None:
            err = f"{r['err_vs_cublas_blockwise']:.1e} vs cuBLAS blockwise"
        if r["err_vs_bf16"] is not None:
            err = f"{r['err_vs_bf16']:.1e} vs bf16"
        lines.append([r["shape"], r["gemm"], f"{r['m']}x{r['n']}x{r['k']}", r["side"], f"{r['ms']:.3f}",
                      f"{r['tflops']:.0f}", err])
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; dense FP8 ceilings by scaling recipe")
    print_columns(lines, 4)
    if args.json:
        write_json(args.json, run_meta(reps=args.reps), rows)


if __name__ == "__main__":
    main()

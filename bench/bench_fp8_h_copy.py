#!/usr/bin/env python3
# The FP8 up projection and h's 1x128 copy (the down projection's operand), the ways the block
# can make them, on the same inputs in the same run, sides timed call by call in turn
# (cute_moe.bench.runner.alternating_ms):
#   gemm            grouped_mm_fp8: pre alone (the plain FP8 GEMM)
#   pass            act_quantize_fp8_1x128 over that pre: h = act(pre) and its 1x128 copy
#   gemm + pass     the two, one call after the other (the block's default path)
#   fused copy      grouped_mm_fp8_act_quant: pre and h's copy from one kernel (1 x 2 clusters
#                   exchanging each row's amax; fp8_ffn.FUSED_H_COPY)
#   fused bf16 h    grouped_mm_fp8_act: pre and a bf16 h from the same kernel (for scale)
# GPT-OSS-20B (swiglu_oai, biases) and Qwen3-30B-A3B (swiglu) up projections, balanced routing;
# TFLOP/s of the GEMM. The copy's bits are checked against the pass's first.
#
#   python bench/bench_fp8_h_copy.py [--shapes gpt-oss-20b,qwen3-30b-a3b] [--reps 50] [--json out.json]
from __future__ import annotations

import argparse

import torch

from bench_fp8_block import BLOCKS
from bench_fp8_gemm import SHAPES, balanced_sizes
from common import fmt, import_cute_moe, print_columns, run_meta, write_json
from cute_moe.bench.runner import alternating_ms, call_step

ALPHA = 1.702


def bench_shape(key: str, reps: int, warmup: int, seed: int):
    from cute_moe import fp8
    s, blk = SHAPES[key], BLOCKS[key]
    m, hidden, n = s["tokens"] * s["topk"], s["hidden"], 2 * s["inter"]
    sizes = balanced_sizes(m, s["experts"])
    g = torch.Generator(device="cuda").manual_seed(seed)
    xq, xs = fp8.quantize_1x128(torch.randn(m, hidden, device="cuda", generator=g).to(torch.bfloat16))
    w = (torch.randn(len(sizes), hidden, n, device="cuda", generator=g) * hidden ** -0.5).to(torch.bfloat16)
    _, _, wq_t, ws_t = fp8.quantize_128x128(w, False, True)
    bias = (torch.randn(len(sizes), n, device="cuda", generator=g) * 0.1).to(torch.bfloat16) if blk["bias"] else None
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    args = (xq, xs, wq_t.transpose(-2, -1), ws_t.transpose(-2, -1), offs, bias)
    act = blk["activation"]
    limit = 7.0 if act == "swiglu_oai" else None
    ops = torch.ops.cute_moe
    pre = ops.grouped_mm_fp8(*args, None)
    # the copy's bits against the pass's, on this shape
    h_q, h_scale, pre2 = ops.grouped_mm_fp8_act_quant(*args, act, ALPHA, limit)
    want_q, want_s = ops.act_quantize_fp8_1x128(pre, act, ALPHA, limit)
    same = (torch.equal(pre, pre2) and torch.equal(h_scale, want_s)
            and torch.equal(h_q.view(torch.uint8), want_q.view(torch.uint8)))
    del h_q, h_scale, pre2, want_q, want_s
    sides = {
        "gemm": lambda: ops.grouped_mm_fp8(*args, None),
        "pass": lambda: ops.act_quantize_fp8_1x128(pre, act, ALPHA, limit),
        "gemm + pass": lambda: ops.act_quantize_fp8_1x128(ops.grouped_mm_fp8(*args, None), act, ALPHA, limit),
        "fused copy": lambda: ops.grouped_mm_fp8_act_quant(*args, act, ALPHA, limit),
        "fused bf16 h": lambda: ops.grouped_mm_fp8_act(*args, act, ALPHA, limit),
    }
    ms = alternating_ms({k: call_step(f) for k, f in sides.items()}, reps, warmup)
    flops = 2.0 * m * hidden * n
    return [dict(shape=key, side=k, ms=v[0], p25=v[1], p75=v[2],
                 tflops=None if k == "pass" else flops / v[0] / 1e9, same_bits=same) for k, v in ms.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the FP8 up projection and h's 1x128 copy")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import_cute_moe()
    rows = [r for key in a.shapes.split(",") for r in bench_shape(key, a.reps, a.warmup, a.seed)]
    print(f"FP8 up projection and h's 1x128 copy; {torch.cuda.get_device_name()}; median ms of {a.reps} "
          "calls per side, sides in turn (25th-75th), TF/s of the GEMM; same bits: the fused copy's h_q, "
          "h_scale and pre equal to the GEMM's pre and the pass's copy")
    lines = [("shape", "side", "ms", "p25-p75", "TF/s", "same bits")]
    lines += [(r["shape"], r["side"], fmt(r["ms"], ".3f"), f"{r['p25']:.3f}-{r['p75']:.3f}",
               fmt(r["tflops"], ".0f"), str(r["same_bits"])) for r in rows]
    print_columns(lines, left=2)
    if a.json:
        write_json(a.json, run_meta(reps=a.reps), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

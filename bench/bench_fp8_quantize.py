#!/usr/bin/env python3
# The FP8 block's quantization passes (docs/fp8.md) at the expert-block shapes, each timed
# alone (CUDA events, the passes taking turns call by call: cute_moe.bench.runner.alternating_ms)
# with the bytes it must move (bf16 read once, each e4m3 copy and its fp32 scales written once)
# over its time: how close each pass runs to the copy bandwidth (H200 4.2 TB/s, H100 3.0).
# The passes, as the FP8 block with FP8 weight gradients runs them (python/cute_moe/fp8_ffn.py):
#   x 1x128+128x1      quantize_1x128_128x1(x, offs): the up projection's operand both ways
#   x[rows] 1x128+128x1  the same gathering the rows (index=rows; nn.MoE's fused gather), and
#   gather, x ...      the gather as a kernel of its own first (the bytes counted are the pass's)
#   dy 1x128+128x128   quantize_1x128_128x1(dy, offs, tile_scales=True)
#   dpre 1x128+128x128 the same over dpre (2I wide)
#   dpre 1x128+sums    quantize_1x128_column_sums(dpre, offs): dx's operand and b_up's gradient
#   ph 128x1           quantize_128x1(p h, offs): the down weight gradient's activation operand
#   h act 1x128        act_quantize_1x128(pre): h = act(pre) and its 1x128 copy
#   x 1x128            quantize_1x128(x): the bf16-weight-gradient recipe's pass
#   W_up 128x128 both  quantize_128x128(W_up, as_is, transposed): the weight cast
#
#   python bench/bench_fp8_quantize.py [--shapes gpt-oss-20b,qwen3-30b-a3b] [--reps 30] [--json out.json]
from __future__ import annotations

import argparse

import torch

from bench_fp8_gemm import SHAPES, balanced_sizes
from common import import_cute_moe, print_columns, run_meta, write_json
from cute_moe.bench.runner import alternating_ms, call_step


def passes(key: str, seed: int) -> dict:
    """{name: (fn, bytes moved)} at `key`'s expert-block shape, balanced routing."""
    from cute_moe import fp8
    s = SHAPES[key]
    m, h, i, e = s["tokens"] * s["topk"], s["hidden"], s["inter"], s["experts"]
    g = torch.Generator(device="cuda").manual_seed(seed)
    offs = torch.tensor(balanced_sizes(m, e), device="cuda").cumsum(0).to(torch.int32)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)

    x, dpre, ph, w_up = randn(m, h), randn(m, 2 * i), randn(m, i), randn(e, h, 2 * i)
    blocks = -(-m // 128) + e
    # the dispatch's gather: each of the tokens' rows topk times, in a random order
    tokens = randn(s["tokens"], h)
    rows = (torch.randperm(m, generator=g, device="cuda") // s["topk"]).to(torch.int32)
    from cute_moe.ffn_autograd import _gather

    def both(rows, cols, tile_scales):  # bf16 in; 1x128 and 128x1 (or 128x128) copies out
        t_scales = blocks * (-(-cols // 128) if tile_scales else cols)
        return 2 * rows * cols + rows * cols + 4 * rows * -(-cols // 128) + cols * 128 * blocks + 4 * t_scales

    return {
        "x 1x128+128x1": (lambda: fp8.quantize_1x128_128x1(x, offs), both(m, h, False)),
        # under a fused gather (nn.MoE): x[rows] read by the pass itself, or gathered first
        "x[rows] 1x128+128x1": (lambda: fp8.quantize_1x128_128x1(tokens, offs, False, rows), both(m, h, False)),
        "gather, x 1x128+128x1": (lambda: fp8.quantize_1x128_128x1(_gather(tokens, rows), offs),
                                  both(m, h, False)),
        # dy has x's shape (M, H): x's data stands in for it
        "dy 1x128+128x128": (lambda: fp8.quantize_1x128_128x1(x, offs, True), both(m, h, True)),
        "dpre 1x128+128x128": (lambda: fp8.quantize_1x128_128x1(dpre, offs, True), both(m, 2 * i, True)),
        # the up projection's input-gradient operand with b_up's gradient (the column sums)
        "dpre 1x128+sums": (lambda: fp8.quantize_1x128_column_sums(dpre, offs),
                            2 * m * 2 * i + m * 2 * i + 4 * m * -(-2 * i // 128)),
        "ph 128x1": (lambda: fp8.quantize_128x1(ph, offs), 2 * m * i + i * 128 * blocks + 4 * blocks * i),
        "h act 1x128": (lambda: fp8.act_quantize_1x128(dpre, "swiglu"), 2 * m * 2 * i + m * i + 4 * m * -(-i // 128)),
        "x 1x128": (lambda: fp8.quantize_1x128(x), 2 * m * h + m * h + 4 * m * -(-h // 128)),
        "W_up 128x128 both": (lambda: fp8.quantize_128x128(w_up, True, True), 2 * w_up.numel() + 2 * w_up.numel()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the FP8 quantization passes against the copy bandwidth")
    ap.add_argument("--shapes", default="gpt-oss-20b,qwen3-30b-a3b")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import_cute_moe()
    rows, lines = [], [["shape", "pass", "ms", "GB moved", "TB/s"]]
    for key in args.shapes.split(","):
        fns = passes(key, args.seed)
        ms = alternating_ms({k: call_step(f) for k, (f, _) in fns.items()}, args.reps, args.warmup)
        for k, (_, nbytes) in fns.items():
            t = ms[k][0]
            rows.append(dict(shape=key, name=k, ms=t, bytes=nbytes, tb_per_s=nbytes / t / 1e9))
            lines.append([key, k, f"{t:.3f}", f"{nbytes / 1e9:.2f}", f"{nbytes / t / 1e9:.2f}"])
    print(f"# {torch.cuda.get_device_name()}, median of {args.reps} calls, taking turns")
    print_columns(lines, 2)
    if args.json:
        write_json(args.json, dict(meta=run_meta(), rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

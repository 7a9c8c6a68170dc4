#!/usr/bin/env python3
# The FP8 grouped GEMMs (docs/fp8.md) against, on the same inputs in the same run, timed call
# by call in turn (cute_moe.bench.runner.alternating_ms):
# * forward (ragged M, cute_moe.fp8.grouped_mm: e4m3 operands, 1x128 / 128x128 block scales):
#   bf16      cute_moe's bf16 GEMM (cute_moe.grouped_mm) of the unquantized operands
#   torch-fp8 torch._scaled_grouped_mm: e4m3 with rowwise scales (one per row of x, one per
#             output column of each expert), torch 2.11's FP8 grouped GEMM
# * weight gradients (ragged K, cute_moe.fp8.grouped_mm_wgrad: quantize_128x1's transposed
#   copies, x by 128x1 blocks of each expert's rows, dy by 128x128):
#   bf16      cute_moe's bf16 weight gradient (torch.ops.cute_moe.grouped_mm_wgrad)
#   fp8 + quantize  the FP8 GEMM with the two 128x1 quantizations of its bf16 operands
# for the GEMMs of the GPT-OSS-20B and Qwen3-30B-A3B expert layers (up and down projection),
# balanced routing; TFLOP/s of the routed rows. Quantization is not timed except where a side
# says so (its inputs are prepared once). Each side's result is checked: ours against the
# fp32 reference of the same quantized inputs, the FP8 sides against bf16.
#
#   python bench/bench_fp8_gemm.py [--shapes gpt-oss-20b,qwen3-30b-a3b] [--roles forward,wgrad]
#       [--reps 50] [--json out.json]
#       [--configs 128x128x128_2x1_coop,...]   (also each FP8 tile forced, as more sides)
from __future__ import annotations

import argparse
import os
import sys

import torch

from common import fmt, import_cute_moe, print_columns, rel_error, run_meta, write_json
from cute_moe.bench.runner import alternating_ms, call_step

# tokens, hidden, expert intermediate, experts, top-k (bench_grouped_gemm.py's shapes)
SHAPES = {
    "gpt-oss-20b": dict(tokens=24576, hidden=2880, inter=2880, experts=32, topk=4),
    "qwen3-30b-a3b": dict(tokens=16384, hidden=2048, inter=768, experts=128, topk=8),
}


def gemms(s: dict, role: str):
    """(name, k, n) of the layer's forward GEMMs (k the reduction), or of its weight
    gradients (dW (k, n) reduced over the routed rows)."""
    if role == "wgrad":
        return [("up wgrad", s["hidden"], 2 * s["inter"]), ("down wgrad", s["inter"], s["hidden"])]
    return [("up fprop", s["hidden"], 2 * s["inter"]), ("down fprop", s["inter"], s["hidden"])]


def balanced_sizes(m: int, experts: int, multiple: int = 16) -> list[int]:
    """m rows over the experts, equal up to a multiple of 16 (torch._scaled_grouped_mm
    wants 16-row aligned groups)."""
    base = m // experts // multiple * multiple
    sizes = [base] * experts
    sizes[-1] += m - base * experts
    return sizes


def forced(config, fn):
    """fn() with the FP8 GEMM's tile forced to `config` (the library reads CUTE_MOE_CONFIG
    per call)."""
    def call():
        os.environ["CUTE_MOE_CONFIG"] = config
        try:
            return fn()
        finally:
            del os.environ["CUTE_MOE_CONFIG"]
    return call


def _available(name, sides):
    """The sides' first results, dropping those this build or torch cannot serve."""
    outs = {}
    for side, fn in list(sides.items()):
        try:
            outs[side] = fn()
        except (RuntimeError, AttributeError) as exc:  # not compiled in, or torch's layout rules
            print(f"# {name}: {side} unavailable: {str(exc).splitlines()[0]}", file=sys.stderr)
            del sides[side]
    torch.cuda.synchronize()
    return outs


def bench_wgrad(name, m, k, n, sizes, reps, warmup, seed, configs=()):
    from cute_moe import fp8
    from cute_moe.ops.fp8 import reference_grouped_mm_fp8_wgrad
    e = len(sizes)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    a_t, a_s = fp8.quantize_128x1(x, offs)
    b_t, b_s = fp8.quantize_128x1(dy, offs, tile_scales=True)

    def quantized():
        return fp8.grouped_mm_wgrad(*fp8.quantize_128x1(x, offs), *fp8.quantize_128x1(dy, offs, True), offs)

    sides = {
        "fp8 (ours)": lambda: fp8.grouped_mm_wgrad(a_t, a_s, b_t, b_s, offs),
        "fp8 + quantize": quantized,
        "bf16 (ours)": lambda: torch.ops.cute_moe.grouped_mm_wgrad(x, dy, offs)[0],
    }
    for c in configs:
        sides[f"fp8 {c}"] = forced(c, sides["fp8 (ours)"])
    outs = _available(name, sides)
    checks = {}
    if "fp8 (ours)" in outs:
        ref = reference_grouped_mm_fp8_wgrad(a_t, a_s, b_t, b_s, offs).float()
        checks = {s: rel_error(outs[s], ref) for s in outs if s.startswith("fp8")}
        if "bf16 (ours)" in outs:
            checks["fp8 (ours) vs bf16"] = rel_error(outs["fp8 (ours)"], outs["bf16 (ours)"])
        del ref
    del outs
    times = alternating_ms({s: call_step(fn) for s, fn in sides.items()}, reps, warmup)
    flops = 2.0 * sum(sizes) * k * n
    return [dict(gemm=name, m=m, k=k, n=n, experts=e, side=s, ms=t[0], q1=t[1], q3=t[2],
                 tflops=flops / t[0] / 1e9) for s, t in times.items()], checks


def bench_one(name, m, k, n, sizes, reps, warmup, seed, configs=()):
    import cute_moe
    from cute_moe import fp8
    from cute_moe.ops.fp8 import reference_grouped_mm_fp8
    e = len(sizes)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k ** -0.5)  # (E, n, k)
    w_kn = w.transpose(-2, -1)  # (E, k, n) k-contiguous: x @ w_kn[e]
    xq, xs = fp8.quantize_1x128(x)
    _, _, wq_t, ws_t = fp8.quantize_128x128(w_kn.contiguous(), as_is=False, transposed=True)
    wq, ws = wq_t.transpose(-2, -1), ws_t.transpose(-2, -1)  # (E, k, n) views, k-contiguous
    # torch's rowwise FP8: one scale per row of x and per output column of each expert
    amax_x = x.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
    sx = (amax_x / 448.0).float()
    xr = (x.float() / sx).to(torch.float8_e4m3fn)
    amax_w = w.float().abs().amax(dim=2, keepdim=True).clamp_min(1e-12)  # (E, n, 1)
    sw = (amax_w / 448.0).float()
    wr = (w.float() / sw).to(torch.float8_e4m3fn).transpose(-2, -1)  # (E, k, n) column-major
    sx1, sw1 = sx.squeeze(1).contiguous(), sw.squeeze(2).contiguous()

    sides = {
        "fp8 (ours)": lambda: fp8.grouped_mm(xq, xs, wq, ws, offs),
        "bf16 (ours)": lambda: cute_moe.grouped_mm(x, w_kn, offs),
        "torch-fp8": lambda: torch._scaled_grouped_mm(xr, wr, sx1, sw1, offs=offs, out_dtype=torch.bfloat16),
    }
    for c in configs:
        sides[f"fp8 {c}"] = forced(c, sides["fp8 (ours)"])
    outs = _available(name, sides)
    ref = reference_grouped_mm_fp8(xq, xs, wq, ws, offs)  # fp32, the same quantized inputs
    checks = {s: rel_error(outs[s], ref) for s in outs if s.startswith("fp8")}
    bf16 = outs["bf16 (ours)"]
    for side in ("fp8 (ours)", "torch-fp8"):
        if side in outs:
            checks[side + " vs bf16"] = rel_error(outs[side], bf16)
    del outs, ref
    times = alternating_ms({s: call_step(fn) for s, fn in sides.items()}, reps, warmup)
    flops = 2.0 * sum(sizes) * k * n
    return [dict(gemm=name, m=m, k=k, n=n, experts=e, side=s, ms=t[0], q1=t[1], q3=t[2],
                 tflops=flops / t[0] / 1e9) for s, t in times.items()], checks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="FP8 grouped GEMM vs bf16 and torch._scaled_grouped_mm")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--roles", default="forward,wgrad", help="forward, wgrad or both")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default="", help="FP8 tiles to force, each as a side of its own")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_fp8_gemm: needs an SM90 GPU", file=sys.stderr)
        return 2
    import_cute_moe()
    rows, lines = [], [("shape", "gemm", "m", "k", "n", "E", "side", "ms", "IQR", "TFLOP/s", "x bf16")]
    check_lines = []
    for key in args.shapes.split(","):
        s = SHAPES[key]
        m = s["tokens"] * s["topk"]
        sizes = balanced_sizes(m, s["experts"])
        jobs = [(role, name, k, n) for role in args.roles.split(",") for name, k, n in gemms(s, role)]
        for role, name, k, n in jobs:
            configs = [c for c in args.configs.split(",") if c]
            run = bench_wgrad if role == "wgrad" else bench_one
            got, checks = run(name, m, k, n, sizes, args.reps, args.warmup, args.seed, configs)
            bf16_ms = next((r["ms"] for r in got if r["side"] == "bf16 (ours)"), float("nan"))
            for r in got:
                r["shape"] = key
                rows.append(r)
                lines.append((key, name, str(m), str(k), str(n), str(len(sizes)), r["side"], fmt(r["ms"], ".3f"),
                              f"{r['q1']:.3f}-{r['q3']:.3f}", fmt(r["tflops"], ".0f"), fmt(bf16_ms / r["ms"], ".2f")))
            check_lines.append((key, name) + tuple(f"{c}: {v:.1e}" for c, v in checks.items()))
            print(f"# {key} {name} done", file=sys.stderr)
    print(f"FP8 grouped GEMMs, balanced routing; {torch.cuda.get_device_name()}; "
          f"median of {args.reps} calls per side, sides in turn call by call")
    print_columns(lines, left=2)
    print("\nrelative errors (fp8 (ours): against the fp32 reference of the same quantized inputs; "
          "'vs bf16': the quantization's own error):")
    for c in check_lines:
        print("  " + "  ".join(c))
    if args.json:
        write_json(args.json, run_meta(reps=args.reps), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

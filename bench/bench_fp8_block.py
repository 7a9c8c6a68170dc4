#!/usr/bin/env python3
# The expert block (up projection, activation, down projection with the router probability)
# forward and forward + backward, on the same inputs in the same run, sides timed call by
# call in turn (cute_moe.bench.runner.alternating_ms):
#   fp8           cute_moe.fp8.expert_ffn: the six GEMMs in FP8, the activation and its
#                 backward in their epilogues, the quantizations as separate passes (docs/fp8.md)
#   fp8 fused-h   the same with h's 1x128 copy written by the up projection's epilogue
#                 (fp8_ffn.FUSED_H_COPY) instead of a pass over pre
#   fp8 bf16-wgrad  the same with its weight gradients in bf16 (fp8_ffn.FP8_WEIGHT_GRADS off)
#   bf16          cute_moe.expert_ffn: the fused bf16 kernels
#   torch fp8     torch._scaled_grouped_mm with rowwise scales for all six GEMMs, quantization,
#                 bias gathers and activation unfused in PyTorch, its backward written as torchao's
#                 FP8 MoE training does it (torch has none: bench/torch_fp8.py)
#   torch fp8 compiled  the same with its quantizers through torch.compile (fused passes)
# GPT-OSS-20B (swiglu_oai, biases) and Qwen3-30B-A3B (swiglu, no biases) dims, balanced
# routing; TFLOP/s of the routed rows' GEMMs (backward: twice the forward's). Weight casts
# are part of each FP8 side's call (they happen once per training step). "bwd" times the
# backward alone (after an untimed forward); "fwd+bwd x bf16" compares the sums;
# "peak GiB": the peak allocation of one forward + backward beyond what was held before it;
# "err vs bf16": the output's relative error against the bf16 block, "grad err": the largest
# of the input gradients' (x, weights, biases, prob).
#
#   python bench/bench_fp8_block.py [--shapes gpt-oss-20b,qwen3-30b-a3b] [--reps 30] [--json out.json]
#   python bench/bench_fp8_block.py --cpu-smoke     (tiny shapes on the CPU: the script's plumbing)
from __future__ import annotations

import argparse
import sys

import torch

from bench_fp8_gemm import SHAPES, balanced_sizes
from common import fmt, print_columns, rel_error, run_meta, write_json
from torch_fp8 import expert_block as torch_fp8_block
from cute_moe.bench.runner import alternating_ms, backward_step, call_step

BLOCKS = {"gpt-oss-20b": dict(activation="swiglu_oai", bias=True),
          "qwen3-30b-a3b": dict(activation="swiglu", bias=False)}


def make_block(key: str, m: int, sizes: list[int], device: str, seed: int, scale: float = 1.0):
    s, blk = SHAPES[key], BLOCKS[key]
    hdim, inter = int(s["hidden"] * scale) // 16 * 16, int(s["inter"] * scale) // 16 * 16
    g = torch.Generator(device=device).manual_seed(seed)
    e = len(sizes)

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=g, device=device) * std).to(torch.bfloat16).requires_grad_()

    t = dict(x=randn(m, hdim), w_up=randn(e, hdim, 2 * inter, std=hdim ** -0.5),
             w_down=randn(e, inter, hdim, std=inter ** -0.5),
             b_up=randn(e, 2 * inter, std=0.1) if blk["bias"] else None,
             b_down=randn(e, hdim, std=0.1) if blk["bias"] else None,
             prob=torch.rand(m, generator=g, device=device).requires_grad_())
    offs = torch.tensor(sizes, device=device).cumsum(0).to(torch.int32)
    return t, offs, hdim, inter, blk["activation"]


def peak_gib(fn, dy, leaves) -> float:
    """GiB allocated at the peak of one forward + backward beyond what was allocated before it
    (the leaves' gradients set to None first, so each side allocates its own)."""
    import gc
    for t in leaves.values():
        if t is not None:
            t.grad = None
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn().backward(dy)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 30


def bench_shape(key, reps, warmup, seed, device="cuda", scale=1.0, experts=None):
    import cute_moe
    from cute_moe import fp8
    s = SHAPES[key]
    m = s["tokens"] * s["topk"] if scale == 1.0 else 96
    sizes = balanced_sizes(m, experts or s["experts"])
    t, offs, hdim, inter, act = make_block(key, m, sizes, device, seed, scale)
    args = (t["x"], t["w_up"], t["w_down"], offs, t["b_up"], t["b_down"])

    def ours_fp8(weight_grads_fp8=True, fused_h=False):
        from cute_moe import fp8_ffn
        settings = fp8_ffn.FP8_WEIGHT_GRADS, fp8_ffn.FUSED_H_COPY
        fp8_ffn.FP8_WEIGHT_GRADS, fp8_ffn.FUSED_H_COPY = weight_grads_fp8, fused_h  # read by the forward
        try:
            return fp8.expert_ffn(*args, activation=act, prob=t["prob"])
        finally:
            fp8_ffn.FP8_WEIGHT_GRADS, fp8_ffn.FUSED_H_COPY = settings

    def ours_bf16():
        return cute_moe.expert_ffn(*args, activation=act, prob=t["prob"])

    forward = {"fp8": ours_fp8, "fp8 fused-h": lambda: ours_fp8(fused_h=True),
               "fp8 bf16-wgrad": lambda: ours_fp8(False), "bf16": ours_bf16}
    if device == "cuda":
        forward["torch fp8"] = lambda: torch_fp8_block(*args, t["prob"], act)
        compiled = lambda: torch_fp8_block(*args, t["prob"], act, compiled=True)  # noqa: E731
        try:
            torch.autograd.grad(compiled(), [t["x"]], torch.ones(m, hdim, device=device, dtype=torch.bfloat16))
            forward["torch fp8 compiled"] = compiled
        except Exception as e:  # no triton / inductor on this machine: the eager side stays
            print(f"# {key}: torch fp8 compiled skipped: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    with torch.no_grad():
        outs = {k: f() for k, f in forward.items()}
    errors = {k: rel_error(v, outs["bf16"]) for k, v in outs.items() if k != "bf16"}
    del outs
    leaves = [v for v in t.values() if v is not None]
    dy = torch.randn(m, hdim, device=device, dtype=torch.bfloat16)
    grads = {k: torch.autograd.grad(f(), leaves, dy) for k, f in forward.items()}
    names = [k for k, v in t.items() if v is not None]
    grad_errors = {}
    for k, g in grads.items():
        if k != "bf16":
            each = {n: rel_error(a, b) for n, a, b in zip(names, g, grads["bf16"])}
            grad_errors[k] = max(each.values())
            print(f"# {key} {k}: gradient errors vs bf16 " + " ".join(f"{n} {v:.1e}" for n, v in each.items()),
                  file=sys.stderr)
    del grads
    fwd = alternating_ms({k: call_step(lambda f=f: f().detach()) for k, f in forward.items()}, reps, warmup,
                         cuda=device == "cuda")
    # the gradients of every input, as a training step's backward makes them (torch.autograd.grad:
    # no accumulation into .grad from the previous timed call, which would add a pass per leaf)
    bwd = alternating_ms({k: backward_step(f, lambda y: torch.autograd.grad(y, leaves, dy))
                          for k, f in forward.items()}, reps, warmup, cuda=device == "cuda")
    peaks = {k: peak_gib(f, dy, t) for k, f in forward.items()} if device == "cuda" else {}
    flops = 2.0 * sum(sizes) * hdim * inter * 3  # up (2I wide) + down
    rows = []
    for side in forward:
        f_ms = fwd[side][0]
        b_ms = bwd[side][0]
        rows.append(dict(shape=key, side=side, m=m, hidden=hdim, inter=inter, experts=len(sizes),
                         fwd_ms=f_ms, bwd_ms=b_ms, fwd_tflops=flops / f_ms / 1e9,
                         bwd_tflops=None if b_ms is None else 2 * flops / b_ms / 1e9,
                         err_vs_bf16=errors.get(side), grad_err_vs_bf16=grad_errors.get(side),
                         peak_gib=peaks.get(side)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the expert block in FP8 vs bf16 vs torch FP8")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU, 2 reps")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("bench_fp8_block: needs an SM90 GPU (or --cpu-smoke)", file=sys.stderr)
        return 2
    rows = []
    for key in args.shapes.split(","):
        if args.cpu_smoke:
            rows += bench_shape(key, 2, 1, args.seed, device="cpu", scale=1 / 16, experts=4)
        else:
            rows += bench_shape(key, args.reps, args.warmup, args.seed)
        print(f"# {key} done", file=sys.stderr)
    where = "CPU (smoke)" if args.cpu_smoke else torch.cuda.get_device_name()
    reps = 2 if args.cpu_smoke else args.reps
    print(f"expert block, balanced routing; {where}; median of {reps} calls per side, sides in turn")
    lines = [("shape", "side", "fwd ms", "fwd TFLOP/s", "bwd ms", "bwd TFLOP/s", "fwd x bf16", "bwd x bf16",
              "fwd+bwd x bf16", "peak GiB", "err vs bf16", "grad err")]
    for r in rows:
        ref = next(b for b in rows if b["shape"] == r["shape"] and b["side"] == "bf16")
        lines.append((r["shape"], r["side"], fmt(r["fwd_ms"], ".3f"), fmt(r["fwd_tflops"], ".0f"),
                      fmt(r["bwd_ms"], ".3f"), fmt(r["bwd_tflops"], ".0f"),
                      fmt(ref["fwd_ms"] / r["fwd_ms"], ".2f"),
                      fmt(None if r["bwd_ms"] is None else ref["bwd_ms"] / r["bwd_ms"], ".2f"),
                      fmt(None if r["bwd_ms"] is None else
                          (ref["fwd_ms"] + ref["bwd_ms"]) / (r["fwd_ms"] + r["bwd_ms"]), ".2f"),
                      fmt(r["peak_gib"], ".2f"), fmt(r["err_vs_bf16"], ".1e"),
                      fmt(r["grad_err_vs_bf16"], ".1e")))
    print_columns(lines, left=2)
    if args.json:
        write_json(args.json, run_meta(reps=reps), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

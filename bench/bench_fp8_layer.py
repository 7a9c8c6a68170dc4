#!/usr/bin/env python3
# The MoE layer (cute_moe.nn.MoE: router, dispatch, experts, combine) with its experts in FP8
# (precision="fp8", cute_moe.fp8.expert_ffn: docs/fp8.md) against, on the same inputs and the
# same parameter tensors in the same run, sides timed call by call in turn
# (cute_moe.bench.runner.alternating_ms):
#   fp8            the layer, its experts' precision "fp8" (MoE's default fuse_gather: the routed
#                  rows gathered by x's 1x128 quantizer, no sorted bf16 copy held)
#   bf16           the same layer object, precision "bf16" (the fused bf16 kernels)
#   torch          the torchtitan-style layer (cute_moe.reference.ReferenceMoE, impl
#                  "grouped_mm": torch._grouped_mm and unfused ops), sharing the parameters
#   torch fp8      that layer with its experts in PyTorch FP8 (bench/torch_fp8.py: all six GEMMs
#                  on torch._scaled_grouped_mm rowwise, torchao's recipe, each expert's rows
#                  padded to 16), its quantizers eager; "torch fp8 compiled": through torch.compile
# forward (the training forward), backward (the input's and every parameter's gradient,
# autograd.grad, after an untimed forward) and the peak memory of one forward + backward, at the
# named configs of `python -m cute_moe.bench`; TFLOP/s of the expert GEMMs (cfg.flops()).
#
#   python bench/bench_fp8_layer.py [--configs gpt-oss-20b,qwen3-30b-a3b] [--reps 20] [--json out.json]
from __future__ import annotations

import argparse
import sys

import torch

from common import fmt, print_columns, rel_error, run_meta, write_json
from torch_fp8 import moe_layer as torch_fp8_layer
from cute_moe.bench.configs import CONFIGS
from cute_moe.bench.runner import alternating_ms, backward_step, build, call_step, peak_bytes


def bench_config(name: str, reps: int, warmup: int, seed: int) -> list[dict]:
    cfg = CONFIGS[name]
    ours, base, x, dy = build(cfg, "cuda", seed)
    inputs = [x] + list(ours.parameters())

    def layer(precision):
        def forward():
            ours.experts.precision = precision  # read by the experts' forward
            return ours(x)
        return forward

    forward = {"fp8": layer("fp8"), "bf16": layer("bf16"), "torch": lambda: base(x),
               "torch fp8": lambda: torch_fp8_layer(base, x)}
    compiled = lambda: torch_fp8_layer(base, x, compiled=True)  # noqa: E731
    try:
        torch.autograd.grad(compiled(), inputs, dy)
        forward["torch fp8 compiled"] = compiled
    except Exception as e:  # no triton / inductor on this machine: the eager side stays
        print(f"# {name}: torch fp8 compiled skipped: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    with torch.no_grad():
        outs = {k: f() for k, f in forward.items()}
    errors = {k: rel_error(v, outs["bf16"]) for k, v in outs.items() if k != "bf16"}
    del outs
    fwd = alternating_ms({k: call_step(lambda f=f: f().detach()) for k, f in forward.items()}, reps, warmup)
    bwd = alternating_ms({k: backward_step(f, lambda y: torch.autograd.grad(y, inputs, dy))
                          for k, f in forward.items()}, reps, warmup)
    fwd_flops, bwd_flops = cfg.flops()
    rows = []
    for side, f in forward.items():
        peak = peak_bytes(lambda: torch.autograd.grad(f(), inputs, dy), True)
        rows.append(dict(config=name, side=side, tokens=cfg.tokens, rows=cfg.rows, fwd_ms=fwd[side][0],
                         bwd_ms=bwd[side][0], fwd_tflops=fwd_flops / fwd[side][0] / 1e9,
                         bwd_tflops=bwd_flops / bwd[side][0] / 1e9, peak_gib=peak / 2 ** 30,
                         err_vs_bf16=errors.get(side)))
    ours.experts.precision = "bf16"
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the MoE layer with FP8 experts vs bf16 vs torchtitan-style (bf16, FP8)")
    ap.add_argument("--configs", default="gpt-oss-20b,qwen3-30b-a3b")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_fp8_layer: needs an SM90 GPU", file=sys.stderr)
        return 2
    rows = []
    for name in args.configs.split(","):
        rows += bench_config(name, args.reps, args.warmup, args.seed)
        print(f"# {name} done", file=sys.stderr)
    print(f"MoE layer, experts in FP8 / bf16 / torch / torch FP8; {torch.cuda.get_device_name()}; median of {args.reps} "
          "calls per side, sides in turn")
    lines = [("config", "side", "fwd ms", "bwd ms", "fwd+bwd ms", "fwd TFLOP/s", "bwd TFLOP/s",
              "fwd+bwd x bf16", "fwd+bwd x torch", "fwd+bwd x torch fp8 c.", "peak GiB", "out vs bf16")]
    for r in rows:
        def total(side):
            b = next((x for x in rows if x["config"] == r["config"] and x["side"] == side), None)
            return None if b is None else b["fwd_ms"] + b["bwd_ms"]
        mine = r["fwd_ms"] + r["bwd_ms"]
        peer = total("torch fp8 compiled")
        lines.append((r["config"], r["side"], fmt(r["fwd_ms"], ".2f"), fmt(r["bwd_ms"], ".2f"), fmt(mine, ".2f"),
                      fmt(r["fwd_tflops"], ".0f"), fmt(r["bwd_tflops"], ".0f"), fmt(total("bf16") / mine, ".2f"),
                      fmt(total("torch") / mine, ".2f"), fmt(None if peer is None else peer / mine, ".2f"),
                      fmt(r["peak_gib"], ".2f"), fmt(r["err_vs_bf16"], ".1e")))
    print_columns(lines, left=2)
    if args.json:
        write_json(args.json, run_meta(reps=args.reps), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

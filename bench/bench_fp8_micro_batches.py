#!/usr/bin/env python3
# One optimizer step's forwards and backwards over k micro-batches (gradient accumulation) of the
# MoE layer (cute_moe.nn.MoE at the named configs of `python -m cute_moe.bench`), with its experts
#   bf16        precision "bf16"
#   fp8         precision "fp8": each weight cast to e4m3 twice per micro-batch; the weight
#               gradients in FP8 or bf16 as the library picks by shape (fp8_ffn.fp8_weight_grads_for)
#   fp8 reuse   precision "fp8" inside cute_moe.fp8.reuse_weight_casts(), opened once per step:
#               each weight cast once per step (both copies in one pass), held until the step ends
#   with --fp8-weight-grads also "fp8 bf16w" and "fp8w": precision "fp8" with the weight gradients
#               forced onto the bf16 / the FP8 ragged-K GEMM (fp8_ffn.FP8_WEIGHT_GRADS False / True)
# on the same layer object, parameter tensors and micro-batches (distinct random tokens each),
# sides timed step by step in turn (cute_moe.bench.runner.alternating_ms). A step is what a
# training loop runs between two optimizer steps: k x (forward, backward with the parameters'
# gradients accumulated in .grad and the input's gradient). Reported: ms per step and per
# micro-batch, the step's speed against bf16 and against fp8, its peak memory above what was
# allocated before, and the bytes the context holds (one layer's; a model holds that per FP8
# layer). Checks first that fp8 reuse gives fp8's bits (outputs and every gradient).
#
#   python bench/bench_fp8_micro_batches.py [--configs gpt-oss-20b,qwen3-30b-a3b] [--micro 1,2,4,8]
#                                           [--reps 10] [--fp8-weight-grads] [--json out.json]
from __future__ import annotations

import argparse
import contextlib
import sys

import torch

from common import fmt, print_columns, run_meta, write_json
import cute_moe
from cute_moe import fp8_ffn
from cute_moe.bench.configs import CONFIGS
from cute_moe.bench.runner import alternating_ms, build, call_step, peak_bytes


def bench_config(name: str, micro: list[int], reps: int, warmup: int, seed: int,
                 fp8_weight_grads: bool = False) -> list[dict]:
    cfg = CONFIGS[name]
    layer, _, x0, dy = build(cfg, "cuda", seed)
    del x0
    params = list(layer.parameters())
    gen = torch.Generator(device="cuda").manual_seed(seed + 7)
    xs = [torch.randn(cfg.tokens, cfg.hidden, device="cuda", generator=gen).to(torch.bfloat16)
          .requires_grad_() for _ in range(max(micro))]
    held = {}
    setting = fp8_ffn.FP8_WEIGHT_GRADS  # restored at the end

    def step(precision, reuse, k, record=None, fp8w=None):
        def run():
            layer.experts.precision = precision  # read by the experts' forward
            fp8_ffn.FP8_WEIGHT_GRADS = fp8w  # read by each forward (None: by shape)
            for p in params:
                p.grad = None
            with (cute_moe.fp8.reuse_weight_casts() if reuse else contextlib.nullcontext()) as c:
                for x in xs[:k]:
                    out = layer(x)
                    out.backward(dy)
                    if record is not None:
                        record.append(out.detach())
                        record.append(x.grad)
                    x.grad = None
                if c is not None:
                    held[k] = c.held_bytes()
        return run

    # fp8 reuse gives fp8's bits, over 2 micro-batches: outputs, input and parameter gradients
    got, want = [], []
    step("fp8", False, 2, want)()
    want += [p.grad.clone() for p in params]
    step("fp8", True, 2, got)()
    got += [p.grad.clone() for p in params]
    same = all(torch.equal(a, b) for a, b in zip(got, want))
    del got, want
    if not same:
        raise SystemExit(f"bench_fp8_micro_batches: {name}: fp8 reuse differs from fp8")
    rows = []
    for k in micro:
        sides = {"bf16": step("bf16", False, k), "fp8": step("fp8", False, k),
                 "fp8 reuse": step("fp8", True, k)}
        if fp8_weight_grads:
            sides["fp8 bf16w"] = step("fp8", False, k, fp8w=False)
            sides["fp8w"] = step("fp8", False, k, fp8w=True)
        ms = alternating_ms({s: call_step(f) for s, f in sides.items()}, reps, warmup)
        for side, f in sides.items():
            peak = peak_bytes(f, True)
            rows.append(dict(config=name, micro_batches=k, side=side, step_ms=ms[side][0],
                             q1_ms=ms[side][1], q3_ms=ms[side][2], peak_gib=peak / 2 ** 30,
                             held_gib=held[k] / 2 ** 30 if side.endswith("reuse") else None))
    layer.experts.precision = "bf16"
    fp8_ffn.FP8_WEIGHT_GRADS = setting
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="k micro-batches of the MoE layer: bf16 / fp8 / fp8 "
                                             "with the weight casts reused across them")
    ap.add_argument("--configs", default="gpt-oss-20b,qwen3-30b-a3b")
    ap.add_argument("--micro", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fp8-weight-grads", action="store_true",
                    help="also the FP8 layer with its weight gradients forced to bf16 and to FP8")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_fp8_micro_batches: needs an SM90 GPU", file=sys.stderr)
        return 2
    micro = [int(k) for k in args.micro.split(",")]
    rows = []
    for name in args.configs.split(","):
        rows += bench_config(name, micro, args.reps, args.warmup, args.seed, args.fp8_weight_grads)
        print(f"# {name} done", file=sys.stderr)
    print(f"MoE layer, one optimizer step's k micro-batches (forward + backward each); "
          f"{torch.cuda.get_device_name()}; median of {args.reps} steps per side, sides in turn; "
          "fp8 reuse checked bit for bit against fp8")
    lines = [("config", "k", "side", "step ms", "q1..q3", "ms / micro-batch", "x bf16", "x fp8",
              "peak GiB", "held GiB")]
    for r in rows:
        def of(side):
            return next(x["step_ms"] for x in rows if x["config"] == r["config"]
                        and x["micro_batches"] == r["micro_batches"] and x["side"] == side)
        per_micro = r["step_ms"] / r["micro_batches"]
        lines.append((r["config"], str(r["micro_batches"]), r["side"], fmt(r["step_ms"], ".2f"),
                      f"{r['q1_ms']:.2f}..{r['q3_ms']:.2f}", fmt(per_micro, ".2f"),
                      fmt(of("bf16") / r["step_ms"], ".3f"), fmt(of("fp8") / r["step_ms"], ".3f"),
                      fmt(r["peak_gib"], ".2f"), fmt(r["held_gib"], ".2f")))
    print_columns(lines, left=3)
    if args.json:
        write_json(args.json, run_meta(reps=args.reps, micro=args.micro,
                                       fp8_weight_grads=args.fp8_weight_grads), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

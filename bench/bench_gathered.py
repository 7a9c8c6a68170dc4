#!/usr/bin/env python3
# Benchmark of the gathered up projection (cute_moe::grouped_mm_act_gathered: the token
# gather fused into the GEMM's A load) against the route the MoE layer takes: the gather
# kernel (cute_moe::gather_rows) then the TMA up projection (cute_moe::grouped_mm_act), on
# the same inputs in the same run. Checks first that the two routes give the same bits.
# Progress goes to stderr, the table to stdout.
#
#   python bench/bench_gathered.py [--shapes gpt-oss-20b,qwen3-30b-a3b,seed-example] [--reps 30] [--json out.json]
from __future__ import annotations

import argparse
import datetime
import sys

import torch

from common import git_commit, import_cute_moe, run_meta, time_ms, write_json
from cute_moe.activation_args import default_limit
from cute_moe.activations import DEFAULT_ALPHA

# tokens T, hidden H, up-projection width N = 2I, experts E, top-k, activation (with its
# default limit)
SHAPES = {
    "gpt-oss-20b": dict(tokens=24576, hidden=2880, n=5760, experts=32, topk=4, act="swiglu_oai"),
    "qwen3-30b-a3b": dict(tokens=16384, hidden=2048, n=1536, experts=128, topk=8, act="swiglu"),
    "seed-example": dict(tokens=8192, hidden=2048, n=2048, experts=8, topk=2, act="swiglu_oai"),
}


def make_inputs(s: dict, skewed: bool, seed: int):
    dev, bf16 = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(seed)
    t, e, k = s["tokens"], s["experts"], s["topk"]
    scores = torch.rand(t, e, device=dev, generator=gen)
    if skewed:  # expert 0 takes most rows, the last two none
        scores[:, 0] += 2.0
        scores[:, -2:] -= 2.0
    choice = scores.topk(k, dim=1).indices.reshape(-1)
    order = torch.sort(choice, stable=True).indices
    return dict(
        rows=(order // k).to(torch.int32),
        offs=torch.cumsum(torch.bincount(choice, minlength=e), 0).to(torch.int32),
        x=torch.randn(t, s["hidden"], device=dev, dtype=bf16, generator=gen),
        w=torch.randn(e, s["hidden"], s["n"], device=dev, dtype=bf16, generator=gen) / s["hidden"] ** 0.5,
        b=torch.randn(e, s["n"], device=dev, dtype=bf16, generator=gen) * 0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    import_cute_moe()
    ops = torch.ops.cute_moe
    rows_out = []
    for name in args.shapes.split(","):
        s = SHAPES[name]
        for skewed in (False, True):
            label = name + (" skewed" if skewed else "")
            print(f"{label} ...", file=sys.stderr, flush=True)
            d = make_inputs(s, skewed, seed=0)
            act = (s["act"], DEFAULT_ALPHA, default_limit(s["act"]))
            fused = lambda: ops.grouped_mm_act_gathered(d["x"], d["rows"], d["w"], d["offs"], d["b"], None, *act)
            gather = lambda: ops.gather_rows(d["x"], d["rows"])
            xs = gather()
            gemm = lambda: ops.grouped_mm_act(xs, d["w"], d["offs"], d["b"], None, *act)
            both = lambda: ops.grouped_mm_act(gather(), d["w"], d["offs"], d["b"], None, *act)
            same = all(torch.equal(a, b) for a, b in zip(fused(), gemm()))
            t = {k: time_ms(f, args.reps, args.warmup) for k, f in
                 (("gather", gather), ("gemm", gemm), ("gather_gemm", both), ("fused", fused))}
            flop = 2 * d["rows"].numel() * s["hidden"] * s["n"]
            rows_out.append(dict(config=label, m=d["rows"].numel(), same_bits=same, **{f"{k}_ms": v for k, v in t.items()},
                                 fused_vs_gather_gemm=t["gather_gemm"] / t["fused"],
                                 fused_tflops=flop / t["fused"] / 1e9, gemm_tflops=flop / t["gemm"] / 1e9))
    print(f"# {torch.cuda.get_device_name()}, {datetime.date.today()}, commit {git_commit()}")
    print("| config | M | gather ms | GEMM ms | gather+GEMM ms | fused ms | fused / (gather+GEMM) | "
          "fused TFLOP/s | GEMM TFLOP/s | same bits |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows_out:
        print(f"| {r['config']} | {r['m']} | {r['gather_ms']:.3f} | {r['gemm_ms']:.3f} | {r['gather_gemm_ms']:.3f} | "
              f"{r['fused_ms']:.3f} | {r['fused_vs_gather_gemm']:.2f}x | {r['fused_tflops']:.0f} | "
              f"{r['gemm_tflops']:.0f} | {r['same_bits']} |")
    if args.json:
        write_json(args.json, run_meta(reps=args.reps, warmup=args.warmup,
                                       shapes={k: SHAPES[k] for k in args.shapes.split(",")}), rows_out)
    return 0 if all(r["same_bits"] for r in rows_out) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# What the groups cost: one plain ragged-M grouped GEMM of a fixed total size (M rows, K, N)
# split into E equal groups (every group a whole number of 128-row tiles, so no padding),
# for several E, each compiled tile config and tile order, next to cuBLAS on the whole
# (M, K) x (K, N) product (the dense ceiling) and torch._grouped_mm. If throughput falls
# with E at equal work, the per-group cost (the ptr-array kernel rewrites the TMA
# descriptors whenever a CTA's group changes) is worth removing. Table on stdout.
#
#   python bench/bench_group_overhead.py [--m 98304] [--k 2880] [--n 2880]
#       [--groups 1,8,32,128] [--configs a,b] [--orders m1,n2] [--reps 30] [--json out.json]
from __future__ import annotations

import argparse
import os
import sys

import torch

from common import fmt, import_cute_moe, print_columns, run_meta, time_ms, write_json


def with_env(fn, **env):
    def run():
        old = {k: os.environ.get(k) for k in env}
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        try:
            return fn()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="per-group cost of the ragged-M grouped GEMM")
    ap.add_argument("--m", type=int, default=98304)
    ap.add_argument("--k", type=int, default=2880)
    ap.add_argument("--n", type=int, default=2880)
    ap.add_argument("--groups", default="1,8,32,128")
    ap.add_argument("--configs", default="heuristic,128x256x64_2x1_coop,128x192x64_2x1_pong")
    ap.add_argument("--orders", default="auto", help="tile orders: auto (the heuristic's) or "
                    "raster+swizzle like m1,n2")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_group_overhead: needs an SM90 GPU", file=sys.stderr)
        return 2
    cm = import_cute_moe()
    torch.manual_seed(0)
    m, k, n = args.m, args.k, args.n
    flops = 2 * m * k * n
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    rows = [("groups", "impl", "config", "order", "ms", "TF/s")]
    records = []

    def record(groups, impl, config, order, ms):
        rows.append((str(groups), impl, config, order, fmt(ms, ".3f"), fmt(flops / ms / 1e9, ".0f")))
        records.append(dict(groups=groups, impl=impl, config=config, order=order, ms=ms,
                            tflops=flops / ms / 1e9))
        print(f"[{groups}] {impl} {config} {order}: {ms:.3f} ms", file=sys.stderr, flush=True)

    w1 = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    record(1, "cublas_mm", "-", "-", time_ms(lambda: x @ w1, args.reps, args.warmup))
    del w1
    for groups in (int(g) for g in args.groups.split(",")):
        if m % (groups * 128):
            print(f"skip {groups} groups: {m} rows are not whole 128-row tiles per group", file=sys.stderr)
            continue
        w = torch.randn(groups, k, n, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        offs = torch.arange(1, groups + 1, device="cuda", dtype=torch.int32) * (m // groups)
        record(groups, "torch_grouped_mm", "-", "-",
               time_ms(lambda: torch._grouped_mm(x, w, offs=offs), args.reps, args.warmup))
        for config in args.configs.split(","):
            for order in args.orders.split(","):
                env = {"CUTE_MOE_CONFIG": None if config == "heuristic" else config,
                       "CUTE_MOE_RASTER": None if order == "auto" else order[0],
                       "CUTE_MOE_SWIZZLE": None if order == "auto" else order[1:]}
                fn = with_env(lambda: cm.grouped_mm(x, w, offs), **env)
                record(groups, "cute_moe", config, order, time_ms(fn, args.reps, args.warmup))
        del w
        torch.cuda.empty_cache()
    print_columns(rows, left=4)
    if args.json:
        write_json(args.json, run_meta(m=m, k=k, n=n, reps=args.reps), records)
    return 0


if __name__ == "__main__":
    sys.exit(main())

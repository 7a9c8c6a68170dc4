#!/usr/bin/env python3
# Tile-configuration sweep of the six GEMM roles of an expert block (the fused up projection
# + activation, the down projection, the fused down dgrad + activation backward, the up
# dgrad and both weight gradients), on the inputs of bench_peer_quack.py: each role timed
# with the heuristic's choice and with every compiled configuration of its kernel (forced
# per call through CUTE_MOE_CONFIG, which the torch ops read on every call). Progress on
# stderr, the table on stdout.
#
#   python bench/bench_roles.py [--shapes gpt-oss-20b,qwen3-30b-a3b] [--routing balanced]
#       [--reps 30] [--roles up_fprop_act,...] [--configs NAME,...] [--orders auto,m1,n2]
#       [--rounds 3] [--schedules d,s] [--json out.json]
# --orders: each forced config also under these tile orders (raster m/n + swizzle 1/2/4/8,
# through CUTE_MOE_RASTER / CUTE_MOE_SWIZZLE; "auto" is the heuristic's order for the
# heuristic's config and CUTLASS's default, along M with swizzle 1, for a forced one). The
# group scheduler applies no swizzle (docs/perf-notes.md, session 11): only the raster acts.
# --schedules: every variant also under these weight-gradient tile schedules (CUTE_MOE_SCHEDULE:
# d dynamic, s static; d4: dynamic with a lookahead of 4, CUTE_MOE_SCHEDULE_LOOKAHEAD); without
# it, the default.
from __future__ import annotations

import argparse
import os
import sys

import torch

from bench_peer_quack import ROLES, SHAPES, make_case, role_fns
from common import fmt, import_cute_moe, print_columns, run_meta, write_json
from cute_moe.bench.runner import alternating_ms, call_step  # noqa: E402 (common put cute_moe on the path)

# the kernel-table call each role runs (torch.ops.cute_moe.kernel_table rows: call:act:config)
ROLE_CALL = {"up_fprop_act": "act_forward", "down_fprop": "ragged_m", "down_dgrad_act": "act_backward_bcol",
             "up_dgrad": "ragged_m_bcol", "up_wgrad": "ragged_k_bf16", "down_wgrad": "ragged_k_bf16"}


def compiled(call: str, act: str) -> list[str]:
    rows = (r.split(":") for r in torch.ops.cute_moe.kernel_table())
    return [cfg for c, a, cfg in rows if c == call and a in ("", act)]


ENV = ("CUTE_MOE_CONFIG", "CUTE_MOE_RASTER", "CUTE_MOE_SWIZZLE", "CUTE_MOE_SCHEDULE",
       "CUTE_MOE_SCHEDULE_LOOKAHEAD")


def forced(fn, config: str | None, order: str = "auto", schedule: str | None = None):
    values = (config, None if order == "auto" else order[0], None if order == "auto" else order[1:],
              None if schedule is None else schedule[:1], None if schedule is None else schedule[1:] or None)

    def run():
        for name, value in zip(ENV, values):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        try:
            return fn()
        finally:
            for name in ENV:
                os.environ.pop(name, None)
    return run


def bench(shape: str, routing: str, args) -> list[dict]:
    s = SHAPES[shape]
    m, h, i = s["tokens"] * s["topk"], s["hidden"], s["inter"]
    sizes, t, offs, cu, onehot, dy = make_case(s, routing, args.seed)
    rows = []
    for role, (ours, _) in role_fns(t, offs, cu, onehot, dy, s["act"], False).items():
        if args.roles and role not in args.roles:
            continue
        k_dim, n_dim = {"up": (h, 2 * i), "down": (i, h)}[role.split("_")[0]]
        flops = 2 * m * k_dim * n_dim
        configs = [None] + [c for c in compiled(ROLE_CALL[role], s["act"])
                            if not args.configs or c in args.configs]
        runs = {(config or "heuristic") + ("" if order == "auto" else f" {order}")
                + ("" if schedule is None else f" schedule {schedule}"):
                forced(ours, config, order, schedule)
                for config in configs for order in (["auto"] if config is None else args.orders)
                for schedule in (args.schedules or [None])}
        # The variants take turns call by call, the median of each: an H100's clocks drift
        # with what it has been running, which would otherwise favour whatever is timed in
        # the better moment (docs/perf-notes.md, sessions 6 and 11).
        steps = {name: call_step(run) for name, run in runs.items()}
        for name, (ms, q1, q3) in alternating_ms(steps, args.reps * args.rounds, args.warmup).items():
            rows.append(dict(shape=shape, routing=routing, role=role, config=name,
                             ms=ms, iqr=[q1, q3], tflops=flops / ms / 1e9))
            print(f"[{shape}/{routing}] {role} {name}: {ms:.3f} ms", file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="tile-config sweep of the expert block's GEMM roles")
    ap.add_argument("--shapes", default="gpt-oss-20b,qwen3-30b-a3b")
    ap.add_argument("--routing", default="balanced")
    ap.add_argument("--configs", default="", help="only these forced configs (comma-separated)")
    ap.add_argument("--roles", default="", help="only these roles (comma-separated)")
    ap.add_argument("--orders", default="auto", help="tile orders of the forced configs, e.g. auto,m1,n2")
    ap.add_argument("--rounds", type=int, default=3, help="timed calls per variant = reps x rounds, "
                    "all of a role's variants taking turns call by call; the median is reported")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--schedules", default="", help="weight-gradient tile schedules to time, e.g. d,s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.schedules = [x for x in args.schedules.split(",") if x]
    args.configs = [c for c in args.configs.split(",") if c]
    args.roles = [r for r in args.roles.split(",") if r]
    args.orders = [o for o in args.orders.split(",") if o]
    bad = [o for o in args.orders if o != "auto" and (o[:1] not in ("m", "n") or o[1:] not in ("1", "2", "4", "8"))]
    if bad:
        ap.error(f"--orders: expected auto or m/n followed by 1, 2, 4 or 8, got {bad}")
    if not torch.cuda.is_available():
        print("bench_roles: needs an SM90 GPU", file=sys.stderr)
        return 2
    import_cute_moe()
    rows = []
    for shape in args.shapes.split(","):
        for routing in args.routing.split(","):
            rows += bench(shape, routing, args)
    best = {}
    for r in rows:
        key = (r["shape"], r["routing"], r["role"])
        best[key] = min(best.get(key, float("inf")), r["ms"])
    lines = [("shape", "routing", "role", "config", "ms", "TF/s", "vs best")]
    for r in rows:
        lines.append((r["shape"], r["routing"], r["role"], r["config"], fmt(r["ms"], ".3f"),
                      fmt(r["tflops"], ".0f"), fmt(r["ms"] / best[(r["shape"], r["routing"], r["role"])], ".3f")))
    print_columns(lines, left=4)
    if args.json:
        write_json(args.json, run_meta(reps=args.reps, warmup=args.warmup, rounds=args.rounds, roles=list(ROLES)), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

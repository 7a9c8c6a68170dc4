#!/usr/bin/env python3
# Runs chosen GEMM roles of bench_peer_quack.py (ours and QuACK's, on the same inputs) once
# each between cudaProfilerStart/Stop, after a warm-up that compiles both sides, so a
# profiler started with --profile-from-start off takes exactly those kernels; each call's
# label ("<side> <shape> <routing> <role>") is printed first, in the profiled order:
#
#   ncu --profile-from-start off --metrics ... python bench/profile_roles.py \
#       --shapes gpt-oss-20b --routing balanced,skewed --roles up_wgrad [--sides ours,quack]
#
# (scripts/profile_roles.sh does that and prints a table). Without quack, ours alone.
from __future__ import annotations

import argparse

import torch

import bench_peer_quack as peer
from common import import_cute_moe


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", default="gpt-oss-20b")
    p.add_argument("--routing", default="balanced")
    p.add_argument("--roles", default=",".join(peer.ROLES))
    p.add_argument("--sides", default="ours,quack")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import_cute_moe()
    peer.Q, why = peer.load_quack()
    sides = [s for s in args.sides.split(",") if s == "ours" or peer.Q is not None]
    if peer.Q is None:
        print(f"quack: skipped ({why})")
    for shape in args.shapes.split(","):
        s = peer.SHAPES[shape]
        for routing in args.routing.split(","):
            sizes, t, offs, cu, onehot, dy = peer.make_case(s, routing, args.seed)
            fns = peer.role_fns(t, offs, cu, onehot, dy, s["act"], False)
            for role in args.roles.split(","):
                for side in sides:
                    fn = fns[role][0 if side == "ours" else 1]
                    for _ in range(3):  # compile (QuACK JITs on first call) and warm up
                        fn()
                    torch.cuda.synchronize()
                    print(f"profiled: {side} {shape} {routing} {role}", flush=True)
                    torch.cuda.profiler.start()
                    fn()
                    torch.cuda.synchronize()
                    torch.cuda.profiler.stop()
            del t, fns
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

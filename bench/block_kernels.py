# Where the expert block's time goes, kernel by kernel: each side's block (ours, and QuACK's
# where it is installed: scripts/peer_install.sh) runs forward + backward a few times under
# torch.profiler, and the GPU time of every kernel it launched is summed by name, with the
# gaps between kernels (the stream idle inside the block). Answers what a block timing
# alone cannot: whether a side's block is faster than its GEMM roles timed one by one, and
# which small kernels (setup, memsets, reductions) sit between the GEMMs.
#   python3 bench/block_kernels.py --shapes gpt-oss-20b --routing balanced [--iters 5] [--forward-only]
# --forward-only: the forward alone, as bench_peer_quack.py times the block's forward.
# --roles: also each GEMM role by itself, repeated (as bench_peer_quack.py times roles).
# --fp8: also our FP8 block (cute_moe.fp8.expert_ffn, docs/fp8.md) on the same leaves, with its
# weight gradients in FP8 ("fp8") and in bf16 ("fp8 bf16-wgrad", the default recipe).
from __future__ import annotations

import argparse
import collections

import torch

import bench_peer_quack as peer
from common import import_cute_moe


def profile_block(fn, leaves, dy, iters: int, forward_only: bool):
    """{kernel name: (calls per iteration, us per iteration)}, busy and span us per iteration."""
    def step():
        out = fn()
        if not forward_only:
            torch.autograd.grad(out, leaves, dy)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per = collections.defaultdict(lambda: [0, 0.0])
    spans = []
    for e in kernels:
        per[e.name][0] += 1
        per[e.name][1] += e.device_time
        spans.append((e.time_range.start, e.time_range.end))
    spans.sort()
    busy = sum(b - a for a, b in spans)
    span = spans[-1][1] - spans[0][0] if spans else 0
    return ({k: (n / iters, us / iters) for k, (n, us) in per.items()}, busy / iters, span / iters)


def fp8_sides(t: dict, offs, act: str) -> dict:
    """{side: our FP8 block's forward} on the peer's leaves, weight gradients FP8 / bf16."""
    from cute_moe import fp8, fp8_ffn

    def block(weight_grads_fp8: bool):
        def fn():
            setting, fp8_ffn.FP8_WEIGHT_GRADS = fp8_ffn.FP8_WEIGHT_GRADS, weight_grads_fp8  # read by the forward
            try:
                return fp8.expert_ffn(t["x"], t["w_up"], t["w_down"], offs, t["b_up"], t["b_down"],
                                      activation=act, swiglu_alpha=peer.ALPHA)
            finally:
                fp8_ffn.FP8_WEIGHT_GRADS = setting
        return fn

    return {"fp8": block(True), "fp8 bf16-wgrad": block(False)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="gpt-oss-20b")
    ap.add_argument("--routing", default="balanced")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--forward-only", action="store_true")
    ap.add_argument("--roles", action="store_true")
    ap.add_argument("--fp8", action="store_true")
    args = ap.parse_args()
    import_cute_moe()
    peer.Q, why = peer.load_quack()
    if peer.Q is None:
        print(f"QuACK: skipped ({why})")
    for shape in args.shapes.split(","):
        s = peer.SHAPES[shape]
        for routing in args.routing.split(","):
            sizes, t, offs, cu, onehot, dy = peer.make_case(s, routing, args.seed)
            leaves = [v for v in t.values() if v is not None]
            act = s["act"]
            sides = peer.block_fns(t, offs, cu, onehot, act, False)
            if peer.Q is None:
                del sides["quack"]
            if args.fp8:
                sides.update(fp8_sides(t, offs, act))
            for side, fn in sides.items():
                per, busy, span = profile_block(fn, leaves, dy, args.iters, args.forward_only)
                what = "fwd" if args.forward_only else "fwd+bwd"
                print(f"\n{shape} {routing} {side}: {what} per iteration: kernels busy {busy / 1e3:.3f} ms, "
                      f"first kernel start to last end {span / 1e3:.3f} ms")
                for name, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
                    print(f"  {us / 1e3:8.3f} ms  x{n:4.1f}  {name[:150]}")
            if not args.roles:
                continue
            print(f"\n{shape} {routing}: each role repeated by itself, kernel GPU ms per call (ours / quack)")
            roles = peer.role_fns(t, offs, cu, onehot, dy, act, False)
            for role, fns in roles.items():
                cells = []
                for side, fn in zip(("ours", "quack"), fns):
                    if side == "quack" and peer.Q is None:
                        continue
                    with torch.no_grad():
                        per, busy, _ = profile_block(fn, [], None, args.iters, True)
                    cells.append(f"{side} {busy / 1e3:.3f}")
                print(f"  {role:15s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

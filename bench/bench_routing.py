# The routing kernels (cute_moe::top_k, cute_moe::sort_by_expert) against the torch path
# they replace (torch.topk; torch.sort + scatter + searchsorted + gather) inside the main
# job's MoE layer: the same layer and inputs in one process, the two sides taking turns call
# by call (cute_moe.bench.runner.alternating_ms), differing only in whether the router and
# the dispatch may use the kernels.
#   python3 bench/bench_routing.py [--configs gpt-oss-20b,qwen3-30b-a3b] [--reps 40]
from __future__ import annotations

import argparse

import torch

from common import import_cute_moe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--configs", default="gpt-oss-20b,qwen3-30b-a3b")
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    import_cute_moe()
    from cute_moe.bench.configs import CONFIGS
    from cute_moe.bench.runner import alternating_ms, backward_step, build, call_step
    from cute_moe.nn import dispatch
    from cute_moe.nn import top_k as top_k_mod

    kernels = (top_k_mod._on_device, dispatch._sort_on_device)

    def on(step, use_kernels: bool):
        def run(clock):
            top_k_mod._on_device = kernels[0] if use_kernels else (lambda logits, k: False)
            dispatch._sort_on_device = kernels[1] if use_kernels else (lambda *a: False)
            step(clock)
        return run

    print(f"{torch.cuda.get_device_name()}; median ms of {args.reps} forward and backward calls "
          f"per side; x = torch path / kernels")
    print(f"{'config':15s} {'fwd kernels':>11s} {'fwd torch':>9s} {'x':>6s} "
          f"{'bwd kernels':>11s} {'bwd torch':>9s} {'x':>6s}")
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        layer, _, x, dy = build(cfg, "cuda", 0)
        inputs = [x, *layer.parameters()]

        def forward():
            return layer(x)

        def backward(out):
            return torch.autograd.grad(out, inputs, dy)

        f = alternating_ms({"k": on(call_step(forward), True), "t": on(call_step(forward), False)},
                           args.reps, 5)
        b = alternating_ms({"k": on(backward_step(forward, backward), True),
                            "t": on(backward_step(forward, backward), False)}, args.reps, 5)
        print(f"{name:15s} {f['k'][0]:11.3f} {f['t'][0]:9.3f} {f['t'][0] / f['k'][0]:5.3f}x "
              f"{b['k'][0]:11.3f} {b['t'][0]:9.3f} {b['t'][0] / b['k'][0]:5.3f}x")
        del layer, x, dy, inputs
        torch.cuda.empty_cache()
    top_k_mod._on_device, dispatch._sort_on_device = kernels
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

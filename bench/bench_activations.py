#!/usr/bin/env python3
# Benchmark of the activation family: cute_moe.expert_ffn, fused, against its
# unfused PyTorch equivalent (torch._grouped_mm, biases gathered per row, the activation
# and the router-probability scaling as bf16/fp32 elementwise ops, as torchtitan runs
# them) on the same inputs in the same run, for every activation on the GPT-OSS-20B
# shape and swiglu on the Qwen3-30B-A3B-like shape. Reports median ms (CUDA events) of
# forward and backward, the speedups, each activation's time relative to the default
# activation's (swiglu_oai, cute_moe/activations.py) on the same shape, and the relative
# difference of the two implementations' outputs and gradients. Progress on stderr, the
# table on stdout.
#
#   python bench/bench_activations.py [--cases gpt-oss-20b:swiglu_oai,...] [--reps 20]
#       [--json out.json]
from __future__ import annotations

import argparse
import sys

import torch

from common import fmt, import_cute_moe, print_columns, rel_error, run_meta, time_ms, write_json
from cute_moe.activation_args import default_limit, is_gated
from cute_moe.activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from cute_moe.reference import activation_ref

SHAPES = {  # tokens T, top-k, hidden H, intermediate I, experts E, biases, router probs
    "gpt-oss-20b": dict(tokens=24576, topk=4, hidden=2880, inter=2880, experts=32, bias=True,
                        prob=True),
    "qwen3-30b-a3b": dict(tokens=16384, topk=8, hidden=2048, inter=768, experts=128, bias=False,
                          prob=True),
    "smoke": dict(tokens=512, topk=4, hidden=256, inter=128, experts=8, bias=True, prob=True),
}
DEFAULT_CASES = ("gpt-oss-20b:swiglu_oai,gpt-oss-20b:swiglu,gpt-oss-20b:geglu,"
                 "gpt-oss-20b:srelu,gpt-oss-20b:none,qwen3-30b-a3b:swiglu")
ALPHA = DEFAULT_ALPHA
AGREE_TOL = 2e-2  # the baseline rounds more often (after the GEMM, the bias, the activation)


def flops(m, hidden, inter, act):
    up = 2 * m * hidden * (2 * inter if is_gated(act) else inter)
    fwd = up + 2 * m * inter * hidden
    return fwd, 2 * fwd


def make_inputs(s, act, seed):
    from cute_moe import testing
    gen = torch.Generator(device="cuda").manual_seed(seed)
    m, h, i, e = s["tokens"] * s["topk"], s["hidden"], s["inter"], s["experts"]
    up = 2 * i if is_gated(act) else i
    sizes = testing.group_sizes(m, e, "balanced", generator=torch.Generator().manual_seed(seed),
                                max_size=s["tokens"])

    def randn(*shape, scale=1.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)

    t = dict(x=randn(m, h), w_up=randn(e, h, up, scale=h ** -0.5),
             w_down=randn(e, i, h, scale=i ** -0.5))
    if s["bias"]:
        t.update(b_up=randn(e, up, scale=0.5), b_down=randn(e, h, scale=0.5))
    if s["prob"]:
        t["prob"] = torch.rand(m, device="cuda", generator=gen)
    for v in t.values():
        v.requires_grad_()
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    return t, offs, randn(m, h)


def fused(t, offs, act):
    import cute_moe
    return cute_moe.expert_ffn(t["x"], t["w_up"], t["w_down"], offs, t.get("b_up"),
                               t.get("b_down"), activation=act, prob=t.get("prob"),
                               swiglu_alpha=ALPHA, limit=default_limit(act))


def unfused(t, offs, act):
    """torchtitan's way: grouped GEMMs, per-row bias gather (repeat_interleave with
    output_size: no host sync), bf16 activation, fp32 probability scaling."""
    x = t["x"]
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).long()
    row_expert = torch.repeat_interleave(torch.arange(offs.shape[0], device=x.device), counts,
                                         output_size=x.shape[0])
    pre = torch._grouped_mm(x, t["w_up"], offs=offs)
    if "b_up" in t:
        pre = pre + t["b_up"][row_expert]
    # the activation in bf16, as an eager PyTorch layer computes it
    h = activation_ref(pre, act, ALPHA, default_limit(act))
    y = torch._grouped_mm(h, t["w_down"], offs=offs)
    if "b_down" in t:
        y = y + t["b_down"][row_expert]
    if "prob" in t:
        y = (y.float() * t["prob"][:, None]).to(x.dtype)
    return y


def run(block, t, offs, dy, act, reps, warmup):
    leaves = list(t.values())
    fwd = lambda: block(t, offs, act)  # noqa: E731
    fwd_bwd = lambda: torch.autograd.grad(block(t, offs, act), leaves, dy)  # noqa: E731
    out, grads = fwd().detach(), fwd_bwd()
    f, fb = time_ms(fwd, reps, warmup), time_ms(fwd_bwd, reps, warmup)
    return dict(fwd_ms=f, bwd_ms=fb - f, out=out, grads=dict(zip(t.keys(), grads)))


def bench_case(shape, act, reps, warmup, seed):
    s = SHAPES[shape]
    t, offs, dy = make_inputs(s, act, seed)
    m = s["tokens"] * s["topk"]
    fwd_flops, bwd_flops = flops(m, s["hidden"], s["inter"], act)
    ours = run(fused, t, offs, dy, act, reps, warmup)
    theirs = run(unfused, t, offs, dy, act, reps, warmup)
    diff = {"out": rel_error(ours["out"], theirs["out"])}
    diff.update({f"d{k}": rel_error(ours["grads"][k], theirs["grads"][k]) for k in t
                 if not k.startswith("b_")})  # baseline bias grads accumulate in bf16
    row = dict(shape=shape, activation=act, m=m, fwd_flops=fwd_flops, bwd_flops=bwd_flops,
               rel_diff=diff)
    for name, res in (("ours", ours), ("torch", theirs)):
        row[f"{name}_fwd_ms"], row[f"{name}_bwd_ms"] = res["fwd_ms"], res["bwd_ms"]
    return row


def print_table(rows):
    base = {r["shape"]: r for r in rows if r["activation"] == DEFAULT_ACTIVATION}
    head = ("shape", "activation", "fwd ours", "fwd torch", "fwd x", "bwd ours", "bwd torch",
            "bwd x", "fwd TF/s", "bwd TF/s", f"f+b vs {DEFAULT_ACTIVATION}", "max rel diff")
    lines = [head]
    for r in rows:
        b = base.get(r["shape"])
        vs = None if b is None else (r["ours_fwd_ms"] + r["ours_bwd_ms"]) / (
            b["ours_fwd_ms"] + b["ours_bwd_ms"])
        lines.append((r["shape"], r["activation"], fmt(r["ours_fwd_ms"], ".2f"),
                      fmt(r["torch_fwd_ms"], ".2f"),
                      fmt(r["torch_fwd_ms"] / r["ours_fwd_ms"], ".2f") + "x",
                      fmt(r["ours_bwd_ms"], ".2f"), fmt(r["torch_bwd_ms"], ".2f"),
                      fmt(r["torch_bwd_ms"] / r["ours_bwd_ms"], ".2f") + "x",
                      fmt(r["fwd_flops"] / r["ours_fwd_ms"] / 1e9, ".0f"),
                      fmt(r["bwd_flops"] / r["ours_bwd_ms"] / 1e9, ".0f"),
                      fmt(vs, ".3f"), fmt(max(r["rel_diff"].values()), ".1e")))
    print(f"ms, median of CUDA events; x: torch / ours; TF/s: GEMM FLOPs / our time; f+b vs "
          f"{DEFAULT_ACTIVATION}: our forward+backward time over {DEFAULT_ACTIVATION}'s on the "
          "same shape; max rel diff: ours vs torch over the output and the gradients of x, "
          "weights and prob")
    print_columns(lines, left=2)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", default=DEFAULT_CASES,
                    help="comma-separated shape:activation pairs, shapes from "
                         f"{', '.join(SHAPES)}")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_activations: no CUDA device; this benchmark needs an SM90 GPU",
              file=sys.stderr)
        return 2
    import_cute_moe()
    rows = []
    for case in args.cases.split(","):
        shape, act = case.split(":")
        rows.append(bench_case(shape, act, args.reps, args.warmup, args.seed))
        r = rows[-1]
        print(f"[{case}] fwd {r['ours_fwd_ms']:.2f} vs {r['torch_fwd_ms']:.2f} ms, bwd "
              f"{r['ours_bwd_ms']:.2f} vs {r['torch_bwd_ms']:.2f} ms", file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    print_table(rows)
    bad = [(r, k, v) for r in rows for k, v in r["rel_diff"].items() if not v <= AGREE_TOL]
    for r, k, v in bad:
        print(f"MISMATCH {r['shape']}/{r['activation']} {k}: {v:.2e} > {AGREE_TOL}",
              file=sys.stderr)
    if args.json:
        write_json(args.json, run_meta(reps=args.reps, shapes=SHAPES), rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

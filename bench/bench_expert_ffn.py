#!/usr/bin/env python3
# Benchmark of one MoE expert block (up projection + bias + GPT-OSS SwiGLU + down
# projection + bias), forward and forward+backward: cute_moe's fused route
# (grouped_mm_swiglu, then grouped_mm_downproj with aux_biased_acc) against the
# torchtitan-style unfused block (torch._grouped_mm, biases gathered per row, the HF
# SwiGLU in bf16) on the same inputs in the same run. Reports median ms of CUDA events,
# TFLOP/s, peak memory of one forward+backward, speedups, and the relative difference of
# the two implementations' outputs and gradients. Progress goes to stderr, the table to
# stdout.
#
#   python bench/bench_expert_ffn.py [--shapes gpt-oss-20b,gpt-oss-20b-e128]
#       [--routing balanced,skewed] [--layout kn,nk] [--reps 30] [--json out.json]
from __future__ import annotations

import argparse
import sys

import torch

from common import (fmt, import_cute_moe, peak_bytes, print_columns, rel_error, run_meta, time_ms,
                    write_json)
from cute_moe.activation_args import default_limit
from cute_moe.activations import DEFAULT_ALPHA

# rows M = tokens * top-k routed rows, hidden H, expert intermediate I (up width 2I), experts E.
SHAPES = {
    "gpt-oss-20b": dict(tokens=24576, topk=4, hidden=2880, inter=2880, experts=32),
    "gpt-oss-20b-e128": dict(tokens=24576, topk=4, hidden=2880, inter=2880, experts=128),
    "smoke": dict(tokens=1024, topk=4, hidden=512, inter=256, experts=8),
}
DEFAULT_SHAPES = ("gpt-oss-20b", "gpt-oss-20b-e128")
ROUTINGS = ("balanced", "skewed")
LAYOUTS = ("kn", "nk")  # kn: W_up (E, H, 2I), W_down (E, I, H); nk: transposed views (torchtitan)
ALPHA, LIMIT = DEFAULT_ALPHA, default_limit("swiglu_oai")  # GPT-OSS's
# The baseline rounds to bf16 more often (after the GEMM, after the bias, inside the
# activation), so the two differ by more than either does from an fp32 reference.
AGREE_TOL = 2e-2
# Bias gradients are checked against fp32 column sums instead: the baseline's come from
# the backward of a row gather, which accumulates in bf16 (errors of several % at
# thousands of rows per expert).
BIAS_TOL = 1e-2
GRAD_NAMES = ("x", "W_up", "b_up", "W_down", "b_down")


def flops(m: int, hidden: int, inter: int) -> tuple[int, int]:
    """(forward, backward) FLOPs of the block's GEMMs for m routed rows."""
    fwd = 2 * m * hidden * 2 * inter + 2 * m * inter * hidden
    return fwd, 2 * fwd


def make_inputs(s: dict, sizes: list[int], layout: str, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev, bf16 = "cuda", torch.bfloat16
    m, h, i, e = s["tokens"] * s["topk"], s["hidden"], s["inter"], s["experts"]

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, dtype=torch.float32, generator=gen) * scale
                ).to(bf16)

    def weight(k, n):
        w = randn(e, k, n, scale=k ** -0.5) if layout == "kn" else randn(e, n, k, scale=k ** -0.5)
        return w.requires_grad_()

    leaves = dict(x=randn(m, h).requires_grad_(), W_up=weight(h, 2 * i),
                  b_up=randn(e, 2 * i, scale=0.5).requires_grad_(), W_down=weight(i, h),
                  b_down=randn(e, h, scale=0.5).requires_grad_())
    offs = torch.tensor(sizes, device=dev).cumsum(0).to(torch.int32)
    return leaves, offs, randn(m, h)


def operand(w: torch.Tensor, layout: str) -> torch.Tensor:
    return w if layout == "kn" else w.transpose(-2, -1)


def fused_block(t: dict, offs: torch.Tensor, layout: str):
    import cute_moe
    h, pre = cute_moe.grouped_mm_swiglu(t["x"], operand(t["W_up"], layout), offs, t["b_up"],
                                        swiglu_alpha=ALPHA, swiglu_limit=LIMIT)
    return cute_moe.grouped_mm_downproj(h, operand(t["W_down"], layout), offs, t["b_down"],
                                        aux_biased_acc=pre, swiglu_alpha=ALPHA,
                                        swiglu_limit=LIMIT)


def torchtitan_block(t: dict, offs: torch.Tensor, layout: str):
    """The unfused block as torchtitan runs it, with the bias gather built on the device
    (repeat_interleave with output_size: no host sync) and HF's SwiGLU in bf16."""
    x = t["x"]
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).long()
    experts = torch.arange(offs.shape[0], device=offs.device)
    row_expert = torch.repeat_interleave(experts, counts, output_size=x.shape[0])
    gate_up = torch._grouped_mm(x, operand(t["W_up"], layout), offs=offs) + t["b_up"][row_expert]
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=LIMIT)
    up = up.clamp(min=-LIMIT, max=LIMIT)
    glu = gate * torch.sigmoid(gate * ALPHA)
    h = (up + 1) * glu
    return torch._grouped_mm(h, operand(t["W_down"], layout), offs=offs) + t["b_down"][row_expert]


def bench_impl(block, t, offs, dy, layout, reps, warmup) -> dict:
    leaves = list(t.values())

    def forward():
        return block(t, offs, layout)

    def forward_backward():
        return torch.autograd.grad(block(t, offs, layout), leaves, dy)

    out = forward().detach()
    grads = forward_backward()
    fwd_ms = time_ms(forward, reps, warmup)
    fwd_bwd_ms = time_ms(forward_backward, reps, warmup)
    return dict(fwd_ms=fwd_ms, fwd_bwd_ms=fwd_bwd_ms, bwd_ms=fwd_bwd_ms - fwd_ms,
                peak_bytes=peak_bytes(forward_backward, True), out=out, grads=grads)


def bias_grad_errors(t, offs, dy, layout, grads: dict) -> dict:
    """Relative error of each implementation's db_up and db_down against fp32 sums over
    the expert's rows of dpre (from fp32 dy @ W_down^T and our pre) and of dy."""
    from cute_moe import reference as ref
    with torch.no_grad():
        _, pre = torch.ops.cute_moe.grouped_mm_swiglu(t["x"], operand(t["W_up"], layout), offs,
                                                      t["b_up"], ALPHA, LIMIT)
        dh = ref.grouped_mm_ref(dy, operand(t["W_down"], layout).transpose(-2, -1), offs,
                                out_dtype=torch.float32)
        truth = {"db_up": ref.grouped_bias_grad_ref(ref.swiglu_oai_bwd_ref(dh, pre, ALPHA, LIMIT),
                                                    offs),
                 "db_down": ref.grouped_bias_grad_ref(dy, offs)}
        del pre, dh
    return {impl: {k: rel_error(g[GRAD_NAMES.index(k[1:])], v) for k, v in truth.items()}
            for impl, g in grads.items()}


def bench_case(shape: str, routing: str, layout: str, reps: int, warmup: int, seed: int) -> dict:
    from cute_moe import testing
    s = SHAPES[shape]
    m = s["tokens"] * s["topk"]
    sizes = testing.group_sizes(m, s["experts"], routing,
                                generator=torch.Generator().manual_seed(seed),
                                max_size=s["tokens"])
    t, offs, dy = make_inputs(s, sizes, layout, seed)
    fwd_flops, bwd_flops = flops(m, s["hidden"], s["inter"])
    row = dict(shape=shape, routing=routing, layout=layout, m=m, hidden=s["hidden"],
               inter=s["inter"], experts=s["experts"], max_group=max(sizes),
               empty_groups=sizes.count(0), fwd_flops=fwd_flops, bwd_flops=bwd_flops)
    ours = bench_impl(fused_block, t, offs, dy, layout, reps, warmup)
    try:
        theirs = bench_impl(torchtitan_block, t, offs, dy, layout, reps, warmup)
        row["torch_error"] = None
    except RuntimeError as exc:  # torch._grouped_mm may not support this device or layout
        theirs = None
        row["torch_error"] = str(exc).splitlines()[0]
    for name, res in (("ours", ours), ("torch", theirs)):
        for key in ("fwd_ms", "bwd_ms", "fwd_bwd_ms", "peak_bytes"):
            row[f"{name}_{key}"] = res[key] if res else None
    row["rel_diff"] = None
    if theirs:
        row["rel_diff"] = {"out": rel_error(ours["out"], theirs["out"])}
        for name, a, b in zip(GRAD_NAMES, ours["grads"], theirs["grads"]):
            if not name.startswith("b_"):
                row["rel_diff"][f"d{name}"] = rel_error(a, b)
    grads = {"ours": ours["grads"], **({"torch": theirs["grads"]} if theirs else {})}
    del ours, theirs
    row["bias_grad_error"] = bias_grad_errors(t, offs, dy, layout, grads)
    return row


def worst(values):
    """The largest value, NaN if any is NaN."""
    values = list(values)
    return float("nan") if any(v != v for v in values) else max(values)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def print_table(rows: list[dict]) -> None:
    head = ("shape", "routing", "layout", "fwd ours", "fwd torch", "fwd x", "bwd ours",
            "bwd torch", "bwd x", "f+b ours", "f+b torch", "f+b x", "f+b TF/s ours",
            "f+b TF/s torch", "peak GiB ours", "peak GiB torch", "max rel diff",
            "db err ours", "db err torch")
    lines = [head]
    for r in rows:
        total = r["fwd_flops"] + r["bwd_flops"]
        tf = lambda ms: None if ms is None else total / ms / 1e9  # noqa: E731
        gib = lambda b: None if b is None else b / 2 ** 30  # noqa: E731
        diff = worst(r["rel_diff"].values()) if r["rel_diff"] else None
        db_err = {k: worst(v.values()) for k, v in r["bias_grad_error"].items()}
        cells = [r["shape"], r["routing"], r["layout"]]
        for key in ("fwd_ms", "bwd_ms", "fwd_bwd_ms"):
            speedup = ratio(r[f"torch_{key}"], r[f"ours_{key}"])
            cells += [fmt(r[f"ours_{key}"], ".2f"), fmt(r[f"torch_{key}"], ".2f"),
                      fmt(speedup, ".2f") + ("x" if speedup else "")]
        cells += [fmt(tf(r["ours_fwd_bwd_ms"]), ".0f"), fmt(tf(r["torch_fwd_bwd_ms"]), ".0f"),
                  fmt(gib(r["ours_peak_bytes"]), ".2f"), fmt(gib(r["torch_peak_bytes"]), ".2f"),
                  fmt(diff, ".1e"), fmt(db_err.get("ours"), ".1e"),
                  fmt(db_err.get("torch"), ".1e")]
        lines.append(tuple(cells))
    print("times in ms (median of CUDA events); x: torch / ours; TF/s over forward+backward "
          "FLOPs (3 x forward); max rel diff: ours vs torch over out, dx, dW_up, dW_down; "
          "db err: max over db_up, db_down of the error vs fp32 sums")
    print_columns(lines, left=3)
    for r in rows:
        if r["torch_error"]:
            print(f"{r['shape']}/{r['routing']}/{r['layout']}: torch baseline failed: "
                  f"{r['torch_error']}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="cute_moe fused expert FFN (SwiGLU) vs a torchtitan-style unfused block")
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                    help=f"comma-separated, from {', '.join(SHAPES)}")
    ap.add_argument("--routing", default="balanced",
                    help=f"comma-separated, from {', '.join(ROUTINGS)}")
    ap.add_argument("--layout", default="kn",
                    help="comma-separated, from kn (W (E, K, N), the seed API's) and nk "
                         "(transposed views, torchtitan's)")
    ap.add_argument("--reps", type=int, default=30, help="timed repetitions (median; >= 10)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", default=None, metavar="PATH", help="also write results here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for opt, choices in (("shapes", SHAPES), ("routing", ROUTINGS), ("layout", LAYOUTS)):
        values = getattr(args, opt).split(",")
        for v in values:
            if v not in choices:
                ap.error(f"--{opt}: unknown value {v!r}; choose from {', '.join(choices)}")
        setattr(args, opt, values)
    if args.reps < 10:
        ap.error("--reps: at least 10")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_expert_ffn: no CUDA device; this benchmark needs an SM90 GPU",
              file=sys.stderr)
        return 2
    import_cute_moe()

    rows = []
    for shape in args.shapes:
        for routing in args.routing:
            for layout in args.layout:
                row = bench_case(shape, routing, layout, args.reps, args.warmup, args.seed)
                rows.append(row)
                torch.cuda.empty_cache()
                print(f"[{shape}/{routing}/{layout}] fwd ours {row['ours_fwd_ms']:.2f} ms, torch "
                      f"{fmt(row['torch_fwd_ms'], '.2f')} ms; fwd+bwd ours "
                      f"{row['ours_fwd_bwd_ms']:.2f} ms, torch "
                      f"{fmt(row['torch_fwd_bwd_ms'], '.2f')} ms", file=sys.stderr, flush=True)

    print_table(rows)
    bad = [(r, k, v) for r in rows if r["rel_diff"] for k, v in r["rel_diff"].items()
           if not v <= AGREE_TOL]
    bad += [(r, k, v) for r in rows for k, v in r["bias_grad_error"]["ours"].items()
            if not v <= BIAS_TOL]
    for r, k, v in bad:
        print(f"MISMATCH {r['shape']}/{r['routing']}/{r['layout']} {k}: relative "
              f"{'error vs fp32 sums' if k.startswith('db') else 'difference to the torch block'}"
              f" {v:.2e} > {BIAS_TOL if k.startswith('db') else AGREE_TOL}", file=sys.stderr)
    if args.json:
        write_json(args.json, run_meta(reps=args.reps, warmup=args.warmup, alpha=ALPHA, limit=LIMIT,
                                       shapes={k: SHAPES[k] for k in args.shapes}), rows)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# Benchmark of the token permute / unpermute gathers of an MoE layer (dispatch, combine and
# their gradients): cute_moe's ops next to the PyTorch equivalents (indexing, index_add_,
# a gathered weighted sum) on the same inputs in the same run, in GB/s of the rows each op
# moves (a gathered row counted every time it is read, each output row once), with a
# correctness spot check.
# Progress goes to stderr, the table to stdout.
#
#   python bench/bench_permute.py [--shapes gpt-oss-20b,qwen3-30b-a3b] [--reps 50] [--json out.json]
from __future__ import annotations

import argparse
import sys

import torch

from common import fmt, import_cute_moe, print_columns, rel_error, run_meta, time_ms, write_json

# tokens T, hidden H, experts E, top-k (M = T*k routed rows).
SHAPES = {
    "gpt-oss-20b": dict(tokens=24576, hidden=2880, experts=32, topk=4),
    "qwen3-30b-a3b": dict(tokens=16384, hidden=2048, experts=128, topk=8),
}
SPOT_CHECK_TOL = 1e-2


def make_inputs(s: dict, seed: int):
    from cute_moe.reference import routing_indices
    dev, bf16 = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(seed)
    t, h, k, e = s["tokens"], s["hidden"], s["topk"], s["experts"]
    expert = torch.rand(t, e, device=dev, generator=gen).topk(k, dim=1).indices
    row_token, token_rows, _ = routing_indices(expert, e)
    weight = torch.rand(t, k, device=dev, generator=gen).softmax(-1)
    w_row = torch.empty(t * k, device=dev).scatter_(0, token_rows.reshape(-1).long(), weight.reshape(-1))
    return dict(
        x=torch.randn(t, h, device=dev, dtype=bf16, generator=gen),
        y=torch.randn(t * k, h, device=dev, dtype=bf16, generator=gen),
        dout=torch.randn(t, h, device=dev, dtype=bf16, generator=gen),
        row_token=row_token, token_rows=token_rows, weight=weight, w_row=w_row,
        row_token64=row_token.long(), token_rows64=token_rows.long())


def cases(d: dict, s: dict):
    """(name, bytes moved, ours, torch): the five gathers of a layer's permute/unpermute."""
    ops = torch.ops.cute_moe
    t, h, k = s["tokens"], s["hidden"], s["topk"]
    m = t * k
    row = tok_rows = 2 * h  # bytes of one bf16 row (routed, token)

    def index_add(src, scale):
        out = torch.zeros(t, h, device="cuda", dtype=src.dtype)
        return out.index_add_(0, d["row_token64"], src if scale is None else src * scale[:, None])

    return [
        ("permute (x[row_token])", m * row + m * row + 4 * m,
         lambda: ops.gather_rows(d["x"], d["row_token"]),
         lambda: d["x"][d["row_token64"]]),
        ("permute bwd (sum of k copies)", m * row + t * tok_rows + 4 * m,
         lambda: ops.gather_sum_rows(d["y"], d["token_rows"]),
         lambda: index_add(d["y"], None)),
        ("unpermute (weighted combine)", m * row + t * tok_rows + 8 * m,
         lambda: ops.gather_sum_rows(d["y"], d["token_rows"], d["weight"]),
         lambda: index_add(d["y"], d["w_row"].to(torch.bfloat16))),
        ("unpermute bwd dy (scaled gather)", m * row + m * row + 8 * m,
         lambda: ops.gather_rows(d["dout"], d["row_token"], d["w_row"]),
         lambda: d["dout"][d["row_token64"]] * d["w_row"].to(torch.bfloat16)[:, None]),
        ("unpermute bwd dweight (dots)", m * row + t * tok_rows + 8 * m,
         lambda: ops.gather_rows_dot(d["dout"], d["y"], d["token_rows"]),
         lambda: torch.bmm(d["y"][d["token_rows64"]], d["dout"][:, :, None]).squeeze(-1).float()),
    ]


def gathered_sum(d: dict):
    """The combine as a gather in PyTorch (no atomics): a second baseline for the combine."""
    y = d["y"][d["token_rows64"]]  # (T, k, H)
    return (y.float() * d["weight"][..., None]).sum(1).to(torch.bfloat16)


def bench_shape(shape: str, s: dict, reps: int, warmup: int, seed: int) -> list[dict]:
    d = make_inputs(s, seed)
    rows = []
    for name, nbytes, ours, theirs in cases(d, s):
        out, ref = ours(), theirs()
        row = dict(shape=shape, op=name, bytes=nbytes, rel_error=rel_error(out.float(), ref.float()),
                   ours_ms=time_ms(ours, reps, warmup), torch_ms=time_ms(theirs, reps, warmup))
        rows.append(row)
        print(f"[{shape}] {name}: ours {row['ours_ms']:.3f} ms, torch {row['torch_ms']:.3f} ms, "
              f"rel err {row['rel_error']:.1e}", file=sys.stderr, flush=True)
    ours = lambda: torch.ops.cute_moe.gather_sum_rows(d["y"], d["token_rows"], d["weight"])  # noqa: E731
    t, h, k = s["tokens"], s["hidden"], s["topk"]
    rows.append(dict(shape=shape, op="unpermute vs gathered sum",
                     bytes=t * k * 2 * h + t * 2 * h + 8 * t * k,
                     rel_error=rel_error(ours().float(), gathered_sum(d).float()),
                     ours_ms=time_ms(ours, reps, warmup),
                     torch_ms=time_ms(lambda: gathered_sum(d), reps, warmup)))
    return rows


def print_table(rows: list[dict]) -> None:
    head = ("shape", "op", "MB", "ours ms", "torch ms", "ours GB/s", "torch GB/s", "speedup", "rel err")
    lines = [head]
    for r in rows:
        bw = lambda ms: r["bytes"] / ms / 1e6  # noqa: E731
        lines.append((r["shape"], r["op"], f"{r['bytes'] / 1e6:.0f}", fmt(r["ours_ms"], ".3f"),
                      fmt(r["torch_ms"], ".3f"), fmt(bw(r["ours_ms"]), ".0f"), fmt(bw(r["torch_ms"]), ".0f"),
                      fmt(r["torch_ms"] / r["ours_ms"], ".2f") + "x", fmt(r["rel_error"], ".1e")))
    print_columns(lines, left=2)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="cute_moe permute/unpermute gathers vs PyTorch")
    ap.add_argument("--shapes", default="gpt-oss-20b", help=f"comma-separated, from {', '.join(SHAPES)}")
    ap.add_argument("--reps", type=int, default=50, help="timed repetitions (median; >= 20)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", default=None, metavar="PATH", help="also write results here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.shapes = args.shapes.split(",")
    for name in args.shapes:
        if name not in SHAPES:
            ap.error(f"--shapes: unknown shape {name!r}; choose from {', '.join(SHAPES)}")
    if args.reps < 20:
        ap.error("--reps: at least 20")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_permute: no CUDA device; this benchmark needs a GPU", file=sys.stderr)
        return 2
    import_cute_moe()
    if not hasattr(torch.ops.cute_moe, "gather_rows"):
        print("bench_permute: the loaded op library has no gather_rows (rebuild it)", file=sys.stderr)
        return 2
    rows = []
    for shape in args.shapes:
        rows += bench_shape(shape, SHAPES[shape], args.reps, args.warmup, args.seed)
    print_table(rows)
    bad = [r for r in rows if not r["rel_error"] <= SPOT_CHECK_TOL]
    for r in bad:
        print(f"MISMATCH {r['shape']}/{r['op']}: rel error vs torch {r['rel_error']:.2e} > "
              f"{SPOT_CHECK_TOL}", file=sys.stderr)
    if args.json:
        write_json(args.json, run_meta(reps=args.reps, warmup=args.warmup,
                                       shapes={k: SHAPES[k] for k in args.shapes}), rows)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

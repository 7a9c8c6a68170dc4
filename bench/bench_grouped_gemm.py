#!/usr/bin/env python3
# Benchmark of the six grouped GEMMs of one MoE expert layer (up/down projection x
# forward, input gradient, weight gradient) for named model shapes and routings:
# cute_moe's ops next to torch._grouped_mm on the same inputs in the same run, with a
# correctness spot check. Progress goes to stderr, the table to stdout.
#
#   python bench/bench_grouped_gemm.py [--shapes gpt-oss-20b,qwen3-30b-a3b]
#       [--routing balanced,skewed] [--reps 50] [--config NAME] [--json out.json]
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import torch

from common import fmt, import_cute_moe, print_columns, rel_error, run_meta, time_ms, write_json

# tokens T, hidden H, expert intermediate I, experts E, top-k; up-projection width 2I (GLU).
SHAPES = {
    "gpt-oss-20b": dict(tokens=24576, hidden=2880, inter=2880, experts=32, topk=4),
    "qwen3-30b-a3b": dict(tokens=16384, hidden=2048, inter=768, experts=128, topk=8),
}
ROUTINGS = ("balanced", "skewed")
SPOT_CHECK_TOL = 1e-2


@dataclass
class Gemm:
    name: str
    kind: str  # "fprop" / "dgrad": ragged M, y = a @ b[e]; "wgrad": ragged K, a.T @ b
    m: int     # routed rows (the ragged dimension)
    k: int
    n: int
    transposed_w: bool = False  # b is the transposed view of an (E, N, K) weight


def layer_gemms(s: dict) -> list[Gemm]:
    m, h, i2, i = s["tokens"] * s["topk"], s["hidden"], 2 * s["inter"], s["inter"]
    return [
        Gemm("up_fprop", "fprop", m, h, i2),            # x @ W_up          (E, H, 2I)
        Gemm("up_dgrad", "dgrad", m, i2, h, True),      # dpre @ W_up^T
        Gemm("up_wgrad", "wgrad", m, h, i2),            # x^T @ dpre    ->  (E, H, 2I)
        Gemm("down_fprop", "fprop", m, i, h),           # h @ W_down        (E, I, H)
        Gemm("down_dgrad", "dgrad", m, h, i, True),     # dy @ W_down^T
        Gemm("down_wgrad", "wgrad", m, i, h),           # h^T @ dy      ->  (E, I, H)
    ]


def compiled_configs(kind: str) -> list[str]:
    """Tile-config names the library compiled for a GEMM kind (its kernel table: rows
    "call:activation:config", declared in codegen/kernel_space.py)."""
    prefix = "ragged_k" if kind == "wgrad" else "ragged_m"
    names = []
    for row in torch.ops.cute_moe.kernel_table():
        call, _, name = row.split(":")
        if call.startswith(prefix) and name not in names:
            names.append(name)
    return names


SCHEDULE_KNOBS = ("CUTE_MOE_CONFIG", "CUTE_MOE_RASTER", "CUTE_MOE_SWIZZLE")


def sweep_variants(kind: str) -> dict[str, dict[str, str]]:
    """Every compiled tile config with the default tile order, then the three main configs
    with other raster orders and swizzles: name -> environment overrides."""
    configs = compiled_configs(kind)
    variants = {name: {"CUTE_MOE_CONFIG": name} for name in configs}
    for name in configs[:3]:
        for raster, swizzle in (("m", 2), ("m", 4), ("n", 1), ("n", 2)):
            variants[f"{name}/r{raster}s{swizzle}"] = {
                "CUTE_MOE_CONFIG": name, "CUTE_MOE_RASTER": raster, "CUTE_MOE_SWIZZLE": str(swizzle)}
    return variants


def make_inputs(g: Gemm, sizes: list[int], gen: torch.Generator):
    num_groups = len(sizes)
    dev, bf16 = "cuda", torch.bfloat16
    offs = torch.tensor(sizes, device=dev).cumsum(0).to(torch.int32)
    a = torch.randn(g.m, g.k, device=dev, dtype=bf16, generator=gen)
    if g.kind == "wgrad":
        return a, torch.randn(g.m, g.n, device=dev, dtype=bf16, generator=gen), offs
    if g.transposed_w:
        w = torch.randn(num_groups, g.n, g.k, device=dev, dtype=bf16, generator=gen)
        w = w.transpose(-2, -1)
    else:
        w = torch.randn(num_groups, g.k, g.n, device=dev, dtype=bf16, generator=gen)
    return a, w.mul_(g.k ** -0.5), offs


def bench_gemm(g: Gemm, sizes: list[int], reps: int, warmup: int, seed: int,
               sweep: bool = False) -> dict:
    ops = torch.ops.cute_moe
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a, b, offs = make_inputs(g, sizes, gen)
    if g.kind == "wgrad":
        ours = lambda: ops.grouped_mm_wgrad(a, b, offs)[0]  # noqa: E731
        theirs = lambda: torch._grouped_mm(a.t(), b, offs=offs)  # noqa: E731
    else:
        ours = lambda: ops.grouped_mm(a, b, offs)  # noqa: E731
        theirs = lambda: torch._grouped_mm(a, b, offs=offs)  # noqa: E731
    row = dict(gemm=g.name, m=g.m, k=g.k, n=g.n, experts=len(sizes),
               flops=2 * sum(sizes) * g.k * g.n, torch_error=None)
    out = ours()
    row["ours_ms"] = time_ms(ours, reps, warmup)
    if sweep:  # forced configurations, one at a time (the library reads the environment per call)
        saved = {k: os.environ.pop(k) for k in SCHEDULE_KNOBS if k in os.environ}
        row["configs"] = {}
        for name, env in sweep_variants(g.kind).items():
            os.environ.update(env)
            row["configs"][name] = time_ms(ours, reps, warmup)
            for k in env:
                os.environ.pop(k)
        os.environ.update(saved)
    try:
        ref = theirs()
        row["torch_ms"] = time_ms(theirs, reps, warmup)
        row["rel_error"] = rel_error(out, ref)
    except RuntimeError as exc:  # torch._grouped_mm may not support this device or layout
        row.update(torch_ms=None, rel_error=None, torch_error=str(exc).splitlines()[0])
    del a, b, out
    return row


def print_table(rows: list[dict]) -> None:
    head = ("shape", "routing", "gemm", "M x K x N", "ours ms", "torch ms", "ours TF/s",
            "torch TF/s", "speedup", "rel err")
    lines = [head]
    for r in rows:
        tf = lambda ms: None if ms is None else r["flops"] / ms / 1e9  # noqa: E731
        speedup = r["torch_ms"] / r["ours_ms"] if r["torch_ms"] else None
        lines.append((r["shape"], r["routing"], r["gemm"], f"{r['m']}x{r['k']}x{r['n']}",
                      fmt(r["ours_ms"], ".3f"), fmt(r["torch_ms"], ".3f"),
                      fmt(tf(r["ours_ms"]), ".0f"), fmt(tf(r["torch_ms"]), ".0f"),
                      fmt(speedup, ".2f") + ("x" if speedup else ""),
                      fmt(r["rel_error"], ".1e")))
    print_columns(lines, left=3)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="cute_moe grouped GEMMs of an MoE layer vs torch._grouped_mm")
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help=f"comma-separated, from {', '.join(SHAPES)}")
    ap.add_argument("--routing", default=",".join(ROUTINGS),
                    help=f"comma-separated, from {', '.join(ROUTINGS)}")
    ap.add_argument("--gemms", default=None, help="comma-separated subset, e.g. up_fprop")
    ap.add_argument("--reps", type=int, default=50, help="timed repetitions (median; >= 20)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--config", default=None, help="force a tile config (sets CUTE_MOE_CONFIG)")
    ap.add_argument("--sweep", action="store_true",
                    help="also time every compiled tile config of each GEMM (printed after the table)")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write results here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.shapes = args.shapes.split(",")
    args.routing = args.routing.split(",")
    for name in args.shapes:
        if name not in SHAPES:
            ap.error(f"--shapes: unknown shape {name!r}; choose from {', '.join(SHAPES)}")
    for name in args.routing:
        if name not in ROUTINGS:
            ap.error(f"--routing: unknown routing {name!r}; choose from {', '.join(ROUTINGS)}")
    if args.reps < 20:
        ap.error("--reps: at least 20")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.config:
        os.environ["CUTE_MOE_CONFIG"] = args.config
    if not torch.cuda.is_available():
        print("bench_grouped_gemm: no CUDA device; this benchmark needs an SM90 GPU",
              file=sys.stderr)
        return 2
    import_cute_moe()
    from cute_moe import testing

    rows = []
    for shape in args.shapes:
        s = SHAPES[shape]
        m = s["tokens"] * s["topk"]
        for routing in args.routing:
            gen = torch.Generator().manual_seed(args.seed)
            sizes = testing.group_sizes(m, s["experts"], routing, generator=gen,
                                        max_size=s["tokens"])
            for g in layer_gemms(s):
                if args.gemms and g.name not in args.gemms.split(","):
                    continue
                row = dict(shape=shape, routing=routing, max_group=max(sizes),
                           empty_groups=sizes.count(0),
                           **bench_gemm(g, sizes, args.reps, args.warmup, args.seed, args.sweep))
                rows.append(row)
                torch.cuda.empty_cache()
                print(f"[{shape}/{routing}] {g.name} {g.m}x{g.k}x{g.n}: ours "
                      f"{row['ours_ms']:.3f} ms, torch {fmt(row['torch_ms'], '.3f')} ms, "
                      f"rel err {fmt(row['rel_error'], '.1e')}", file=sys.stderr, flush=True)

    print_table(rows)
    if args.sweep:
        print("\ntile-config sweep (ms; 'ours ms' above is the heuristic's choice; best first):")
        for r in rows:
            best = sorted(r["configs"].items(), key=lambda kv: kv[1])
            cells = [f"{name} {ms:.3f}" for name, ms in best[:6]]
            print(f"  {r['shape']}/{r['routing']}/{r['gemm']} (torch {fmt(r['torch_ms'], '.3f')}): "
                  + "  ".join(cells))
    bad = [r for r in rows if r["rel_error"] is not None and not r["rel_error"] <= SPOT_CHECK_TOL]
    for r in bad:
        print(f"MISMATCH {r['shape']}/{r['routing']}/{r['gemm']}: rel error vs "
              f"torch._grouped_mm {r['rel_error']:.2e} > {SPOT_CHECK_TOL}", file=sys.stderr)
    if args.json:
        write_json(args.json, run_meta(config=args.config, reps=args.reps, warmup=args.warmup,
                                       shapes={k: SHAPES[k] for k in args.shapes}), rows)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# Peer benchmark: cute_moe against QuACK (quack-kernels==0.6.5, Dao-AILab's CuTe-DSL
# kernels; optional: requirements-peer.txt, docs/peers.md) on the same seeded inputs in the
# same run. Per shape x routing: the expert block forward and backward (ours: expert_ffn;
# QuACK: its public varlen kernels composed as a user would, gemm_gated + gemm forward,
# gemm_dgated + gemm dgrad / varlen-K wgrad backward, plus a one-hot GEMM for the bias
# gradients it does not return), then the six GEMM roles alone on the same operands: median
# ms of CUDA events, TFLOP/s, peak memory, relative error vs an fp32 reference, and each row's
# caveats (QuACK's public swiglu_oai has no clamp, its bias gradients take the extra
# reduction, its config is the untuned default unless --tuned). Without quack it prints one
# line and times our side alone. Progress on stderr, tables on stdout.
#
#   python bench/bench_peer_quack.py [--shapes gpt-oss-20b,qwen3-30b-a3b,seed-example]
#       [--routing balanced,skewed] [--reps 20] [--rounds 3] [--tuned] [--json out.json]
# Every timing is the median of --reps x --rounds timed calls per side, the two sides taking
# turns call by call after both have compiled (cute_moe.bench.runner.alternating_ms: the
# same clocks for both under the GPU's power limit); the block table also gives each side's
# interquartile spread.
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from common import align_columns, fmt, import_cute_moe, peak_bytes, rel_error, run_meta, write_json
from cute_moe.bench.runner import (alternating_ms, backward_step,  # noqa: E402 (common put
                                   call_step)                      # cute_moe on the path)

FIELDS = ("tokens", "topk", "hidden", "inter", "experts", "act", "bias")  # M = tokens * topk
SHAPES = {name: dict(zip(FIELDS, v)) for name, v in (
    ("gpt-oss-20b", (24576, 4, 2880, 2880, 32, "swiglu_oai", True)),
    ("qwen3-30b-a3b", (16384, 8, 2048, 768, 128, "swiglu", False)),
    ("seed-example", (16384, 2, 2048, 1024, 8, "swiglu_oai", True)),
    ("smoke", (1024, 4, 512, 256, 8, "swiglu_oai", True)))}
DEFAULT_SHAPES = ("gpt-oss-20b", "qwen3-30b-a3b", "seed-example")
ROUTINGS = ("balanced", "skewed")
ALPHA = 1.702
LIMITS = {"swiglu_oai": 7.0, "swiglu": None}  # ours; QuACK's public path never clamps
GRADS = ("x", "w_up", "b_up", "w_down", "b_down")
ROLES = ("up_fprop_act", "down_fprop", "down_dgrad_act", "up_dgrad", "up_wgrad", "down_wgrad")
TOL = 1e-2  # ours vs the fp32 reference (cute_moe.testing's bf16 tolerance)
Q = None  # quack.gemm_interface, once loaded


def load_quack():
    """(quack.gemm_interface, None) or (None, why not)."""
    try:
        try:
            import quack.gemm_interface as q
        except ModuleNotFoundError as exc:
            if exc.name != "cutlass":
                raise
            # a pip --target install: the .pth that puts CuTe DSL on sys.path is not read
            import nvidia_cutlass_dsl
            sys.path.insert(0, os.path.join(list(nvidia_cutlass_dsl.__path__)[0], "dsl_packages"))
            import quack.gemm_interface as q
        return q, None
    except Exception as exc:  # noqa: BLE001 (absent or broken: the peer is skipped either way)
        return None, _why(exc)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def _f32(b):  # fp32: the bias dtype QuACK's tests use
    return None if b is None else b.float()


class QuackBlock(torch.autograd.Function):
    """The expert block from QuACK's public kernels. cu: int32 (E+1,) cumulative row counts
    with a leading 0; onehot: (E, M) bf16 expert-of-row matrix for the bias gradients."""

    @staticmethod
    def forward(ctx, x, w_up, b_up, w_down, b_down, cu, onehot, act, tuned):
        pre, h = Q.gemm_gated(x, w_up, bias=_f32(b_up), activation=act, cu_seqlens_m=cu,
                              tuned=tuned)
        y = Q.gemm(h, w_down, bias=_f32(b_down), cu_seqlens_m=cu, tuned=tuned)
        ctx.save_for_backward(x, w_up, w_down, pre, cu, onehot)
        ctx.act, ctx.tuned, ctx.biased = act, tuned, b_up is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w_up, w_down, pre, cu, onehot = ctx.saved_tensors
        kw = dict(dynamic_scheduler=True, tuned=ctx.tuned)  # as quack.mlp's backward
        dy = dy.contiguous()
        dpre, h = Q.gemm_dgated(dy, w_down.mT, pre, activation=ctx.act, cu_seqlens_m=cu,
                                **kw)[:2]  # h recomputed from pre
        dw_down = Q.gemm(h.mT, dy, cu_seqlens_k=cu, **kw)
        dx = Q.gemm(dpre, w_up.mT, cu_seqlens_m=cu, **kw)
        dw_up = Q.gemm(x.mT, dpre, cu_seqlens_k=cu, **kw)
        db_up = db_down = None
        if ctx.biased:  # QuACK returns no bias gradients: the extra reduction
            db_up, db_down = onehot @ dpre, onehot @ dy
        return dx, dw_up, db_up, dw_down, db_down, None, None, None, None


def make_case(s: dict, routing: str, seed: int):
    from cute_moe import testing
    m, h, i, e = s["tokens"] * s["topk"], s["hidden"], s["inter"], s["experts"]
    sizes = testing.group_sizes(m, e, routing, generator=torch.Generator().manual_seed(seed),
                                max_size=s["tokens"])
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)

    t = dict(x=randn(m, h), w_up=randn(e, h, 2 * i, scale=h ** -0.5),
             b_up=randn(e, 2 * i, scale=0.5) if s["bias"] else None,
             w_down=randn(e, i, h, scale=i ** -0.5),
             b_down=randn(e, h, scale=0.5) if s["bias"] else None)
    for v in t.values():
        if v is not None:
            v.requires_grad_()
    counts = torch.tensor(sizes, device="cuda")
    offs = counts.cumsum(0).to(torch.int32)          # ours: (E,) cumulative ends
    cu = torch.cat([offs.new_zeros(1), offs])        # QuACK: (E+1,) with a leading 0
    row_expert = torch.repeat_interleave(torch.arange(e, device="cuda"), counts, output_size=m)
    onehot = (torch.arange(e, device="cuda")[:, None] == row_expert[None]).to(torch.bfloat16)
    return sizes, t, offs, cu, onehot, randn(m, h)


def reference(t: dict, offs, dy, act: str):
    """fp32 output and gradients, and the share of pre-activations our clamp changes."""
    from cute_moe import reference as ref
    limit, f32 = LIMITS[act], dict(out_dtype=torch.float32)
    x, wu, bu, wd, bd = (None if t[k] is None else t[k].detach().float() for k in GRADS)
    pre = ref.grouped_mm_ref(x, wu, offs, bu, **f32)
    h = ref.act_ref(pre, act, ALPHA, limit)
    out = ref.grouped_mm_ref(h, wd, offs, bd, **f32)
    dh = ref.grouped_mm_ref(dy.float(), wd.transpose(-2, -1), offs, **f32)
    dpre = ref.act_bwd_ref(dh, pre, act, ALPHA, limit)
    g = dict(x=ref.grouped_mm_ref(dpre, wu.transpose(-2, -1), offs, **f32),
             w_up=ref.grouped_mm_wgrad_ref(x, dpre, offs, torch.float32),
             w_down=ref.grouped_mm_wgrad_ref(h, dy, offs, torch.float32))
    if bu is not None:
        g["b_up"] = ref.grouped_bias_grad_ref(dpre, offs)
        g["b_down"] = ref.grouped_bias_grad_ref(dy, offs)
    clamped = None if limit is None else (
        ((pre[:, 0::2] > limit).sum() + (pre[:, 1::2].abs() > limit).sum()).item() / pre.numel())
    return out, g, clamped


def prepare_block(block, leaves: dict, dy, ref) -> dict:
    """Compiles (QuACK JIT-compiles, and with --tuned autotunes, on the first call) and
    checks one implementation of the block; its errors, peak memory and timers."""
    def backward(out):
        return torch.autograd.grad(out, list(leaves.values()), dy)

    out = block()
    err = {"out": rel_error(out, ref[0])}
    err.update({f"d{k}": rel_error(g, ref[1][k]) for k, g in zip(leaves, backward(out))})
    del out
    res = dict(peak_bytes=peak_bytes(lambda: backward(block()), True), err=err)
    torch.cuda.synchronize()  # wall clock, to check that the kernels ran on the timed stream
    t0 = time.perf_counter()
    for _ in range(3):
        block()
    torch.cuda.synchronize()
    res["fwd_wall_ms"] = (time.perf_counter() - t0) * 1e3 / 3
    return res, (call_step(block), backward_step(block, backward))


def block_fns(t: dict, offs, cu, onehot, act: str, tuned: bool) -> dict:
    """{side: the expert block's forward} on the same leaves (ours: expert_ffn; QuACK's
    composed from its public kernels, QuackBlock)."""
    import cute_moe
    return {"ours": lambda: cute_moe.expert_ffn(t["x"], t["w_up"], t["w_down"], offs, t["b_up"],
                                                t["b_down"], activation=act, swiglu_alpha=ALPHA),
            "quack": lambda: QuackBlock.apply(t["x"], t["w_up"], t["b_up"], t["w_down"],
                                              t["b_down"], cu, onehot, act, tuned)}


def role_fns(t: dict, offs, cu, onehot, dy, act: str, tuned: bool) -> dict:
    """{role: (ours, quack)}, each returning its main output, on the same operands (our
    forward's h and pre, our backward's dpre)."""
    ops, limit, bf16 = torch.ops.cute_moe, LIMITS[act], torch.bfloat16
    x, wu, bu, wd, bd = (None if t[k] is None else t[k].detach() for k in GRADS)
    bu32, bd32, kw = _f32(bu), _f32(bd), dict(dynamic_scheduler=True, tuned=tuned)
    with torch.no_grad():
        h, pre = ops.grouped_mm_act(x, wu, offs, bu, None, act, ALPHA, limit)
        dpre = ops.grouped_mm_act_bwd(dy, wd.mT, offs, pre, None, None, None, False, act,
                                      ALPHA, limit)[0]

    def quack_wgrad(a, b):  # dW, and db by the extra reduction where there is a bias
        return Q.gemm(a.mT, b, cu_seqlens_k=cu, **kw), None if bu is None else onehot @ b

    return {
        "up_fprop_act": (
            lambda: ops.grouped_mm_act(x, wu, offs, bu, None, act, ALPHA, limit)[0],
            lambda: Q.gemm_gated(x, wu, bias=bu32, activation=act, cu_seqlens_m=cu,
                                 tuned=tuned)[1]),
        "down_fprop": (lambda: ops.grouped_mm(h, wd, offs, bd),
                       lambda: Q.gemm(h, wd, bias=bd32, cu_seqlens_m=cu, tuned=tuned)),
        # ours: the up projection's bias gradient from this kernel's epilogue where there is one
        "down_dgrad_act": (
            lambda: ops.grouped_mm_act_bwd(dy, wd.mT, offs, pre, None, None, None, False, act,
                                           ALPHA, limit, "interleaved", bu is not None)[0],
            lambda: Q.gemm_dgated(dy, wd.mT, pre, activation=act, cu_seqlens_m=cu, **kw)[0]),
        "up_dgrad": (lambda: ops.grouped_mm(dpre, wu.mT, offs),
                     lambda: Q.gemm(dpre, wu.mT, cu_seqlens_m=cu, **kw)),
        # ours: b_down's gradient fused into the weight-gradient GEMM where there is a bias
        # (b_up's comes from down_dgrad_act's epilogue)
        "up_wgrad": (lambda: ops.grouped_mm_wgrad(x, dpre, offs, bf16, False)[0],
                     lambda: quack_wgrad(x, dpre)[0]),
        "down_wgrad": (lambda: ops.grouped_mm_wgrad(h, dy, offs, bf16, bu is not None)[0],
                       lambda: quack_wgrad(h, dy)[0]),
    }


def caveats(act: str, biased: bool, tuned: bool, role: str | None, clamped=None) -> str:
    c = []
    if act == "swiglu_oai" and role in (None, "up_fprop_act", "down_dgrad_act"):
        c.append("quack: no clamp" + ("" if clamped is None else " (inactive on these inputs)"
                                      if clamped == 0 else f" (ours clamps {clamped:.1e} of pre)"))
    if biased and role in (None, "up_wgrad", "down_wgrad"):
        c.append("quack: +db by one-hot GEMM")
    if biased and role == "down_dgrad_act":
        c.append("ours: +db_up from its epilogue")
    return "; ".join(c + ["quack autotuned" if tuned else "quack untuned default"])


def bench_case(shape: str, routing: str, args) -> list[dict]:
    s = SHAPES[shape]
    act, biased, m, h, i = s["act"], s["bias"], s["tokens"] * s["topk"], s["hidden"], s["inter"]
    sizes, t, offs, cu, onehot, dy = make_case(s, routing, args.seed)
    base = dict(shape=shape, routing=routing, act=act, bias=biased, m=m, hidden=h, inter=i,
                experts=s["experts"], max_group=max(sizes), empty_groups=sizes.count(0))
    leaves = {k: v for k, v in t.items() if v is not None}
    ref = reference(t, offs, dy, act)
    fwd_flops = 2 * m * h * 2 * i + 2 * m * i * h
    block = dict(base, kind="block", fwd_flops=fwd_flops, bwd_flops=2 * fwd_flops,
                 clamped=ref[2], caveats=caveats(act, biased, args.tuned, None, ref[2]),
                 quack_error=None)
    impls = block_fns(t, offs, cu, onehot, act, args.tuned)
    results, fwd_timers, bwd_timers = {}, {}, {}
    for name, fn in impls.items():
        results[name] = {}
        try:
            if name == "ours" or Q is not None:
                results[name], (fwd_timers[name], bwd_timers[name]) = prepare_block(fn, leaves, dy, ref)
        except Exception as exc:  # noqa: BLE001 (a peer failure is reported on its row)
            if name == "ours":
                raise
            block["quack_error"] = _why(exc)
        torch.cuda.empty_cache()
    for what, steps in (("fwd_ms", fwd_timers), ("bwd_ms", bwd_timers)):
        for name, (median, q1, q3) in alternating_ms(steps, args.reps * args.rounds, args.warmup).items():
            results[name][what] = median
            results[name][what + "_iqr"] = [q1, q3]
    for name, res in results.items():
        for k in ("fwd_ms", "bwd_ms", "fwd_ms_iqr", "bwd_ms_iqr", "peak_bytes", "err", "fwd_wall_ms"):
            block[f"{name}_{k}"] = res.get(k)
    del ref
    rows = [block]
    for role, (f_ours, f_theirs) in role_fns(t, offs, cu, onehot, dy, act, args.tuned).items():
        k_dim, n_dim = {"up": (h, 2 * i), "down": (i, h)}[role.split("_")[0]]
        row = dict(base, kind="role", role=role, flops=2 * m * k_dim * n_dim, quack_error=None,
                   caveats=caveats(act, biased, args.tuned, role), quack_ms=None, diff=None)
        out = f_ours()
        timers = {"ours": call_step(f_ours)}
        if Q is not None:
            try:
                row["diff"] = rel_error(f_theirs(), out)  # also compiles QuACK's kernel
                timers["quack"] = call_step(f_theirs)
            except Exception as exc:  # noqa: BLE001
                row["quack_error"] = _why(exc)
        del out
        for name, (median, q1, q3) in alternating_ms(timers, args.reps * args.rounds, args.warmup).items():
            row[f"{name}_ms"], row[f"{name}_iqr"] = median, [q1, q3]
        rows.append(row)
        print(f"[{shape}/{routing}] {role}: ours {row['ours_ms']:.3f} ms, quack "
              f"{fmt(row['quack_ms'], '.3f')} ms", file=sys.stderr, flush=True)
    torch.cuda.empty_cache()
    return rows


def worst(err: dict | None):
    return None if not err else max(err.values(), key=lambda v: float("inf") if v != v else v)


def _ratio(a, b):
    return None if a is None or b is None else a / b


def print_table(lines: list[tuple]) -> None:
    """Aligned columns, the last (the caveats) left as it is."""
    for line, last in zip(align_columns([ln[:-1] for ln in lines], 3), (ln[-1] for ln in lines)):
        print(f"{line}  {last}")


def print_tables(rows: list[dict]) -> None:
    x = lambda a, b: fmt(_ratio(a, b), ".2f") + ("x" if a and b else "")  # noqa: E731
    lines = [("shape", "routing", "act", "fwd ours", "fwd quack", "fwd x", "bwd ours",
              "bwd quack", "bwd x", "TF/s ours", "TF/s quack", "GiB ours", "GiB quack",
              "err ours", "err quack", "iqr % fwd", "iqr % bwd", "caveats")]

    def spread(r, k):  # interquartile range over the median, ours / quack, in %
        cells = []
        for impl in ("ours", "quack"):
            iqr, med = r.get(f"{impl}_{k}_iqr"), r.get(f"{impl}_{k}")
            cells.append("-" if not iqr or not med else f"{100 * (iqr[1] - iqr[0]) / med:.1f}")
        return "/".join(cells)

    for r in (r for r in rows if r["kind"] == "block"):
        cells = [r["shape"], r["routing"], r["act"] + ("+bias" if r["bias"] else "")]
        for k in ("fwd_ms", "bwd_ms"):
            cells += [fmt(r[f"ours_{k}"], ".2f"), fmt(r[f"quack_{k}"], ".2f"),
                      x(r[f"quack_{k}"], r[f"ours_{k}"])]
        for impl in ("ours", "quack"):
            fwd, bwd = r[f"{impl}_fwd_ms"], r[f"{impl}_bwd_ms"]
            ms = None if fwd is None or bwd is None else (fwd + bwd) * 1e9
            cells.append(fmt(_ratio(r["fwd_flops"] + r["bwd_flops"], ms), ".0f"))
        cells += [fmt(_ratio(r[f"{i}_peak_bytes"], 2 ** 30), ".2f") for i in ("ours", "quack")]
        cells += [fmt(worst(r["ours_err"]), ".1e"), fmt(worst(r["quack_err"]), ".1e"),
                  spread(r, "fwd_ms"), spread(r, "bwd_ms"), r["caveats"]]
        lines.append(tuple(cells))
    print("expert block: median ms of CUDA events (bwd: the backward alone); x = quack / ours; "
          "TF/s over the forward+backward GEMM FLOPs; GiB: peak above the inputs in one "
          "forward+backward; err: worst relative error vs fp32 over out and every gradient; "
          "iqr: interquartile range of the timed calls over their median, ours / quack")
    print_table(lines)
    lines = [("shape", "routing", "role", "ms ours", "ms quack", "x", "TF/s ours", "TF/s quack",
              "diff", "caveats")]
    for r in (r for r in rows if r["kind"] == "role"):
        tf = [fmt(_ratio(r["flops"], ms and ms * 1e9), ".0f")
              for ms in (r["ours_ms"], r["quack_ms"])]
        lines.append((r["shape"], r["routing"], r["role"], fmt(r["ours_ms"], ".3f"),
                      fmt(r["quack_ms"], ".3f"), x(r["quack_ms"], r["ours_ms"]), *tf,
                      fmt(r["diff"], ".1e"), r["caveats"]))
    print("\nGEMM roles on the same operands: median ms; diff = ||quack - ours|| / ||ours||")
    print_table(lines)
    for r in rows:
        if r["quack_error"]:
            print(f"{r['shape']}/{r['routing']}/{r.get('role', 'block')}: quack failed: "
                  f"{r['quack_error']}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="cute_moe vs QuACK (peer) on MoE expert blocks")
    for opt, default, choices in (("shapes", DEFAULT_SHAPES, SHAPES),
                                  ("routing", ROUTINGS, ROUTINGS)):
        ap.add_argument(f"--{opt}", default=",".join(default),
                        help=f"comma-separated, from {', '.join(choices)}")
    ap.add_argument("--reps", type=int, default=20, help="timed repetitions (median; >= 10)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="timed calls per side = reps x rounds, the sides taking turns call by call")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tuned", action="store_true",
                    help="QuACK autotunes each kernel on its first call (~22 configs: minutes)")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write results here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for opt, choices in (("shapes", SHAPES), ("routing", ROUTINGS)):
        setattr(args, opt, getattr(args, opt).split(","))
        for v in getattr(args, opt):
            if v not in choices:
                ap.error(f"--{opt}: unknown value {v!r}; choose from {', '.join(choices)}")
    if args.reps < 10:
        ap.error("--reps: at least 10")
    return args


def main(argv=None) -> int:
    global Q
    args = parse_args(argv)
    Q, why = load_quack()
    if Q is None:
        print(f"peer quack: skipped ({why}; pip install -r requirements-peer.txt)", flush=True)
    if not torch.cuda.is_available():
        print("bench_peer_quack: no CUDA device; this benchmark needs an SM90 GPU", file=sys.stderr)
        return 2
    import_cute_moe()  # raises with how to build the op library when it is missing
    # the one-hot bias-gradient GEMM (QuACK's side) then accumulates and reduces in fp32
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    rows = []
    for shape in args.shapes:
        for routing in args.routing:
            rows += bench_case(shape, routing, args)
            b = rows[-len(ROLES) - 1]
            print(f"[{shape}/{routing}] block fwd ours {b['ours_fwd_ms']:.2f} ms, quack "
                  f"{fmt(b['quack_fwd_ms'], '.2f')} ms; bwd ours {b['ours_bwd_ms']:.2f} ms, "
                  f"quack {fmt(b['quack_bwd_ms'], '.2f')} ms", file=sys.stderr, flush=True)
    print_tables(rows)
    blocks = [r for r in rows if r["kind"] == "block"]
    bad = [r for r in blocks if not worst(r["ours_err"]) <= TOL]
    for r in bad:
        print(f"MISMATCH {r['shape']}/{r['routing']}: ours vs fp32 {worst(r['ours_err']):.2e} "
              f"> {TOL}", file=sys.stderr)
    for r in blocks:
        if r["quack_fwd_ms"] and r["quack_fwd_wall_ms"] > 2 * r["quack_fwd_ms"] + 1:
            print(f"WARNING {r['shape']}/{r['routing']}: quack forward wall clock "
                  f"{r['quack_fwd_wall_ms']:.2f} ms vs CUDA events {r['quack_fwd_ms']:.2f} ms "
                  "(host overhead, or kernels off the timed stream)", file=sys.stderr)
    if args.json:
        peer = dict(name="quack", version=sys.modules["quack"].__version__ if Q else None,
                    skipped=why, tuned=args.tuned)
        write_json(args.json, run_meta(reps=args.reps, warmup=args.warmup, rounds=args.rounds, alpha=ALPHA,
                                       limits=LIMITS, peer=peer,
                                       shapes={k: SHAPES[k] for k in args.shapes}), rows)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

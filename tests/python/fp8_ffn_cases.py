# Random expert blocks for cute_moe.fp8.expert_ffn and its quantization-matched reference: the
# same block written apart from it, forward and every gradient in closed form in a chosen dtype
# (float64 by default, on the CPU and the GPU), with the FP8 path's quantizations (the
# reference quantizers, which the CUDA ones match bit for bit) and its bf16 roundings at the
# same points. Shared by the CPU and GPU tests.
from __future__ import annotations

import torch

from cute_moe import reference as ref, testing
from cute_moe.reference import fp8 as ref_fp8
from cute_moe.reference.groups import group_bounds, zero_padding

BF16 = torch.bfloat16
ACTIVATIONS = tuple(ref.ACTIVATIONS)  # the names, in the table's order
GRAD_NAMES = ("x", "w_up", "w_down", "b_up", "b_down", "prob")


def make_leaves(counts, hidden, inter, activation, *, bias, prob, pad=0, device="cpu", seed=0,
                w_std=3.0):
    """Leaves (dict: x, w_up, w_down and, where asked, b_up, b_down, prob; requires_grad) and
    offs of a block with `counts` rows per expert and `pad` padding rows. w_std * k^-0.5 is the
    weights' standard deviation (3: pre-activations of about 3, so swiglu_oai's clamp at 7
    and the kinks are crossed)."""
    g = torch.Generator().manual_seed(seed)
    experts, m = len(counts), sum(counts) + pad
    up = ref.up_width(activation, inter)

    def randn(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(BF16)

    leaves = dict(x=randn(m, hidden), w_up=randn(experts, hidden, up, s=w_std * hidden ** -0.5),
                  w_down=randn(experts, inter, hidden, s=w_std * inter ** -0.5))
    if bias:
        leaves["b_up"] = randn(experts, up, s=0.5)
        leaves["b_down"] = randn(experts, hidden, s=0.5)
    if prob:
        leaves["prob"] = torch.rand(m, generator=g)
    leaves = {k: v.to(device).requires_grad_() for k, v in leaves.items()}
    return leaves, ref.offsets_from_counts(counts, device=device)


def run_fp8(leaves, offs, activation, **kw):
    import cute_moe
    return cute_moe.fp8.expert_ffn(leaves["x"], leaves["w_up"], leaves["w_down"], offs,
                                   leaves.get("b_up"), leaves.get("b_down"), activation=activation,
                                   prob=leaves.get("prob"), **kw)


def fp8_grads(leaves, offs, activation, dy, fp8_weight_grads=None):
    """(y, {name: gradient}) of cute_moe.fp8.expert_ffn, its weight gradients in FP8 or bf16
    (fp8_ffn.FP8_WEIGHT_GRADS, read by the forward; None: as it is set)."""
    from cute_moe import fp8_ffn
    setting = fp8_ffn.FP8_WEIGHT_GRADS
    if fp8_weight_grads is not None:
        fp8_ffn.FP8_WEIGHT_GRADS = fp8_weight_grads
    try:
        out = run_fp8(leaves, offs, activation)
    finally:
        fp8_ffn.FP8_WEIGHT_GRADS = setting
    names = [k for k in GRAD_NAMES if k in leaves]
    grads = torch.autograd.grad(out, [leaves[k] for k in names], dy)
    return out, dict(zip(names, grads))


def bf16_grads(leaves, offs, activation, dy, fn):
    """(y, {name: gradient}) of an unquantized block fn(leaves, offs, activation) (the fp32
    reference or cute_moe.expert_ffn)."""
    out = fn(leaves, offs, activation)
    names = [k for k in GRAD_NAMES if k in leaves]
    grads = torch.autograd.grad(out, [leaves[k] for k in names], dy.to(out.dtype))
    return out, dict(zip(names, grads))


def _deq_1x128(q, scale, dtype):
    """Dequantized exactly in dtype (float64: e4m3 times an fp32 scale is exact there)."""
    return q.to(dtype) * scale.to(dtype).repeat_interleave(128, dim=1)[:, :q.shape[1]]


def _deq_128x128(q, scale, dtype):
    k, n = q.shape[-2:]
    s = scale.to(dtype).repeat_interleave(128, dim=-2).repeat_interleave(128, dim=-1)
    return q.to(dtype) * s[..., :k, :n]


def fp8_ffn_ref(leaves, offs, activation, dy, dtype=torch.float64, alpha=1.702, limit="default",
                unquantized=(), fp8_weight_grads=False):
    """(y, {name: gradient}) of the FP8 path computed in dtype from its definition:
        x~ = Q1(x), Wu~ = Q128(w_up), Wd~ = Q128(w_down)  (Q: quantize, then dequantize)
        pre = bf16(x~ Wu~ + b_up),  h = bf16(act(pre)),  z = Q1(h) Wd~ + b_down,  y = prob z
        u = Q1(dy) Wd~^T,  dpre = bf16(act'(pre) prob u),  hp = bf16(prob h),
        dprob = <act(pre), u> + <dy, b_down>,  dx = Q1(dpre) Wu~^T,
        dW_up = Qc(x)^T Qt(dpre),  db_up = sum dpre,  dW_down = Qc(hp)^T Qt(dy),  db_down = sum prob dy
    per expert (Q1 by 1 x 128 blocks; Qc by 128 x 1 and Qt by 128 x 128 blocks of each expert's
    rows, with fp8_weight_grads, else the identity), padding rows zero. The bf16 roundings of the FP8 path's intermediates (pre, h,
    hp, dpre: GEMM outputs and the inputs of the quantizers) are applied here too, so that the
    quantizers see the same values; u and act(pre) inside dprob and dpre stay unrounded as in
    the fused backward kernel; the outputs are not rounded (dtype).
    unquantized: operands to leave unquantized, of "x", "w_up", "w_down", "h", "dy", "dpre", "hp"
    (a reference that the FP8 path must not match; "x", "dy" and "dpre" both of their copies)."""
    limit = ref.default_limit(activation) if limit == "default" else limit
    d = {k: v.detach() for k, v in leaves.items()}
    x, w_up, w_down = d["x"], d["w_up"], d["w_down"]
    b_up, b_down, prob = d.get("b_up"), d.get("b_down"), d.get("prob")
    m, inter = x.shape[0], w_down.shape[1]
    dy = dy.to(dtype)

    def r16(t):
        return t.to(BF16).to(dtype)

    def q1(t, name):  # t holds bf16 values: quantize exactly what the FP8 path quantizes
        if name in unquantized:
            return t.to(dtype)
        return _deq_1x128(*ref_fp8.quantize_1x128(t.to(BF16)), dtype)

    def qc(t, name, tile_scales=False):  # a weight gradient's copy: blocks of each expert's rows
        if name in unquantized or not fp8_weight_grads:
            return t.to(dtype)
        q, scale = ref_fp8.quantize_128x1(t.to(BF16), offs, tile_scales)
        if tile_scales:
            scale = scale.repeat_interleave(128, dim=1)[:, :t.shape[1]]
        out = torch.zeros(t.shape, dtype=dtype, device=t.device)
        for start, end, first in ref_fp8.group_row_blocks(offs, m):
            for b, r in enumerate(range(start, end, 128)):
                stop = min(r + 128, end)
                out[r:stop] = q[r:stop].to(dtype) * scale[first + b].to(dtype)  # exact in float64
        return out

    def q128(w, name):
        if name in unquantized:
            return w.to(dtype)
        return _deq_128x128(*ref_fp8.quantize_128x128(w), dtype)

    def per_group(fn, rows, width):
        out = torch.zeros(rows.shape[0], width, dtype=dtype, device=x.device)
        for e, (s, t) in enumerate(group_bounds(offs, m)):
            out[s:t] = fn(e, s, t)
        return out

    def bias(b, e):
        return b[e].to(dtype) if b is not None else 0.0

    wu, wd = q128(w_up, "w_up"), q128(w_down, "w_down")
    xq = q1(x, "x")
    pre = r16(per_group(lambda e, s, t: xq[s:t] @ wu[e] + bias(b_up, e), x, wu.shape[2]))
    h = r16(ref.act_ref(pre, activation, alpha, limit))
    hq = q1(h, "h")
    z = per_group(lambda e, s, t: hq[s:t] @ wd[e] + bias(b_down, e), h, x.shape[1])
    p = prob.to(dtype)[:, None] if prob is not None else None
    y = zero_padding(z * p, offs) if p is not None else z  # padding rows' prob unread
    dyq = q1(dy.to(BF16), "dy")
    u = per_group(lambda e, s, t: dyq[s:t] @ wd[e].transpose(0, 1), dy, inter)
    dpre = r16(ref.act_bwd_ref(u * p if p is not None else u, pre, activation, alpha, limit))
    hf = ref.act_ref(pre, activation, alpha, limit)  # unrounded, as in the kernel
    hp = r16(hf * p) if p is not None else h
    dpq = q1(dpre, "dpre")
    grads = {"x": per_group(lambda e, s, t: dpq[s:t] @ wu[e].transpose(0, 1), dpre, x.shape[1])}
    xc, dpc, hpc, dyc = qc(x, "x"), qc(dpre, "dpre", True), qc(hp, "hp"), qc(dy, "dy", True)
    bounds = group_bounds(offs, m)
    grads["w_up"] = torch.stack([xc[s:t].T @ dpc[s:t] for s, t in bounds])
    grads["w_down"] = torch.stack([hpc[s:t].T @ dyc[s:t] for s, t in bounds])
    g = dy * p if p is not None else dy
    if b_up is not None:
        grads["b_up"] = torch.stack([dpre[s:t].sum(0) for s, t in bounds])
    if b_down is not None:
        grads["b_down"] = torch.stack([g[s:t].sum(0) for s, t in bounds])
    if prob is not None:
        dprob = (hf * u).sum(-1)
        if b_down is not None:
            dprob = dprob + per_group(lambda e, s, t: dy[s:t] @ b_down[e].to(dtype)[:, None], dy,
                                      1)[:, 0]
        grads["prob"] = zero_padding(dprob, offs)
    return y, grads


def errors(out, grads, want_out, want_grads):
    """Relative Frobenius errors: {"out": .., "d<name>": ..}."""
    errs = {"out": testing.rel_error(out, want_out)}
    errs.update({f"d{k}": testing.rel_error(grads[k], want_grads[k]) for k in grads})
    return errs


def check_loose(out, grads, want_out, want_grads, tol, what):
    """Every relative Frobenius error at most tol."""
    errs = errors(out, grads, want_out, want_grads)
    bad = {k: f"{v:.2e}" for k, v in errs.items() if not v <= tol}
    assert not bad, f"{what}: relative errors above {tol}: {bad}"
    return errs


def check_matched(out, grads, want_out, want_grads, frob_tol, min_exact, what,
                  min_exact_rows=0.9):
    """The FP8 path against fp8_ffn_ref in float64 (the CPU test's tight check). Each output
    against the reference rounded as the output is (bf16; dprob fp32): at least min_exact of
    its elements agree to fp32 level (bf16 outputs bit for bit), min_exact_rows of dprob's
    (within 2^-20 of its largest magnitude: each sums a row of H bf16 z, so it agrees only
    where none of them was rounded the other way), and the relative Frobenius error is at
    most frob_tol. Not all elements: where a bf16 rounding of the FP8 path's fp32 arithmetic
    and of the reference's float64 falls on the other side (about 1e-4 of the roundings), that
    element and what is computed from it differ by an ulp, or by an e4m3 step where a
    quantizer reads it."""
    got = {"out": out, **{f"d{k}": v for k, v in grads.items()}}
    ref64 = {"out": want_out, **{f"d{k}": v for k, v in want_grads.items()}}
    report, bad = {}, {}
    for k, a in got.items():
        b = ref64[k].to(a.dtype).double()
        a = a.detach().double()
        if k == "dprob":
            same = (a - b).abs() <= 2.0 ** -20 * ref64[k].abs().max().clamp(min=1e-30)
        else:
            same = a == b
        exact = same.double().mean().item() if same.numel() else 1.0
        frob = testing.rel_error(a, b)
        report[k] = f"exact {exact:.4f}, rel {frob:.1e}"
        if not (exact >= (min_exact_rows if k == "dprob" else min_exact) and frob <= frob_tol):
            bad[k] = report[k]
    assert not bad, (f"{what}: {bad} (want exact >= {min_exact}, {min_exact_rows} for dprob, "
                     f"rel <= {frob_tol}); all: {report}")
    return report

# Pure-PyTorch references of the cute-moe grouped GEMMs: the ground truth of every test
# and the CPU implementation of the ops. They loop over groups and read `offs` on the
# host, which the kernels never do; that is acceptable here and only here.
#
# Group e owns rows [offs[e-1], offs[e]) (offs[-1] := 0); rows at or past offs[E-1]
# are padding: never read, and zero in a ragged-M output. Gated activations take `pre`
# with gate and linear columns interleaved (column 2j gate j, 2j+1 linear j).
from __future__ import annotations

from collections.abc import Sequence
import math

import torch

__all__ = [
    "offsets_from_counts",
    "group_bounds",
    "grouped_mm_ref",
    "grouped_mm_wgrad_ref",
    "grouped_bias_grad_ref",
    "swiglu_oai_ref",
    "swiglu_oai_bwd_ref",
    "grouped_mm_swiglu_ref",
    "grouped_mm_swiglu_bwd_ref",
    "ACTIVATIONS",
    "GATED_ACTIVATIONS",
    "default_limit",
    "act_ref",
    "act_bwd_ref",
    "rows_to_groups",
    "grouped_mm_scaled_ref",
    "grouped_mm_act_ref",
    "grouped_mm_act_bwd_ref",
    "expert_ffn_ref",
]

# Every activation of an expert FFN (design.md 2); the gated ones read interleaved
# (gate, linear) column pairs, so their up-projection is twice as wide as h.
ACTIVATIONS = ("swiglu_oai", "swiglu", "geglu", "srelu", "none")
GATED_ACTIVATIONS = ("swiglu_oai", "swiglu", "geglu")


def offsets_from_counts(counts: Sequence[int] | torch.Tensor, device=None) -> torch.Tensor:
    """int32 cumulative end offsets of groups with `counts` rows each (on the device of
    `counts` if it is a tensor, without a host read)."""
    if not isinstance(counts, torch.Tensor):
        counts = torch.tensor(list(counts), dtype=torch.int64)
    if counts.dim() != 1:
        raise ValueError(f"counts: expected a 1-D sequence, got shape {tuple(counts.shape)}")
    return torch.cumsum(counts.to(device=device or counts.device), 0, dtype=torch.int32)


def group_bounds(offs: torch.Tensor, m: int) -> list[tuple[int, int]]:
    """(start, end) row range of every group, checked like the kernels check offs on the
    device: non-decreasing and within [0, m]. One host read of offs."""
    ends = offs.tolist()
    bounds, start = [], 0
    for e, end in enumerate(ends):
        if end < start or end > m:
            raise ValueError(
                f"offs: expected non-decreasing offsets within [0, {m}], "
                f"got offs[{e}]={end} after {start}")
        bounds.append((start, end))
        start = end
    return bounds


def grouped_mm_ref(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                   bias: torch.Tensor | None = None,
                   compute_dtype: torch.dtype = torch.float32,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y[rows_e] = x[rows_e] @ w[e] + bias[e]; padding rows zero. x (M, K), w (E, K, N),
    bias (E, N). Computes in `compute_dtype`, returns `out_dtype` (default x.dtype).
    Differentiable with respect to x, w and bias."""
    m, n = x.shape[0], w.shape[-1]
    xc, wc = x.to(compute_dtype), w.to(compute_dtype)
    bc = bias.to(compute_dtype) if bias is not None else None
    pieces = []
    bounds = group_bounds(offs, m)
    for e, (start, end) in enumerate(bounds):
        y = xc[start:end] @ wc[e]
        pieces.append(y + bc[e] if bc is not None else y)
    end = bounds[-1][1] if bounds else 0
    pieces.append(xc.new_zeros(m - end, n))
    return torch.cat(pieces).to(out_dtype or x.dtype)


def grouped_mm_wgrad_ref(x: torch.Tensor, dy: torch.Tensor, offs: torch.Tensor,
                         out_dtype: torch.dtype = torch.bfloat16,
                         compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """dw[e] = x[rows_e].T @ dy[rows_e], shape (E, K, N); empty groups give zeros and
    padding rows are ignored."""
    xc, dyc = x.to(compute_dtype), dy.to(compute_dtype)
    dw = [xc[s:e].t() @ dyc[s:e] for s, e in group_bounds(offs, x.shape[0])]
    if not dw:
        return x.new_zeros(0, x.shape[1], dy.shape[1], dtype=out_dtype)
    return torch.stack(dw).to(out_dtype)


def grouped_bias_grad_ref(dy: torch.Tensor, offs: torch.Tensor,
                          compute_dtype: torch.dtype = torch.float32,
                          row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """db[e] = sum over rows_e of row_scale[r] * dy[r] (row_scale optional), shape (E, N),
    float32."""
    dyc = dy.to(compute_dtype)
    if row_scale is not None:
        dyc = dyc * row_scale.to(compute_dtype)[:, None]
    db = [dyc[s:e].sum(0) for s, e in group_bounds(offs, dy.shape[0])]
    if not db:
        return dy.new_zeros(0, dy.shape[1], dtype=torch.float32)
    return torch.stack(db).to(torch.float32)


def _math_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float32, or float64 when an input is float64."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _gate_linear(pre: torch.Tensor, limit: float | None):
    a, b = pre[..., 0::2], pre[..., 1::2]
    if limit is None:
        return a, b
    return a.clamp(max=limit), b.clamp(-limit, limit)


def swiglu_oai_ref(pre: torch.Tensor, alpha: float = 1.702,
                   limit: float | None = 7.0) -> torch.Tensor:
    """GPT-OSS SwiGLU of interleaved pre-activations (..., 2I) -> (..., I):
    g = min(a, limit), u = clamp(b, -limit, limit) (no clamps when limit is None),
    h = g * sigmoid(alpha * g) * (u + 1). Computes and returns float32 (float64 for a
    float64 input). Differentiable."""
    g, u = _gate_linear(pre.to(_math_dtype(pre)), limit)
    return g * torch.sigmoid(alpha * g) * (u + 1)


def _zero_padding(t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    bounds = group_bounds(offs, t.shape[0])
    t[(bounds[-1][1] if bounds else 0):] = 0
    return t


def grouped_mm_swiglu_ref(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                          bias: torch.Tensor | None = None, alpha: float = 1.702,
                          limit: float | None = 7.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cute_moe::grouped_mm_swiglu: pre = round(x[rows_e] @ w[e] + bias[e]) (M, 2I),
    h = round(swiglu_oai(pre)) (M, I) from the rounded pre; padding rows zero in both.
    x (M, K), w (E, K, 2I) interleaved, bias (E, 2I). Returns (h, pre) in x's dtype.
    Differentiable."""
    pre = grouped_mm_ref(x, w, offs, bias)
    return swiglu_oai_ref(pre, alpha, limit).to(x.dtype), pre


def grouped_mm_swiglu_bwd_ref(dy: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                              pre: torch.Tensor, alpha: float = 1.702,
                              limit: float | None = 7.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cute_moe::grouped_mm_swiglu_bwd: dh = dy[rows_e] @ w[e] in float32 (not rounded),
    dpre = round(swiglu_oai_bwd(dh, pre)) (M, 2I) and h = round(swiglu_oai(pre)) (M, I)
    exactly as grouped_mm_swiglu_ref computes it; padding rows zero in both, whatever pre
    holds there. dy (M, N), w (E, N, I), pre (M, 2I). Returns (dpre, h) in pre's dtype."""
    dh = grouped_mm_ref(dy, w, offs, out_dtype=torch.float32)
    dpre = swiglu_oai_bwd_ref(dh, pre, alpha, limit).to(pre.dtype)
    h = swiglu_oai_ref(pre, alpha, limit).to(pre.dtype)
    return _zero_padding(dpre, offs), _zero_padding(h, offs)


def default_limit(activation: str):
    """The clamp limit an activation has when none is given: 7.0 for swiglu_oai (GPT-OSS),
    none otherwise."""
    return 7.0 if activation == "swiglu_oai" else None


def act_ref(pre: torch.Tensor, activation: str = "swiglu", alpha: float = 1.702,
            limit: float | None = None) -> torch.Tensor:
    """h = act(pre) (design.md 2) in float32 (float64 for a float64 input). Gated
    activations take interleaved (gate a, linear b) columns (..., 2I) -> (..., I) with
    g = min(a, limit), u = clamp(b, -limit, limit) when limit is set:
    swiglu_oai g*sigmoid(alpha*g)*(u+1); swiglu silu(g)*u; geglu gelu_tanh(g)*u.
    srelu relu(pre)^2 and none (identity) keep the width. Differentiable."""
    p = pre.to(_math_dtype(pre))
    if activation in GATED_ACTIVATIONS:
        g, u = _gate_linear(p, limit)
        if activation == "swiglu_oai":
            return g * torch.sigmoid(alpha * g) * (u + 1)
        if activation == "swiglu":
            return torch.nn.functional.silu(g) * u
        return torch.nn.functional.gelu(g, approximate="tanh") * u
    if activation == "srelu":
        return torch.relu(p) ** 2
    if activation == "none":
        return p
    raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")


def act_bwd_ref(dh: torch.Tensor, pre: torch.Tensor, activation: str = "swiglu",
                alpha: float = 1.702, limit: float | None = None) -> torch.Tensor:
    """The gradient of act_ref with respect to pre for an upstream gradient dh, in closed
    form (design.md 2): float32 (float64 if an input is), interleaved like pre for the
    gated activations. The clamps pass gradient inside their closed intervals, as autograd
    does. Closed form rather than autograd of act_ref: the op library's CPU kernels call
    this below the autograd dispatch key, where autograd records nothing."""
    dtype = _math_dtype(dh, pre)
    p = pre.to(dtype)
    dh = dh.to(dtype)
    if activation not in GATED_ACTIVATIONS:
        if activation == "srelu":
            return dh * 2 * torch.relu(p)
        if activation == "none":
            return dh.clone()
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    a, b = p[..., 0::2], p[..., 1::2]
    g, u = _gate_linear(p, limit)
    if activation == "swiglu_oai":
        s = torch.sigmoid(alpha * g)
        da = dh * (u + 1) * (s + alpha * g * s * (1 - s))
        db = dh * g * s
    elif activation == "swiglu":
        s = torch.sigmoid(g)
        da = dh * u * (s + g * s * (1 - s))
        db = dh * g * s
    else:  # geglu: gelu_tanh(g) = g/2 (1 + tanh(k)), k = sqrt(2/pi) (g + 0.044715 g^3)
        c = math.sqrt(2.0 / math.pi)
        t = torch.tanh(c * (g + 0.044715 * g ** 3))
        dgelu = 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * c * (1 + 3 * 0.044715 * g * g)
        da = dh * u * dgelu
        db = dh * 0.5 * g * (1 + t)
    if limit is not None:
        da = torch.where(a <= limit, da, 0.0)
        db = torch.where((b >= -limit) & (b <= limit), db, 0.0)
    return torch.stack((da, db), dim=-1).flatten(-2)


def swiglu_oai_bwd_ref(dh: torch.Tensor, pre: torch.Tensor, alpha: float = 1.702,
                       limit: float | None = 7.0) -> torch.Tensor:
    """Gradient of swiglu_oai_ref with respect to pre (act_bwd_ref of "swiglu_oai")."""
    return act_bwd_ref(dh, pre, "swiglu_oai", alpha, limit)


def rows_to_groups(offs: torch.Tensor, m: int) -> torch.Tensor:
    """int64 (m,) group of every row; padding rows get E. Reads offs on the device, no
    host sync (searchsorted)."""
    rows = torch.arange(m, device=offs.device, dtype=offs.dtype)
    return torch.searchsorted(offs, rows, right=True)


def _per_row(values: torch.Tensor | None, offs: torch.Tensor, m: int, dtype) -> torch.Tensor | None:
    """values[group(r)] for each row (padding rows 0)."""
    if values is None:
        return None
    padded = torch.cat([values.to(dtype), values.new_zeros((1,) + values.shape[1:], dtype=dtype)])
    return padded[rows_to_groups(offs, m)]


def grouped_mm_scaled_ref(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                          bias: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                          prob: torch.Tensor | None = None,
                          compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """cute_moe::grouped_mm_scaled: y[r] = prob[r] * (scale[e] * (x[r] @ w[e]) + bias[e]),
    rounded once to x's dtype; padding rows zero. Differentiable."""
    m = x.shape[0]
    y = grouped_mm_ref(x, w, offs, out_dtype=compute_dtype, compute_dtype=compute_dtype)
    if scale is not None:
        y = y * _per_row(scale, offs, m, compute_dtype)[:, None]
    if bias is not None:
        y = y + _per_row(bias, offs, m, compute_dtype)
    if prob is not None:
        y = y * prob.to(compute_dtype)[:, None]
    return y.to(x.dtype)


def grouped_mm_act_ref(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                       bias: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                       activation: str = "swiglu", alpha: float = 1.702,
                       limit: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cute_moe::grouped_mm_act: pre = round(scale[e] * (x[rows_e] @ w[e]) + bias[e]),
    h = round(act(pre)) from the rounded pre; padding rows zero in both. Returns (h, pre)
    in x's dtype. Differentiable."""
    pre = grouped_mm_scaled_ref(x, w, offs, bias, scale)
    return _zero_padding(act_ref(pre, activation, alpha, limit).to(x.dtype), offs), pre


def grouped_mm_act_gathered_ref(x: torch.Tensor, rows: torch.Tensor, w: torch.Tensor,
                                offs: torch.Tensor, bias: torch.Tensor | None = None,
                                scale: torch.Tensor | None = None, activation: str = "swiglu",
                                alpha: float = 1.702, limit: float | None = None):
    """cute_moe::grouped_mm_act_gathered: grouped_mm_act_ref over x[rows] (routed row r is
    token row rows[r] of x). Returns (h, pre). Differentiable."""
    return grouped_mm_act_ref(x[rows.long()], w, offs, bias, scale, activation, alpha, limit)


def grouped_mm_act_bwd_ref(dy: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                           pre: torch.Tensor, scale: torch.Tensor | None = None,
                           prob: torch.Tensor | None = None,
                           out_bias: torch.Tensor | None = None, prob_grad: bool = False,
                           activation: str = "swiglu", alpha: float = 1.702,
                           limit: float | None = None):
    """cute_moe::grouped_mm_act_bwd. With u = dy[rows_e] @ w[e] (float32, w = W_down[e]^T),
    s = scale[e], p = prob[r] (1 where absent): dh = p * s * u, dpre = round(act'(pre) dh),
    hp = round(p * act(pre)), and with prob_grad dprob = sum_j act(pre) * s * u + sum_n
    dy * out_bias[e] (float32). Padding rows zero. Returns (dpre, hp, dprob) (dprob empty
    without prob_grad)."""
    m = dy.shape[0]
    u = grouped_mm_ref(dy, w, offs, out_dtype=torch.float32)
    if scale is not None:
        u = u * _per_row(scale, offs, m, torch.float32)[:, None]
    p = prob.to(torch.float32)[:, None] if prob is not None else None
    dh = u * p if p is not None else u
    dpre = act_bwd_ref(dh, pre, activation, alpha, limit).to(pre.dtype)
    h = act_ref(pre, activation, alpha, limit).to(torch.float32)
    hp = (h * p if p is not None else h).to(pre.dtype)
    dprob = u.new_empty(0)
    if prob_grad:
        dprob = (h * u).sum(-1)
        if out_bias is not None:
            dprob = dprob + (dy.to(torch.float32) * _per_row(out_bias, offs, m, torch.float32)).sum(-1)
        dprob = _zero_padding(dprob, offs)
    return _zero_padding(dpre, offs), _zero_padding(hp, offs), dprob


def _round_straight_through(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """t rounded to dtype and back in the forward pass; identity for the gradient."""
    if dtype is None:
        return t
    return t + (t.to(dtype).to(t.dtype) - t).detach()


def expert_ffn_ref(x: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor | None,
                   w_down: torch.Tensor, b_down: torch.Tensor | None, offs: torch.Tensor,
                   alpha: float = 1.702, limit: float | None = 7.0,
                   compute_dtype: torch.dtype = torch.float32,
                   round_dtype: torch.dtype | None = torch.bfloat16,
                   return_activation: bool = False, *, activation: str = "swiglu_oai",
                   prob: torch.Tensor | None = None, scale_up: torch.Tensor | None = None,
                   scale_down: torch.Tensor | None = None):
    """One MoE expert block, group by group, written like HF transformers' experts:
    pre = scale_up[e] * (x @ W_up[e]) + b_up[e]; h = act(pre) (act_ref: for swiglu_oai
    gate = pre[..., ::2].clamp(max=limit), up = pre[..., 1::2].clamp(-limit, limit),
    h = (up + 1) * gate * sigmoid(gate * alpha)); out = prob[r] * (scale_down[e] *
    (h @ W_down[e]) + b_down[e]). Every optional tensor may be None. Computed in
    compute_dtype; pre and h are rounded to round_dtype in the forward pass only (as the
    kernels store them), which keeps the clamp masks where the kernels have them.
    Returns out (M, H) in compute_dtype, padding rows zero, and with return_activation
    also h. Differentiable with respect to every tensor."""
    m, inter, hidden = x.shape[0], w_down.shape[-2], w_down.shape[-1]
    xc, wu, wd = x.to(compute_dtype), w_up.to(compute_dtype), w_down.to(compute_dtype)
    bu = b_up.to(compute_dtype) if b_up is not None else None
    bd = b_down.to(compute_dtype) if b_down is not None else None
    pieces, acts = [], []
    bounds = group_bounds(offs, m)
    for e, (start, end) in enumerate(bounds):
        pre = xc[start:end] @ wu[e]
        if scale_up is not None:
            pre = pre * scale_up[e].to(compute_dtype)
        if bu is not None:
            pre = pre + bu[e]
        pre = _round_straight_through(pre, round_dtype)
        act = _round_straight_through(act_ref(pre, activation, alpha, limit).to(compute_dtype),
                                      round_dtype)
        acts.append(act)
        out = act @ wd[e]
        if scale_down is not None:
            out = out * scale_down[e].to(compute_dtype)
        if bd is not None:
            out = out + bd[e]
        if prob is not None:
            out = out * prob[start:end, None].to(compute_dtype)
        pieces.append(out)
    pad = m - (bounds[-1][1] if bounds else 0)
    out = torch.cat(pieces + [xc.new_zeros(pad, hidden)])
    if return_activation:
        return out, torch.cat(acts + [xc.new_zeros(pad, inter)])
    return out

# Pure-PyTorch references of the cute-moe grouped GEMMs: the ground truth of every test
# and the CPU implementation of the ops. They loop over groups and read `offs` on the
# host, which the kernels never do; that is acceptable here and only here.
#
# Group e owns rows [offs[e-1], offs[e]) (offs[-1] := 0); rows at or past offs[E-1]
# are padding: never read, and zero in a ragged-M output. Gated activations take `pre`
# with gate and linear columns interleaved (column 2j gate j, 2j+1 linear j).
from __future__ import annotations

from collections.abc import Sequence

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
    "expert_ffn_ref",
]


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
                          compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """db[e] = sum of dy over rows_e, shape (E, N), float32."""
    dyc = dy.to(compute_dtype)
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


def swiglu_oai_bwd_ref(dh: torch.Tensor, pre: torch.Tensor, alpha: float = 1.702,
                       limit: float | None = 7.0) -> torch.Tensor:
    """Gradient of swiglu_oai_ref with respect to pre, in closed form (design.md 2), for
    an upstream gradient dh (..., I). Interleaved like pre; float32 (float64 if an input
    is). The clamps pass gradient inside their closed intervals, as in autograd."""
    dtype = _math_dtype(dh, pre)
    p = pre.to(dtype)
    dh = dh.to(dtype)
    a, b = p[..., 0::2], p[..., 1::2]
    g, u = _gate_linear(p, limit)
    s = torch.sigmoid(alpha * g)
    da = dh * (u + 1) * (s + alpha * g * s * (1 - s))
    db = dh * g * s
    if limit is not None:
        da = torch.where(a <= limit, da, 0.0)
        db = torch.where((b >= -limit) & (b <= limit), db, 0.0)
    return torch.stack((da, db), dim=-1).flatten(-2)


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
                   return_activation: bool = False):
    """One MoE expert block written like HF transformers' GPT-OSS experts, group by group:
    gate_up = x @ W_up[e] + b_up[e]; gate = gate_up[..., ::2].clamp(max=limit);
    up = gate_up[..., 1::2].clamp(-limit, limit); glu = gate * sigmoid(gate * alpha);
    out = ((up + 1) * glu) @ W_down[e] + b_down[e]. Computed in compute_dtype; gate_up
    and the activation are rounded to round_dtype in the forward pass only (as the
    kernels store them), which keeps the clamp masks where the kernels have them.
    Returns out (M, H) in compute_dtype, padding rows zero, and with return_activation
    also the activation (M, I). Differentiable."""
    m, inter, hidden = x.shape[0], w_down.shape[-2], w_down.shape[-1]
    xc, wu, wd = x.to(compute_dtype), w_up.to(compute_dtype), w_down.to(compute_dtype)
    bu = b_up.to(compute_dtype) if b_up is not None else None
    bd = b_down.to(compute_dtype) if b_down is not None else None
    pieces, acts = [], []
    bounds = group_bounds(offs, m)
    for e, (start, end) in enumerate(bounds):
        gate_up = xc[start:end] @ wu[e]
        if bu is not None:
            gate_up = gate_up + bu[e]
        gate_up = _round_straight_through(gate_up, round_dtype)
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        if limit is not None:
            gate = gate.clamp(min=None, max=limit)
            up = up.clamp(min=-limit, max=limit)
        glu = gate * torch.sigmoid(gate * alpha)
        act = _round_straight_through((up + 1) * glu, round_dtype)
        acts.append(act)
        out = act @ wd[e]
        pieces.append(out + bd[e] if bd is not None else out)
    pad = m - (bounds[-1][1] if bounds else 0)
    out = torch.cat(pieces + [xc.new_zeros(pad, hidden)])
    if return_activation:
        return out, torch.cat(acts + [xc.new_zeros(pad, inter)])
    return out

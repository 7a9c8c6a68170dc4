"""References of the grouped GEMM ops: grouped_mm, its gradients, grouped_mm_scaled."""
from __future__ import annotations

import torch

from .groups import group_bounds, per_row

__all__ = ["grouped_mm_ref", "grouped_mm_wgrad_ref", "grouped_bias_grad_ref",
           "grouped_bias_grads_ref", "grouped_mm_scaled_ref"]


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


def grouped_bias_grads_ref(src: torch.Tensor, offs: torch.Tensor,
                           row_scale: torch.Tensor | None = None,
                           bias: torch.Tensor | None = None,
                           index: torch.Tensor | None = None):
    """cute_moe::grouped_bias_grads: with dy = src[index] (index given) or src,
    db (E, N) float32 = grouped_bias_grad_ref(dy, offs, row_scale=row_scale),
    bias_dot (M,) float32 = dy[r] . bias[group(r)] (padding rows 0; (0,) without bias),
    gathered = dy ((0, N) without index)."""
    dy = src[index.long()] if index is not None else src
    m, n = dy.shape
    db = grouped_bias_grad_ref(dy, offs, row_scale=row_scale)
    if bias is None:
        bias_dot = src.new_zeros(0, dtype=torch.float32)
    else:
        bias_dot = (dy.float() * per_row(bias, offs, m, torch.float32)).sum(1)
    gathered = dy if index is not None else src.new_empty(0, n)
    return db, bias_dot, gathered


def grouped_mm_scaled_ref(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                          bias: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                          prob: torch.Tensor | None = None,
                          compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """cute_moe::grouped_mm_scaled: y[r] = prob[r] * (scale[e] * (x[r] @ w[e]) + bias[e]),
    rounded once to x's dtype; padding rows zero. Differentiable."""
    m = x.shape[0]
    y = grouped_mm_ref(x, w, offs, out_dtype=compute_dtype, compute_dtype=compute_dtype)
    if scale is not None:
        y = y * per_row(scale, offs, m, compute_dtype)[:, None]
    if bias is not None:
        y = y + per_row(bias, offs, m, compute_dtype)
    if prob is not None:
        y = y * prob.to(compute_dtype)[:, None]
    return y.to(x.dtype)


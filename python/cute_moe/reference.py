# Pure-PyTorch references of the cute-moe grouped GEMMs: the ground truth of every test
# and the CPU implementation of the ops. They loop over groups and read `offs` on the
# host, which the kernels never do; that is acceptable here and only here.
#
# Group e owns rows [offs[e-1], offs[e]) (offs[-1] := 0); rows at or past offs[E-1]
# are padding: never read, and zero in a ragged-M output.
from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "offsets_from_counts",
    "group_bounds",
    "grouped_mm_ref",
    "grouped_mm_wgrad_ref",
    "grouped_bias_grad_ref",
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

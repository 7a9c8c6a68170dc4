"""References of the token permute / unpermute (dispatch and combine) and their gather ops."""
# The ground truth of the tests and the CPU implementation of the cute_moe::gather_* ops.
# Plain indexing and fp32 (or finer) math, differentiable with plain autograd; they check
# the index values on the host, which the kernels never do.
#
# Routing of T tokens to top-k experts gives M = T*k routed rows sorted by expert:
#   row_token  (M,)   int32: the token of routed row r;
#   token_rows (T, k) int32: the routed row of (token t, choice j), the inverse.
from __future__ import annotations

import torch

from .routing import sort_by_expert_ref

__all__ = [
    "gather_rows_ref",
    "gather_sum_rows_ref",
    "gather_rows_dot_ref",
    "permute_ref",
    "unpermute_ref",
    "routing_indices",
]


def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float32, or float64 when an input is float64."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _check_index(name: str, index: torch.Tensor, bound: int) -> None:
    """Every value in [0, bound), as the kernels check on the device (plain indexing would
    wrap negative values). One host read; skipped while tracing."""
    if index.numel() == 0 or torch.compiler.is_compiling():
        return
    lo, hi = int(index.min()), int(index.max())
    if lo < 0 or hi >= bound:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name}: expected values in [0, {bound}) (rows of src), got {bad}")


def gather_rows_ref(src: torch.Tensor, index: torch.Tensor, scale: torch.Tensor | None = None,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """out[r] = scale[r] * src[index[r]]: src (N, H), index (M,), scale (M,) or None.
    Unscaled it is an exact copy; scaled it computes in fp32 (fp64 for fp64 inputs).
    Returns out_dtype (default src.dtype)."""
    _check_index("index", index, src.shape[0])
    out = src[index.long()]
    if scale is not None:
        cdt = _compute_dtype(src, scale)
        out = out.to(cdt) * scale.to(cdt)[:, None]
    return out.to(out_dtype or src.dtype)


def gather_sum_rows_ref(src: torch.Tensor, index: torch.Tensor, weight: torch.Tensor | None = None,
                        out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """out[t] = sum_j weight[t, j] * src[index[t, j]]: src (M, H), index (T, k), weight
    (T, k) or None (all ones). fp32 math (fp64 for fp64 inputs); k = 0 gives zeros.
    Returns out_dtype (default src.dtype)."""
    _check_index("index", index, src.shape[0])
    cdt = _compute_dtype(src, weight)
    rows = src[index.long()].to(cdt)  # (T, k, H)
    if weight is not None:
        rows = rows * weight.to(cdt)[..., None]
    return rows.sum(1).to(out_dtype or src.dtype)


def gather_rows_dot_ref(a: torch.Tensor, src: torch.Tensor, index: torch.Tensor,
                        out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """out[t, j] = sum_n a[t, n] * src[index[t, j], n]: a (T, H), src (M, H), index (T, k).
    fp32 math (fp64 for fp64 inputs); returns out_dtype (default the compute dtype)."""
    _check_index("index", index, src.shape[0])
    cdt = _compute_dtype(a, src)
    out = (src[index.long()].to(cdt) * a.to(cdt)[:, None, :]).sum(-1)
    return out.to(out_dtype or cdt)


def permute_ref(x: torch.Tensor, row_token: torch.Tensor) -> torch.Tensor:
    """The dispatch: x_sorted[r] = x[row_token[r]], (M, H) from x (T, H)."""
    return gather_rows_ref(x, row_token)


def unpermute_ref(y: torch.Tensor, token_rows: torch.Tensor,
                  weight: torch.Tensor | None = None) -> torch.Tensor:
    """The combine: out[t] = sum_j weight[t, j] * y[token_rows[t, j]], (T, H) in y's dtype,
    from y (M, H)."""
    return gather_sum_rows_ref(y, token_rows, weight)


def routing_indices(expert: torch.Tensor, num_experts: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row_token, token_rows, offs) of top-k choices `expert` (T, k) integer expert ids:
    routed rows sorted by expert, stable (token order within an expert), offs the int32
    cumulative end offsets of the E experts. On expert's device, without a host read.
    reference/routing.py's sort_by_expert_ref without router weights."""
    if expert.dim() != 2:
        raise ValueError(f"expert: expected a 2-D (T, k) tensor, got shape {tuple(expert.shape)}")
    s = sort_by_expert_ref(expert, num_experts)
    return s.row_token, s.token_rows, s.offs

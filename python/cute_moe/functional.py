# Public functional API of cute-moe. Runs the compiled ops when the library is loaded
# (any device: CPU goes through the registered reference kernel) and the PyTorch
# reference, with plain autograd, otherwise.
from __future__ import annotations

import torch

from . import _library
from .ops.checks import check_offs_values
from .ops.gemm import check_grouped_mm_args
from .reference.gemm import grouped_mm_ref

__all__ = ["grouped_mm"]


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """Grouped GEMM with ragged M: y[rows_e] = x[rows_e] @ w[e] (+ bias[e]).

    x: (M, K) bf16, unit column stride; rows are sorted by group.
    w: (E, K, N) bf16, row-major per group, or a transposed view of an (E, N, K) tensor
       (the `x @ W[e].T` layout), used without a copy.
    offs: (E,) int32 cumulative end offsets on x's device; group e owns rows
       [offs[e-1], offs[e]) with offs[-1] := 0; groups may be empty.
    bias: optional (E, N) bf16.
    Returns y (M, N) bf16; rows at or past offs[E-1] are zero. Differentiable with
    respect to x, w and bias. With the compiled library the call never synchronises
    with the host; the fallback reference reads offs on the host.
    offs is checked on the device: a decreasing, negative or past-M entry stops the
    kernel with a message and a trap that leaves the CUDA context unusable (restart the
    process). cute_moe.set_offs_check(True) (or CUTE_MOE_CHECK_OFFS=1) checks it on the
    host first and raises ValueError naming the first bad entry (one sync per call).
    """
    check_grouped_mm_args(x, w, offs, bias)
    check_offs_values("grouped_mm", offs, x.shape[0], "x")
    if _library.library_loaded():
        return torch.ops.cute_moe.grouped_mm(x, w, offs, bias)
    return grouped_mm_ref(x, w, offs, bias)

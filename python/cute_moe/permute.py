# Token permute / unpermute of an MoE layer (the dispatch and the combine), differentiable.
#
# Routing of T tokens to top-k experts gives M = T*k routed rows sorted by expert, described
# by two int32 index tensors that the router builds on the device (see
# cute_moe.nn.dispatch.sort_by_expert, or reference/permute.py's routing_indices):
#   row_token  (M,)   the token of routed row r;
#   token_rows (T, k) the routed row of (token t, choice j), the inverse permutation.
# Each direction and its gradient is a gather over one of them, so nothing is scattered
# with atomics: forward and backward are deterministic, and with the op library free of
# host synchronisation (CUDA-graph safe).
#
# bf16 inputs run the library's ops (their CPU kernels are the references) under the
# autograd.Functions below; other dtypes, or no library, run the references with plain
# autograd.
from __future__ import annotations

import torch

from . import _library
from .ops.permute import (check_permute_args, check_row_length, check_unpermute_args,
                          vector_rows_ok)
from .reference.permute import permute_ref, unpermute_ref

__all__ = ["permute", "unpermute"]


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t, or a copy when the kernels cannot read its rows as 16-byte vectors. Under
    torch.compile, which cannot trace storage offsets, a contiguous copy where needed."""
    if torch.compiler.is_compiling():
        return t.contiguous()
    return t if vector_rows_ok(t) else t.contiguous()


class _Permute(torch.autograd.Function):
    """x_sorted[r] = x[row_token[r]]; dx[t] = sum_j dx_sorted[token_rows[t, j]]."""

    @staticmethod
    def forward(ctx, x, row_token, token_rows):
        ctx.save_for_backward(token_rows)
        return torch.ops.cute_moe.gather_rows(x, row_token, None)

    @staticmethod
    def backward(ctx, grad):
        (token_rows,) = ctx.saved_tensors
        return torch.ops.cute_moe.gather_sum_rows(_rows(grad), token_rows, None), None, None


class _Unpermute(torch.autograd.Function):
    """out[t] = sum_j weight[t, j] * y[token_rows[t, j]];
    dy[r] = w_row[r] * dout[row_token[r]] with w_row[token_rows[t, j]] = weight[t, j];
    dweight[t, j] = <dout[t], y[token_rows[t, j]]>."""

    @staticmethod
    def forward(ctx, y, token_rows, row_token, weight):
        need_y, need_w = ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[3]
        ctx.save_for_backward(token_rows, row_token, weight if need_y else None,
                              y if need_w else None)
        return torch.ops.cute_moe.gather_sum_rows(y, token_rows, weight)

    @staticmethod
    def backward(ctx, grad):
        token_rows, row_token, weight, y = ctx.saved_tensors
        ops = torch.ops.cute_moe
        grad = _rows(grad)
        dy = dweight = None
        if ctx.needs_input_grad[0]:
            w_row = None
            if weight is not None:
                # Each routed row is one (t, j): a permutation, so the scatter has one writer
                # per element (deterministic, no host read).
                w_row = weight.new_empty(row_token.shape[0]).scatter_(
                    0, token_rows.reshape(-1).long(), weight.reshape(-1))
            dy = ops.gather_rows(grad, row_token, w_row)
        if y is not None:
            dweight = ops.gather_rows_dot(grad, y, token_rows)
        return dy, None, None, dweight


def _use_ops(t: torch.Tensor) -> bool:
    return _library.library_loaded() and t.dtype == torch.bfloat16


def permute(x: torch.Tensor, row_token: torch.Tensor, token_rows: torch.Tensor) -> torch.Tensor:
    """The dispatch: x_sorted[r] = x[row_token[r]].

    x: (T, H) tokens; bf16 runs the op library (H a multiple of 8), other floating dtypes
       the PyTorch reference.
    row_token: (M,) int32, the token of each routed row (rows sorted by expert).
    token_rows: (T, k) int32, the routed row of each (token, choice): the inverse of
       row_token, M = T*k. Only the backward reads it: dx[t] = sum_j dx_sorted[token_rows[t, j]],
       a gather in a fixed order (deterministic, no atomics).
    Returns x_sorted (M, H) in x's dtype. Index values are checked on the device (a bad one
    stops the kernel with a message). Differentiable with respect to x.
    """
    check_permute_args(x, row_token, token_rows)
    if not _use_ops(x):
        return permute_ref(x, row_token)
    check_row_length("permute", "x", x)
    return _Permute.apply(_rows(x), row_token.contiguous(), token_rows.contiguous())


def gather_rows(x: torch.Tensor, rows: torch.Tensor, token_rows) -> torch.Tensor:
    """x[rows], differentiable: the dispatch (permute) where token_rows is given (its backward a
    deterministic gather-sum), plain indexing otherwise (the blocks' "gather first" route)."""
    if token_rows is not None:
        return permute(x, rows, token_rows)
    return x[rows.long()]


def unpermute(y: torch.Tensor, token_rows: torch.Tensor, row_token: torch.Tensor,
              weight: torch.Tensor | None = None) -> torch.Tensor:
    """The combine: out[t] = sum_{j=0..k-1, in order} weight[t, j] * y[token_rows[t, j]].

    y: (M, H) expert outputs in routed-row order; bf16 runs the op library (H a multiple
       of 8), other floating dtypes the PyTorch reference.
    token_rows: (T, k) int32, the routed row of each (token, choice).
    row_token: (M,) int32, its inverse (M = T*k); only the backward reads it:
       dy[r] = w_row[r] * dout[row_token[r]].
    weight: optional (T, k) routing probabilities (any floating dtype; the library
       computes in fp32), None for a plain sum. dweight[t, j] = <dout[t], y[token_rows[t, j]]>.
    Returns out (T, H) in y's dtype, summed in fp32 and rounded once. Differentiable with
    respect to y and weight.
    """
    check_unpermute_args(y, token_rows, row_token, weight)
    if not _use_ops(y):
        return unpermute_ref(y, token_rows, weight)
    check_row_length("unpermute", "y", y)
    if weight is not None:
        weight = weight.to(torch.float32).contiguous()
    return _Unpermute.apply(_rows(y), token_rows.contiguous(), row_token.contiguous(), weight)

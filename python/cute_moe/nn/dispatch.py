# Dispatch and combine of an MoE layer: the routing metadata that sorts routed rows by
# expert, built on the device with no host synchronisation (so a whole training step
# can be captured in a CUDA graph and replayed with other routing), and the row
# gather / deterministic gather-sum of cute_moe.permute taking that metadata.
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _library
from ..ops.routing import SORT_MAX_EXPERTS
from ..permute import permute as _gather_rows
from ..permute import unpermute as _combine_rows
from ..reference.routing import sort_by_expert_ref

__all__ = ["Dispatch", "sort_by_expert", "sort_received", "tokens_per_expert", "permute",
           "unpermute"]


class Dispatch(NamedTuple):
    row_token: torch.Tensor   # (M,) int32: token of routed row r (rows sorted by expert)
    token_rows: torch.Tensor  # (T, k) int32: routed row of (token t, choice j)
    offs: torch.Tensor        # (E,) int32: cumulative end row of each expert
    prob: torch.Tensor | None  # (M,): router weight of each routed row, or None


def sort_by_expert(experts: torch.Tensor, num_experts: int,
                   weights: torch.Tensor | None = None) -> Dispatch:
    """Routing metadata for experts (T, k) (the expert of every token's choices) and,
    optionally, weights (T, k) (the router weight of each choice; the returned prob
    stays differentiable with respect to it).

    Routed row r = j-th choice of token t, M = T * k rows, sorted by expert with a
    stable sort so that each expert's rows keep token order (deterministic, and the
    order torchtitan's dispatcher produces). offs[e] = number of rows with expert <= e
    (empty experts cost nothing). Ids outside [0, num_experts) (expert-parallel
    sentinels) are padding rows: sorted after every expert, past offs[-1], where the
    grouped GEMMs leave them zero. Device work only: no .item(), no data-dependent shapes.
    On a GPU with the op library, one counting sort (cute_moe::sort_by_expert, three small
    kernels); elsewhere its reference (torch.sort), with the same result."""
    if not isinstance(experts, torch.Tensor) or experts.dim() != 2:
        raise ValueError(f"sort_by_expert: experts: expected a (T, k) tensor, got "
                         f"{tuple(experts.shape) if isinstance(experts, torch.Tensor) else experts!r}")
    if weights is not None and weights.shape != experts.shape:
        raise ValueError(f"sort_by_expert: weights: expected shape {tuple(experts.shape)} "
                         f"(experts'), got {tuple(weights.shape)}")
    if _sort_on_device(experts, num_experts, weights):
        if weights is not None:
            weights = weights.to(torch.float32).contiguous()  # prob is fp32 for the kernels anyway
        return Dispatch(*_SortByExpert.apply(experts.contiguous(), num_experts, weights))
    s = sort_by_expert_ref(experts, num_experts, weights)
    return Dispatch(s.row_token, s.token_rows, s.offs, s.prob)


def _sort_on_device(experts, num_experts, weights) -> bool:
    return (_library.library_loaded() and experts.is_cuda
            and experts.dtype in (torch.int64, torch.int32)
            and isinstance(num_experts, int) and 1 <= num_experts <= SORT_MAX_EXPERTS
            and experts.numel() < 2 ** 31
            and (weights is None or (weights.is_floating_point() and weights.device == experts.device
                                     and weights.dtype != torch.float64)))


class _SortByExpert(torch.autograd.Function):
    """cute_moe::sort_by_expert; prob[r] = weights[i] for the choice i sorted to row r, so
    dweights[i] = dprob[token_rows[i]] (a gather: one reader per element)."""

    @staticmethod
    def forward(ctx, experts, num_experts, weights):
        row_token, token_rows, offs, prob = torch.ops.cute_moe.sort_by_expert(
            experts, num_experts, weights)
        ctx.save_for_backward(token_rows)
        ctx.mark_non_differentiable(row_token, token_rows, offs)
        return row_token, token_rows, offs, (prob if weights is not None else None)

    @staticmethod
    def backward(ctx, _row_token, _token_rows, _offs, dprob):
        (token_rows,) = ctx.saved_tensors
        dweights = None
        if ctx.needs_input_grad[2] and dprob is not None:
            dweights = dprob.index_select(0, token_rows.reshape(-1)).view(token_rows.shape)
        return None, None, dweights


def sort_received(counts: torch.Tensor, rows: int) -> Dispatch:
    """Expert parallelism: the Dispatch that sorts by expert the rows an all-to-all
    delivered. counts (R, E): rows from source rank r for local expert e, which arrive
    ordered by rank, then expert; rows: their total (the host has it: the all-to-all's
    splits needed it; rows past the counts' total, if any, are padding that stays in
    place). Within an expert the rows keep the ranks' order (torchtitan's permutation,
    without its padding rows). Each received row is one routed row (k = 1): token_rows
    (rows, 1), prob None. Device work only (fewer rows than the counts say stop the device's
    scatter with an index error)."""
    if not isinstance(counts, torch.Tensor) or counts.dim() != 2 or counts.shape[1] == 0 \
            or counts.is_floating_point() or counts.is_complex():
        raise ValueError(f"sort_received: counts: expected an integer (ranks, experts) tensor with "
                         f"at least one expert, got {counts!r:.80}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(f"sort_received: rows: expected the received rows' count (an int >= 0), "
                         f"got {rows!r}")
    c = counts.to(torch.int64)
    ranks, experts = c.shape
    dev = c.device
    # each (rank, expert) chunk's end in the received order (rank-major) and in the sorted
    # order (expert-major), both indexed rank-major: a row moves by their difference
    received_end = c.reshape(-1).cumsum(0)
    sorted_end = c.t().reshape(-1).cumsum(0).view(experts, ranks).t().reshape(-1)
    t = torch.arange(rows, device=dev)
    chunk = torch.searchsorted(received_end, t, right=True).clamp_(max=ranks * experts - 1)
    row = t + (sorted_end - received_end)[chunk]
    row_token = torch.empty(rows, dtype=torch.int32, device=dev).scatter_(0, row, t.to(torch.int32))
    offs = torch.cumsum(c.sum(0), 0, dtype=torch.int32)
    return Dispatch(row_token, row.to(torch.int32).view(rows, 1), offs, None)


def tokens_per_expert(offs: torch.Tensor) -> torch.Tensor:
    """Rows per expert (E,) int32 from cumulative end offsets, on the device."""
    return torch.diff(offs, prepend=offs.new_zeros(1))


# --- row gather and combine ------------------------------------------------------------
# cute_moe.permute's gathers: deterministic (no atomics, fp32 sums in choice order),
# sync-free on bf16 CUDA tensors, its references for other dtypes.

def permute(x: torch.Tensor, d: Dispatch) -> torch.Tensor:
    """Routed rows sorted by expert: x_sorted[r] = x[row_token[r]], (M, H). Differentiable
    (the gradient sums each token's k rows in a fixed order)."""
    return _gather_rows(x, d.row_token, d.token_rows)


def unpermute(y: torch.Tensor, d: Dispatch, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Combine: out[t] = sum_j weight[t, j] * y[token_rows[t, j]] (weight 1 when None),
    (T, H) in y's dtype, summed in fp32 in choice order (deterministic). Differentiable
    with respect to y and weight."""
    return _combine_rows(y, d.token_rows, d.row_token, weight)

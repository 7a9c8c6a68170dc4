"""References of the routing ops: the router's top-k and the sort of routed rows by expert."""
# The ground truth of the tests and the CPU implementation of cute_moe::top_k and
# cute_moe::sort_by_expert, in plain PyTorch (differentiable with plain autograd); their
# outputs are the kernels' bit for bit.
from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["top_k_ref", "SortedRows", "sort_by_expert_ref", "expert_buckets"]


def top_k_ref(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) (T, k): the k largest of each row in descending order, equal values
    lower column first, NaN above every number: a stable descending sort's first k (which
    torch.topk does not promise for equal values)."""
    values, indices = torch.sort(logits, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


class SortedRows(NamedTuple):
    row_token: torch.Tensor       # (M,) int32: token of sorted row r
    token_rows: torch.Tensor      # (T, k) int32: sorted row of (token t, choice j)
    offs: torch.Tensor            # (E,) int32: end row of each expert
    prob: torch.Tensor | None     # (M,) the weights in sorted order, or None


def expert_buckets(experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The flat ids with every id outside [0, num_experts) made num_experts: padding rows,
    sorted after all experts (expert-parallel sentinels; a negative id would otherwise sort
    into expert 0's rows)."""
    flat = experts.reshape(-1)
    return torch.where((flat >= 0) & (flat < num_experts), flat,
                       torch.full_like(flat, num_experts))


def sort_by_expert_ref(experts: torch.Tensor, num_experts: int,
                       weights: torch.Tensor | None = None) -> SortedRows:
    """Routed row r = the r-th (token t, choice j) in order of (expert, t * k + j): a stable
    sort of the flat choices by expert, ids outside [0, num_experts) past every expert.
    offs[e] = rows with expert <= e. prob = weights in that order (differentiable)."""
    t, k = experts.shape
    m, dev = t * k, experts.device
    sorted_ids, order = torch.sort(expert_buckets(experts, num_experts), stable=True)
    row_token = torch.div(order, k, rounding_mode="floor").to(torch.int32)
    token_rows = torch.empty(m, dtype=torch.int32, device=dev).scatter_(
        0, order, torch.arange(m, dtype=torch.int32, device=dev)).view(t, k)
    offs = torch.searchsorted(sorted_ids, torch.arange(num_experts, dtype=sorted_ids.dtype,
                                                        device=dev), right=True, out_int32=True)
    prob = None if weights is None else weights.reshape(-1).gather(0, order)
    return SortedRows(row_token, token_rows, offs, prob)

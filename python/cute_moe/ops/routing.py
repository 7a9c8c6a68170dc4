"""The routing ops: top_k (the router's choice) and sort_by_expert (the dispatch metadata)."""
# Their argument checks (the CUDA ops' rules, so every path rejects the same inputs), and
# their fake and CPU kernels (the references), registered on import when the op library is
# loaded. The ops have no autograd of their own: cute_moe/nn/top_k.py and nn/dispatch.py
# put them in autograd.Functions. Shapes, dtypes and devices only: values are never read.
from __future__ import annotations

import torch

from .. import _library
from ..reference.routing import sort_by_expert_ref, top_k_ref
from .checks import check_contiguous, check_same_device, check_tensor, fail
from .registry import register_kernels

__all__ = ["OPS", "TOP_K_MAX_COLUMNS", "TOP_K_MAX_CHOICES", "SORT_MAX_EXPERTS",
           "check_top_k_args", "check_sort_by_expert_args"]

OPS = ("top_k", "sort_by_expert")
TOP_K_MAX_COLUMNS = 512   # cute_moe::kTopKMaxColumns
TOP_K_MAX_CHOICES = 32    # cute_moe::kTopKMaxChoices
SORT_MAX_EXPERTS = 1024   # cute_moe::kSortMaxExperts


def _int(op: str, name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        fail(op, name, "an int", repr(v))


def check_top_k_args(logits, k, op: str = "top_k") -> None:
    """logits (T, E) float32 contiguous, 1 <= E <= 512; 1 <= k <= min(E, 32)."""
    check_tensor(op, "logits", logits, 2, torch.float32)
    check_contiguous(op, "logits", logits)
    e = logits.shape[1]
    if not 1 <= e <= TOP_K_MAX_COLUMNS:
        fail(op, "logits", f"1 to {TOP_K_MAX_COLUMNS} columns", f"shape {tuple(logits.shape)}")
    _int(op, "k", k)
    if not 1 <= k <= min(e, TOP_K_MAX_CHOICES):
        fail(op, "k", f"1 <= k <= min(columns, {TOP_K_MAX_CHOICES}) = {min(e, TOP_K_MAX_CHOICES)}", k)


def check_sort_by_expert_args(experts, num_experts, weights=None, op: str = "sort_by_expert") -> None:
    """experts (T, k) int64 or int32 contiguous; 1 <= num_experts <= 1024; weights None or
    (T, k) float32 contiguous on experts' device; T * k < 2^31."""
    if not isinstance(experts, torch.Tensor):
        fail(op, "experts", "a tensor", type(experts).__name__)
    if experts.dim() != 2:
        fail(op, "experts", "a (T, k) tensor", f"shape {tuple(experts.shape)}")
    if experts.dtype not in (torch.int64, torch.int32):
        fail(op, "experts", "dtype torch.int64 or torch.int32", experts.dtype)
    check_contiguous(op, "experts", experts)
    _int(op, "num_experts", num_experts)
    if not 1 <= num_experts <= SORT_MAX_EXPERTS:
        fail(op, "num_experts", f"1 to {SORT_MAX_EXPERTS}", num_experts)
    if experts.numel() >= 2 ** 31:
        fail(op, "experts", "fewer than 2^31 entries (int32 row numbers)", f"shape {tuple(experts.shape)}")
    if weights is not None:
        check_tensor(op, "weights", weights, 2, torch.float32)
        if weights.shape != experts.shape:
            fail(op, "weights", f"experts' shape {tuple(experts.shape)}", f"shape {tuple(weights.shape)}")
        check_contiguous(op, "weights", weights)
        check_same_device(op, "experts", experts, weights=weights)


# --- fake and CPU kernels (every argument given: see registry.py) ---------------------

def _fake_top_k(logits, k):
    check_top_k_args(logits, k)
    t = logits.shape[0]
    return logits.new_empty(t, k), logits.new_empty(t, k, dtype=torch.int64)


def _cpu_top_k(logits, k):
    check_top_k_args(logits, k)
    values, indices = top_k_ref(logits, k)
    return values.contiguous(), indices.contiguous()


def _fake_sort_by_expert(experts, num_experts, weights):
    check_sort_by_expert_args(experts, num_experts, weights)
    t, k = experts.shape
    int32 = dict(dtype=torch.int32)
    return (experts.new_empty(t * k, **int32), experts.new_empty(t, k, **int32),
            experts.new_empty(num_experts, **int32),
            experts.new_empty(t * k if weights is not None else 0, dtype=torch.float32))


def _cpu_sort_by_expert(experts, num_experts, weights):
    check_sort_by_expert_args(experts, num_experts, weights)
    s = sort_by_expert_ref(experts, num_experts, weights)
    prob = s.prob if s.prob is not None else experts.new_empty(0, dtype=torch.float32)
    return s.row_token, s.token_rows, s.offs, prob


def _register() -> None:
    register_kernels("top_k", _fake_top_k, _cpu_top_k)
    register_kernels("sort_by_expert", _fake_sort_by_expert, _cpu_sort_by_expert)


if _library.library_loaded():
    _register()

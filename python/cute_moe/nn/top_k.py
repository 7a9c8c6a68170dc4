# The router's top-k: cute_moe::top_k (one warp per token) for float32 logits on a GPU,
# torch.topk elsewhere. Both give each row's k largest values in descending order and
# their columns; for equal values the kernel takes the lower column first, torch.topk
# promises no order. Differentiable with respect to the logits (the values' gradient
# scattered to the chosen columns, as torch.topk's backward does).
from __future__ import annotations

import torch

from .. import _library
from ..ops.routing import TOP_K_MAX_CHOICES, TOP_K_MAX_COLUMNS

__all__ = ["top_k"]


class _TopK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, k):
        values, indices = torch.ops.cute_moe.top_k(logits, k)
        ctx.save_for_backward(indices)
        ctx.columns = logits.shape[1]
        ctx.mark_non_differentiable(indices)
        return values, indices

    @staticmethod
    def backward(ctx, dvalues, _dindices):
        (indices,) = ctx.saved_tensors
        grad = dvalues.new_zeros(dvalues.shape[0], ctx.columns).scatter_(1, indices, dvalues)
        return grad, None


def _on_device(logits: torch.Tensor, k: int) -> bool:
    return (_library.library_loaded() and logits.is_cuda and logits.dtype == torch.float32
            and logits.dim() == 2 and 1 <= logits.shape[1] <= TOP_K_MAX_COLUMNS
            and 1 <= k <= min(logits.shape[1], TOP_K_MAX_CHOICES))


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) (T, k) of logits (T, E): torch.topk(logits, k, dim=-1)'s result."""
    if _on_device(logits, k):
        return _TopK.apply(logits.contiguous(), k)
    return torch.topk(logits, k, dim=-1)

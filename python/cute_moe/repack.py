# Load-time conversion of gated up-projection weights between the "halves" layout of
# Llama, Mixtral and Qwen checkpoints ([gate | linear] along the 2I dimension) and the
# interleaved layout the fused kernels read (column 2j gate j, 2j+1 linear j; GPT-OSS).
from __future__ import annotations

import torch

__all__ = ["halves_to_interleaved", "interleaved_to_halves"]


def _gated_dim(t, dim: int, fn: str) -> int:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"cute_moe.{fn}: t: expected a tensor, got {type(t).__name__}")
    if not -t.dim() <= dim < t.dim():
        raise ValueError(f"cute_moe.{fn}: dim: expected a dimension of a {t.dim()}-D tensor, "
                         f"got {dim}")
    dim %= t.dim()
    if t.shape[dim] % 2:
        raise ValueError(f"cute_moe.{fn}: t: expected an even size 2I along dim {dim}, got "
                         f"shape {tuple(t.shape)}")
    return dim


def halves_to_interleaved(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """[gate_0 .. gate_{I-1} | lin_0 .. lin_{I-1}] along `dim` -> [gate_0, lin_0, gate_1,
    lin_1, ...]. E.g. W_up (E, H, 2I) with dim=-1, a transposed (E, 2I, H) with dim=1,
    b_up (E, 2I). Returns a new contiguous tensor."""
    dim = _gated_dim(t, dim, "halves_to_interleaved")
    gate, lin = t.chunk(2, dim)
    return torch.stack((gate, lin), dim + 1).flatten(dim, dim + 1)


def interleaved_to_halves(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The inverse of halves_to_interleaved. Returns a new contiguous tensor."""
    dim = _gated_dim(t, dim, "interleaved_to_halves")
    pairs = t.unflatten(dim, (t.shape[dim] // 2, 2))
    return torch.cat((pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)), dim)

"""Group offsets of the references: building them, reading them on the host, rows per group."""
# Group e owns rows [offs[e-1], offs[e]) (offs[-1] := 0); rows at or past offs[E-1] are
# padding: never read, and zero in a ragged-M output. The references read offs on the
# host, which the kernels never do; that is acceptable in the references and only there.
from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["offsets_from_counts", "group_bounds", "rows_to_groups", "per_row", "zero_padding"]


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

def zero_padding(t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    bounds = group_bounds(offs, t.shape[0])
    t[(bounds[-1][1] if bounds else 0):] = 0
    return t

def rows_to_groups(offs: torch.Tensor, m: int) -> torch.Tensor:
    """int64 (m,) group of every row; padding rows get E. Reads offs on the device, no
    host sync (searchsorted)."""
    rows = torch.arange(m, device=offs.device, dtype=offs.dtype)
    return torch.searchsorted(offs, rows, right=True)


def per_row(values: torch.Tensor | None, offs: torch.Tensor, m: int, dtype) -> torch.Tensor | None:
    """values[group(r)] for each row (padding rows 0)."""
    if values is None:
        return None
    padded = torch.cat([values.to(dtype), values.new_zeros((1,) + values.shape[1:], dtype=dtype)])
    return padded[rows_to_groups(offs, m)]


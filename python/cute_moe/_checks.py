# Argument checks of the grouped GEMM ops, shared by the public functions, the fake
# (shape) kernels and the CPU kernels so that every path rejects the same inputs with
# the same message. Shapes, dtypes, strides and devices only: offs is never read here.
from __future__ import annotations

import torch


def _fail(op: str, name: str, expected: str, got) -> None:
    raise ValueError(f"cute_moe.{op}: {name}: expected {expected}, got {got}")


def _tensor(op: str, name: str, t, ndim: int, dtype: torch.dtype) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(op, name, "a tensor", type(t).__name__)
    if t.dim() != ndim:
        _fail(op, name, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")
    if t.dtype != dtype:
        _fail(op, name, f"dtype {dtype}", t.dtype)


def _same_device(op: str, ref_name: str, ref: torch.Tensor, **others) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            _fail(op, name, f"a tensor on {ref_name}'s device {ref.device}", t.device)


def _offs(op: str, offs, num_groups: int, what: str) -> None:
    _tensor(op, "offs", offs, 1, torch.int32)
    if offs.shape[0] != num_groups:
        _fail(op, "offs", f"length {num_groups} ({what})", f"length {offs.shape[0]}")


def check_grouped_mm_args(x, w, offs, bias=None, op: str = "grouped_mm") -> None:
    """x (M, K) with unit column stride, w (E, K, N) with w.stride(2) == 1 or
    w.stride(1) == 1, offs (E,) int32, bias (E, N); all bf16 but offs, one device."""
    _tensor(op, "x", x, 2, torch.bfloat16)
    _tensor(op, "w", w, 3, torch.bfloat16)
    num_groups, k, n = w.shape
    _offs(op, offs, num_groups, "w.shape[0], the number of groups")
    if x.shape[1] != k:
        _fail(op, "x", f"{k} columns (w.shape[1])", f"shape {tuple(x.shape)}")
    if x.stride(1) != 1 and x.shape[1] > 1:
        _fail(op, "x", "unit column stride (call .contiguous())", f"strides {x.stride()}")
    if w.stride(2) != 1 and w.stride(1) != 1:
        _fail(op, "w", "w.stride(2) == 1 (E, K, N) or w.stride(1) == 1 (a transposed "
              "(E, N, K) tensor)", f"strides {w.stride()}")
    if bias is not None:
        _tensor(op, "bias", bias, 2, torch.bfloat16)
        if tuple(bias.shape) != (num_groups, n):
            _fail(op, "bias", f"shape {(num_groups, n)} (E, N)", f"shape {tuple(bias.shape)}")
    _same_device(op, "x", x, w=w, offs=offs, bias=bias)


def check_grouped_mm_wgrad_args(x, dy, offs, out_dtype=None,
                                op: str = "grouped_mm_wgrad") -> None:
    """x (M, K), dy (M, N) bf16, offs 1-D int32, out_dtype bf16, float32 or None."""
    _tensor(op, "x", x, 2, torch.bfloat16)
    _tensor(op, "dy", dy, 2, torch.bfloat16)
    if dy.shape[0] != x.shape[0]:
        _fail(op, "dy", f"{x.shape[0]} rows (x.shape[0])", f"shape {tuple(dy.shape)}")
    _tensor(op, "offs", offs, 1, torch.int32)
    if out_dtype not in (None, torch.bfloat16, torch.float32):
        _fail(op, "out_dtype", "torch.bfloat16 or torch.float32", out_dtype)
    _same_device(op, "x", x, dy=dy, offs=offs)


def check_grouped_column_sum_args(src, offs, op: str = "grouped_column_sum") -> None:
    """src (M, N) bf16, offs 1-D int32 on src's device."""
    _tensor(op, "src", src, 2, torch.bfloat16)
    _tensor(op, "offs", offs, 1, torch.int32)
    _same_device(op, "src", src, offs=offs)

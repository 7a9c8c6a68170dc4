"""The FP8 quantizer ops (docs/fp8.md): quantize_fp8_1x128 and quantize_fp8_128x128."""
# Their argument checks (the CUDA ops' rules, so that every path rejects the same inputs),
# and their fake and CPU kernels (the references of cute_moe.reference.fp8), registered on
# import when the op library is loaded.
from __future__ import annotations

import torch

from .. import _library
from ..reference.fp8 import FP8_DTYPE, quantize_1x128, quantize_128x128
from .checks import fail
from .registry import register_kernels

__all__ = ["OPS", "check_quantize_1x128_args", "check_quantize_128x128_args", "reference_128x128"]

OPS = ("quantize_fp8_1x128", "quantize_fp8_128x128")


def _bf16(op: str, name: str, t, ndim: int, dims16: int) -> None:
    """A bf16 operand of `ndim` dimensions whose last `dims16` are multiples of 16."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"cute_moe.{op}: {name}: expected a tensor, got {type(t).__name__}")
    if t.dtype != torch.bfloat16:
        fail(op, name, "a bfloat16 tensor", f"dtype {t.dtype}")
    if t.dim() != ndim:
        fail(op, name, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")
    if any(d % 16 for d in t.shape[ndim - dims16:]):
        what = "its last dimension" if dims16 == 1 else f"its last {dims16} dimensions"
        fail(op, name, f"{what} a multiple of 16 (16-byte fp8 rows)", f"shape {tuple(t.shape)}")
    if t.numel() and t.stride(-1) != 1:
        fail(op, name, "unit stride along its last dimension (call .contiguous())",
             f"strides {t.stride()}")


def check_quantize_1x128_args(x) -> None:
    _bf16("quantize_fp8_1x128", "x", x, 2, 1)


def check_quantize_128x128_args(w, as_is: bool, transposed: bool) -> None:
    _bf16("quantize_fp8_128x128", "w", w, 3, 2)
    if not (as_is or transposed):
        fail("quantize_fp8_128x128", "as_is / transposed", "at least one output asked for",
             "both False")


def _blocks(n: int) -> int:
    return (n + 127) // 128


def _fake_1x128(x):
    check_quantize_1x128_args(x)
    return x.new_empty(x.shape, dtype=FP8_DTYPE), x.new_empty(x.shape[0], _blocks(x.shape[1]),
                                                             dtype=torch.float32)


def _cpu_1x128(x):
    check_quantize_1x128_args(x)
    return quantize_1x128(x)


def _fake_128x128(w, as_is, transposed):
    check_quantize_128x128_args(w, as_is, transposed)
    e, k, n = w.shape
    none8, none32 = w.new_empty(0, dtype=FP8_DTYPE), w.new_empty(0, dtype=torch.float32)
    return (w.new_empty(e, k, n, dtype=FP8_DTYPE) if as_is else none8,
            w.new_empty(e, _blocks(k), _blocks(n), dtype=torch.float32) if as_is else none32,
            w.new_empty(e, n, k, dtype=FP8_DTYPE) if transposed else none8,
            w.new_empty(e, _blocks(n), _blocks(k), dtype=torch.float32) if transposed else none32)


def reference_128x128(w, as_is: bool, transposed: bool):
    """The op's outputs from the reference (its CPU kernel, and cute_moe.fp8's fallback)."""
    check_quantize_128x128_args(w, as_is, transposed)
    q, s = quantize_128x128(w)
    none8, none32 = w.new_empty(0, dtype=FP8_DTYPE), w.new_empty(0, dtype=torch.float32)
    return (q if as_is else none8, s if as_is else none32,
            q.transpose(-2, -1).contiguous() if transposed else none8,
            s.transpose(-2, -1).contiguous() if transposed else none32)


def _register() -> None:
    register_kernels("quantize_fp8_1x128", _fake_1x128, _cpu_1x128)
    register_kernels("quantize_fp8_128x128", _fake_128x128, reference_128x128)


if _library.library_loaded():
    _register()

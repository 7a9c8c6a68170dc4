"""The FP8 training recipe's kernels (docs/fp8.md), on the GPU: the quantizers (e4m3 values with
one fp32 scale per block, amax and scales computed on the device, no host sync, bit for bit
cute_moe.reference.fp8) and the ragged-M grouped GEMM on their outputs; and expert_ffn, the
expert block with its four ragged-M GEMMs in FP8, built from them (fp8_ffn.py; interim and
unfused). On the CPU or without the op library, the references run instead."""
from __future__ import annotations

import torch

from . import _library
from .ops.checks import check_offs_values
from .ops.fp8 import (check_grouped_mm_fp8_args, check_quantize_128x128_args,
                      check_quantize_1x128_args, reference_128x128, reference_grouped_mm_fp8)
from .reference import fp8 as _ref

__all__ = ["quantize_1x128", "quantize_128x128", "grouped_mm", "expert_ffn"]


def _op(x: torch.Tensor) -> bool:
    return x.is_cuda and _library.library_loaded()


def quantize_1x128(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, k) bf16 -> e4m3 (rows, k) and fp32 scales (rows, ceil(k / 128)): one per row and
    128 consecutive columns (activations feeding a ragged-M GEMM). k a multiple of 16."""
    check_quantize_1x128_args(x)
    if _op(x):
        return torch.ops.cute_moe.quantize_fp8_1x128(x)
    return _ref.quantize_1x128(x)


def quantize_128x128(w: torch.Tensor, as_is: bool = True, transposed: bool = False):
    """(E, k, n) bf16 weights -> (q, scale, q_t, scale_t): e4m3 (E, k, n) with fp32 scales
    (E, ceil(k / 128), ceil(n / 128)) when as_is, and the transposed copy (E, n, k) with
    scales (E, ceil(n / 128), ceil(k / 128)) when transposed (the operand of the other GEMM),
    from one pass over w; what was not asked for comes back empty. k, n multiples of 16."""
    check_quantize_128x128_args(w, as_is, transposed)
    if _op(w):
        return torch.ops.cute_moe.quantize_fp8_128x128(w, as_is, transposed)
    return reference_128x128(w, as_is, transposed)


def grouped_mm(x: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
               offs: torch.Tensor, bias: torch.Tensor | None = None,
               row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Ragged-M FP8 grouped GEMM with DeepSeek-style block scales: for the rows r of group e,
    y[r] = row_scale[r] * (deq(x)[r] @ deq(w)[e] + bias[e]), deq(x) = x * x_scale by 1 x 128
    blocks and deq(w) = w * w_scale by 128 x 128 blocks; fp32 math, one rounding to the
    bfloat16 output (m, n). Rows at or past offs[-1] are zero.

    - x: e4m3 (m, k), unit stride along k, its row stride a multiple of 16 elements;
      k a multiple of 16 (not necessarily of 128: the last block may be shorter).
    - x_scale: float32 (m, ceil(k / 128)), as quantize_1x128 returns it (any strides).
    - w: e4m3 (E, k, n), k-contiguous (w.stride(1) == 1: FP8 tensor cores read both
      operands k-major), e.g. ``q_t.transpose(-2, -1)`` of the (E, n, k) ``q_t`` of
      ``quantize_128x128(..., transposed=True)``; w.stride(2) and w.stride(0) multiples of
      16; n a multiple of 8; 1 <= E <= 65536.
    - w_scale: float32 (E, ceil(k / 128), ceil(n / 128)) (any strides: the as-is scale, or
      ``scale_t.transpose(-2, -1)``).
    - offs: int32 (E,) cumulative end offsets of the groups, read on the device only.
    - bias: optional bfloat16 (E, n), unit stride along n; row_scale: optional float32 (m,),
      contiguous (e.g. the router probabilities of the rows).

    A forward building block, without autograd: the FP8 training path (its backward GEMMs
    and quantizing epilogues) comes later."""
    check_grouped_mm_fp8_args(x, x_scale, w, w_scale, offs, bias, row_scale)
    check_offs_values("grouped_mm_fp8", offs, x.shape[0], "x")
    return grouped_mm_unchecked(x, x_scale, w, w_scale, offs, bias, row_scale)


def grouped_mm_unchecked(x, x_scale, w, w_scale, offs, bias=None, row_scale=None) -> torch.Tensor:
    """grouped_mm on arguments the caller has checked (fp8.expert_ffn checks its block once,
    not each of its GEMMs: in checked mode every offs check reads offs on the host)."""
    if _op(x):
        return torch.ops.cute_moe.grouped_mm_fp8(x, x_scale, w, w_scale, offs, bias, row_scale)
    return reference_grouped_mm_fp8(x, x_scale, w, w_scale, offs, bias, row_scale)


# last: fp8_ffn builds on the functions above
from .fp8_ffn import expert_ffn  # noqa: E402

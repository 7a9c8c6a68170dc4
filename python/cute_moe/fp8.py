"""The FP8 quantizers of the training recipe (docs/fp8.md), on the GPU: e4m3 values with one
fp32 scale per block, amax and scales computed on the device (no host sync), bit for bit
cute_moe.reference.fp8 (which runs instead on the CPU or without the op library)."""
from __future__ import annotations

import torch

from . import _library
from .ops.fp8 import check_quantize_128x128_args, check_quantize_1x128_args, reference_128x128
from .reference import fp8 as _ref

__all__ = ["quantize_1x128", "quantize_128x128"]


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

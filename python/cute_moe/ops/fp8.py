"""The FP8 ops (docs/fp8.md): the quantizers quantize_fp8_1x128, quantize_fp8_128x128 and
quantize_fp8_128x1 (and the 1x128 and 128x1 copies at once, quantize_fp8_1x128_128x1; the
activation's h from pre quantized 1x128, act_quantize_fp8_1x128; the 1x128 copy with each
group's column sums, quantize_fp8_1x128_column_sums), the
ragged-M grouped GEMM grouped_mm_fp8 with its fused activation forward and backward, and the
weight gradient grouped_mm_fp8_wgrad."""
# Their argument checks (the CUDA ops' rules, so that every path rejects the same inputs),
# and their fake and CPU kernels (the references of cute_moe.reference.fp8), registered on
# import when the op library is loaded.
from __future__ import annotations

import torch

from .. import _library
from ..activation_args import check_act_params, check_activation, is_gated
from ..reference.fp8 import (FP8_DTYPE, act_quantize_1x128, grouped_mm_fp8_act_bwd_ref,
                             grouped_mm_fp8_act_ref, grouped_mm_fp8_ref, grouped_mm_wgrad_fp8_t_ref,
                             quantize_1x128, quantize_128x1_t, quantize_128x128)
from ..reference.gemm import grouped_bias_grad_ref
from ..reference.groups import zero_padding
from ..reference.permute import gather_rows_ref
from .checks import (check_contiguous, check_offs_length, check_same_device, check_scales,
                     check_tensor, fail, unit_columns)
from .glu import check_act_bwd_tensors
from .registry import register_kernels

__all__ = ["OPS", "check_quantize_1x128_args", "reference_1x128", "check_act_quantize_1x128_args",
           "reference_act_quantize_1x128", "check_quantize_128x128_args", "reference_128x128",
           "check_quantize_128x1_args", "reference_128x1", "check_quantize_1x128_128x1_args",
           "reference_1x128_128x1",
           "check_quantize_1x128_column_sums_args", "reference_1x128_column_sums",
           "check_grouped_mm_fp8_args", "reference_grouped_mm_fp8", "check_grouped_mm_fp8_act_args",
           "reference_grouped_mm_fp8_act", "check_grouped_mm_fp8_act_quant_args",
           "reference_grouped_mm_fp8_act_quant", "check_grouped_mm_fp8_act_bwd_args",
           "reference_grouped_mm_fp8_act_bwd", "check_grouped_mm_fp8_wgrad_args",
           "reference_grouped_mm_fp8_wgrad"]

OPS = ("quantize_fp8_1x128", "quantize_fp8_128x128", "quantize_fp8_128x1",
       "quantize_fp8_1x128_128x1", "quantize_fp8_1x128_column_sums", "act_quantize_fp8_1x128",
       "grouped_mm_fp8",
       "grouped_mm_fp8_act", "grouped_mm_fp8_act_bwd", "grouped_mm_fp8_wgrad")


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


def check_quantize_1x128_args(x, index=None) -> None:
    """x a bf16 (rows, cols) matrix, cols a multiple of 16; index None or (M,) int32,
    contiguous, on x's device (its values are checked by the kernels: in [0, rows))."""
    op = "quantize_fp8_1x128"
    _bf16(op, "x", x, 2, 1)
    if index is not None:
        check_tensor(op, "index", index, 1, torch.int32)
        check_contiguous(op, "index", index)
        check_same_device(op, "x", x, index=index)


def check_act_quantize_1x128_args(pre, activation, alpha, limit) -> None:
    """pre a bf16 (rows, w) matrix, w a multiple of 16 (32 for a gated activation: h, w / 2
    wide, in 16-byte fp8 rows); the activation's arguments as the fused ops take them."""
    op = "act_quantize_fp8_1x128"
    check_activation(activation, limit, op)
    check_act_params(alpha, limit, op)
    _bf16(op, "pre", pre, 2, 1)
    if is_gated(activation) and pre.shape[1] % 32:
        fail(op, "pre", f"pre.shape[1] (2I) a multiple of 32 for {activation!r} (interleaved "
             "gate/linear pairs; h, I wide, in 16-byte fp8 rows)", f"shape {tuple(pre.shape)}")


def _h_width(pre, activation) -> int:
    return pre.shape[1] // 2 if is_gated(activation) else pre.shape[1]


def _fake_act_1x128(pre, activation, alpha, limit):
    check_act_quantize_1x128_args(pre, activation, alpha, limit)
    cols = _h_width(pre, activation)
    return (pre.new_empty(pre.shape[0], cols, dtype=FP8_DTYPE),
            pre.new_empty(pre.shape[0], _blocks(cols), dtype=torch.float32))


def reference_act_quantize_1x128(pre, activation, alpha, limit):
    """The op's (q, scale) from the reference (its CPU kernel)."""
    check_act_quantize_1x128_args(pre, activation, alpha, limit)
    return act_quantize_1x128(pre, activation, alpha, limit)


def check_quantize_128x128_args(w, as_is: bool, transposed: bool) -> None:
    _bf16("quantize_fp8_128x128", "w", w, 3, 2)
    if not (as_is or transposed):
        fail("quantize_fp8_128x128", "as_is / transposed", "at least one output asked for",
             "both False")


def _blocks(n: int) -> int:
    return (n + 127) // 128


def _fake_1x128(x, index):
    check_quantize_1x128_args(x, index)
    rows = x.shape[0] if index is None else index.shape[0]
    return (x.new_empty(rows, x.shape[1], dtype=FP8_DTYPE),
            x.new_empty(rows, _blocks(x.shape[1]), dtype=torch.float32))


def reference_1x128(x, index=None):
    """The op's outputs from the reference (its CPU kernel, and cute_moe.fp8's fallback): the
    rows gathered first where an index is given (range-checked as the kernels check it)."""
    check_quantize_1x128_args(x, index)
    return quantize_1x128(x if index is None else gather_rows_ref(x, index))


def _transposed_copy(w, e: int, n: int, k: int) -> torch.Tensor:
    """quantize_fp8_128x128's q_t: (E, n, k) e4m3 with each row padded to whole 128-byte lines
    (strides (n * kp, kp, 1), kp = k rounded up to 128), as the CUDA op allocates it (its
    kernel writes rows 128 k at a time, faster into whole lines)."""
    kp = _blocks(k) * 128
    return w.new_empty_strided((e, n, k), (n * kp, kp, 1), dtype=FP8_DTYPE)


def _fake_128x128(w, as_is, transposed):
    check_quantize_128x128_args(w, as_is, transposed)
    e, k, n = w.shape
    none8, none32 = w.new_empty(0, dtype=FP8_DTYPE), w.new_empty(0, dtype=torch.float32)
    return (w.new_empty(e, k, n, dtype=FP8_DTYPE) if as_is else none8,
            w.new_empty(e, _blocks(k), _blocks(n), dtype=torch.float32) if as_is else none32,
            _transposed_copy(w, e, n, k) if transposed else none8,
            w.new_empty(e, _blocks(n), _blocks(k), dtype=torch.float32) if transposed else none32)


def reference_128x128(w, as_is: bool, transposed: bool):
    """The op's outputs from the reference (its CPU kernel, and cute_moe.fp8's fallback)."""
    check_quantize_128x128_args(w, as_is, transposed)
    q, s = quantize_128x128(w)
    none8, none32 = w.new_empty(0, dtype=FP8_DTYPE), w.new_empty(0, dtype=torch.float32)
    if transposed:
        e, k, n = w.shape
        q_t = _transposed_copy(w, e, n, k)
        q_t.copy_(q.transpose(-2, -1))
    return (q if as_is else none8, s if as_is else none32, q_t if transposed else none8,
            s.transpose(-2, -1).contiguous() if transposed else none32)


def check_quantize_128x1_args(x, offs, op: str = "quantize_fp8_128x1") -> None:
    _bf16(op, "x", x, 2, 1)
    check_tensor(op, "offs", offs, 1, torch.int32)
    if offs.shape[0] < 1 or offs.shape[0] > MAX_GROUPS:
        fail(op, "offs", f"1 to {MAX_GROUPS} groups", f"shape {tuple(offs.shape)}")
    check_same_device(op, "x", x, offs=offs)


def _row_blocks(m: int, groups: int) -> int:
    return _blocks(m) + groups


def _fake_128x1(x, offs, tile_scales=False):
    check_quantize_128x1_args(x, offs)
    m, n = x.shape
    b = _row_blocks(m, offs.shape[0])
    return (x.new_empty(n, 128 * b, dtype=FP8_DTYPE),
            x.new_empty(b, _blocks(n) if tile_scales else n, dtype=torch.float32))


def reference_128x1(x, offs, tile_scales=False):
    """The op's outputs from the reference (its CPU kernel, and cute_moe.fp8's fallback)."""
    check_quantize_128x1_args(x, offs)
    return quantize_128x1_t(x, offs, tile_scales)


def check_quantize_1x128_128x1_args(x, offs, index=None) -> None:
    """quantize_fp8_1x128's rules for x and index, quantize_fp8_128x1's for x and offs."""
    check_quantize_1x128_args(x, index)
    check_quantize_128x1_args(x, offs)


def _fake_1x128_128x1(x, offs, tile_scales=False, index=None):
    check_quantize_1x128_128x1_args(x, offs, index)
    rows = x if index is None else x.new_empty(index.shape[0], x.shape[1])  # the sorted rows' shape
    return _fake_1x128(rows, None) + _fake_128x1(rows, offs, tile_scales)


def reference_1x128_128x1(x, offs, tile_scales=False, index=None):
    """quantize_fp8_1x128_128x1's outputs from the reference: (q, scale) of quantize_1x128 and
    (q_t, scale_t) of quantize_128x1, of x[index] where an index is given (range-checked as the
    kernels check it)."""
    check_quantize_1x128_128x1_args(x, offs, index)
    if index is not None:
        x = gather_rows_ref(x, index)
    return quantize_1x128(x) + quantize_128x1_t(x, offs, tile_scales)


def check_quantize_1x128_column_sums_args(x, offs) -> None:
    """x a bf16 (m, n) matrix of rows sorted by group, n a multiple of 16; offs (E,) int32,
    1 <= E <= 65536, on x's device (its values are checked by the kernels)."""
    check_quantize_128x1_args(x, offs, "quantize_fp8_1x128_column_sums")


def _fake_1x128_column_sums(x, offs):
    check_quantize_1x128_column_sums_args(x, offs)
    return _fake_1x128(x, None) + (x.new_empty(offs.shape[0], x.shape[1], dtype=torch.float32),)


def reference_1x128_column_sums(x, offs):
    """quantize_fp8_1x128_column_sums's outputs from the reference: (q, scale) of quantize_1x128
    and each group's fp32 column sums (E, n)."""
    check_quantize_1x128_column_sums_args(x, offs)
    return quantize_1x128(x) + (grouped_bias_grad_ref(x, offs),)


# --- grouped_mm_fp8: the ragged-M FP8 GEMM --------------------------------------------

MAX_GROUPS = 65536  # the core's kMaxGroups


def _non_negative_strides(op: str, name: str, t: torch.Tensor) -> None:
    if any(s < 0 for s in t.stride()):
        fail(op, name, "non-negative strides", f"strides {t.stride()}")


def check_grouped_mm_fp8_args(x, x_scale, w, w_scale, offs, bias=None, row_scale=None,
                              op: str = "grouped_mm_fp8", x_name: str = "x") -> None:
    """The rules of cute_moe::grouped_mm_fp8 (shapes, dtypes, strides, devices):
    x (m, k) e4m3, unit stride along k, k a positive multiple of 16, row stride a multiple
    of 16 elements (16-byte rows) and >= k; x_scale (m, ceil(k / 128)) float32;
    w (E, k, n) e4m3 k-contiguous (w.stride(1) == 1: the transposed view of an (E, n, k)
    tensor), n a positive multiple of 8, w.stride(2) (its row pitch) a multiple of 16 and
    >= k, w.stride(0) a multiple of 16, 1 <= E <= 65536; w_scale (E, ceil(k / 128),
    ceil(n / 128)) float32; offs (E,) int32; bias (E, n) bfloat16 with unit stride along n
    and a row stride that is a multiple of 8; row_scale (m,) float32 contiguous; scales with
    any non-negative strides; one device. A stride along a dimension of size 1 (one row of
    x, one group of w and bias) is free. x_name: what the op calls x (and x_scale)."""
    xs = x_name + "_scale"
    check_tensor(op, x_name, x, 2, FP8_DTYPE)
    check_tensor(op, "w", w, 3, FP8_DTYPE)
    m, k = x.shape
    num_groups, wk, n = w.shape
    if not 1 <= num_groups <= MAX_GROUPS:
        fail(op, "w", f"1 to {MAX_GROUPS} groups along its first dimension (E)",
             f"shape {tuple(w.shape)}")
    if wk != k:
        fail(op, x_name, f"{wk} columns (w.shape[1], k)", f"shape {tuple(x.shape)}")
    if k <= 0 or k % 16:
        fail(op, x_name, "k = x.shape[1] a positive multiple of 16 (16-byte e4m3 rows)",
             f"shape {tuple(x.shape)}")
    if n <= 0 or n % 8:
        fail(op, "w", "n = w.shape[2] a positive multiple of 8 (16-byte bfloat16 output rows)",
             f"shape {tuple(w.shape)}")
    if not unit_columns(x):
        fail(op, x_name, "unit stride along k (call .contiguous())", f"strides {x.stride()}")
    if m > 1 and (x.stride(0) % 16 or x.stride(0) < k):
        fail(op, x_name, f"a row stride that is a multiple of 16 elements and >= k = {k}",
             f"strides {x.stride()}")
    if w.stride(1) != 1:
        fail(op, "w", "w.stride(1) == 1, k-contiguous (FP8 tensor cores read both operands "
             "k-major): a transposed view such as q_t.transpose(-2, -1) of an (E, n, k) "
             "tensor", f"strides {w.stride()}")
    if w.stride(2) % 16 or w.stride(2) < k:
        fail(op, "w", f"w.stride(2) (its row pitch) a multiple of 16 elements and >= k = {k}",
             f"strides {w.stride()}")
    if num_groups > 1 and (w.stride(0) < 0 or w.stride(0) % 16):
        fail(op, "w", "w.stride(0) a non-negative multiple of 16 elements (16-byte aligned "
             "expert matrices)", f"strides {w.stride()}")
    check_offs_length(op, offs, num_groups, "w.shape[0], the number of groups")
    kb, nb = _blocks(k), _blocks(n)
    check_tensor(op, xs, x_scale, 2, torch.float32)
    if tuple(x_scale.shape) != (m, kb):
        fail(op, xs, f"shape {(m, kb)} (m, ceil(k / 128)): one per row and 128 columns "
             "of x", f"shape {tuple(x_scale.shape)}")
    _non_negative_strides(op, xs, x_scale)
    check_tensor(op, "w_scale", w_scale, 3, torch.float32)
    if tuple(w_scale.shape) != (num_groups, kb, nb):
        fail(op, "w_scale", f"shape {(num_groups, kb, nb)} (E, ceil(k / 128), ceil(n / 128)): "
             "one per 128 x 128 block of w", f"shape {tuple(w_scale.shape)}")
    _non_negative_strides(op, "w_scale", w_scale)
    if bias is not None:
        check_tensor(op, "bias", bias, 2, torch.bfloat16)
        if tuple(bias.shape) != (num_groups, n):
            fail(op, "bias", f"shape {(num_groups, n)} (E, n)", f"shape {tuple(bias.shape)}")
        if not unit_columns(bias):
            fail(op, "bias", "unit stride along n (call .contiguous())", f"strides {bias.stride()}")
        if num_groups > 1 and bias.stride(0) % 8:
            fail(op, "bias", "a row stride that is a multiple of 8 elements (16-byte rows)",
                 f"strides {bias.stride()}")
    check_scales(op, "row_scale", row_scale, m, f"one per row of {x_name}", x_name, x)
    if row_scale is not None and m > 1 and row_scale.stride(0) != 1:
        fail(op, "row_scale", "a contiguous tensor (call .contiguous())",
             f"strides {row_scale.stride()}")
    check_same_device(op, x_name, x, **{xs: x_scale}, w=w, w_scale=w_scale, offs=offs, bias=bias)


def reference_grouped_mm_fp8(x, x_scale, w, w_scale, offs, bias=None, row_scale=None,
                             out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The op's output from the reference (its CPU kernel, and cute_moe.fp8's fallback):
    y[r] = row_scale[r] * (deq(x)[r] @ deq(w)[e] + bias[e]) for the rows r of group e, in
    fp32, rounded once to out_dtype (the op's bfloat16; float32 for the value before the
    rounding); rows at or past offs[-1] zero."""
    check_grouped_mm_fp8_args(x, x_scale, w, w_scale, offs, bias, row_scale)
    y = grouped_mm_fp8_ref(x, x_scale, w, w_scale, offs, bias, out_dtype=torch.float32)
    if row_scale is not None:
        y = zero_padding(y * row_scale.float()[:, None], offs)  # padding rows' scales unread
    return y.to(out_dtype)


def _fake_grouped_mm_fp8(x, x_scale, w, w_scale, offs, bias, row_scale):
    check_grouped_mm_fp8_args(x, x_scale, w, w_scale, offs, bias, row_scale)
    return x.new_empty((x.shape[0], w.shape[2]), dtype=torch.bfloat16)


# --- grouped_mm_fp8_act / _bwd: the fused activation epilogues on the FP8 GEMM ----------

def check_grouped_mm_fp8_act_args(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit,
                                  op: str = "grouped_mm_fp8_act") -> None:
    """grouped_mm_fp8's rules (no row_scale) and a fused activation: w's n (the up width 2I,
    columns interleaved (gate, linear) for a gated one) a multiple of 16 when gated."""
    check_activation(activation, limit, op)
    if activation == "none":
        fail(op, "activation", "a fused activation (not 'none': use grouped_mm_fp8)",
             repr(activation))
    check_grouped_mm_fp8_args(x, x_scale, w, w_scale, offs, bias, None, op)
    if is_gated(activation) and w.shape[2] % 16:
        fail(op, "w", f"w.shape[2] (2I) a multiple of 16 for {activation!r} (interleaved "
             "gate/linear pairs, 16-byte rows of h)", f"shape {tuple(w.shape)}")
    check_act_params(alpha, limit, op)


def reference_grouped_mm_fp8_act(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit):
    """The op's (h, pre) from the reference (its CPU kernel)."""
    check_grouped_mm_fp8_act_args(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit)
    return grouped_mm_fp8_act_ref(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit)


def _fake_grouped_mm_fp8_act(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit):
    check_grouped_mm_fp8_act_args(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit)
    m, n = x.shape[0], w.shape[2]
    h = n // 2 if is_gated(activation) else n
    return (x.new_empty(m, h, dtype=torch.bfloat16), x.new_empty(m, n, dtype=torch.bfloat16))


def check_grouped_mm_fp8_act_quant_args(x, x_scale, w, w_scale, offs, bias, activation, alpha,
                                        limit) -> None:
    """grouped_mm_fp8_act's rules for a gated activation, w's n (2I) a multiple of 32 (h, I
    wide, in 16-byte fp8 rows)."""
    op = "grouped_mm_fp8_act_quant"
    check_grouped_mm_fp8_act_args(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit, op)
    if not is_gated(activation):
        fail(op, "activation", "a gated activation (swiglu_oai, swiglu, geglu): the epilogue "
             "quantizes h by 1 x 128 blocks of its (gate, linear) pairs", repr(activation))
    if w.shape[2] % 32:
        fail(op, "w", "w.shape[2] (2I) a multiple of 32 (h, I wide, in 16-byte fp8 rows)",
             f"shape {tuple(w.shape)}")


def reference_grouped_mm_fp8_act_quant(x, x_scale, w, w_scale, offs, bias, activation, alpha,
                                       limit):
    """The op's (h_q, h_scale, pre) from the reference (its CPU kernel): the up projection's
    pre, then act_quantize_1x128's copy of h (rows past offs[-1] from pre's zero rows; the
    kernel leaves them unwritten)."""
    check_grouped_mm_fp8_act_quant_args(x, x_scale, w, w_scale, offs, bias, activation, alpha,
                                        limit)
    _, pre = grouped_mm_fp8_act_ref(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit)
    h_q, h_scale = act_quantize_1x128(pre, activation, alpha, limit)
    return h_q, h_scale, pre


def _fake_grouped_mm_fp8_act_quant(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit):
    check_grouped_mm_fp8_act_quant_args(x, x_scale, w, w_scale, offs, bias, activation, alpha,
                                        limit)
    m, n = x.shape[0], w.shape[2]
    return (x.new_empty(m, n // 2, dtype=FP8_DTYPE),
            x.new_empty(m, _blocks(n // 2), dtype=torch.float32),
            x.new_empty(m, n, dtype=torch.bfloat16))


def check_grouped_mm_fp8_act_bwd_args(dy, dy_scale, w, w_scale, offs, pre, prob, out_bias, dy_bf16,
                                      prob_grad, activation, alpha, limit,
                                      op: str = "grouped_mm_fp8_act_bwd") -> None:
    """grouped_mm_fp8's rules for dy (m, H) e4m3 and w = W_down as the k-contiguous (E, H, I)
    view (n = I); pre (m, 2I or I) bf16 with unit column stride; prob (m,) float32; prob_grad
    needs prob; out_bias (E, H) bf16 only with prob_grad, and then dy_bf16 (dy unquantized,
    (m, H) bf16 with unit column stride) for its term."""
    check_activation(activation, limit, op)
    check_grouped_mm_fp8_args(dy, dy_scale, w, w_scale, offs, None, prob, op, x_name="dy")
    check_act_bwd_tensors(op, dy, w, pre, prob, out_bias, prob_grad, activation)
    if out_bias is not None and dy_bf16 is None:
        fail(op, "dy_bf16", "the unquantized dy (bf16) when out_bias is given (its term of dprob)",
             None)
    if dy_bf16 is not None:
        check_tensor(op, "dy_bf16", dy_bf16, 2, torch.bfloat16)
        if tuple(dy_bf16.shape) != tuple(dy.shape):
            fail(op, "dy_bf16", f"dy's shape {tuple(dy.shape)}", f"shape {tuple(dy_bf16.shape)}")
        if not unit_columns(dy_bf16):
            fail(op, "dy_bf16", "unit column stride (call .contiguous())",
                 f"strides {dy_bf16.stride()}")
    check_same_device(op, "dy", dy, dy_bf16=dy_bf16)
    check_act_params(alpha, limit, op)


def _dpre_fp8_shapes(m: int, width: int, dpre_fp8: bool):
    """The op's dpre_q and dpre_scale shapes: (m, width), (m, ceil(width / 128)), or no rows
    (and dpre_q no columns) without dpre_fp8."""
    rows = m if dpre_fp8 else 0
    return (rows, width if dpre_fp8 else 0), (rows, (width + 127) // 128)


def check_dpre_fp8(dpre_fp8: bool, activation: str) -> None:
    """dpre's e4m3 copy from the epilogue is written for the gated activations only."""
    if dpre_fp8 and not is_gated(activation):
        fail("grouped_mm_fp8_act_bwd", "dpre_fp8", "a gated activation (swiglu_oai, swiglu, geglu)",
             repr(activation))


def reference_grouped_mm_fp8_act_bwd(dy, dy_scale, w, w_scale, offs, pre, prob, out_bias, dy_bf16,
                                     prob_grad, activation, alpha, limit, dpre_fp8=False):
    """The op's (dpre, prob * h, dprob, dpre_q, dpre_scale) from the reference (its CPU kernel);
    dpre_q and dpre_scale empty without dpre_fp8."""
    check_grouped_mm_fp8_act_bwd_args(dy, dy_scale, w, w_scale, offs, pre, prob, out_bias, dy_bf16,
                                      prob_grad, activation, alpha, limit)
    check_dpre_fp8(dpre_fp8, activation)
    out = grouped_mm_fp8_act_bwd_ref(dy, dy_scale, w, w_scale, offs, pre, prob, out_bias, dy_bf16,
                                     prob_grad, activation, alpha, limit, dpre_fp8)
    if dpre_fp8:
        return out
    q_shape, s_shape = _dpre_fp8_shapes(dy.shape[0], pre.shape[1], False)
    return (*out, pre.new_empty(q_shape, dtype=FP8_DTYPE), pre.new_empty(s_shape, dtype=torch.float32))


def _fake_grouped_mm_fp8_act_bwd(dy, dy_scale, w, w_scale, offs, pre, prob, out_bias, dy_bf16,
                                 prob_grad, activation, alpha, limit, dpre_fp8=False):
    check_grouped_mm_fp8_act_bwd_args(dy, dy_scale, w, w_scale, offs, pre, prob, out_bias, dy_bf16,
                                      prob_grad, activation, alpha, limit)
    check_dpre_fp8(dpre_fp8, activation)
    m = dy.shape[0]
    q_shape, s_shape = _dpre_fp8_shapes(m, pre.shape[1], dpre_fp8)
    return (pre.new_empty(pre.shape), pre.new_empty(m, w.shape[2]),
            pre.new_empty(m if prob_grad else 0, dtype=torch.float32),
            pre.new_empty(q_shape, dtype=FP8_DTYPE), pre.new_empty(s_shape, dtype=torch.float32))


# --- grouped_mm_fp8_wgrad: the ragged-K FP8 GEMM (the weight gradients) -------------------

def check_grouped_mm_fp8_wgrad_args(a_t, a_scale, b_t, b_scale, offs) -> None:
    """The rules of cute_moe::grouped_mm_fp8_wgrad: a_t (k, 128 * blocks) and b_t
    (n, 128 * blocks) e4m3 with unit stride along their columns and row strides that are
    multiples of 16 (quantize_fp8_128x1's q_t), k and n positive multiples of 16, blocks >= E;
    a_scale (blocks, k) (one per 128 x 1 block) and b_scale (blocks, ceil(n / 128)) (one per
    128 x 128 block: quantize_fp8_128x1 with tile_scales) float32, contiguous along their last
    dimension; offs (E,) int32, 1 <= E <= 65536; one device."""
    op = "grouped_mm_fp8_wgrad"
    check_tensor(op, "a_t", a_t, 2, FP8_DTYPE)
    check_tensor(op, "b_t", b_t, 2, FP8_DTYPE)
    check_tensor(op, "offs", offs, 1, torch.int32)
    groups = offs.shape[0]
    if not 1 <= groups <= MAX_GROUPS:
        fail(op, "offs", f"1 to {MAX_GROUPS} groups", f"shape {tuple(offs.shape)}")
    (k, cols), n = a_t.shape, b_t.shape[0]
    if cols % 128 or cols // 128 < groups:
        fail(op, "a_t", f"(k, 128 * blocks) with blocks = ceil(m / 128) + E >= E = {groups} "
             "(quantize_fp8_128x1's q_t)", f"shape {tuple(a_t.shape)}")
    if b_t.shape[1] != cols:
        fail(op, "b_t", f"(n, {cols}), as many columns as a_t", f"shape {tuple(b_t.shape)}")
    for name, t, d in (("a_t", a_t, k), ("b_t", b_t, n)):
        if d <= 0 or d % 16:
            fail(op, name, "a positive multiple of 16 rows", f"shape {tuple(t.shape)}")
        if not unit_columns(t):
            fail(op, name, "unit stride along its columns (call .contiguous())",
                 f"strides {t.stride()}")
        if d > 1 and t.stride(0) % 16:
            fail(op, name, "a row stride that is a multiple of 16 elements (16-byte rows)",
                 f"strides {t.stride()}")
    blocks = cols // 128
    for name, t, d, per in (("a_scale", a_scale, k, "column"),
                            ("b_scale", b_scale, _blocks(n), "128 columns (tile_scales)")):
        check_tensor(op, name, t, 2, torch.float32)
        if tuple(t.shape) != (blocks, d):
            fail(op, name, f"shape {(blocks, d)}: one per 128-row block and {per}",
                 f"shape {tuple(t.shape)}")
        if t.stride(0) < 0 or (d > 1 and t.stride(1) != 1):
            fail(op, name, "unit stride along its last dimension and a non-negative row stride",
                 f"strides {t.stride()}")
    check_same_device(op, "a_t", a_t, a_scale=a_scale, b_t=b_t, b_scale=b_scale, offs=offs)


def reference_grouped_mm_fp8_wgrad(a_t, a_scale, b_t, b_scale, offs) -> torch.Tensor:
    """The op's output from the reference (its CPU kernel, and cute_moe.fp8's fallback):
    dw[e] = deq(a_e)^T @ deq(b_e) in fp32 over expert e's blocks, rounded once to bfloat16."""
    check_grouped_mm_fp8_wgrad_args(a_t, a_scale, b_t, b_scale, offs)
    return grouped_mm_wgrad_fp8_t_ref(a_t, a_scale, b_t, b_scale, offs).to(torch.bfloat16)


def _fake_grouped_mm_fp8_wgrad(a_t, a_scale, b_t, b_scale, offs):
    check_grouped_mm_fp8_wgrad_args(a_t, a_scale, b_t, b_scale, offs)
    return a_t.new_empty((offs.shape[0], a_t.shape[0], b_t.shape[0]), dtype=torch.bfloat16)


def _register() -> None:
    register_kernels("quantize_fp8_1x128", _fake_1x128, reference_1x128)
    register_kernels("quantize_fp8_128x128", _fake_128x128, reference_128x128)
    register_kernels("quantize_fp8_128x1", _fake_128x1, reference_128x1)
    register_kernels("quantize_fp8_1x128_128x1", _fake_1x128_128x1, reference_1x128_128x1)
    register_kernels("quantize_fp8_1x128_column_sums", _fake_1x128_column_sums,
                     reference_1x128_column_sums)
    register_kernels("act_quantize_fp8_1x128", _fake_act_1x128, reference_act_quantize_1x128)
    register_kernels("grouped_mm_fp8", _fake_grouped_mm_fp8, reference_grouped_mm_fp8)
    register_kernels("grouped_mm_fp8_act", _fake_grouped_mm_fp8_act, reference_grouped_mm_fp8_act)
    register_kernels("grouped_mm_fp8_act_quant", _fake_grouped_mm_fp8_act_quant,
                     reference_grouped_mm_fp8_act_quant)
    register_kernels("grouped_mm_fp8_act_bwd", _fake_grouped_mm_fp8_act_bwd,
                     reference_grouped_mm_fp8_act_bwd)
    register_kernels("grouped_mm_fp8_wgrad", _fake_grouped_mm_fp8_wgrad,
                     reference_grouped_mm_fp8_wgrad)


if _library.library_loaded():
    _register()

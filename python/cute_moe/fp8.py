"""The FP8 training recipe's kernels (docs/fp8.md), on the GPU: the quantizers (e4m3 values with
one fp32 scale per block, amax and scales computed on the device, no host sync, bit for bit
cute_moe.reference.fp8; and the activation's h from pre, quantized), the ragged-M grouped GEMM
on their outputs and its fused activation forward and backward, the weight-gradient GEMM; and
expert_ffn, the expert block in FP8, built from them (fp8_ffn.py), with reuse_weight_casts, its
weight casts made once per optimizer step (fp8_weight_casts.py). On the CPU or without the op
library, the references run instead."""
from __future__ import annotations

import torch

from . import _library
from .activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from .ops.checks import check_offs_values
from .ops.fp8 import (check_act_quantize_1x128_args, check_dpre_fp8, check_grouped_mm_fp8_act_args,
                      check_grouped_mm_fp8_act_bwd_args, check_grouped_mm_fp8_act_quant_args,
                      check_grouped_mm_fp8_args,
                      check_quantize_128x128_args, check_grouped_mm_fp8_wgrad_args,
                      check_quantize_128x1_args, check_quantize_1x128_128x1_args,
                      check_quantize_1x128_args,
                      check_quantize_1x128_column_sums_args, reference_1x128,
                      reference_128x1, reference_1x128_128x1, reference_1x128_column_sums,
                      reference_128x128,
                      reference_grouped_mm_fp8, reference_grouped_mm_fp8_act,
                      reference_grouped_mm_fp8_act_bwd, reference_grouped_mm_fp8_act_quant,
                      reference_grouped_mm_fp8_wgrad)
from .reference import fp8 as _ref

__all__ = ["quantize_1x128", "quantize_128x128", "quantize_128x1", "quantize_1x128_128x1",
           "quantize_1x128_column_sums", "act_quantize_1x128",
           "grouped_mm", "grouped_mm_act", "grouped_mm_act_quant", "grouped_mm_act_bwd",
           "grouped_mm_wgrad", "expert_ffn",
           "reuse_weight_casts"]


def _op(x: torch.Tensor) -> bool:
    return x.is_cuda and _library.library_loaded()


def quantize_1x128(x: torch.Tensor, index: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, k) bf16 -> e4m3 (rows, k) and fp32 scales (rows, ceil(k / 128)): one per row and
    128 consecutive columns (activations feeding a ragged-M GEMM). k a multiple of 16. With
    index ((M,) int32, values in [0, rows)), the copy of x[index] (M rows) from one pass that
    gathers the rows itself: the bits of quantize_1x128(x[index]) without x[index] in bf16."""
    check_quantize_1x128_args(x, index)
    if _op(x):
        return torch.ops.cute_moe.quantize_fp8_1x128(x, index)
    return reference_1x128(x, index)


def act_quantize_1x128(pre: torch.Tensor, activation: str = DEFAULT_ACTIVATION,
                       alpha: float = DEFAULT_ALPHA, limit: float | None = None):
    """The up projection's activation and h's 1x128 quantization in one pass over pre:
    (rows, w) bf16 -> quantize_1x128(h) with h = act(pre) computed in fp32 from pre and
    rounded to bf16 (the h grouped_mm_act writes beside pre, so the same bits): e4m3
    (rows, cols) and fp32 scales (rows, ceil(cols / 128)). A gated activation reads pre's
    columns as interleaved (gate, linear) pairs, cols = w / 2 (w a multiple of 32); else
    cols = w. limit taken literally (None: no clamp)."""
    check_act_quantize_1x128_args(pre, activation, alpha, limit)
    if _op(pre):
        return torch.ops.cute_moe.act_quantize_fp8_1x128(pre, activation, alpha, limit)
    return _ref.act_quantize_1x128(pre, activation, alpha, limit)


def quantize_128x128(w: torch.Tensor, as_is: bool = True, transposed: bool = False):
    """(E, k, n) bf16 weights -> (q, scale, q_t, scale_t): e4m3 (E, k, n) with fp32 scales
    (E, ceil(k / 128), ceil(n / 128)) when as_is, and the transposed copy (E, n, k) with
    scales (E, ceil(n / 128), ceil(k / 128)) when transposed (the operand of the other GEMM),
    from one pass over w; what was not asked for comes back empty. k, n multiples of 16."""
    check_quantize_128x128_args(w, as_is, transposed)
    if _op(w):
        return torch.ops.cute_moe.quantize_fp8_128x128(w, as_is, transposed)
    return reference_128x128(w, as_is, transposed)


def quantize_128x1(x: torch.Tensor, offs: torch.Tensor,
                   tile_scales: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, n) bf16 routed rows sorted by expert (offs (E,) int32 cumulative end rows) -> the
    operand of a weight-gradient GEMM (reduction along the rows): q_t e4m3 (n, 128 * blocks)
    and fp32 scales (blocks, n), blocks = ceil(m / 128) + E, one scale per column and 128 rows
    of one expert (tile_scales: one per 128 columns of those rows, scales (blocks,
    ceil(n / 128))). Expert e's rows are cut into ceil(rows_e / 128) blocks numbered after those
    of the experts before it; block b's rows sit transposed in columns 128 b .. 128 b + 127 of
    q_t (zeros after the expert's last row), so every expert starts on a 128-column boundary
    and q_t is k-major for the FP8 tensor cores. Blocks no expert uses are zero with scale 1;
    padding rows are not read. n a multiple of 16. No host sync on CUDA."""
    check_quantize_128x1_args(x, offs)
    if _op(x):
        return torch.ops.cute_moe.quantize_fp8_128x1(x, offs, tile_scales)
    return reference_128x1(x, offs, tile_scales)


def quantize_1x128_128x1(x: torch.Tensor, offs: torch.Tensor, tile_scales: bool = False,
                         index: torch.Tensor | None = None):
    """quantize_1x128(x) and quantize_128x1(x, offs, tile_scales) from one read of x: (q, scale,
    q_t, scale_t), the same bits as the two calls. For an operand that feeds both an
    input-gradient GEMM (by 1 x 128 blocks) and a weight gradient (by 128 x 1 or 128 x 128
    blocks of each group's rows). With index ((M,) int32, values in [0, rows)), the copies of
    x[index] (M rows sorted by group: the dispatch's gather) from one pass that gathers the rows
    itself, without x[index] in bf16."""
    check_quantize_1x128_128x1_args(x, offs, index)
    if _op(x):
        return torch.ops.cute_moe.quantize_fp8_1x128_128x1(x, offs, tile_scales, index)
    return reference_1x128_128x1(x, offs, tile_scales, index)


def quantize_1x128_column_sums(x: torch.Tensor, offs: torch.Tensor):
    """quantize_1x128(x) and each group's column sums from one read of x: (q, scale, sums), sums
    (E, n) float32 with sums[e] = the sum of group e's rows (offs (E,) int32 cumulative end rows;
    rows past offs[-1] quantized, not summed; an empty group's sums zero), the same bits as
    quantize_1x128(x) and the bias-gradient column sums (deterministic: a fixed order, no
    atomics). In the FP8 block, dpre's copy for the up projection's input gradient and the
    gradient of its bias. n a multiple of 16. No host sync on CUDA."""
    check_quantize_1x128_column_sums_args(x, offs)
    if _op(x):
        return torch.ops.cute_moe.quantize_fp8_1x128_column_sums(x, offs)
    return reference_1x128_column_sums(x, offs)


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


def grouped_mm_wgrad(a_t: torch.Tensor, a_scale: torch.Tensor, b_t: torch.Tensor,
                     b_scale: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The FP8 weight gradient (ragged-K grouped GEMM): dw[e] = deq(a_e)^T @ deq(b_e), an
    (k, n) fp32 sum over expert e's routed rows rounded once to bfloat16, (E, k, n); empty
    experts exactly zero. a_t, a_scale = quantize_128x1(a) and b_t, b_scale =
    quantize_128x1(b, tile_scales=True) for the (m, k) and (m, n) row-sorted operands (e.g. x
    and dpre for the up projection's weight): e4m3 (k, 128 * blocks) and (n, 128 * blocks),
    scales (blocks, k) and (blocks, ceil(n / 128)), blocks = ceil(m / 128) + E. No host sync
    on CUDA."""
    check_grouped_mm_fp8_wgrad_args(a_t, a_scale, b_t, b_scale, offs)
    # the copies of m rows hold ceil(m / 128) + E blocks: offs within the largest such m
    check_offs_values("grouped_mm_fp8_wgrad", offs, 128 * (a_scale.shape[0] - offs.shape[0]),
                      "a_t's rows (128 * (blocks - E))")
    if _op(a_t):
        return torch.ops.cute_moe.grouped_mm_fp8_wgrad(a_t, a_scale, b_t, b_scale, offs)
    return reference_grouped_mm_fp8_wgrad(a_t, a_scale, b_t, b_scale, offs)


def grouped_mm_act(x: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                   offs: torch.Tensor, bias: torch.Tensor | None = None, *,
                   activation: str = DEFAULT_ACTIVATION, alpha: float = DEFAULT_ALPHA,
                   limit: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 up projection with its activation in the epilogue, one kernel: for the rows r
    of group e, pre[r] = deq(x)[r] @ deq(w)[e] + bias[e] (fp32 math, rounded once to bf16) and
    h[r] = act(pre[r]) computed from the rounded pre (bf16). Returns (h, pre); rows at or past
    offs[-1] zero. Operands as grouped_mm's (no row_scale); w's n columns are the up width,
    for a gated activation ("swiglu_oai", "swiglu", "geglu") interleaved (column 2j gate j,
    2j + 1 linear j), n a multiple of 16, and h is n / 2 wide. activation: a fused one (not
    "none"); limit taken literally (None: no clamp; cute_moe.expert_ffn resolves defaults).
    Without autograd (cute_moe.fp8.expert_ffn builds the block on it)."""
    check_grouped_mm_fp8_act_args(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit)
    check_offs_values("grouped_mm_fp8_act", offs, x.shape[0], "x")
    return grouped_mm_act_unchecked(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit)


def grouped_mm_act_unchecked(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit):
    if _op(x):
        return torch.ops.cute_moe.grouped_mm_fp8_act(x, x_scale, w, w_scale, offs, bias, activation,
                                                     alpha, limit)
    return reference_grouped_mm_fp8_act(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit)


def grouped_mm_act_quant(x: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor,
                         w_scale: torch.Tensor, offs: torch.Tensor, bias: torch.Tensor | None = None,
                         *, activation: str = DEFAULT_ACTIVATION, alpha: float = DEFAULT_ALPHA,
                         limit: float | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """grouped_mm_act with h written by the same epilogue as its 1 x 128 e4m3 copy instead of
    bf16 (the down projection's operand; no pass over pre): returns (h_q, h_scale, pre), h_q
    (m, n / 2) e4m3 and h_scale (m, ceil(n / 256)) fp32, bit for bit
    act_quantize_1x128(pre, activation, alpha, limit) on the rows of the groups (rows at or past
    offs[-1] are left unwritten by the kernel). Gated activations only, n a multiple of 32.
    The kernel runs 1 x 2 clusters: the two CTAs of a block of h exchange its rows' amax."""
    check_grouped_mm_fp8_act_quant_args(x, x_scale, w, w_scale, offs, bias, activation, alpha,
                                        limit)
    check_offs_values("grouped_mm_fp8_act_quant", offs, x.shape[0], "x")
    return grouped_mm_act_quant_unchecked(x, x_scale, w, w_scale, offs, bias, activation, alpha,
                                          limit)


def grouped_mm_act_quant_unchecked(x, x_scale, w, w_scale, offs, bias, activation, alpha, limit):
    if _op(x):
        return torch.ops.cute_moe.grouped_mm_fp8_act_quant(x, x_scale, w, w_scale, offs, bias,
                                                           activation, alpha, limit)
    return reference_grouped_mm_fp8_act_quant(x, x_scale, w, w_scale, offs, bias, activation,
                                              alpha, limit)


def grouped_mm_act_bwd(dy: torch.Tensor, dy_scale: torch.Tensor, w: torch.Tensor,
                       w_scale: torch.Tensor, offs: torch.Tensor, pre: torch.Tensor,
                       prob: torch.Tensor | None = None, out_bias: torch.Tensor | None = None,
                       dy_bf16: torch.Tensor | None = None, prob_grad: bool = False, *,
                       activation: str = DEFAULT_ACTIVATION, alpha: float = DEFAULT_ALPHA,
                       limit: float | None = None, dpre_fp8: bool = False):
    """The FP8 down projection's input gradient with the activation's backward in the epilogue,
    one kernel (cute_moe.grouped_mm_act_bwd's contract with dy in FP8): with u = deq(dy) @
    deq(w)[e] in fp32 (w = W_down (E, I, H) quantized 128 x 128 and read as its k-contiguous
    (E, H, I) view, e.g. ``q.transpose(-2, -1)`` of quantize_128x128(W_down)'s as-is copy),
    p = prob[r] (1 where absent): dpre = act'(pre) * p * u (bf16, pre's width and
    layout), hp = p * act(pre) (bf16, I wide; the down projection's weight-gradient operand),
    and with prob_grad dprob = sum_j act(pre) * u + dy_bf16 . out_bias[e] (float32; out_bias's
    term needs dy_bf16, the unquantized dy). Returns (dpre, hp, dprob), dprob empty without
    prob_grad; padding rows zero. With dpre_fp8 (gated activations) the epilogue also writes
    dpre's 1 x 128 copy, the up projection's input-gradient operand, bit for bit
    quantize_1x128(dpre) on the groups' rows (past offs[-1] unwritten): returns (dpre, hp, dprob,
    dpre_q, dpre_scale). (On an H100 the copy costs the kernel more than quantize_1x128 costs.)"""
    check_grouped_mm_fp8_act_bwd_args(dy, dy_scale, w, w_scale, offs, pre, prob, out_bias, dy_bf16,
                                      prob_grad, activation, alpha, limit)
    check_offs_values("grouped_mm_fp8_act_bwd", offs, dy.shape[0], "dy")
    check_dpre_fp8(dpre_fp8, activation)
    return grouped_mm_act_bwd_unchecked(dy, dy_scale, w, w_scale, offs, pre, prob, out_bias,
                                        dy_bf16, prob_grad, activation, alpha, limit, dpre_fp8)


def grouped_mm_act_bwd_unchecked(dy, dy_scale, w, w_scale, offs, pre, prob, out_bias, dy_bf16,
                                 prob_grad, activation, alpha, limit, dpre_fp8=False):
    if _op(dy):
        out = torch.ops.cute_moe.grouped_mm_fp8_act_bwd(dy, dy_scale, w, w_scale, offs, pre, prob,
                                                        out_bias, dy_bf16, prob_grad, activation,
                                                        alpha, limit, dpre_fp8)
    else:
        out = reference_grouped_mm_fp8_act_bwd(dy, dy_scale, w, w_scale, offs, pre, prob, out_bias,
                                               dy_bf16, prob_grad, activation, alpha, limit,
                                               dpre_fp8)
    return out if dpre_fp8 else out[:3]


# last: fp8_ffn and fp8_weight_casts build on the functions above
from .fp8_ffn import expert_ffn  # noqa: E402
from .fp8_weight_casts import reuse_weight_casts  # noqa: E402

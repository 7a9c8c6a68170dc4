"""The FP8 training recipe's quantizers and GEMMs, in PyTorch (docs/fp8.md): the ground truth
the FP8 kernels are held to (each FP8 GEMM against these on the same quantized inputs)."""
# e4m3 values with one fp32 scale per block: x ~= q * scale, scale = amax(block) / 448 (1 for
# an all-zero block), so the block's largest magnitude lands on e4m3's largest finite value.
# Three block shapes, each along the reduction dimension of the GEMM that consumes it:
#   1 x 128     activations and gradients feeding a ragged-M GEMM (reduction along columns)
#   128 x 128   weights (either GEMM reads them, so both dimensions are blocked)
#   128 x 1     activations and gradients feeding a weight gradient (reduction along rows);
#               the row blocks start at each group's first row, so no block straddles two
#               experts: group e has ceil(rows_e / 128) blocks, after those of groups < e.
from __future__ import annotations

import torch

from .groups import group_bounds

__all__ = ["FP8_DTYPE", "FP8_MAX", "BLOCK", "quantize_1x128", "dequantize_1x128",
           "quantize_128x128", "dequantize_128x128", "group_row_blocks", "quantize_128x1",
           "dequantize_128x1", "grouped_mm_fp8_ref", "grouped_mm_wgrad_fp8_ref",
           "grouped_mm_fp8_act_ref", "grouped_mm_fp8_act_bwd_ref", "quantize_128x1_t",
           "dequantize_128x1_t", "grouped_mm_wgrad_fp8_t_ref"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite magnitude
BLOCK = 128


def _scale(amax: torch.Tensor) -> torch.Tensor:
    # a tensor divisor on purpose: CUDA torch turns division by a Python scalar into a
    # multiplication by its reciprocal, which differs from amax / 448 in the last bit
    return torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))


def _cast(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # x / scale is within [-448, 448] by construction; the clamp only absorbs rounding
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _blocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


def _pad_cols(x: torch.Tensor) -> torch.Tensor:
    pad = _blocks(x.shape[-1]) * BLOCK - x.shape[-1]
    return torch.nn.functional.pad(x, (0, pad)) if pad else x


def quantize_1x128(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, k) -> e4m3 (rows, k) and fp32 scales (rows, ceil(k / 128)): one per row and
    128 consecutive columns (a last, shorter block where k is not a multiple of 128)."""
    if x.dim() != 2:
        raise ValueError(f"quantize_1x128: expected a 2-D (rows, k) tensor, got shape {tuple(x.shape)}")
    rows, k = x.shape
    xp = _pad_cols(x.float()).view(rows, _blocks(k), BLOCK)
    scale = _scale(xp.abs().amax(dim=-1))
    q = _cast(xp, scale[..., None]).view(rows, _blocks(k) * BLOCK)[:, :k]
    return q.contiguous(), scale


def act_quantize_1x128(pre: torch.Tensor, activation: str = "swiglu_oai", alpha: float = 1.702,
                       limit: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h = act(pre) (fp32 math on the bf16 pre, rounded to bf16: the fused up projection's h),
    then quantize_1x128(h) (cute_moe::act_quantize_fp8_1x128): the down projection's operand
    from one pass over pre. Gated activations read pre's interleaved (gate, linear) columns."""
    from .activation import act_ref
    return quantize_1x128(act_ref(pre, activation, alpha, limit).to(torch.bfloat16))


def dequantize_1x128(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of quantize_1x128's output."""
    rows, k = q.shape
    blocks = _pad_cols(q.float()).view(rows, _blocks(k), BLOCK) * scale[..., None]
    return blocks.view(rows, _blocks(k) * BLOCK)[:, :k]


def quantize_128x128(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., k, n) -> e4m3 (..., k, n) and fp32 scales (..., ceil(k / 128), ceil(n / 128))."""
    if w.dim() < 2:
        raise ValueError(f"quantize_128x128: expected a (..., k, n) tensor, got shape {tuple(w.shape)}")
    *lead, k, n = w.shape
    kb, nb = _blocks(k), _blocks(n)
    wp = torch.nn.functional.pad(w.float(), (0, nb * BLOCK - n, 0, kb * BLOCK - k))
    tiles = wp.reshape(*lead, kb, BLOCK, nb, BLOCK)
    scale = _scale(tiles.abs().amax(dim=(-3, -1)))
    q = _cast(tiles, scale[..., :, None, :, None]).reshape(*lead, kb * BLOCK, nb * BLOCK)
    return q[..., :k, :n].contiguous(), scale


def dequantize_128x128(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of quantize_128x128's output."""
    *lead, k, n = q.shape
    full = scale.repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)
    return q.float() * full[..., :k, :n]


def group_row_blocks(offs: torch.Tensor, m: int) -> list[tuple[int, int, int]]:
    """(first row, end row, first scale block) of every group's 128-row blocks: group e's
    blocks come after those of the groups before it, ceil(rows_e / 128) of them. At most
    ceil(m / 128) + groups blocks in all: the size the kernels allocate, the host knowing no
    routing."""
    out, block = [], 0
    for start, end in group_bounds(offs, m):
        out.append((start, end, block))
        block += _blocks(end - start)
    return out


def quantize_128x1(x: torch.Tensor, offs: torch.Tensor,
                   tile_scales: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, n) routed rows sorted by expert -> e4m3 (m, n) and fp32 scales
    (ceil(m / 128) + groups, n): one per column and 128 rows of one group, the blocks of each
    group starting at its first row (group_row_blocks). Unused scale rows are 1; padding
    rows (at or past offs[-1]) quantize to zero. tile_scales: one scale per 128 columns of such
    a block instead (its amax over them), scales (ceil(m / 128) + groups, ceil(n / 128))."""
    if x.dim() != 2:
        raise ValueError(f"quantize_128x1: expected a 2-D (m, n) tensor, got shape {tuple(x.shape)}")
    m, n = x.shape
    q = torch.zeros(m, n, dtype=FP8_DTYPE, device=x.device)
    scale = torch.ones(_blocks(m) + offs.numel(), _blocks(n) if tile_scales else n, dtype=torch.float32,
                       device=x.device)
    for start, end, first in group_row_blocks(offs, m):
        for b, r in enumerate(range(start, end, BLOCK)):
            rows = x[r:min(r + BLOCK, end)].float()
            amax = rows.abs().amax(dim=0)
            if tile_scales:
                s = _scale(_pad_cols(amax[None])[0].view(-1, BLOCK).amax(dim=1))
                scale[first + b] = s
                s = s.repeat_interleave(BLOCK)[:n]
            else:
                s = _scale(amax)
                scale[first + b] = s
            q[r:r + rows.shape[0]] = _cast(rows, s)
    return q, scale


def quantize_128x1_t(x: torch.Tensor, offs: torch.Tensor,
                     tile_scales: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_128x1 laid out for the weight-gradient GEMM, which reads both operands k-major
    (the routed rows contiguous): q_t (n, 128 * blocks) e4m3 with block b's rows in columns
    128 b .. 128 b + 127 (zeros after its group's last row, and in the blocks no group uses),
    and the same scale (blocks, n) (tile_scales: (blocks, ceil(n / 128))), blocks =
    ceil(m / 128) + groups."""
    q, scale = quantize_128x1(x, offs, tile_scales)
    m, n = x.shape
    q_t = torch.zeros(n, BLOCK * scale.shape[0], dtype=FP8_DTYPE, device=x.device)
    for start, end, first in group_row_blocks(offs, m):
        for b, r in enumerate(range(start, end, BLOCK)):
            stop = min(r + BLOCK, end)
            col = BLOCK * (first + b)
            q_t[:, col:col + stop - r] = q[r:stop].T
    return q_t, scale


def dequantize_128x1_t(q_t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 (n, 128 * blocks) values of quantize_128x1_t's output (each column block times its
    scale row; a (blocks, ceil(n / 128)) scale of tile_scales covers 128 rows of q_t each)."""
    n = q_t.shape[0]
    if scale.shape[1] != n:
        scale = scale.repeat_interleave(BLOCK, dim=1)[:, :n]
    return q_t.float() * scale.t().repeat_interleave(BLOCK, dim=1)


def dequantize_128x1(q: torch.Tensor, scale: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """fp32 values of quantize_128x1's output (padding rows zero)."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for start, end, first in group_row_blocks(offs, q.shape[0]):
        for b, r in enumerate(range(start, end, BLOCK)):
            stop = min(r + BLOCK, end)
            out[r:stop] = q[r:stop].float() * scale[first + b]
    return out


def grouped_mm_fp8_ref(xq, x_scale, wq, w_scale, offs, bias=None, out_dtype=torch.float32):
    """Ragged-M FP8 GEMM: y[rows of e] = deq(x)[rows of e] @ deq(w)[e] (+ bias[e]), x by
    1 x 128 blocks (m, k), w by 128 x 128 blocks (E, k, n); fp32 math, padding rows zero.
    What the kernel computes, up to the order of its fp32 sums."""
    from .gemm import grouped_mm_ref
    x = dequantize_1x128(xq, x_scale)
    w = dequantize_128x128(wq, w_scale)
    return grouped_mm_ref(x, w, offs, None if bias is None else bias.float(), out_dtype=out_dtype)


def grouped_mm_wgrad_fp8_ref(aq, a_scale, bq, b_scale, offs, out_dtype=torch.float32):
    """Ragged-K FP8 weight gradient: dW[e] = deq(a)[rows of e]^T @ deq(b)[rows of e], both
    (m, .) by 128 x 1 blocks of their group's rows; empty experts exactly zero."""
    from .gemm import grouped_mm_wgrad_ref
    a = dequantize_128x1(aq, a_scale, offs)
    b = dequantize_128x1(bq, b_scale, offs)
    return grouped_mm_wgrad_ref(a, b, offs, out_dtype=out_dtype)


def grouped_mm_wgrad_fp8_t_ref(a_t, a_scale, b_t, b_scale, offs) -> torch.Tensor:
    """grouped_mm_wgrad_fp8_ref on quantize_128x1_t's transposed copies: dw[e] (k, n) fp32 =
    deq(a_t)[:, cols_e] @ deq(b_t)[:, cols_e]^T over the columns of expert e's blocks (zeros
    past its last row in both); empty experts exactly zero. The copies of m rows hold
    ceil(m / 128) + E blocks, so offs is checked against m = 128 * (blocks - E)."""
    a, b = dequantize_128x1_t(a_t, a_scale), dequantize_128x1_t(b_t, b_scale)
    groups = offs.shape[0]
    out = torch.zeros(groups, a_t.shape[0], b_t.shape[0], dtype=torch.float32, device=a_t.device)
    m = BLOCK * (a_scale.shape[0] - groups)
    for e, (start, end, first) in enumerate(group_row_blocks(offs, m)):
        cols = slice(BLOCK * first, BLOCK * (first + _blocks(end - start)))
        out[e] = a[:, cols] @ b[:, cols].T
    return out


def grouped_mm_fp8_act_ref(xq, x_scale, wq, w_scale, offs, bias=None, activation="swiglu_oai",
                           alpha=1.702, limit=None):
    """The FP8 up projection with its activation (cute_moe::fp8_act_forward): pre =
    round_bf16(deq(x) @ deq(w)[e] + bias[e]) (fp32 math), h = round_bf16(act(pre)) from the
    rounded pre; padding rows zero. Returns (h, pre), bf16; w's columns interleaved for a
    gated activation."""
    from .activation import act_ref
    from .groups import zero_padding
    pre = grouped_mm_fp8_ref(xq, x_scale, wq, w_scale, offs, bias).to(torch.bfloat16)
    return zero_padding(act_ref(pre, activation, alpha, limit).to(torch.bfloat16), offs), pre


def grouped_mm_fp8_act_bwd_ref(dyq, dy_scale, wq, w_scale, offs, pre, prob=None, out_bias=None,
                               dy=None, prob_grad=False, activation="swiglu_oai", alpha=1.702,
                               limit=None, dpre_fp8=False):
    """The FP8 down projection's input gradient with the activation's backward
    (cute_moe::fp8_act_backward): u = deq(dy) @ deq(w)[e] (fp32; w = W_down as (E, H, I)), then
    the bf16 kernel's epilogue (reference.glu.act_bwd_epilogue_ref; dy, the unquantized
    gradient, is read for out_bias's term of dprob). Returns (dpre, p * h, dprob), and with
    dpre_fp8 also dpre's 1 x 128 copy (quantize_1x128 of the bf16 dpre: dpre_q, dpre_scale)."""
    from .glu import act_bwd_epilogue_ref
    u = grouped_mm_fp8_ref(dyq, dy_scale, wq, w_scale, offs)
    out = act_bwd_epilogue_ref(u, dy, offs, pre, None, prob, out_bias, prob_grad, activation,
                               alpha, limit)
    return (*out, *quantize_1x128(out[0])) if dpre_fp8 else out

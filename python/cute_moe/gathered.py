# The expert up projection over gathered token rows: the MoE dispatch's gather fused into
# the GEMM's A load (cute_moe::grouped_mm_act_gathered), so the (M, H) sorted copy of the
# tokens is never made. On the H200 it is slower than gathering first (docs/perf-notes.md:
# the cp.async row loads are issue-bound in the kernel's two loader warps), so the MoE
# layer does not use it; it is the route that saves that copy's memory.
from __future__ import annotations

import torch

from . import _ops
from ._checks import check_grouped_mm_act_gathered_args
from .expert_ffn import _param_grads, _scaled_mm
from .reference import act_bwd_ref, grouped_mm_act_gathered_ref

__all__ = ["grouped_mm_act_gathered"]


class _GatheredUpProj(torch.autograd.Function):
    """(x, rows, w, offs, bias, scale) -> (h, pre) over the rows x[rows]."""

    @staticmethod
    def forward(ctx, x, rows, w, offs, bias, scale, activation, alpha, limit):
        h, pre = torch.ops.cute_moe.grouped_mm_act_gathered(x, rows, w, offs, bias, scale,
                                                            activation, alpha, limit)
        ctx.set_materialize_grads(False)
        ctx.act = (activation, alpha, limit)
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.save_for_backward(x, rows, w, offs, bias, scale, pre)
        return h, pre

    @staticmethod
    def backward(ctx, grad_h, grad_pre):
        x, rows, w, offs, bias, scale, pre = ctx.saved_tensors
        dpre = grad_pre
        if grad_h is not None:
            d = act_bwd_ref(grad_h, pre, *ctx.act)
            dpre = d if grad_pre is None else d + grad_pre.to(d.dtype)
        if dpre is None:
            return (None,) * 9
        dpre = dpre.to(pre.dtype).contiguous()
        need_x, _, need_w, _, need_b, need_scale = ctx.needs_input_grad[:6]
        dx = None
        if need_x:
            # each token's rows summed in fp32 (index_add_: atomics, so not bitwise
            # deterministic on CUDA)
            dxs = _scaled_mm(dpre, w.transpose(-2, -1), offs, None, scale)
            dx = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
            dx = dx.index_add_(0, rows.long(), dxs.float()).to(x.dtype)
        xs = None
        if need_w or need_scale:
            xs = torch.ops.cute_moe.gather_rows(x, rows, None) if x.is_cuda else x[rows.long()]
        dw, db, dscale = _param_grads(xs, dpre, offs, w, need_w,
                                      ctx.bias_dtype if need_b else None, scale, need_scale)
        return dx, None, dw, None, db, dscale, None, None, None


def grouped_mm_act_gathered(x: torch.Tensor, rows: torch.Tensor, w: torch.Tensor,
                            offs: torch.Tensor, bias: torch.Tensor | None = None,
                            scale: torch.Tensor | None = None, activation: str = "swiglu",
                            alpha: float = 1.702, limit: float | None = None):
    """The up projection of an expert FFN over gathered rows: with xs = x[rows],
    pre = scale[e] * (xs[rows_e] @ w[e]) + bias[e] and h = act(pre), for routed rows
    sorted by expert (offs as in grouped_mm). Returns (h, pre), equal bit for bit to
    cute_moe::grouped_mm_act on x[rows].

    x: (T, H) bf16 tokens; rows: (M,) int32 on x's device, the token of each routed row
    (values in [0, T): checked on the device); w: (E, H, N) bf16, row-major per expert;
    bias (E, N), scale (E,) float32 optional; activation one of swiglu_oai, swiglu,
    geglu, srelu. Differentiable in x, w, bias and scale. Without the compiled op it runs
    the reference (x[rows] then grouped_mm_act) under plain autograd."""
    check_grouped_mm_act_gathered_args(x, rows, w, offs, bias, scale, activation, alpha, limit)
    if _ops.GATHER_REGISTERED:
        return _GatheredUpProj.apply(x, rows, w, offs, bias, scale, activation, alpha, limit)
    return grouped_mm_act_gathered_ref(x, rows, w, offs, bias, scale, activation, alpha, limit)

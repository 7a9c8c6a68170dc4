# Fused MoE expert FFN with the GPT-OSS SwiGLU (design.md 2-3), the API of seed 000:
# grouped_mm_swiglu runs the up projection, bias and activation in one grouped GEMM and
# also returns the pre-activations; grouped_mm_downproj, handed those, runs the SwiGLU
# backward inside the down projection's input-gradient GEMM and recomputes the
# activation there instead of keeping it. The autograd spans both calls, so it lives in
# two autograd.Functions here rather than on the ops. Ops the library lacks are replaced
# by the references, under the same autograd.
from __future__ import annotations

import warnings

import torch

from . import _ops
from ._checks import (check_grouped_mm_args, check_grouped_mm_swiglu_args, check_pre_args,
                      check_swiglu_params)
from .functional import grouped_mm
from .reference import (grouped_bias_grad_ref, grouped_mm_ref, grouped_mm_swiglu_bwd_ref,
                        grouped_mm_swiglu_ref, grouped_mm_wgrad_ref, swiglu_oai_bwd_ref,
                        swiglu_oai_ref)

__all__ = ["grouped_mm_swiglu", "grouped_mm_downproj"]

_UP_NAMES = {"w": "W_up", "alpha": "swiglu_alpha", "limit": "swiglu_limit"}
_DOWN_NAMES = {"x": "swiglu_out", "w": "W_down", "alpha": "swiglu_alpha",
               "limit": "swiglu_limit"}


def _mm(a, w, offs, bias=None):
    if _ops.REGISTERED:
        return torch.ops.cute_moe.grouped_mm(a, w, offs, bias)
    return grouped_mm_ref(a, w, offs, bias)


def _swiglu_fwd(x, w, offs, bias, alpha, limit):
    if _ops.SWIGLU_REGISTERED:
        return torch.ops.cute_moe.grouped_mm_swiglu(x, w, offs, bias, alpha, limit)
    return grouped_mm_swiglu_ref(x, w, offs, bias, alpha, limit)


def _swiglu_bwd(dy, w, offs, pre, alpha, limit):
    if _ops.SWIGLU_REGISTERED:
        return torch.ops.cute_moe.grouped_mm_swiglu_bwd(dy, w, offs, pre, alpha, limit)
    return grouped_mm_swiglu_bwd_ref(dy, w, offs, pre, alpha, limit)


def _param_grads(a, dy, offs, w_transposed, w_dtype, need_w, bias_dtype):
    """Gradients of w and bias in y[rows_e] = a[rows_e] @ w[e] + bias[e]: dw with the
    weight's layout (the transposed view of an (E, N, K) gradient for a transposed
    weight), db in bias_dtype, or None where not needed (bias_dtype None)."""
    need_b = bias_dtype is not None
    dw = db = None
    if _ops.REGISTERED:
        ops = torch.ops.cute_moe
        if need_w and not w_transposed:
            dw, db = ops.grouped_mm_wgrad(a, dy, offs, w_dtype, need_b)
        elif need_w:
            dw = ops.grouped_mm_wgrad(dy, a, offs, w_dtype)[0].transpose(-2, -1)
        if need_b and (w_transposed or not need_w):
            db = ops.grouped_column_sum(dy, offs)
    else:
        if need_w and not w_transposed:
            dw = grouped_mm_wgrad_ref(a, dy, offs, w_dtype)
        elif need_w:
            dw = grouped_mm_wgrad_ref(dy, a, offs, w_dtype).transpose(-2, -1)
        if need_b:
            db = grouped_bias_grad_ref(dy, offs)
    return dw, db.to(bias_dtype) if need_b else None


class _UpProj(torch.autograd.Function):
    """(x, W_up, offs, b_up) -> (h, pre). Backward takes the gradient of pre (from
    _DownProj) and, when h also feeds something else, adds the SwiGLU backward of h's
    gradient computed from pre, recomputed."""

    @staticmethod
    def forward(ctx, x, w, offs, bias, alpha, limit):
        h, pre = _swiglu_fwd(x, w, offs, bias, alpha, limit)
        ctx.set_materialize_grads(False)
        ctx.alpha, ctx.limit = alpha, limit
        ctx.w_transposed = w.stride(2) != 1
        ctx.w_dtype = w.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        # pre is NOT kept here: in the fused route _DownProj keeps it and frees it after its
        # backward, before this backward allocates dW_up (1 GiB less at the peak for
        # GPT-OSS-20B). The unfused route recomputes it (x, W_up, bias are inputs: saving
        # them costs nothing).
        ctx.save_for_backward(x, w, offs, bias)
        return h, pre

    @staticmethod
    def backward(ctx, grad_h, grad_pre):
        x, w, offs, bias = ctx.saved_tensors
        dpre = grad_pre
        if grad_h is not None:  # swiglu_out took gradient outside the fused route
            pre = _swiglu_fwd(x, w, offs, bias, ctx.alpha, ctx.limit)[1]  # same bits as the forward's
            d = swiglu_oai_bwd_ref(grad_h, pre, ctx.alpha, ctx.limit)
            dpre = (d if grad_pre is None else d + grad_pre.to(d.dtype)).to(pre.dtype)
        if dpre is None:
            return (None,) * 6
        dpre = dpre.contiguous()
        need_x, need_w, _, need_b = ctx.needs_input_grad[:4]
        dx = _mm(dpre, w.transpose(-2, -1), offs) if need_x else None
        dw, db = _param_grads(x, dpre, offs, ctx.w_transposed, ctx.w_dtype, need_w,
                              ctx.bias_dtype if need_b else None)
        return dx, dw, None, db, None, None


class _DownProj(torch.autograd.Function):
    """(h, W_down, offs, b_down, pre) -> out = h @ W_down[e] + b_down[e]. Keeps pre, not
    h: backward gets (dpre, h) from one fused GEMM and returns dpre as pre's gradient and
    none for h (the gradient h would get reaches the same leaves through pre)."""

    @staticmethod
    def forward(ctx, h, w, offs, bias, pre, alpha, limit):
        out = _mm(h, w, offs, bias)
        need_w, need_pre = ctx.needs_input_grad[1], ctx.needs_input_grad[4]
        ctx.alpha, ctx.limit = alpha, limit
        ctx.w_transposed = w.stride(2) != 1
        ctx.w_dtype = w.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.save_for_backward(pre if need_w or need_pre else None, w if need_pre else None,
                              offs)
        return out

    @staticmethod
    def backward(ctx, dy):
        pre, w, offs = ctx.saved_tensors
        _, need_w, _, need_b, need_pre = ctx.needs_input_grad[:5]
        dy = dy.contiguous()
        dpre = h = None
        if need_pre:
            dpre, h = _swiglu_bwd(dy, w.transpose(-2, -1), offs, pre, ctx.alpha, ctx.limit)
        elif need_w:
            h = swiglu_oai_ref(pre, ctx.alpha, ctx.limit).to(pre.dtype)
        dw, db = _param_grads(h, dy, offs, ctx.w_transposed, ctx.w_dtype, need_w,
                              ctx.bias_dtype if need_b else None)
        return None, dw, None, db, dpre, None, None


def _fused_pair(swiglu_out, aux, alpha, limit, op) -> bool:
    """Whether the fused backward may route swiglu_out's gradient through aux: always
    when swiglu_out takes no gradient, else only when both are the outputs of one
    grouped_mm_swiglu call. Also checks alpha and limit against that call's. Under
    torch.compile, which cannot trace autograd history, the pairing is assumed."""
    if torch.compiler.is_compiling():
        return True
    node = aux.grad_fn
    if isinstance(node, _UpProj._backward_cls):
        for name, value, used in (("swiglu_alpha", alpha, node.alpha),
                                  ("swiglu_limit", limit, node.limit)):
            if value != used:
                raise ValueError(
                    f"cute_moe.{op}: {name}: expected {used}, the value grouped_mm_swiglu "
                    f"used for aux_biased_acc, got {value}")
    if not (torch.is_grad_enabled() and swiglu_out.requires_grad):
        return True
    return node is not None and swiglu_out.grad_fn is node


def _float(v):
    return None if v is None else float(v)


def grouped_mm_swiglu(x: torch.Tensor, W_up: torch.Tensor, offs: torch.Tensor,
                      bias: torch.Tensor | None = None, swiglu_alpha: float = 1.702,
                      swiglu_limit: float | None = 7.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused up projection of an MoE expert FFN: pre = x[rows_e] @ W_up[e] + bias[e] and
    the GPT-OSS SwiGLU of it, in one grouped GEMM.

    x: (M, H) bf16, unit column stride, rows sorted by expert.
    W_up: (E, H, 2I) bf16 with gate and linear columns interleaved (column 2j is gate j,
       2j+1 linear j; reshape "halves" checkpoints with repack.halves_to_interleaved), or
       a transposed view of an (E, 2I, H) tensor.
    offs: (E,) int32 cumulative end offsets on x's device; experts may be empty.
    bias: optional (E, 2I) bf16, interleaved like W_up.
    swiglu_alpha, swiglu_limit: h = g * sigmoid(alpha * g) * (u + 1) with g = min(gate,
       limit), u = clamp(linear, -limit, limit); limit None: no clamps.
    Returns (swiglu_out (M, I), aux_biased_acc (M, 2I)), bf16, rows at or past offs[E-1]
    zero. aux_biased_acc is pre, rounded once; swiglu_out is computed from it. Pass both
    to grouped_mm_downproj so that the SwiGLU backward runs fused there. Differentiable
    with respect to x, W_up and bias, through either output.
    """
    check_grouped_mm_swiglu_args(x, W_up, offs, bias, swiglu_alpha, swiglu_limit,
                                 op="grouped_mm_swiglu", names=_UP_NAMES)
    return _UpProj.apply(x, W_up, offs, bias, float(swiglu_alpha), _float(swiglu_limit))


def grouped_mm_downproj(swiglu_out: torch.Tensor, W_down: torch.Tensor, offs: torch.Tensor,
                        bias: torch.Tensor | None = None,
                        aux_biased_acc: torch.Tensor | None = None,
                        swiglu_alpha: float = 1.702,
                        swiglu_limit: float | None = 7.0) -> torch.Tensor:
    """Down projection of an MoE expert FFN: out[rows_e] = swiglu_out[rows_e] @ W_down[e]
    + bias[e], (M, H) bf16, rows at or past offs[E-1] zero.

    swiglu_out: (M, I) bf16, the first output of grouped_mm_swiglu.
    W_down: (E, I, H) bf16, or a transposed view of an (E, H, I) tensor.
    bias: optional (E, H) bf16.
    aux_biased_acc: the second output of the same grouped_mm_swiglu call. Given it, the
       backward computes the down projection's input gradient and the SwiGLU backward in
       one fused GEMM, recomputes swiglu_out from aux_biased_acc for W_down's gradient,
       and returns the gradient to aux_biased_acc (none to swiglu_out: it reaches the
       same parameters that way). Without it this is cute_moe.grouped_mm.
    swiglu_alpha, swiglu_limit: must be those given to grouped_mm_swiglu; the backward
       uses these. Checked when aux_biased_acc carries its autograd history (not under
       torch.compile).
    If swiglu_out needs a gradient but is not the partner of aux_biased_acc (a view of
    it, another tensor), the fused route would lose that gradient: this warns and runs
    the unfused grouped_mm instead (not under torch.compile, which cannot see the
    pairing: there the pair is trusted). Differentiable with respect to every tensor
    input.
    """
    op = "grouped_mm_downproj"
    check_grouped_mm_args(swiglu_out, W_down, offs, bias, op=op, names=_DOWN_NAMES)
    check_swiglu_params(swiglu_alpha, swiglu_limit, op, _DOWN_NAMES)
    if aux_biased_acc is None:
        return grouped_mm(swiglu_out, W_down, offs, bias)
    check_pre_args(aux_biased_acc, swiglu_out.shape[0], swiglu_out.shape[1], "swiglu_out",
                   swiglu_out, op, name="aux_biased_acc")
    alpha, limit = float(swiglu_alpha), _float(swiglu_limit)
    if not _fused_pair(swiglu_out, aux_biased_acc, alpha, limit, op):
        warnings.warn(f"cute_moe.{op}: swiglu_out needs a gradient but is not the output of "
                      "the grouped_mm_swiglu call that returned aux_biased_acc; running the "
                      "unfused backward", stacklevel=2)
        return grouped_mm(swiglu_out, W_down, offs, bias)
    return _DownProj.apply(swiglu_out, W_down, offs, bias, aux_biased_acc, alpha, limit)

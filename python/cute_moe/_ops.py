# Python registrations for the ops of the compiled library (which defines the schemas
# and the CUDA kernels): fake kernels for tracing (torch.compile, FakeTensorMode), CPU
# kernels that run the references, and the autograd formula of cute_moe::grouped_mm.
# Nothing is registered when the library is not loaded. The fused SwiGLU ops get fake
# and CPU kernels only, when the library has them: their autograd spans two ops and
# lives in expert_ffn.py.
from __future__ import annotations

import torch

from . import _library
from ._checks import (check_grouped_column_sum_args, check_grouped_mm_act_args,
                      check_grouped_mm_act_bwd_args, check_grouped_mm_act_gathered_args,
                      check_grouped_mm_args,
                      check_grouped_mm_scaled_args, check_grouped_mm_swiglu_args,
                      check_grouped_mm_swiglu_bwd_args, check_grouped_mm_wgrad_args)
from .reference import (GATED_ACTIVATIONS, grouped_bias_grad_ref, grouped_mm_act_bwd_ref,
                        grouped_mm_act_gathered_ref, grouped_mm_act_ref, grouped_mm_ref, grouped_mm_scaled_ref,
                        grouped_mm_swiglu_bwd_ref, grouped_mm_swiglu_ref, grouped_mm_wgrad_ref)

__all__ = ["REGISTERED", "SWIGLU_REGISTERED", "ACT_REGISTERED", "GATHER_REGISTERED"]

SWIGLU_OPS = ("grouped_mm_swiglu", "grouped_mm_swiglu_bwd")
ACT_OPS = ("grouped_mm_act", "grouped_mm_act_bwd", "grouped_mm_scaled")


def _fake_grouped_mm(x, w, offs, bias=None):
    check_grouped_mm_args(x, w, offs, bias)
    return x.new_empty(x.shape[0], w.shape[2])


def _fake_grouped_mm_wgrad(x, dy, offs, out_dtype=None, bias_grad=False):
    check_grouped_mm_wgrad_args(x, dy, offs, out_dtype)
    num_groups = offs.shape[0]
    dw = x.new_empty(num_groups, x.shape[1], dy.shape[1], dtype=out_dtype or torch.bfloat16)
    db = x.new_empty((num_groups, dy.shape[1]) if bias_grad else (0,), dtype=torch.float32)
    return dw, db


def _cpu_grouped_mm(x, w, offs, bias=None):
    check_grouped_mm_args(x, w, offs, bias)
    return grouped_mm_ref(x, w, offs, bias)


def _cpu_grouped_mm_wgrad(x, dy, offs, out_dtype=None, bias_grad=False):
    check_grouped_mm_wgrad_args(x, dy, offs, out_dtype)
    dw = grouped_mm_wgrad_ref(x, dy, offs, out_dtype or torch.bfloat16)
    if not bias_grad:
        return dw, x.new_empty(0, dtype=torch.float32)
    return dw, grouped_bias_grad_ref(dy, offs)


def _fake_grouped_column_sum(src, offs, row_scale=None):
    check_grouped_column_sum_args(src, offs, row_scale)
    return src.new_empty(offs.shape[0], src.shape[1], dtype=torch.float32)


def _cpu_grouped_column_sum(src, offs, row_scale=None):
    check_grouped_column_sum_args(src, offs, row_scale)
    return grouped_bias_grad_ref(src, offs, row_scale=row_scale)


def _fake_grouped_mm_scaled(x, w, offs, bias=None, scale=None, prob=None):
    check_grouped_mm_scaled_args(x, w, offs, bias, scale, prob)
    return x.new_empty(x.shape[0], w.shape[2])


def _cpu_grouped_mm_scaled(x, w, offs, bias=None, scale=None, prob=None):
    check_grouped_mm_scaled_args(x, w, offs, bias, scale, prob)
    return grouped_mm_scaled_ref(x, w, offs, bias, scale, prob)


def _fake_grouped_mm_act(x, w, offs, bias=None, scale=None, activation="swiglu_oai", alpha=1.702,
                         limit=None):
    check_grouped_mm_act_args(x, w, offs, bias, scale, activation, alpha, limit)
    n = w.shape[2]
    return x.new_empty(x.shape[0], n // 2 if activation in GATED_ACTIVATIONS else n), \
        x.new_empty(x.shape[0], n)


def _cpu_grouped_mm_act(x, w, offs, bias=None, scale=None, activation="swiglu_oai", alpha=1.702,
                        limit=None):
    check_grouped_mm_act_args(x, w, offs, bias, scale, activation, alpha, limit)
    return grouped_mm_act_ref(x, w, offs, bias, scale, activation, alpha, limit)


def _fake_grouped_mm_act_gathered(x, rows, w, offs, bias=None, scale=None, activation="swiglu_oai",
                                  alpha=1.702, limit=None):
    check_grouped_mm_act_gathered_args(x, rows, w, offs, bias, scale, activation, alpha, limit)
    n, m = w.shape[2], rows.shape[0]
    return x.new_empty(m, n // 2 if activation in GATED_ACTIVATIONS else n), x.new_empty(m, n)


def _cpu_grouped_mm_act_gathered(x, rows, w, offs, bias=None, scale=None, activation="swiglu_oai",
                                 alpha=1.702, limit=None):
    check_grouped_mm_act_gathered_args(x, rows, w, offs, bias, scale, activation, alpha, limit)
    return grouped_mm_act_gathered_ref(x, rows, w, offs, bias, scale, activation, alpha, limit)


def _fake_grouped_mm_act_bwd(dy, w, offs, pre, scale=None, prob=None, out_bias=None,
                             prob_grad=False, activation="swiglu_oai", alpha=1.702, limit=None):
    check_grouped_mm_act_bwd_args(dy, w, offs, pre, scale, prob, out_bias, prob_grad,
                                  activation, alpha, limit)
    m = dy.shape[0]
    return (pre.new_empty(pre.shape), pre.new_empty(m, w.shape[2]),
            dy.new_empty(m if prob_grad else 0, dtype=torch.float32))


def _cpu_grouped_mm_act_bwd(dy, w, offs, pre, scale=None, prob=None, out_bias=None,
                            prob_grad=False, activation="swiglu_oai", alpha=1.702, limit=None):
    check_grouped_mm_act_bwd_args(dy, w, offs, pre, scale, prob, out_bias, prob_grad,
                                  activation, alpha, limit)
    return grouped_mm_act_bwd_ref(dy, w, offs, pre, scale, prob, out_bias, prob_grad,
                                  activation, alpha, limit)


def _fake_grouped_mm_swiglu(x, w, offs, bias=None, alpha=1.702, limit=7.0):
    check_grouped_mm_swiglu_args(x, w, offs, bias, alpha, limit)
    m, two_i = x.shape[0], w.shape[2]
    return x.new_empty(m, two_i // 2), x.new_empty(m, two_i)


def _cpu_grouped_mm_swiglu(x, w, offs, bias=None, alpha=1.702, limit=7.0):
    check_grouped_mm_swiglu_args(x, w, offs, bias, alpha, limit)
    return grouped_mm_swiglu_ref(x, w, offs, bias, alpha, limit)


def _fake_grouped_mm_swiglu_bwd(dy, w, offs, pre, alpha=1.702, limit=7.0):
    check_grouped_mm_swiglu_bwd_args(dy, w, offs, pre, alpha, limit)
    m, inter = dy.shape[0], w.shape[2]
    return pre.new_empty(m, 2 * inter), pre.new_empty(m, inter)


def _cpu_grouped_mm_swiglu_bwd(dy, w, offs, pre, alpha=1.702, limit=7.0):
    check_grouped_mm_swiglu_bwd_args(dy, w, offs, pre, alpha, limit)
    return grouped_mm_swiglu_bwd_ref(dy, w, offs, pre, alpha, limit)


def _setup_context(ctx, inputs, output):
    x, w, offs, bias = inputs
    need_x, need_w = ctx.needs_input_grad[:2]
    # (E, K, N) row-major weights give (E, K, N) gradients; a transposed view of an
    # (E, N, K) tensor gets the transposed view of an (E, N, K) gradient.
    ctx.w_transposed = w.stride(2) != 1
    ctx.w_dtype = w.dtype
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.save_for_backward(x if need_w else None, w if need_x else None, offs)


def _backward(ctx, dy):
    x, w, offs = ctx.saved_tensors
    # The dispatcher drops a bias equal to its default (None) from the inputs.
    needs = ctx.needs_input_grad
    need_x, need_w = needs[:2]
    need_b = len(needs) > 3 and needs[3]
    dy = dy.contiguous()
    dx = dw = db = None
    if need_x:
        dx = torch.ops.cute_moe.grouped_mm(dy, w.transpose(-2, -1), offs)
    if need_w and not ctx.w_transposed:
        dw, db = torch.ops.cute_moe.grouped_mm_wgrad(x, dy, offs, ctx.w_dtype, need_b)
    elif need_w:
        dw_t, _ = torch.ops.cute_moe.grouped_mm_wgrad(dy, x, offs, ctx.w_dtype)
        dw = dw_t.transpose(-2, -1)
    if need_b:
        if db is None:
            db = torch.ops.cute_moe.grouped_column_sum(dy, offs)
        db = db.to(ctx.bias_dtype)
    else:
        db = None
    return (dx, dw, None, db)[: len(needs)]


def _register() -> None:
    torch.library.register_fake("cute_moe::grouped_mm", _fake_grouped_mm)
    torch.library.register_fake("cute_moe::grouped_mm_wgrad", _fake_grouped_mm_wgrad)
    torch.library.register_kernel("cute_moe::grouped_mm", "cpu", _cpu_grouped_mm)
    torch.library.register_kernel("cute_moe::grouped_mm_wgrad", "cpu", _cpu_grouped_mm_wgrad)
    torch.library.register_fake("cute_moe::grouped_column_sum", _fake_grouped_column_sum)
    torch.library.register_kernel("cute_moe::grouped_column_sum", "cpu", _cpu_grouped_column_sum)
    torch.library.register_autograd("cute_moe::grouped_mm", _backward,
                                    setup_context=_setup_context)


def _has_op(name: str) -> bool:
    try:
        getattr(torch.ops.cute_moe, name).default
    except (AttributeError, RuntimeError):
        return False
    return True


def _register_swiglu() -> None:
    torch.library.register_fake("cute_moe::grouped_mm_swiglu", _fake_grouped_mm_swiglu)
    torch.library.register_kernel("cute_moe::grouped_mm_swiglu", "cpu", _cpu_grouped_mm_swiglu)
    torch.library.register_fake("cute_moe::grouped_mm_swiglu_bwd", _fake_grouped_mm_swiglu_bwd)
    torch.library.register_kernel("cute_moe::grouped_mm_swiglu_bwd", "cpu",
                                  _cpu_grouped_mm_swiglu_bwd)


def _register_act() -> None:
    for name, fake, cpu in (("grouped_mm_scaled", _fake_grouped_mm_scaled, _cpu_grouped_mm_scaled),
                            ("grouped_mm_act", _fake_grouped_mm_act, _cpu_grouped_mm_act),
                            ("grouped_mm_act_bwd", _fake_grouped_mm_act_bwd,
                             _cpu_grouped_mm_act_bwd)):
        torch.library.register_fake(f"cute_moe::{name}", fake)
        torch.library.register_kernel(f"cute_moe::{name}", "cpu", cpu)


REGISTERED = _library.library_loaded()
if REGISTERED:
    _register()
# An older library may lack the fused SwiGLU ops; expert_ffn.py then runs the references.
SWIGLU_REGISTERED = REGISTERED and all(_has_op(name) for name in SWIGLU_OPS)
if SWIGLU_REGISTERED:
    _register_swiglu()
# The activation family and the scaled GEMM (issue 4); without them expert_ffn.py runs the
# references.
ACT_REGISTERED = REGISTERED and all(_has_op(name) for name in ACT_OPS)
if ACT_REGISTERED:
    _register_act()
# The gathered up projection (the token gather fused into its A load).
GATHER_REGISTERED = ACT_REGISTERED and _has_op("grouped_mm_act_gathered")
if GATHER_REGISTERED:
    torch.library.register_fake("cute_moe::grouped_mm_act_gathered", _fake_grouped_mm_act_gathered)
    torch.library.register_kernel("cute_moe::grouped_mm_act_gathered", "cpu",
                                  _cpu_grouped_mm_act_gathered)

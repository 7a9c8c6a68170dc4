"""The grouped GEMM ops: grouped_mm, grouped_mm_wgrad, grouped_column_sum, grouped_bias_grads,
grouped_mm_scaled."""
# Their argument checks, fake and CPU kernels (the references), and the autograd formula
# of cute_moe::grouped_mm, registered on import when the op library is loaded.
from __future__ import annotations

import torch

from .. import _library
from ..reference.gemm import (grouped_bias_grad_ref, grouped_bias_grads_ref, grouped_mm_ref,
                              grouped_mm_scaled_ref, grouped_mm_wgrad_ref)
from .checks import (check_offs_length, check_same_device, check_scales, check_tensor, fail,
                     unit_columns)
from .registry import register_kernels

__all__ = ["check_grouped_mm_args", "check_grouped_mm_split_args", "check_grouped_mm_wgrad_args",
           "check_grouped_column_sum_args", "check_grouped_bias_grads_args",
           "check_grouped_mm_scaled_args"]


def check_grouped_mm_args(x, w, offs, bias=None, op: str = "grouped_mm",
                          names: dict[str, str] | None = None) -> None:
    """x (M, K) with unit column stride, w (E, K, N) with w.stride(2) == 1 or
    w.stride(1) == 1, offs (E,) int32, bias (E, N); all bf16 but offs, one device.
    `names` renames arguments in the messages (e.g. {"w": "W_up"})."""
    name = (names or {}).get
    nx, nw, nb = name("x", "x"), name("w", "w"), name("bias", "bias")
    check_tensor(op, nx, x, 2, torch.bfloat16)
    check_tensor(op, nw, w, 3, torch.bfloat16)
    num_groups, k, n = w.shape
    check_offs_length(op, offs, num_groups, f"{nw}.shape[0], the number of groups")
    if x.shape[1] != k:
        fail(op, nx, f"{k} columns ({nw}.shape[1])", f"shape {tuple(x.shape)}")
    if not unit_columns(x):
        fail(op, nx, "unit column stride (call .contiguous())", f"strides {x.stride()}")
    if w.stride(2) != 1 and w.stride(1) != 1:
        fail(op, nw, f"{nw}.stride(2) == 1 (E, K, N) or {nw}.stride(1) == 1 (a transposed "
             "(E, N, K) tensor)", f"strides {w.stride()}")
    if bias is not None:
        check_tensor(op, nb, bias, 2, torch.bfloat16)
        if tuple(bias.shape) != (num_groups, n):
            fail(op, nb, f"shape {(num_groups, n)} (E, N)", f"shape {tuple(bias.shape)}")
    check_same_device(op, nx, x, **{nw: w, "offs": offs, nb: bias})


def check_grouped_mm_split_args(x, w, w_hi, offs, bias=None, op: str = "grouped_mm") -> None:
    """grouped_mm's rules with W's rows in two tensors: w (E, K1, N) and w_hi (E, K2, N),
    K1 + K2 = x.shape[1], both bf16 on x's device."""
    check_tensor(op, "w", w, 3, torch.bfloat16)
    check_tensor(op, "w_hi", w_hi, 3, torch.bfloat16)
    check_tensor(op, "x", x, 2, torch.bfloat16)
    if (w_hi.shape[0], w_hi.shape[2]) != (w.shape[0], w.shape[2]):
        fail(op, "w_hi", f"shape (E, K2, N) with (E, N) = {(w.shape[0], w.shape[2])} (w's)",
             f"shape {tuple(w_hi.shape)}")
    if w.shape[1] + w_hi.shape[1] != x.shape[1]:
        fail(op, "x", f"{w.shape[1] + w_hi.shape[1]} columns (w's rows and w_hi's)",
             f"shape {tuple(x.shape)}")
    check_grouped_mm_args(x[:, :w.shape[1]], w, offs, bias, op)
    if w_hi.stride(2) != 1 and w_hi.stride(1) != 1:
        fail(op, "w_hi", "w_hi.stride(2) == 1 or w_hi.stride(1) == 1", f"strides {w_hi.stride()}")
    check_same_device(op, "x", x, w_hi=w_hi)


def check_grouped_mm_wgrad_args(x, dy, offs, out_dtype=None,
                                op: str = "grouped_mm_wgrad") -> None:
    """x (M, K), dy (M, N) bf16, offs 1-D int32, out_dtype bf16, float32 or None."""
    check_tensor(op, "x", x, 2, torch.bfloat16)
    check_tensor(op, "dy", dy, 2, torch.bfloat16)
    if dy.shape[0] != x.shape[0]:
        fail(op, "dy", f"{x.shape[0]} rows (x.shape[0])", f"shape {tuple(dy.shape)}")
    check_tensor(op, "offs", offs, 1, torch.int32)
    if out_dtype not in (None, torch.bfloat16, torch.float32):
        fail(op, "out_dtype", "torch.bfloat16 or torch.float32", out_dtype)
    check_same_device(op, "x", x, dy=dy, offs=offs)


def check_grouped_column_sum_args(src, offs, row_scale=None,
                                  op: str = "grouped_column_sum") -> None:
    """src (M, N) bf16, offs 1-D int32 and row_scale (M,) float32 on src's device."""
    check_tensor(op, "src", src, 2, torch.bfloat16)
    check_tensor(op, "offs", offs, 1, torch.int32)
    check_same_device(op, "src", src, offs=offs)
    check_scales(op, "row_scale", row_scale, src.shape[0], "one per row of src", "src", src)


def check_grouped_bias_grads_args(src, offs, row_scale=None, bias=None, index=None,
                                  op: str = "grouped_bias_grads") -> int:
    """src (rows, N) bf16, offs 1-D int32, index (M,) int32 (M = src's rows without it),
    row_scale (M,) float32, bias (E, N) bf16, on src's device. Returns M."""
    check_tensor(op, "src", src, 2, torch.bfloat16)
    check_tensor(op, "offs", offs, 1, torch.int32)
    m = src.shape[0]
    if index is not None:
        check_tensor(op, "index", index, 1, torch.int32)
        m = index.shape[0]
    check_same_device(op, "src", src, offs=offs, index=index, bias=bias)
    check_scales(op, "row_scale", row_scale, m, "one per row of dy (index's length with an "
                 "index, else src's rows)", "src", src)
    if bias is not None:
        check_tensor(op, "bias", bias, 2, torch.bfloat16)
        if tuple(bias.shape) != (offs.shape[0], src.shape[1]):
            fail(op, "bias", f"shape {(offs.shape[0], src.shape[1])} (E, N)",
                 f"shape {tuple(bias.shape)}")
    return m


def check_grouped_mm_scaled_args(x, w, offs, bias=None, scale=None, prob=None,
                                 op: str = "grouped_mm_scaled") -> None:
    check_grouped_mm_args(x, w, offs, bias, op)
    check_scales(op, "scale", scale, w.shape[0], "one per group", "x", x)
    check_scales(op, "prob", prob, x.shape[0], "one per row of x", "x", x)


# --- fake and CPU kernels (every argument given: see registry.py) ---------------------

def _fake_grouped_mm(x, w, offs, bias, w_hi):
    if w_hi is not None:
        check_grouped_mm_split_args(x, w, w_hi, offs, bias)
    else:
        check_grouped_mm_args(x, w, offs, bias)
    return x.new_empty(x.shape[0], w.shape[2])


def _cpu_grouped_mm(x, w, offs, bias, w_hi):
    if w_hi is not None:
        check_grouped_mm_split_args(x, w, w_hi, offs, bias)
        w = torch.cat([w, w_hi], dim=1)
    else:
        check_grouped_mm_args(x, w, offs, bias)
    return grouped_mm_ref(x, w, offs, bias)


def _fake_grouped_mm_wgrad(x, dy, offs, out_dtype, bias_grad):
    check_grouped_mm_wgrad_args(x, dy, offs, out_dtype)
    num_groups = offs.shape[0]
    dw = x.new_empty(num_groups, x.shape[1], dy.shape[1], dtype=out_dtype or torch.bfloat16)
    db = x.new_empty((num_groups, dy.shape[1]) if bias_grad else (0,), dtype=torch.float32)
    return dw, db


def _cpu_grouped_mm_wgrad(x, dy, offs, out_dtype, bias_grad):
    check_grouped_mm_wgrad_args(x, dy, offs, out_dtype)
    dw = grouped_mm_wgrad_ref(x, dy, offs, out_dtype or torch.bfloat16)
    if not bias_grad:
        return dw, x.new_empty(0, dtype=torch.float32)
    return dw, grouped_bias_grad_ref(dy, offs)


def _fake_grouped_column_sum(src, offs, row_scale):
    check_grouped_column_sum_args(src, offs, row_scale)
    return src.new_empty(offs.shape[0], src.shape[1], dtype=torch.float32)


def _cpu_grouped_column_sum(src, offs, row_scale):
    check_grouped_column_sum_args(src, offs, row_scale)
    return grouped_bias_grad_ref(src, offs, row_scale=row_scale)


def _fake_grouped_bias_grads(src, offs, row_scale, bias, index):
    m = check_grouped_bias_grads_args(src, offs, row_scale, bias, index)
    n = src.shape[1]
    return (src.new_empty(offs.shape[0], n, dtype=torch.float32),
            src.new_empty(m if bias is not None else 0, dtype=torch.float32),
            src.new_empty(m if index is not None else 0, n))


def _cpu_grouped_bias_grads(src, offs, row_scale, bias, index):
    check_grouped_bias_grads_args(src, offs, row_scale, bias, index)
    return grouped_bias_grads_ref(src, offs, row_scale, bias, index)


def _fake_grouped_mm_scaled(x, w, offs, bias, scale, prob):
    check_grouped_mm_scaled_args(x, w, offs, bias, scale, prob)
    return x.new_empty(x.shape[0], w.shape[2])


def _cpu_grouped_mm_scaled(x, w, offs, bias, scale, prob):
    check_grouped_mm_scaled_args(x, w, offs, bias, scale, prob)
    return grouped_mm_scaled_ref(x, w, offs, bias, scale, prob)


# --- autograd of cute_moe::grouped_mm --------------------------------------------------

def _setup_context(ctx, inputs, output):
    # The dispatcher drops trailing arguments equal to their defaults (None) from inputs.
    x, w, offs = inputs[:3]
    bias = inputs[3] if len(inputs) > 3 else None
    w_hi = inputs[4] if len(inputs) > 4 else None
    needs = ctx.needs_input_grad
    need_x, need_w = needs[:2]
    need_w_hi = w_hi is not None and needs[4]
    # (E, K, N) row-major weights give (E, K, N) gradients; a transposed view of an
    # (E, N, K) tensor gets the transposed view of an (E, N, K) gradient.
    ctx.w_transposed = w.stride(2) != 1
    ctx.w_hi_transposed = w_hi is not None and w_hi.stride(2) != 1
    ctx.w_dtype = w.dtype
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.split = w.shape[1] if w_hi is not None else None
    ctx.save_for_backward(x if need_w or need_w_hi else None, w if need_x else None, offs,
                          w_hi if need_x else None)


def _wgrad_of(x, dy, offs, transposed, dtype, need_b=False):
    """(dw, db or None) of y = x @ w in w's layout."""
    if not transposed:
        dw, db = torch.ops.cute_moe.grouped_mm_wgrad(x, dy, offs, dtype, need_b)
        return dw, (db if need_b else None)
    return torch.ops.cute_moe.grouped_mm_wgrad(dy, x, offs, dtype)[0].transpose(-2, -1), None


def _backward(ctx, dy):
    x, w, offs, w_hi = ctx.saved_tensors
    needs = ctx.needs_input_grad
    need_x, need_w = needs[:2]
    need_b = len(needs) > 3 and needs[3]
    need_w_hi = len(needs) > 4 and needs[4]
    dy = dy.contiguous()
    dx = dw = db = dw_hi = None
    # grouped_mm_scaled without scales: grouped_mm's kernel without its autograd layer
    mm = torch.ops.cute_moe.grouped_mm_scaled
    if need_x and ctx.split is None:
        dx = mm(dy, w.transpose(-2, -1), offs)
    elif need_x:  # x's columns: [dy @ w^T | dy @ w_hi^T]
        dx = torch.cat([mm(dy, w.transpose(-2, -1), offs), mm(dy, w_hi.transpose(-2, -1), offs)],
                       dim=1)
    x_lo, x_hi = x, None
    if ctx.split is not None and x is not None:  # column slices; the kernels need 16-byte rows
        x_lo, x_hi = x[:, :ctx.split], x[:, ctx.split:]
        if ctx.split % 8:
            x_hi = x_hi.contiguous()
    if need_w:
        dw, db = _wgrad_of(x_lo, dy, offs, ctx.w_transposed, ctx.w_dtype, need_b)
    if need_w_hi:
        dw_hi, _ = _wgrad_of(x_hi, dy, offs, ctx.w_hi_transposed, ctx.w_dtype)
    if need_b:
        if db is None:
            db = torch.ops.cute_moe.grouped_column_sum(dy, offs)
        db = db.to(ctx.bias_dtype)
    else:
        db = None
    return (dx, dw, None, db, dw_hi)[: len(needs)]


def _register() -> None:
    for name, fake, cpu in (
            ("grouped_mm", _fake_grouped_mm, _cpu_grouped_mm),
            ("grouped_mm_wgrad", _fake_grouped_mm_wgrad, _cpu_grouped_mm_wgrad),
            ("grouped_column_sum", _fake_grouped_column_sum, _cpu_grouped_column_sum),
            ("grouped_bias_grads", _fake_grouped_bias_grads, _cpu_grouped_bias_grads),
            ("grouped_mm_scaled", _fake_grouped_mm_scaled, _cpu_grouped_mm_scaled)):
        register_kernels(name, fake, cpu)
    torch.library.register_autograd("cute_moe::grouped_mm", _backward,
                                    setup_context=_setup_context)


if _library.library_loaded():
    _register()

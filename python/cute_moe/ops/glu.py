"""The GEMM-plus-activation ops: grouped_mm_act(_gathered, _bwd), grouped_mm_swiglu(_bwd)."""
# Their argument checks, fake and CPU kernels (the references), registered on import when
# the op library is loaded. Their autograd spans two ops (an up projection and the down
# projection that runs its backward), so it lives in cute_moe/ffn_autograd.py, not here.
from __future__ import annotations

import torch

from .. import _library
from ..activation_args import check_act_params, check_activation, is_gated
from ..reference.glu import (GATE_LINEAR, grouped_mm_act_bwd_ref, grouped_mm_act_gathered_ref,
                             grouped_mm_act_ref, grouped_mm_swiglu_bwd_ref, grouped_mm_swiglu_ref)
from .checks import check_same_device, check_scales, check_tensor, fail, unit_columns
from .gemm import check_grouped_mm_args
from .registry import register_kernels

__all__ = ["check_gate_linear", "check_gated_width", "check_w_linear", "check_grouped_mm_swiglu_args",
           "check_pre_args",
           "check_grouped_mm_swiglu_bwd_args", "check_grouped_mm_act_args",
           "check_grouped_mm_act_gathered_args", "check_grouped_mm_act_bwd_args"]


def check_gated_width(op: str, w, name: str = "w", activation: str | None = None) -> None:
    """An even w.shape[2]: the 2I interleaved (gate, linear) columns of a gated activation."""
    if w.shape[2] % 2:
        what = f" for {activation!r}" if activation else ""
        fail(op, name, f"an even {name}.shape[2] (2I interleaved gate/linear columns{what})",
             f"shape {tuple(w.shape)}")


def check_grouped_mm_swiglu_args(x, w, offs, bias, alpha, limit, op: str = "grouped_mm_swiglu",
                                 names: dict[str, str] | None = None) -> None:
    """check_grouped_mm_args with an even output width 2I (interleaved gate/linear
    columns) and valid SwiGLU parameters."""
    check_grouped_mm_args(x, w, offs, bias, op, names)
    check_gated_width(op, w, (names or {}).get("w", "w"))
    check_act_params(alpha, limit, op, names)


def check_pre_args(pre, m: int, inter: int, ref_name: str, ref: torch.Tensor, op: str,
                   name: str = "pre") -> None:
    """pre (m, 2 * inter) bf16 with unit column stride, on ref's device."""
    check_tensor(op, name, pre, 2, torch.bfloat16)
    if tuple(pre.shape) != (m, 2 * inter):
        fail(op, name, f"shape {(m, 2 * inter)} (M, 2I)", f"shape {tuple(pre.shape)}")
    if not unit_columns(pre):
        fail(op, name, "unit column stride (call .contiguous())", f"strides {pre.stride()}")
    check_same_device(op, ref_name, ref, **{name: pre})


def check_grouped_mm_swiglu_bwd_args(dy, w, offs, pre, alpha, limit,
                                     op: str = "grouped_mm_swiglu_bwd") -> None:
    """dy (M, N) and w (E, N, I) as check_grouped_mm_args has them, pre (M, 2I)."""
    check_grouped_mm_args(dy, w, offs, None, op, {"x": "dy"})
    check_pre_args(pre, dy.shape[0], w.shape[2], "dy", dy, op)
    check_act_params(alpha, limit, op)


def check_gate_linear(op: str, gate_linear, activation: str) -> None:
    if gate_linear not in GATE_LINEAR:
        fail(op, "gate_linear", " or ".join(repr(g) for g in GATE_LINEAR), repr(gate_linear))
    if gate_linear == "halves" and not is_gated(activation):
        fail(op, "gate_linear", "'interleaved' for a non-gated activation (no gate/linear pairs)",
             f"'halves' with {activation!r}")


def check_grouped_mm_act_args(x, w, offs, bias, scale, activation, alpha, limit,
                              op: str = "grouped_mm_act", gate_linear: str = "interleaved") -> None:
    check_activation(activation, limit, op)
    check_gate_linear(op, gate_linear, activation)
    if activation == "none":
        fail(op, "activation", "a fused activation (not 'none': use grouped_mm_scaled)",
             repr(activation))
    check_grouped_mm_args(x, w, offs, bias, op)
    if is_gated(activation):
        check_gated_width(op, w, "w", activation)
    check_scales(op, "scale", scale, w.shape[0], "one per group", "x", x)
    check_act_params(alpha, limit, op)


def check_w_linear(op: str, w, w_linear, gate_linear: str) -> None:
    """w_linear, the linear half as its own tensor: gate_linear "halves", w's shape
    (E, K, I), bf16 on w's device."""
    if gate_linear != "halves":
        fail(op, "w_linear", "None unless gate_linear='halves' (the linear half as its own tensor)",
             "a tensor")
    check_tensor(op, "w_linear", w_linear, 3, torch.bfloat16)
    if tuple(w_linear.shape) != tuple(w.shape):
        fail(op, "w_linear", f"the gate half's shape {tuple(w.shape)} (E, K, I)",
             f"shape {tuple(w_linear.shape)}")
    if w_linear.stride(2) != 1 and w_linear.stride(1) != 1:
        fail(op, "w_linear", "w_linear.stride(2) == 1 or w_linear.stride(1) == 1",
             f"strides {w_linear.stride()}")
    check_same_device(op, "w", w, w_linear=w_linear)


def check_grouped_mm_act_gathered_args(x, rows, w, offs, bias, scale, activation, alpha, limit,
                                       op: str = "grouped_mm_act_gathered") -> None:
    """grouped_mm_act's rules for x (T, K) plus rows (M,) int32 on x's device and a weight
    contiguous along N (the gathered kernel loads B as (E, K, N) row-major)."""
    check_grouped_mm_act_args(x, w, offs, bias, scale, activation, alpha, limit, op)
    check_tensor(op, "rows", rows, 1, torch.int32)
    check_same_device(op, "x", x, rows=rows)
    if w.stride(2) != 1 and w.shape[2] > 1:
        fail(op, "w", "w.stride(2) == 1 (an (E, K, N) row-major weight)", f"strides {w.stride()}")
    if rows.shape[0] > 0 and x.shape[0] == 0:
        fail(op, "x", "at least one row to gather from", f"shape {tuple(x.shape)}")


def check_grouped_mm_act_bwd_args(dy, w, offs, pre, scale, prob, out_bias, prob_grad,
                                  activation, alpha, limit,
                                  op: str = "grouped_mm_act_bwd",
                                  gate_linear: str = "interleaved") -> None:
    check_activation(activation, limit, op)
    check_gate_linear(op, gate_linear, activation)
    check_grouped_mm_args(dy, w, offs, None, op, {"x": "dy"})
    check_scales(op, "scale", scale, w.shape[0], "one per group", "dy", dy)
    check_scales(op, "prob", prob, dy.shape[0], "one per row of dy", "dy", dy)
    check_act_bwd_tensors(op, dy, w, pre, prob, out_bias, prob_grad, activation)
    check_act_params(alpha, limit, op)


def check_act_bwd_tensors(op: str, dy, w, pre, prob, out_bias, prob_grad: bool,
                          activation: str) -> None:
    """The activation backward's extra tensors (grouped_mm_act_bwd, grouped_mm_fp8_act_bwd):
    pre (m, 2I or I) bf16 with unit column stride; prob given for prob_grad; out_bias (E, H)
    bf16 only with prob_grad; all on dy's device (dy (m, H), w (E, H, I))."""
    width = 2 * w.shape[2] if is_gated(activation) else w.shape[2]
    check_tensor(op, "pre", pre, 2, torch.bfloat16)
    if tuple(pre.shape) != (dy.shape[0], width):
        fail(op, "pre", f"shape {(dy.shape[0], width)}", f"shape {tuple(pre.shape)}")
    if not unit_columns(pre):
        fail(op, "pre", "unit column stride (call .contiguous())", f"strides {pre.stride()}")
    if prob_grad and prob is None:
        fail(op, "prob", "a tensor when prob_grad is set", None)
    if out_bias is not None:
        if not prob_grad:
            fail(op, "out_bias", "None unless prob_grad (it is only read for dprob)", "a tensor")
        check_tensor(op, "out_bias", out_bias, 2, torch.bfloat16)
        if tuple(out_bias.shape) != (w.shape[0], dy.shape[1]):
            fail(op, "out_bias", f"shape {(w.shape[0], dy.shape[1])} (E, H)",
                 f"shape {tuple(out_bias.shape)}")
    check_same_device(op, "dy", dy, pre=pre, out_bias=out_bias)


# --- fake and CPU kernels (every argument given: see registry.py) ---------------------

def _h_width(activation: str, n: int) -> int:
    return n // 2 if is_gated(activation) else n


def _whole_w(w, w_linear, gate_linear, op="grouped_mm_act"):
    """The up projection as one (E, K, 2I) tensor: [w | w_linear] where the halves are two."""
    if w_linear is None:
        return w
    check_w_linear(op, w, w_linear, gate_linear)
    return torch.cat([w, w_linear], dim=2)


def _fake_grouped_mm_act(x, w, offs, bias, scale, activation, alpha, limit, gate_linear, w_linear):
    w = _whole_w(w, w_linear, gate_linear)
    check_grouped_mm_act_args(x, w, offs, bias, scale, activation, alpha, limit,
                              gate_linear=gate_linear)
    n = w.shape[2]
    return x.new_empty(x.shape[0], _h_width(activation, n)), x.new_empty(x.shape[0], n)


def _cpu_grouped_mm_act(x, w, offs, bias, scale, activation, alpha, limit, gate_linear, w_linear):
    w = _whole_w(w, w_linear, gate_linear)
    check_grouped_mm_act_args(x, w, offs, bias, scale, activation, alpha, limit,
                              gate_linear=gate_linear)
    return grouped_mm_act_ref(x, w, offs, bias, scale, activation, alpha, limit, gate_linear)


def _fake_grouped_mm_act_gathered(x, rows, w, offs, bias, scale, activation, alpha, limit):
    check_grouped_mm_act_gathered_args(x, rows, w, offs, bias, scale, activation, alpha, limit)
    n, m = w.shape[2], rows.shape[0]
    return x.new_empty(m, _h_width(activation, n)), x.new_empty(m, n)


def _cpu_grouped_mm_act_gathered(x, rows, w, offs, bias, scale, activation, alpha, limit):
    check_grouped_mm_act_gathered_args(x, rows, w, offs, bias, scale, activation, alpha, limit)
    return grouped_mm_act_gathered_ref(x, rows, w, offs, bias, scale, activation, alpha, limit)


def _fake_grouped_mm_act_bwd(dy, w, offs, pre, scale, prob, out_bias, prob_grad, activation,
                             alpha, limit, gate_linear, bias_grad):
    check_grouped_mm_act_bwd_args(dy, w, offs, pre, scale, prob, out_bias, prob_grad,
                                  activation, alpha, limit, gate_linear=gate_linear)
    m = dy.shape[0]
    return (pre.new_empty(pre.shape), pre.new_empty(m, w.shape[2]),
            dy.new_empty(m if prob_grad else 0, dtype=torch.float32),
            dy.new_empty((w.shape[0], pre.shape[1]) if bias_grad else (0, 0), dtype=torch.float32))


def _cpu_grouped_mm_act_bwd(dy, w, offs, pre, scale, prob, out_bias, prob_grad, activation,
                            alpha, limit, gate_linear, bias_grad):
    check_grouped_mm_act_bwd_args(dy, w, offs, pre, scale, prob, out_bias, prob_grad,
                                  activation, alpha, limit, gate_linear=gate_linear)
    return grouped_mm_act_bwd_ref(dy, w, offs, pre, scale, prob, out_bias, prob_grad,
                                  activation, alpha, limit, gate_linear, bias_grad)


def _fake_grouped_mm_swiglu(x, w, offs, bias, alpha, limit):
    check_grouped_mm_swiglu_args(x, w, offs, bias, alpha, limit)
    m, two_i = x.shape[0], w.shape[2]
    return x.new_empty(m, two_i // 2), x.new_empty(m, two_i)


def _cpu_grouped_mm_swiglu(x, w, offs, bias, alpha, limit):
    check_grouped_mm_swiglu_args(x, w, offs, bias, alpha, limit)
    return grouped_mm_swiglu_ref(x, w, offs, bias, alpha, limit)


def _fake_grouped_mm_swiglu_bwd(dy, w, offs, pre, alpha, limit):
    check_grouped_mm_swiglu_bwd_args(dy, w, offs, pre, alpha, limit)
    m, inter = dy.shape[0], w.shape[2]
    return pre.new_empty(m, 2 * inter), pre.new_empty(m, inter)


def _cpu_grouped_mm_swiglu_bwd(dy, w, offs, pre, alpha, limit):
    check_grouped_mm_swiglu_bwd_args(dy, w, offs, pre, alpha, limit)
    return grouped_mm_swiglu_bwd_ref(dy, w, offs, pre, alpha, limit)


def _register() -> None:
    for name, fake, cpu in (
            ("grouped_mm_act", _fake_grouped_mm_act, _cpu_grouped_mm_act),
            ("grouped_mm_act_gathered", _fake_grouped_mm_act_gathered,
             _cpu_grouped_mm_act_gathered),
            ("grouped_mm_act_bwd", _fake_grouped_mm_act_bwd, _cpu_grouped_mm_act_bwd),
            ("grouped_mm_swiglu", _fake_grouped_mm_swiglu, _cpu_grouped_mm_swiglu),
            ("grouped_mm_swiglu_bwd", _fake_grouped_mm_swiglu_bwd, _cpu_grouped_mm_swiglu_bwd)):
        register_kernels(name, fake, cpu)


if _library.library_loaded():
    _register()

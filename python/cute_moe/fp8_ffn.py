"""cute_moe.fp8.expert_ffn: the expert block with its four ragged-M GEMMs in FP8, the activation
and its backward fused into the up projection and the down projection's input gradient (issue
14's training path so far; docs/fp8.md)."""
# One autograd.Function over the whole block. Each weight is cast once per forward (one
# quantize_128x128 call: the transposed copy for the forward GEMM, the as-is copy for the input
# gradient, kept for the backward); activations and gradients are quantized 1x128 right before
# the GEMM that reads them. The up projection writes pre and h (bf16) from one FP8 kernel, the
# down projection's input gradient writes dpre, prob * h and dprob from another (the bf16
# kernels' epilogues on the FP8 mainloop); the weight and bias gradients are the bf16 ops of
# ffn_autograd (no FP8 ragged-K GEMM yet). On the CPU (or without the op library) cute_moe.fp8
# runs its references.
from __future__ import annotations

from typing import NamedTuple

import torch

from .activation_args import (LIMIT_DEFAULT, check_act_params, check_activation, is_gated,
                              resolve_limit)
from .activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from .ffn_autograd import Act, _param_grads
from .fp8 import (grouped_mm_act_bwd_unchecked, grouped_mm_act_unchecked, grouped_mm_unchecked,
                  quantize_1x128, quantize_128x128)
from .ops.checks import check_offs_values, check_scales
from .ops.gemm import check_grouped_mm_args
from .ops.glu import check_gate_linear, check_gated_width
from .reference.activation import act_ref

__all__ = ["expert_ffn"]

_OP = "fp8.expert_ffn"
_BF16_PATH = "cute_moe.expert_ffn"


class _Cast(NamedTuple):
    """A weight (E, k, n) in e4m3 by 128x128 blocks, from one quantize_128x128 call: the
    transposed copy (always: the forward GEMM's operand) and the as-is copy (when the input
    gradient needs it; empty otherwise)."""
    q: torch.Tensor        # (E, k, n) or empty
    scale: torch.Tensor    # (E, ceil(k / 128), ceil(n / 128)) or empty
    q_t: torch.Tensor      # (E, n, k)
    scale_t: torch.Tensor  # (E, ceil(n / 128), ceil(k / 128))


def _cast(w: torch.Tensor, as_is: bool) -> _Cast:
    return _Cast(*quantize_128x128(w, as_is=as_is, transposed=True))


def _operand(q: torch.Tensor, scale: torch.Tensor):
    """An FP8 GEMM's weight operand from one copy of a cast: q (E, n, k) as the k-contiguous
    (E, k, n) view, its scales as (E, ceil(k / 128), ceil(n / 128)). From q_t: W (x @ W); from
    the as-is q: W^T (dy @ W^T)."""
    return q.transpose(-2, -1), scale.transpose(-2, -1)


def _fp8_mm(a: torch.Tensor, operand, offs, bias=None, row_scale=None) -> torch.Tensor:
    """a (bf16) quantized 1x128, times an FP8 weight operand: bf16 out."""
    aq, a_scale = quantize_1x128(a)
    return grouped_mm_unchecked(aq, a_scale, *operand, offs, bias, row_scale)


def _forward(x, w_up, w_down, offs, b_up, b_down, prob, act: Act, wu_as_is: bool, wd_as_is: bool):
    """(y, pre, cast of w_up, cast of w_down)."""
    wu, wd = _cast(w_up, wu_as_is), _cast(w_down, wd_as_is)
    up = _operand(wu.q_t, wu.scale_t)
    if act.name == "none":  # h = pre: a plain GEMM
        h = pre = _fp8_mm(x, up, offs, b_up)
    else:
        xq, x_scale = quantize_1x128(x)
        h, pre = grouped_mm_act_unchecked(xq, x_scale, *up, offs, b_up, act.name, act.alpha,
                                          act.limit)
    y = _fp8_mm(h, _operand(wd.q_t, wd.scale_t), offs, b_down, prob)
    return y, pre, wu, wd


class _Fp8ExpertFFN(torch.autograd.Function):
    """(x, w_up, w_down, offs, b_up, b_down, prob, act) -> y; see expert_ffn."""

    @staticmethod
    def forward(ctx, x, w_up, w_down, offs, b_up, b_down, prob, act):
        need_x, need_wu, need_wd, _, need_bu, need_bd, need_prob = ctx.needs_input_grad[:7]
        need_dpre = need_x or need_wu or need_bu
        y, pre, wu, wd = _forward(x, w_up, w_down, offs, b_up, b_down, prob, act,
                                  wu_as_is=need_x, wd_as_is=need_dpre or need_prob)
        ctx.act = act
        ctx.bias_dtypes = (b_up.dtype if b_up is not None else None,
                           b_down.dtype if b_down is not None else None)
        # Kept: pre (bf16; the backward kernel recomputes h from it), the as-is casts the
        # backward GEMMs read, and inputs (free).
        keep_wd = need_dpre or need_prob
        ctx.save_for_backward(
            x if need_wu else None, w_up, w_down, offs, b_down if need_prob else None, prob,
            pre if (need_dpre or need_wd or need_bd or need_prob) else None,
            wu.q if need_x else None, wu.scale if need_x else None,
            wd.q if keep_wd else None, wd.scale if keep_wd else None)
        return y

    @staticmethod
    def backward(ctx, dy):
        (x, w_up, w_down, offs, b_down, prob, pre, wu_q, wu_s, wd_q, wd_s) = ctx.saved_tensors
        need_x, need_wu, need_wd, _, need_bu, need_bd, need_prob = ctx.needs_input_grad[:7]
        need_dpre = need_x or need_wu or need_bu
        act = ctx.act
        bu_dtype, bd_dtype = ctx.bias_dtypes
        dy = dy.contiguous()
        dx = dw_up = db_up = dw_down = db_down = dprob = None
        dpre = hp = None
        if need_dpre or need_prob:
            # one kernel: dh = prob * (Q(dy) W_down^T), dpre = act'(pre) dh, hp = prob * act(pre),
            # dprob = <act(pre), dy W_down^T> + <dy, b_down>
            dyq, dy_scale = quantize_1x128(dy)
            with_bias = need_prob and b_down is not None
            dpre, hp, dprob = grouped_mm_act_bwd_unchecked(
                dyq, dy_scale, *_operand(wd_q, wd_s), offs, pre, prob,
                b_down if with_bias else None, dy if with_bias else None, need_prob, act.name,
                act.alpha, act.limit)
            if not need_prob:
                dprob = None
        elif need_wd:
            h = act_ref(pre, act.name, act.alpha, act.limit)
            hp = (h * prob[:, None] if prob is not None else h).to(pre.dtype)
        if need_wd or need_bd:
            dw_down, db_down, _ = _param_grads(hp, dy, offs, w_down, need_wd,
                                               bd_dtype if need_bd else None, row_scale=prob)
        if need_wu or need_bu:
            dw_up, db_up, _ = _param_grads(x, dpre, offs, w_up, need_wu,
                                           bu_dtype if need_bu else None)
        if need_x:
            dx = _fp8_mm(dpre, _operand(wu_q, wu_s), offs)
        return dx, dw_up, dw_down, None, db_up, db_down, dprob, None


def _unsupported(what: str, hint: str = "") -> None:
    raise NotImplementedError(f"cute_moe.{_OP}: {what} is not supported by the FP8 path yet; "
                              f"{_BF16_PATH} serves it (bf16){hint}")


def _check_row_major(name: str, w: torch.Tensor, shape: str) -> None:
    if w.stride(2) != 1 and w.shape[2] > 1:
        _unsupported(f"{name} as a transposed view (strides {w.stride()}; the FP8 path reads "
                     f"{shape} row-major, unit stride along the last dimension)",
                     f", or pass {name}.contiguous()")


def expert_ffn(x: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, offs: torch.Tensor,
               b_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None, *,
               activation: str = DEFAULT_ACTIVATION, prob: torch.Tensor | None = None,
               swiglu_alpha: float = DEFAULT_ALPHA, limit: float | str | None = LIMIT_DEFAULT,
               scale_up: torch.Tensor | None = None, scale_down: torch.Tensor | None = None,
               gather=None, gate_linear: str = "interleaved") -> torch.Tensor:
    """The expert block of cute_moe.expert_ffn with its four ragged-M GEMMs in FP8 (e4m3 x e4m3,
    DeepSeek-V3's block scales: docs/fp8.md). The same math and argument conventions:
        pre = x[r] @ w_up[e] + b_up[e];  h = act(pre);  y = prob[r] * (h @ w_down[e] + b_down[e])
    for the rows r of expert e (rows sorted by expert; offs (E,) int32 cumulative end offsets;
    experts may be empty; rows at or past offs[-1] are padding and give zero output and
    gradients). Returns y (M, H) bf16, differentiable with respect to x, w_up, w_down, b_up,
    b_down and prob.

    Layout (the default one of cute_moe.expert_ffn): x (M, H); w_up (E, H, 2I) row-major
    with gate and linear columns interleaved for the gated activations ("swiglu_oai", the
    default, "swiglu", "geglu"), (E, H, I) for "srelu" and "none"; w_down (E, I, H) row-major;
    b_up (E, 2I) / (E, I), b_down (E, H), optional; all bf16; H and I multiples of 16 (16-byte
    e4m3 rows). prob (M,) float32 (bf16 is converted). swiglu_alpha and limit as in
    cute_moe.expert_ffn ("default": the activation's own clamp, 7.0 for swiglu_oai; None: no
    clamp). Transposed weight views, gate_linear="halves", gather and scale_up / scale_down
    raise NotImplementedError: cute_moe.expert_ffn (bf16) serves them.

    What is FP8: the four ragged-M GEMMs (fp32 accumulation, bf16 out), each reading a
    1x128-quantized bf16 activation or gradient and a 128x128-quantized weight, in three
    kernels and a plain GEMM: the up projection (x, W_up) writing pre and h = act(pre) from one
    kernel; the down projection (h, W_down; bias and prob in its epilogue); the down
    projection's input gradient (dy, W_down^T) with the activation's backward in its epilogue:
    dpre = act'(pre) * prob * (Q(dy) W_down^T), prob * h for the weight gradient, and
    dprob = <act(pre), Q(dy) W_down^T> + <dy, b_down>, from one kernel; and the up
    projection's (dpre, W_up^T). Each weight is cast once per forward (as-is and transposed
    copies from one pass); the backward reuses the casts.
    What is not yet: the weight gradients run on the bf16 ragged-K GEMM (dW_up = x^T dpre,
    dW_down = (prob h)^T dy) and the bias gradients are fp32 column sums of dpre and prob * dy
    (no FP8 ragged-K GEMM yet); the quantizations of x, h, dy and dpre are separate passes
    (quantize_1x128), not yet in the epilogues (docs/fp8.md).

    Accuracy: each GEMM is the fp32 math of its quantized operands, rounded once to bf16
    (docs/fp8.md's contract: the tensor cores' k-block accumulation is a little short of
    fp32); the intermediates pre, h and dpre are bf16 (dh stays fp32 inside its kernel).
    Against the float64 evaluation of these definitions, relative Frobenius errors of a few
    1e-3 on the GPU (the GEMMs' bf16 outputs, and the e4m3 steps where a quantizer reads a
    value rounded the other way; the tests bound them at 1e-2), up to 3e-3 with the CPU
    references. Against the bf16 block
    (cute_moe.expert_ffn), the e4m3 roundings of up to three chained GEMM operands: 5-7%
    relative in the output and the gradients on random data, up to 9% in dx and dW_up where
    quantizing pre moves many values across swiglu_oai's clamps (the tests bound all at 0.1).
    """
    if scale_up is not None or scale_down is not None:
        _unsupported("scale_up / scale_down (per-expert scales)")
    if gather is not None:
        _unsupported("gather (the token gather fused into the up projection)",
                     ", or gather the rows first (cute_moe.permute)")
    if gate_linear == "halves":
        _unsupported("gate_linear='halves'",
                     ", or convert once with cute_moe.repack.halves_to_interleaved")
    limit = resolve_limit(activation, limit)
    check_activation(activation, limit, _OP)
    check_act_params(swiglu_alpha, limit, _OP, {"alpha": "swiglu_alpha"})
    check_gate_linear(_OP, gate_linear, activation)
    gated = is_gated(activation)
    check_grouped_mm_args(x, w_up, offs, b_up, op=_OP, names={"w": "w_up", "bias": "b_up"})
    if gated:
        check_gated_width(_OP, w_up, "w_up", activation)
    _check_row_major("w_up", w_up, "(E, H, 2I)" if gated else "(E, H, I)")
    num_experts, hidden = w_up.shape[0], x.shape[1]
    inter = w_up.shape[2] // 2 if gated else w_up.shape[2]
    if w_down.dim() != 3 or tuple(w_down.shape) != (num_experts, inter, hidden):
        raise ValueError(f"cute_moe.{_OP}: w_down: expected shape {(num_experts, inter, hidden)} "
                         f"(E, I, H), got shape {tuple(w_down.shape)}")
    _check_row_major("w_down", w_down, "(E, I, H)")
    check_grouped_mm_args(x.new_empty_strided((x.shape[0], inter), (0, 1)), w_down, offs, b_down,
                          op=_OP, names={"x": "h", "w": "w_down", "bias": "b_down"})
    if hidden % 16 or inter % 16:
        raise ValueError(f"cute_moe.{_OP}: expected H and I multiples of 16 (16-byte e4m3 rows), "
                         f"got H = {hidden}, I = {inter}")
    check_offs_values(_OP, offs, x.shape[0], "x")
    if isinstance(prob, torch.Tensor) and prob.dtype != torch.float32:
        prob = prob.to(torch.float32)
    check_scales(_OP, "prob", prob, x.shape[0], "one per routed row", "x", x)
    b_up = b_up.contiguous() if b_up is not None else None
    b_down = b_down.contiguous() if b_down is not None else None
    prob = prob.contiguous() if prob is not None else None
    act = Act(activation, float(swiglu_alpha), None if limit is None else float(limit))
    leaves = (x, w_up, w_down, b_up, b_down, prob)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in leaves):
        return _Fp8ExpertFFN.apply(x, w_up, w_down, offs, b_up, b_down, prob, act)
    return _forward(x, w_up, w_down, offs, b_up, b_down, prob, act, False, False)[0]

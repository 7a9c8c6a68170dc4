# Fused MoE expert FFN with the GPT-OSS SwiGLU (design.md 2-3), the API of seed 000:
# grouped_mm_swiglu runs the up projection, bias and activation in one grouped GEMM and
# also returns the pre-activations; grouped_mm_downproj, handed those, runs the SwiGLU
# backward inside the down projection's input-gradient GEMM and recomputes the
# activation there instead of keeping it. The autograd spans both calls, so it lives in
# two autograd.Functions here rather than on the ops. Ops the library lacks are replaced
# by the references, under the same autograd.
# Fused MoE expert FFN (design.md 2-3). The up projection runs the GEMM, the per-expert
# scale, the bias and the activation in one grouped GEMM and also returns the
# pre-activations; the down projection, handed those, runs the activation's backward
# (and the router-probability gradient) inside its input-gradient GEMM and recomputes
# the activation there instead of keeping it. expert_ffn is the general API; the seed's
# grouped_mm_swiglu / grouped_mm_downproj are thin wrappers of the same two autograd
# Functions. Ops the library lacks are replaced by the references, under the same
# autograd.
from __future__ import annotations

import warnings
from typing import NamedTuple

import torch

from . import _ops
from ._checks import (check_activation, check_grouped_mm_args, check_grouped_mm_swiglu_args,
                      check_offs_values, check_pre_args, check_scales, check_swiglu_params)
from ._checks_permute import check_permute_args
from .functional import grouped_mm
from .permute import permute as _permute
from .reference import (GATED_ACTIVATIONS, act_bwd_ref, act_ref, default_limit,
                        grouped_bias_grad_ref, grouped_mm_act_bwd_ref, grouped_mm_act_ref,
                        grouped_mm_ref, grouped_mm_scaled_ref, grouped_mm_wgrad_ref)

__all__ = ["expert_ffn", "grouped_mm_swiglu", "grouped_mm_downproj"]

_UP_NAMES = {"w": "W_up", "alpha": "swiglu_alpha", "limit": "swiglu_limit"}
_DOWN_NAMES = {"x": "swiglu_out", "w": "W_down", "alpha": "swiglu_alpha",
               "limit": "swiglu_limit"}


class _Act(NamedTuple):
    """An activation with its parameters (alpha: swiglu_oai's sigmoid scale)."""
    name: str
    alpha: float
    limit: float | None


def _mm(a, w, offs, bias=None):
    if _ops.REGISTERED:
        return torch.ops.cute_moe.grouped_mm(a, w, offs, bias)
    return grouped_mm_ref(a, w, offs, bias)


def _scaled_mm(a, w, offs, bias=None, scale=None, prob=None):
    """prob[r] * (scale[e] * (a @ w[e]) + bias[e]), no autograd."""
    if scale is None and prob is None:
        return _mm(a, w, offs, bias)
    if _ops.ACT_REGISTERED:
        return torch.ops.cute_moe.grouped_mm_scaled(a, w, offs, bias, scale, prob)
    return grouped_mm_scaled_ref(a, w, offs, bias, scale, prob)


def _act_fwd(x, w, offs, bias, scale, act: _Act, rows=None):
    """(h, pre) of the fused up projection; over x[rows] when rows is given (the gather
    fused into the GEMM)."""
    if rows is not None:
        return torch.ops.cute_moe.grouped_mm_act_gathered(x, rows, w, offs, bias, scale, act.name,
                                                          act.alpha, act.limit)
    if _ops.ACT_REGISTERED:
        return torch.ops.cute_moe.grouped_mm_act(x, w, offs, bias, scale, act.name, act.alpha,
                                                 act.limit)
    if act.name == "swiglu_oai" and scale is None and _ops.SWIGLU_REGISTERED:
        return torch.ops.cute_moe.grouped_mm_swiglu(x, w, offs, bias, act.alpha, act.limit)
    return grouped_mm_act_ref(x, w, offs, bias, scale, act.name, act.alpha, act.limit)


def _act_bwd(dy, w, offs, pre, scale, prob, out_bias, prob_grad, act: _Act):
    """(dpre, prob * h, dprob) of the fused down-projection input gradient."""
    if _ops.ACT_REGISTERED:
        return torch.ops.cute_moe.grouped_mm_act_bwd(dy, w, offs, pre, scale, prob, out_bias,
                                                     prob_grad, act.name, act.alpha, act.limit)
    return grouped_mm_act_bwd_ref(dy, w, offs, pre, scale, prob, out_bias, prob_grad, act.name,
                                  act.alpha, act.limit)


def _column_sum(src, offs, row_scale=None):
    if _ops.REGISTERED and (row_scale is None or _ops.ACT_REGISTERED):
        return torch.ops.cute_moe.grouped_column_sum(src, offs, row_scale) if row_scale is not None \
            else torch.ops.cute_moe.grouped_column_sum(src, offs)
    return grouped_bias_grad_ref(src, offs, row_scale=row_scale)


def _wgrad(a, dy, offs, w, out_dtype):
    """a[rows_e]^T @ dy[rows_e] in w's layout (the transposed view of an (E, N, K) result
    for a transposed weight)."""
    transposed = w.stride(2) != 1
    if _ops.REGISTERED:
        if transposed:
            return torch.ops.cute_moe.grouped_mm_wgrad(dy, a, offs, out_dtype)[0].transpose(-2, -1)
        return torch.ops.cute_moe.grouped_mm_wgrad(a, dy, offs, out_dtype)[0]
    if transposed:
        return grouped_mm_wgrad_ref(dy, a, offs, out_dtype).transpose(-2, -1)
    return grouped_mm_wgrad_ref(a, dy, offs, out_dtype)


def _param_grads(a, dy, offs, w, need_w, bias_dtype, scale=None, need_scale=False,
                 row_scale=None):
    """Gradients of w, bias and scale in y[r] = row_scale[r] * (scale[e] * (a[r] @ w[e]) +
    bias[e]) when `a` already carries row_scale (a = row_scale * h): dw with the weight's
    layout, db (in bias_dtype; None when bias_dtype is None) = sum row_scale * dy, dscale
    = <w[e], a^T dy>. None where not needed."""
    need_b = bias_dtype is not None
    dw = db = dscale = None
    if scale is None:
        if need_w and need_b and row_scale is None and _ops.REGISTERED and w.stride(2) == 1:
            dw, db = torch.ops.cute_moe.grouped_mm_wgrad(a, dy, offs, w.dtype, True)
        elif need_w:
            dw = _wgrad(a, dy, offs, w, w.dtype)
    elif need_w or need_scale:
        g = _wgrad(a, dy, offs, w, torch.float32)  # unscaled, so dscale needs no division
        if need_w:
            dw = (g * scale[:, None, None]).to(w.dtype)
        if need_scale:
            dscale = (g * w.to(torch.float32)).sum((1, 2)).to(scale.dtype)
    if need_b and db is None:
        db = _column_sum(dy, offs, row_scale)
    return dw, (db.to(bias_dtype) if need_b else None), dscale


def _gathered_ok(x, w, act) -> bool:
    """Whether the gathered up projection (the op) takes these operands."""
    return (_ops.GATHER_REGISTERED and x.is_cuda and act.name != "none"
            and (w.stride(2) == 1 or w.shape[2] == 1))


class _UpProj(torch.autograd.Function):
    """(x, W_up, offs, b_up, scale_up) -> (h, pre). Backward takes the gradient of pre
    (from _DownProj) and, when h also feeds something else, adds the activation's backward
    of h's gradient computed from pre, recomputed. With h_differentiable False (expert_ffn,
    where h only feeds _DownProj) h is marked non-differentiable, so no gradient of h
    exists to handle, under torch.compile too.
    Gathered (rows given, the gathered op; _gathered_ok): x holds the tokens and routed row
    r is x[rows[r]]. The backward sums each token's rows of the input gradient, through
    token_rows (T, k) when given (deterministic, cute_moe.permute's gather-sum), else with
    index_add_; it gathers x[rows] once more for the weight gradient."""

    @staticmethod
    def forward(ctx, x, w, offs, bias, scale, act, h_differentiable, rows=None, token_rows=None):
        h, pre = _act_fwd(x, w, offs, bias, scale, act, rows)
        ctx.set_materialize_grads(False)
        if not h_differentiable:
            ctx.mark_non_differentiable(h)
        ctx.act = act
        ctx.bias_dtype = bias.dtype if bias is not None else None
        # pre is NOT kept here: in the fused route _DownProj keeps it and frees it after its
        # backward, before this backward allocates dW_up (1 GiB less at the peak for
        # GPT-OSS-20B). The unfused route recomputes it (x, W_up, bias are inputs: saving
        # them costs nothing).
        ctx.save_for_backward(x, w, offs, bias, scale, rows, token_rows)
        return h, pre

    @staticmethod
    def backward(ctx, grad_h, grad_pre):
        x, w, offs, bias, scale, rows, token_rows = ctx.saved_tensors
        act = ctx.act
        dpre = grad_pre
        # h took gradient outside the fused route (the seed API's swiglu_out used twice).
        # torch.compile may hand a zero grad_h here rather than None: still correct.
        if grad_h is not None:
            pre = _act_fwd(x, w, offs, bias, scale, act, rows)[1]  # same bits as the forward's
            d = act_bwd_ref(grad_h, pre, act.name, act.alpha, act.limit)
            dpre = (d if grad_pre is None else d + grad_pre.to(d.dtype)).to(pre.dtype)
        if dpre is None:
            return (None,) * 9
        dpre = dpre.contiguous()
        need_x, need_w, _, need_b, need_scale = ctx.needs_input_grad[:5]
        dx = _scaled_mm(dpre, w.transpose(-2, -1), offs, None, scale) if need_x else None
        if rows is not None:
            if dx is not None and token_rows is not None:
                dx = torch.ops.cute_moe.gather_sum_rows(dx, token_rows, None)
            elif dx is not None:
                acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
                dx = acc.index_add_(0, rows.long(), dx.float()).to(x.dtype)
            x = torch.ops.cute_moe.gather_rows(x, rows, None) if (need_w or need_scale) else None
        dw, db, dscale = _param_grads(x, dpre, offs, w, need_w,
                                      ctx.bias_dtype if need_b else None, scale, need_scale)
        return dx, dw, None, db, dscale, None, None, None, None


class _DownProj(torch.autograd.Function):
    """(h, W_down, offs, b_down, pre, prob, scale_down) -> out = prob[r] * (scale_down[e] *
    (h @ W_down[e]) + b_down[e]). Keeps pre, not h: backward gets (dpre, prob * h, dprob)
    from one fused GEMM and returns dpre as pre's gradient and none for h (the gradient h
    would get reaches the same leaves through pre). For "none", h is pre (the same
    tensor is passed twice)."""

    @staticmethod
    def forward(ctx, h, w, offs, bias, pre, prob, scale, act):
        out = _scaled_mm(h, w, offs, bias, scale, prob)
        _, need_w, _, need_b, need_pre, need_prob, need_scale = ctx.needs_input_grad[:7]
        ctx.act = act
        ctx.bias_dtype = bias.dtype if bias is not None else None
        keep_pre = need_w or need_pre or need_prob or need_scale or (need_b and prob is not None)
        ctx.save_for_backward(pre if keep_pre else None, w, offs, bias if need_prob else None,
                              prob, scale)
        return out

    @staticmethod
    def backward(ctx, dy):
        pre, w, offs, bias, prob, scale = ctx.saved_tensors
        _, need_w, _, need_b, need_pre, need_prob, need_scale = ctx.needs_input_grad[:7]
        act = ctx.act
        dy = dy.contiguous()
        dpre = hp = dprob = None
        if act.name == "none" and prob is None:  # a plain input gradient; h is pre
            if need_pre:
                dpre = _scaled_mm(dy, w.transpose(-2, -1), offs, None, scale)
            hp = pre
        elif need_pre or need_prob:
            dpre, hp, dprob = _act_bwd(dy, w.transpose(-2, -1), offs, pre, scale, prob, bias,
                                       need_prob, act)
            if not need_prob:
                dprob = None
        elif need_w or need_scale:
            h = act_ref(pre, act.name, act.alpha, act.limit)
            hp = (h * prob[:, None] if prob is not None else h).to(pre.dtype)
        dw, db, dscale = _param_grads(hp, dy, offs, w, need_w, ctx.bias_dtype if need_b else None,
                                      scale, need_scale, row_scale=prob)
        if not need_pre:
            dpre = None
        return None, dw, None, db, dpre, dprob, dscale, None


class _ScaledMM(torch.autograd.Function):
    """y = scale[e] * (x @ w[e]) + bias[e] (the "none" activation's up projection)."""

    @staticmethod
    def forward(ctx, x, w, offs, bias, scale):
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.save_for_backward(x, w, offs, scale)
        return _scaled_mm(x, w, offs, bias, scale)

    @staticmethod
    def backward(ctx, dy):
        x, w, offs, scale = ctx.saved_tensors
        need_x, need_w, _, need_b, need_scale = ctx.needs_input_grad[:5]
        dy = dy.contiguous()
        dx = _scaled_mm(dy, w.transpose(-2, -1), offs, None, scale) if need_x else None
        dw, db, dscale = _param_grads(x, dy, offs, w, need_w, ctx.bias_dtype if need_b else None,
                                      scale, need_scale)
        return dx, dw, None, db, dscale


_DEFAULT = object()


def expert_ffn(x: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, offs: torch.Tensor,
               b_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None, *,
               activation: str = "swiglu", prob: torch.Tensor | None = None,
               scale_up: torch.Tensor | None = None, scale_down: torch.Tensor | None = None,
               swiglu_alpha: float = 1.702, limit=_DEFAULT,
               gather: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor:
    """The expert block of an MoE layer on routed rows sorted by expert:
        pre = scale_up[e] * (x[r] @ w_up[e]) + b_up[e]
        h   = act(pre)
        y   = prob[r] * (scale_down[e] * (h @ w_down[e]) + b_down[e])
    in two fused grouped GEMMs (the down projection's backward runs the activation's
    backward and computes prob's gradient in its epilogue; `h` is recomputed, not kept).

    x: (M, H) bf16, rows sorted by expert. offs: (E,) int32 cumulative end offsets on x's
       device (experts may be empty; rows past offs[-1] are padding and give zeros).
    w_up: (E, H, 2I) bf16 with gate and linear columns interleaved (column 2j gate j, 2j+1
       linear j; cute_moe.repack converts [gate | linear] halves) for the gated activations,
       (E, H, I) for "srelu" and "none"; or a transposed view of (E, 2I, H) / (E, I, H).
    w_down: (E, I, H) bf16, or a transposed view of (E, H, I).
    b_up: (E, 2I) (interleaved) or (E, I); b_down: (E, H); bf16, optional.
    activation: "swiglu_oai" (GPT-OSS: g*sigmoid(swiglu_alpha*g)*(u+1)), "swiglu"
       (silu(g)*u), "geglu" (gelu_tanh(g)*u), "srelu" (relu(a)^2) or "none".
    limit: clamp of the gated activations (g = min(a, limit), u = clamp(b, -limit,
       limit)); default 7.0 for swiglu_oai, None (no clamp) otherwise.
    prob: (M,) router probability of each routed row (float32; bf16 is converted).
    scale_up, scale_down: (E,) float32 per-expert scalars on the GEMM results (the seed's
       per-group alpha).
    gather: (rows, token_rows) to run the block on x[rows] with x the (T, H) tokens: rows
       (M,) int32, the token of each routed row; token_rows (T, k) int32, the routed row of
       each (token, choice) (cute_moe.permute's inverse; None: x's gradient is summed with
       index_add_, not bitwise deterministic). Where the gathered up projection runs (CUDA,
       a gated or srelu activation, w_up contiguous along 2I) the gather happens inside the
       GEMM and the (M, H) sorted copy of x is never made: less memory, more time on
       Hopper (docs/perf-notes.md); elsewhere x is gathered first. Same result either way.
    Returns y (M, H) bf16. Differentiable with respect to every tensor argument but offs.
    A bad offs (decreasing, negative or past M) stops the kernel with a message and a
    trap that leaves the CUDA context unusable; cute_moe.set_offs_check(True) (or
    CUTE_MOE_CHECK_OFFS=1) checks it on the host first and raises ValueError (a sync per
    call: for debugging).
    """
    op = "expert_ffn"
    limit = default_limit(activation) if limit is _DEFAULT else limit
    check_activation(activation, limit, op)
    check_swiglu_params(swiglu_alpha, limit, op, {"alpha": "swiglu_alpha"})
    gated = activation in GATED_ACTIVATIONS
    check_grouped_mm_args(x, w_up, offs, b_up, op=op, names={"w": "w_up", "bias": "b_up"})
    if gated and w_up.shape[2] % 2:
        raise ValueError(f"cute_moe.{op}: w_up: expected an even w_up.shape[2] (2I interleaved "
                         f"gate/linear columns for {activation!r}), got shape {tuple(w_up.shape)}")
    inter = w_up.shape[2] // 2 if gated else w_up.shape[2]
    num_experts, hidden = w_up.shape[0], x.shape[1]
    act = _Act(activation, float(swiglu_alpha), None if limit is None else float(limit))
    rows = token_rows = None
    if gather is not None:
        rows, token_rows = gather
        if token_rows is not None:
            check_permute_args(x, rows, token_rows)
        elif not (isinstance(rows, torch.Tensor) and rows.dim() == 1 and rows.dtype == torch.int32
                  and rows.device == x.device):
            raise ValueError(f"cute_moe.{op}: gather: expected rows as a 1-D int32 tensor on x's "
                             f"device, got {rows!r:.80}")
        if not _gathered_ok(x, w_up, act):  # gather first: the same result
            x = _permute(x, rows, token_rows) if token_rows is not None else x[rows.long()]
            rows = token_rows = None
    m = x.shape[0] if rows is None else rows.shape[0]
    if w_down.dim() != 3 or tuple(w_down.shape) != (num_experts, inter, hidden):
        raise ValueError(f"cute_moe.{op}: w_down: expected shape {(num_experts, inter, hidden)} "
                         f"(E, I, H), got shape {tuple(w_down.shape)}")
    check_grouped_mm_args(_h_like(x, m, inter), w_down, offs, b_down, op=op,
                          names={"x": "h", "w": "w_down", "bias": "b_down"})
    check_offs_values(op, offs, m, "x" if rows is None else "gather's rows")
    if prob is not None and isinstance(prob, torch.Tensor) and prob.dtype != torch.float32:
        prob = prob.to(torch.float32)
    check_scales(op, "prob", prob, m, "one per routed row", "x", x)
    check_scales(op, "scale_up", scale_up, num_experts, "one per expert", "x", x)
    check_scales(op, "scale_down", scale_down, num_experts, "one per expert", "x", x)
    if activation == "none":  # h = pre: the down projection keeps h as its "pre"
        h = _ScaledMM.apply(x, w_up, offs, b_up, scale_up)
        return _DownProj.apply(h, w_down, offs, b_down, h, prob, scale_down, act)
    h, pre = _UpProj.apply(x, w_up, offs, b_up, scale_up, act, False, rows, token_rows)
    return _DownProj.apply(h, w_down, offs, b_down, pre, prob, scale_down, act)


def _h_like(x, m, inter):
    """A stand-in of h (M, I) for the shape checks (one row of memory: row stride 0)."""
    return x.new_empty_strided((m, inter), (0, 1))


def _fused_pair(swiglu_out, aux, alpha, limit, op) -> bool:
    """Whether the fused backward may route swiglu_out's gradient through aux: always
    when swiglu_out takes no gradient, else only when both are the outputs of one
    grouped_mm_swiglu call. Also checks alpha and limit against that call's. Under
    torch.compile, which cannot trace autograd history, the pairing is assumed."""
    if torch.compiler.is_compiling():
        return True
    node = aux.grad_fn
    if isinstance(node, _UpProj._backward_cls):
        for name, value, used in (("swiglu_alpha", alpha, node.act.alpha),
                                  ("swiglu_limit", limit, node.act.limit)):
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
    check_offs_values("grouped_mm_swiglu", offs, x.shape[0], "x")
    act = _Act("swiglu_oai", float(swiglu_alpha), _float(swiglu_limit))
    return _UpProj.apply(x, W_up, offs, bias, None, act, True)


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
    check_offs_values(op, offs, swiglu_out.shape[0], "swiglu_out")
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
    act = _Act("swiglu_oai", alpha, limit)
    return _DownProj.apply(swiglu_out, W_down, offs, bias, aux_biased_acc, None, None, act)

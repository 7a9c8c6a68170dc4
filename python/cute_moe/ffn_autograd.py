"""The autograd of the fused expert FFN: its up and down projections as autograd.Functions."""
# The up projection runs the GEMM, the per-expert scale, the bias and the activation in
# one grouped GEMM and also returns the pre-activations; the down projection, handed
# those, runs the activation's backward (and the router-probability gradient) inside its
# input-gradient GEMM and recomputes the activation there instead of keeping it. The
# autograd spans both ops, so it lives here rather than on the ops. Without the op
# library the references run in place of the ops, under the same autograd.
from __future__ import annotations

from typing import NamedTuple

import torch

from . import _library
from .reference.activation import act_bwd_ref, act_ref
from .reference.gemm import (grouped_bias_grad_ref, grouped_bias_grads_ref, grouped_mm_ref,
                             grouped_mm_scaled_ref, grouped_mm_wgrad_ref)
from .reference.glu import as_gate_linear, grouped_mm_act_bwd_ref, grouped_mm_act_ref
from .reference.permute import permute_ref, unpermute_ref

__all__ = ["Act", "UpProj", "DownProj", "ScaledMM", "gathered_ok"]


class Act(NamedTuple):
    """An activation with its parameters (alpha: swiglu_oai's sigmoid scale) and, for the
    gated ones, where the up projection's (gate, linear) columns sit: "interleaved" or
    "halves" ([gate | linear]: the weight, its bias and their gradients; pre is always
    interleaved, and in "halves" the gradient DownProj hands back for pre is in halves,
    which UpProj expects)."""
    name: str
    alpha: float
    limit: float | None
    gate_linear: str = "interleaved"


def _mm_split(a, w, w_hi, offs):
    """a @ [w; w_hi] per group, W's rows in two tensors (read in place by the kernel)."""
    if _library.library_loaded():
        return torch.ops.cute_moe.grouped_mm(a, w, offs, None, w_hi)
    return grouped_mm_ref(a, torch.cat([w, w_hi], dim=1), offs)


def _scaled_mm(a, w, offs, bias=None, scale=None, prob=None):
    """prob[r] * (scale[e] * (a @ w[e]) + bias[e]), no autograd. Without scales the op runs
    grouped_mm's kernel, and unlike grouped_mm it has no Python autograd kernel, which costs
    ~5-20 us of host time a call even with grad off (docs/perf-notes.md, session 39)."""
    if _library.library_loaded():
        return torch.ops.cute_moe.grouped_mm_scaled(a, w, offs, bias, scale, prob)
    return grouped_mm_scaled_ref(a, w, offs, bias, scale, prob)


# Where expert_ffn's gather (nn.MoE's fuse_gather) runs in bf16: a gather pass whose sorted copy
# is freed as soon as the up projection's GEMM has read it (False, the default), or inside that
# GEMM (True: grouped_mm_act_gathered, no copy at all). The backward gathers again for the weight
# gradient either way, so both hold the same memory from the forward to the backward and reach the
# same peak; on an H100 the gathered GEMM takes the MoE layer's forward from 7.6 to 11.5 ms at
# GPT-OSS-20B (2.6 to 4.6 at Qwen3-30B-A3B), the pass costs its backward 0.3 ms, 1-4% of the step
# (docs/perf-notes.md, session 29). Read by each expert_ffn call.
GATHER_IN_GEMM = False


def _act_fwd(x, w, offs, bias, scale, act: Act, rows=None, w_linear=None, in_gemm=True):
    """(h, pre) of the fused up projection; over x[rows] when rows is given (the gather
    fused into the GEMM, or with in_gemm False a gather pass first: the same bits); w_linear:
    the linear half of a halves w as its own tensor."""
    if rows is not None and not in_gemm:
        return _act_fwd(_gather(x, rows), w, offs, bias, scale, act, None, w_linear)
    if rows is not None:
        return torch.ops.cute_moe.grouped_mm_act_gathered(x, rows, w, offs, bias, scale, act.name,
                                                          act.alpha, act.limit)
    if _library.library_loaded():
        if w_linear is not None:
            return torch.ops.cute_moe.grouped_mm_act(x, w, offs, bias, scale, act.name, act.alpha,
                                                     act.limit, act.gate_linear, w_linear)
        return torch.ops.cute_moe.grouped_mm_act(x, w, offs, bias, scale, act.name, act.alpha,
                                                 act.limit, act.gate_linear)
    if w_linear is not None:
        w = torch.cat([w, w_linear], dim=2)
    return grouped_mm_act_ref(x, w, offs, bias, scale, act.name, act.alpha, act.limit,
                              act.gate_linear)


def _act_bwd(dy, w, offs, pre, scale, prob, out_bias, prob_grad, act: Act, bias_grad=False):
    """(dpre, prob * h, dprob, db) of the fused down-projection input gradient (db: dpre's
    column sums per expert, the up projection's bias gradient, when bias_grad)."""
    if _library.library_loaded():
        return torch.ops.cute_moe.grouped_mm_act_bwd(dy, w, offs, pre, scale, prob, out_bias,
                                                     prob_grad, act.name, act.alpha, act.limit,
                                                     act.gate_linear, bias_grad)
    return grouped_mm_act_bwd_ref(dy, w, offs, pre, scale, prob, out_bias, prob_grad, act.name,
                                  act.alpha, act.limit, act.gate_linear, bias_grad)


def _column_sum(src, offs, row_scale=None):
    if _library.library_loaded():
        return torch.ops.cute_moe.grouped_column_sum(src, offs, row_scale) if row_scale is not None \
            else torch.ops.cute_moe.grouped_column_sum(src, offs)
    return grouped_bias_grad_ref(src, offs, row_scale=row_scale)


def _output_grads(dout, offs, prob, bias, need_db, row_token):
    """dy = dout, or dout[row_token] when dout is the gradient of a combine (the rows of
    token t summed: the backward gathers), and from the same pass over dy: db (E, N)
    float32 = the column sums of prob * dy per expert when need_db, and bias_dot (M,)
    float32 = dy[r] . bias[e] when a bias is given (prob's gradient's bias term). One read
    of dy instead of one per quantity (cute_moe::grouped_bias_grads)."""
    if not need_db and bias is None:
        return (dout if row_token is None else _gather(dout, row_token)), None, None
    if _library.library_loaded():
        db, bias_dot, gathered = torch.ops.cute_moe.grouped_bias_grads(dout, offs, prob, bias,
                                                                       row_token)
    else:
        db, bias_dot, gathered = grouped_bias_grads_ref(dout, offs, prob, bias, row_token)
    return (gathered if row_token is not None else dout, db if need_db else None,
            bias_dot if bias is not None else None)


def _combine(y, token_rows):
    """out[t] = sum_j y[token_rows[t, j]] (cute_moe.permute.unpermute without weights)."""
    if _library.library_loaded():
        return torch.ops.cute_moe.gather_sum_rows(y, token_rows, None)
    return unpermute_ref(y, token_rows, None)


def _gather(x, rows):
    """x[rows] (the dispatch's gather: cute_moe.permute.permute's forward)."""
    if _library.library_loaded():
        return torch.ops.cute_moe.gather_rows(x, rows, None)
    return permute_ref(x, rows)


def _token_grads(dx_rows, rows, token_rows, num_tokens: int):
    """The gradient of x (num_tokens, H) from that of x[rows]: each token's rows summed,
    through token_rows (T, k) when given (a gather-sum in a fixed order: deterministic), else
    with index_add_ (not bitwise deterministic on CUDA)."""
    if token_rows is not None:
        return _combine(dx_rows, token_rows)
    acc = dx_rows.new_zeros((num_tokens, dx_rows.shape[1]), dtype=torch.float32)
    return acc.index_add_(0, rows.long(), dx_rows.float()).to(dx_rows.dtype)


def _wgrad(a, dy, offs, w, out_dtype):
    """a[rows_e]^T @ dy[rows_e] in w's layout (the transposed view of an (E, N, K) result
    for a transposed weight)."""
    transposed = w.stride(2) != 1
    if _library.library_loaded():
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
        if (need_w and need_b and row_scale is None and _library.library_loaded()
                and w.stride(2) == 1):
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


def gathered_ok(x, w, act: Act) -> bool:
    """Whether the gathered up projection (the op) takes these operands."""
    return (_library.library_loaded() and x.is_cuda and act.name != "none"
            and act.gate_linear == "interleaved" and (w.stride(2) == 1 or w.shape[2] == 1))


class UpProj(torch.autograd.Function):
    """(x, W_up, offs, b_up, scale_up) -> (h, pre). Backward takes the gradient of pre
    (from DownProj) and, when h also feeds something else, adds the activation's backward
    of h's gradient computed from pre, recomputed. With h_differentiable False (expert_ffn,
    where h only feeds DownProj) h is marked non-differentiable, so no gradient of h
    exists to handle, under torch.compile too.
    Gathered (rows given; gathered_ok): x holds the tokens and routed row r is x[rows[r]],
    read by the gathered GEMM (gather_in_gemm) or copied out by a gather pass whose copy
    is freed after the GEMM (the same bits; GATHER_IN_GEMM above). The backward sums each
    token's rows of the input gradient, through token_rows (T, k) when given
    (deterministic, cute_moe.permute's gather-sum), else with index_add_; it gathers
    x[rows] once more for the weight gradient.
    bias_grad_elsewhere: the bias's gradient comes from DownProj (its fused backward sums
    dpre's columns in its epilogue, given up_bias) and this backward returns none; only
    where h is not differentiable (pre's gradient is then DownProj's dpre, whole).
    w_linear (halves only; no rows, no scale): w_up's [gate | linear] halves as two tensors,
    w the gate half and w_linear the linear one, each (E, H, I) (torchtitan's w1, w3 read
    transposed), read in place by every GEMM; their gradients come back as two tensors."""

    @staticmethod
    def forward(ctx, x, w, offs, bias, scale, act, h_differentiable, rows=None, token_rows=None,
                bias_grad_elsewhere=False, w_linear=None, gather_in_gemm=True):
        h, pre = _act_fwd(x, w, offs, bias, scale, act, rows, w_linear, gather_in_gemm)
        ctx.gather_in_gemm = gather_in_gemm
        ctx.set_materialize_grads(False)
        if not h_differentiable:
            ctx.mark_non_differentiable(h)
        ctx.bias_grad_elsewhere = bias_grad_elsewhere and not h_differentiable
        ctx.act = act
        ctx.bias_dtype = bias.dtype if bias is not None else None
        # pre is NOT kept here: in the fused route DownProj keeps it and frees it after its
        # backward, before this backward allocates dW_up (1 GiB less at the peak for
        # GPT-OSS-20B). The unfused route recomputes it (x, W_up, bias are inputs: saving
        # them costs nothing).
        ctx.save_for_backward(x, w, offs, bias, scale, rows, token_rows, w_linear)
        return h, pre

    @staticmethod
    def backward(ctx, grad_h, grad_pre):
        x, w, offs, bias, scale, rows, token_rows, w_linear = ctx.saved_tensors
        act = ctx.act
        dpre = grad_pre
        # h took gradient outside the fused route (grouped_mm_swiglu's swiglu_out used twice).
        # torch.compile may hand a zero grad_h here rather than None: still correct.
        if grad_h is not None:
            pre = _act_fwd(x, w, offs, bias, scale, act, rows, w_linear, ctx.gather_in_gemm)[1]
            d = as_gate_linear(act_bwd_ref(grad_h, pre, act.name, act.alpha, act.limit), act.gate_linear)
            dpre = (d if grad_pre is None else d + grad_pre.to(d.dtype)).to(pre.dtype)
        if dpre is None:
            return (None,) * 12
        dpre = dpre.contiguous()
        need_x, need_w, _, need_b, need_scale = ctx.needs_input_grad[:5]
        need_b = need_b and not ctx.bias_grad_elsewhere
        if w_linear is not None:  # no rows, no scale (expert_ffn joins the halves otherwise)
            return UpProj._halves_pair_grads(ctx, x, w, w_linear, offs, dpre, need_x, need_w, need_b)
        dx = _scaled_mm(dpre, w.transpose(-2, -1), offs, None, scale) if need_x else None
        if rows is not None:
            if dx is not None:
                dx = _token_grads(dx, rows, token_rows, x.shape[0])
            x = _gather(x, rows) if (need_w or need_scale) else None
        dw, db, dscale = _param_grads(x, dpre, offs, w, need_w,
                                      ctx.bias_dtype if need_b else None, scale, need_scale)
        return dx, dw, None, db, dscale, None, None, None, None, None, None, None

    @staticmethod
    def _halves_pair_grads(ctx, x, w, w_linear, offs, dpre, need_x, need_w, need_b):
        """The gradients with the halves as two tensors: dx = dpre @ [w; w_linear]^T in one
        GEMM reading both (K = 2I split between them), and each half's weight gradient from
        its half of dpre (a column slice, read in place), in its own layout."""
        inter = w.shape[2]
        need_w_linear = ctx.needs_input_grad[10]
        dx = _mm_split(dpre, w.transpose(-2, -1), w_linear.transpose(-2, -1), offs) if need_x else None
        dw = _wgrad(x, dpre[:, :inter], offs, w, w.dtype) if need_w else None
        dw_linear = _wgrad(x, dpre[:, inter:], offs, w_linear, w_linear.dtype) if need_w_linear else None
        db = _column_sum(dpre, offs).to(ctx.bias_dtype) if need_b else None
        return dx, dw, None, db, None, None, None, None, None, None, dw_linear, None


class DownProj(torch.autograd.Function):
    """(h, W_down, offs, b_down, pre, prob, scale_down, act[, combine]) -> out = prob[r] *
    (scale_down[e] * (h @ W_down[e]) + b_down[e]). Keeps pre, not h: backward gets (dpre,
    prob * h, dprob) from one fused GEMM and returns dpre as pre's gradient and none for h
    (the gradient h would get reaches the same leaves through pre). For "none", h is pre
    (the same tensor is passed twice).
    combine (row_token (M,), token_rows (T, k)): returns the tokens' sums of their rows,
    out_t[t] = sum_j out[token_rows[t, j]] (an MoE layer's combine), so that the backward
    gathers the rows' gradient and the bias-side gradients (db, prob's bias term) in one
    pass (_output_grads).
    up_bias (the up projection's bias, read for its dtype only): this backward returns its
    gradient, dpre's column sums from the fused kernel's epilogue (UpProj then returns none:
    its bias_grad_elsewhere)."""

    @staticmethod
    def forward(ctx, h, w, offs, bias, pre, prob, scale, act, combine=None, up_bias=None):
        out = _scaled_mm(h, w, offs, bias, scale, prob)
        _, need_w, _, need_b, need_pre, need_prob, need_scale = ctx.needs_input_grad[:7]
        ctx.act = act
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.up_bias_dtype = up_bias.dtype if up_bias is not None else None
        keep_pre = need_w or need_pre or need_prob or need_scale or (need_b and prob is not None)
        row_token = None
        if combine is not None:
            row_token, token_rows = combine
            out = _combine(out, token_rows)
        ctx.save_for_backward(pre if keep_pre else None, w, offs, bias if need_prob else None,
                              prob, scale, row_token)
        return out

    @staticmethod
    def backward(ctx, dout):
        pre, w, offs, bias, prob, scale, row_token = ctx.saved_tensors
        _, need_w, _, need_b, need_pre, need_prob, need_scale = ctx.needs_input_grad[:7]
        need_up_b = len(ctx.needs_input_grad) > 9 and ctx.needs_input_grad[9]  # up_bias given
        act = ctx.act
        # The bias side from the pass that gathers dy (combine) or from one pass of its own:
        # db where prob scales the rows (else the weight-gradient op sums dy), and the bias
        # term of prob's gradient (bias is kept only where prob needs a gradient).
        dy, db, bias_dot = _output_grads(dout.contiguous(), offs, prob, bias,
                                         need_b and (prob is not None or row_token is not None),
                                         row_token)
        dpre = hp = dprob = db_up = None
        if act.name == "none" and prob is None:  # a plain input gradient; h is pre
            if need_pre:
                dpre = _scaled_mm(dy, w.transpose(-2, -1), offs, None, scale)
            hp = pre
        elif need_pre or need_prob:
            dpre, hp, dprob, db_up = _act_bwd(dy, w.transpose(-2, -1), offs, pre, scale, prob, None,
                                              need_prob, act, need_up_b)
            db_up = db_up.to(ctx.up_bias_dtype) if need_up_b else None
            if not need_prob:
                dprob = None
            elif bias_dot is not None:
                dprob = dprob + bias_dot
        elif need_w or need_scale:
            h = act_ref(pre, act.name, act.alpha, act.limit)
            hp = (h * prob[:, None] if prob is not None else h).to(pre.dtype)
        dw, db_w, dscale = _param_grads(hp, dy, offs, w, need_w,
                                        ctx.bias_dtype if need_b and db is None else None,
                                        scale, need_scale, row_scale=prob)
        db = db.to(ctx.bias_dtype) if db is not None else db_w
        if not need_pre:
            dpre = None
        return None, dw, None, db, dpre, dprob, dscale, None, None, db_up


class ScaledMM(torch.autograd.Function):
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


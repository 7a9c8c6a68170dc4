"""cute_moe.fp8.expert_ffn: the expert block with its six GEMMs in FP8, the activation with h's
quantization in one pass after the up projection, its backward fused into the down projection's
input gradient (issue 14's training path so far; docs/fp8.md)."""
# Two autograd.Functions, as the bf16 block's: the up projection and the down projection, so that
# autograd frees pre between their backwards. Each weight is cast twice per micro-batch: the
# transposed copy for the forward GEMM in the forward, the as-is copy for the input gradient in the
# backward (kept from the forward, the two FP8 copies would hold 0.8 GB more per GPT-OSS-20B layer
# than the bf16 block keeps; recast, they cost one more read of the bf16 weights, ~0.5 ms a
# GPT-OSS-20B layer on an H100), unless a reuse_weight_casts context is open (fp8_weight_casts.py:
# the copies made once per optimizer step, held until it closes); activations and gradients are
# quantized right before the GEMM that reads them (dpre's 1x128 copy can come from the down
# projection's fused backward instead: FUSED_DPRE_COPY, _DpreCopy): 1x128 for the ragged-M GEMMs;
# for the FP8 weight gradients (FP8_WEIGHT_GRADS, fp8_weight_grads_for) by blocks of each expert's
# rows, 128x1 for the activation operand (x, p h) and 128x128 for the gradient (dy, dpre), each made
# as late as its bf16 tensor allows and that tensor freed once its copies exist (x's and, without a
# combine, dy's copies from one pass writing both; dpre's 128x128 after dx; after a combine p h's
# before dy is gathered and dy's after); the up projection keeps x's 128x1 copy for its weight
# gradient instead of the bf16 x, half the bytes. The up projection writes pre from the plain FP8
# GEMM, and one pass over pre writes h's 1x128 copy (act_quantize_1x128: h is never stored in bf16;
# with FUSED_H_COPY the up projection's epilogue writes the copy itself, slower today);
# the down projection's input gradient writes dpre (and, asked, its 1x128 e4m3 copy), prob * h and
# dprob from one FP8 kernel (the bf16 kernel's epilogue on the FP8 mainloop, and a quantizing node);
# the bias gradients are fp32 column sums of the bf16 dpre and dy (b_up's from the pass that writes
# dpre's 1x128 copy, quantize_1x128_column_sums). On the CPU (or without the op library)
# cute_moe.fp8 runs its references.
from __future__ import annotations

import torch

from .activation_args import (LIMIT_DEFAULT, check_act_params, check_activation, is_gated,
                              resolve_limit)
from .activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from .ffn_autograd import (Act, _column_sum, _combine, _gather, _output_grads, _param_grads,
                           _token_grads)
from .fp8 import (act_quantize_1x128, grouped_mm_act_bwd_unchecked, grouped_mm_act_quant_unchecked,
                  grouped_mm_unchecked, grouped_mm_wgrad, quantize_1x128, quantize_1x128_128x1,
                  quantize_1x128_column_sums, quantize_128x1)
from .fp8_weight_casts import backward_operand, forward_operand
from .ops.checks import check_offs_values, check_scales
from .ops.gemm import check_grouped_mm_args
from .ops.glu import check_gate_linear, check_gated_width
from .ops.permute import checked_combine, checked_gather
from .reference.activation import act_ref

__all__ = ["expert_ffn"]

_OP = "fp8.expert_ffn"
_BF16_PATH = "cute_moe.expert_ffn"

# The weight gradients on the FP8 ragged-K GEMM (True) or on the bf16 one over the bf16 operands
# (False); None (the default) picks by shape, fp8_weight_grads_for. Each forward reads it; its
# backward follows what the forward decided.
FP8_WEIGHT_GRADS: bool | None = None
# The FP8 weight gradients pay where each expert has this many routed rows or more on average:
# their GEMMs are ~1.4x the bf16 ones on deep groups, and their operands' 128x1 copies come
# from passes that write them beside the 1x128 copies. The MoE layer per micro-batch against the
# bf16 weight gradients (H200, session 41): GPT-OSS-20B (3072 rows an expert) 1.06x, the seed
# example (6144) 1.03x; GPT-OSS-120B (768) 0.99-1.00x, Qwen3-30B-A3B (1024) 0.93x, their shallow
# groups leaving the FP8 GEMM few k-blocks a tile (docs/perf-notes.md, session 41).
FP8_WEIGHT_GRADS_MIN_ROWS_PER_EXPERT = 2048


def fp8_weight_grads_for(rows: int, experts: int, hidden: int, inter: int, gathered: bool) -> bool:
    """Whether a block of `rows` routed rows over `experts` experts (H = hidden, I = inter;
    `gathered`: a gather fused into x's quantizer) runs its weight gradients in FP8:
    FP8_WEIGHT_GRADS where it is set, else where the experts are deep enough and the layer's
    peak memory stays below the bf16 layer's (issue 14's bar). With a fused gather the peak is
    at the down projection's weight gradient, where the FP8 one holds x's and dy's copies by 128
    rows (M H bytes each) in place of the bf16 one's p h (2 M I, p h's own copy being M I) and
    dW_down (2 E I H): FP8 where the copies take at most 3/4 of those bytes, the rest of the
    layer's tensors being no exact model (GPT-OSS-20B: 0.70, bench/memory_trace.py 3.64
    against 3.79 GiB; the seed example 2.4, 0.90 against 0.78 forced; a GPU test's layer with
    H = I and 2048 rows an expert, 1.0, above bf16's peak forced). Without one the bf16 layer
    also holds the sorted x (2 M H): they fit (GPT-OSS-20B 4.03 against 4.32 GiB)."""
    if FP8_WEIGHT_GRADS is not None:
        return bool(FP8_WEIGHT_GRADS)
    if rows < FP8_WEIGHT_GRADS_MIN_ROWS_PER_EXPERT * max(experts, 1):
        return False
    return not gathered or 4 * (2 * rows * hidden) <= 3 * (rows * inter + 2 * experts * inter * hidden)

# dpre's 1x128 copy from the down projection's fused backward (True; gated activations) or from a
# quantization pass of its own in the up projection's backward (False, the default: on an H100
# the copy's direct stores from the epilogue add 1.0 ms to that kernel at GPT-OSS-20B, the pass
# costs 0.6; docs/perf-notes.md, session 18). Same bits either way.
FUSED_DPRE_COPY = False

# h's 1x128 copy from the up projection's epilogue (True; gated activations, 2I a multiple of 32:
# grouped_mm_act_quant, its 1 x 2 clusters exchanging the rows' amax) or from a pass over pre
# (False: act_quantize_1x128). Same bits either way.
FUSED_H_COPY = False


def _quantized(a: torch.Tensor, offs, both: bool, tile_scales: bool, rows=None):
    """a's 1x128 copy (q, scale), and with `both` its weight-gradient copy from the same pass
    (q_t, scale_t: by 128 x 1 blocks of each expert's rows, or 128 x 128 with tile_scales, the
    gradient operand's; None, None without); of a[rows] where rows is given, gathered by the
    pass itself."""
    if both:
        return quantize_1x128_128x1(a, offs, tile_scales, rows)
    return (*quantize_1x128(a, rows), None, None)


class _DpreCopy:
    """dpre's 1x128 copy, handed from _Fp8DownProj's backward (whose fused kernel writes it
    beside dpre) to _Fp8UpProj's (whose input gradient reads it). Keyed by the dpre tensor
    itself: the up projection takes it only when the gradient it receives is that tensor, and
    quantizes dpre again otherwise (the same bits: the epilogue's copy is quantize_1x128's)."""

    __slots__ = ("wanted", "dpre", "q", "scale")

    def __init__(self):
        self.wanted = False  # set by the up projection's forward: whether it will compute dx
        self.dpre = self.q = self.scale = None

    def put(self, dpre, q, scale):
        self.dpre, self.q, self.scale = dpre, q, scale

    def take(self, dpre):
        copy = (self.q, self.scale) if self.dpre is not None and dpre is self.dpre else None
        self.dpre = self.q = self.scale = None
        return copy


class _Fp8UpProj(torch.autograd.Function):
    """(x, W_up, offs, b_up, act, link, rows, token_rows, train, weight_grads_fp8) ->
    (h_q, h_scale, pre): pre = x W_up + b_up (over x[rows] where rows is given: x's 1x128 copy,
    and for an FP8 weight gradient its 128x1 copy, come from one pass that gathers the rows, the
    sorted bf16 copy is never made; the backward sums each token's rows of dx and gathers x again
    for the bf16 weight gradient) from the plain FP8 GEMM, and h = act(pre)'s 1x128 copy (the
    down projection's operand) from one pass over pre (act_quantize_1x128: the bits of quantize_1x128
    of the fused up projection's h, which cost more in its cooperative kernel's epilogue than the
    pass; docs/perf-notes.md, sessions 26 and 44), or with FUSED_H_COPY (gated activations) from
    the up projection's own epilogue (grouped_mm_act_quant, the same bits). h is never stored in
    bf16. h_q and h_scale only feed
    _Fp8DownProj, which hands pre its gradient: they are non-differentiable. Keeps x's 128x1 copy
    for the weight gradient (the bf16 x on the bf16 weight-gradient path) and the inputs; casts
    W_up's as-is copy again in the backward (in a reuse_weight_casts context, where `train` (grad
    mode at the call) says a backward may follow, the forward's cast writes it too and the context
    keeps it)."""

    @staticmethod
    def forward(ctx, x, w_up, offs, b_up, act, link, rows, token_rows, train, weight_grads_fp8):
        up = forward_operand(w_up, backward_too=train and ctx.needs_input_grad[0])
        need_w = ctx.needs_input_grad[1]
        fp8_w = need_w and weight_grads_fp8
        # x's 1x128 copy, and for the FP8 weight gradient its 128x1 copy, from one pass over the
        # rows (gathering them where rows is given: the sorted bf16 x is never made)
        xq, x_scale, xq_t, x_scale_t = _quantized(x, offs, fp8_w, False, rows)
        if FUSED_H_COPY and is_gated(act.name) and w_up.shape[2] % 32 == 0:
            h_q, h_scale, pre = grouped_mm_act_quant_unchecked(xq, x_scale, *up, offs, b_up,
                                                               act.name, act.alpha, act.limit)
            del xq, x_scale
        else:
            pre = grouped_mm_unchecked(xq, x_scale, *up, offs, b_up)
            del xq, x_scale
            h_q, h_scale = act_quantize_1x128(pre, act.name, act.alpha, act.limit)  # "none": h is pre
        ctx.mark_non_differentiable(h_q, h_scale)
        ctx.set_materialize_grads(False)
        ctx.bias_dtype = b_up.dtype if b_up is not None else None
        ctx.link = link
        if link is not None:
            link.wanted = ctx.needs_input_grad[0]
        ctx.save_for_backward(x if need_w and not fp8_w else None, xq_t, x_scale_t, w_up, offs,
                              rows, token_rows)
        ctx.num_tokens = x.shape[0]
        return h_q, h_scale, pre

    @staticmethod
    def backward(ctx, _grad_h_q, _grad_h_scale, dpre):
        x, xq_t, x_scale_t, w_up, offs, rows, token_rows = ctx.saved_tensors
        need_x, need_w, _, need_b = ctx.needs_input_grad[:4]
        none = (None,) * 10
        if dpre is None:
            return none
        dpre = dpre.contiguous()
        copy = ctx.link.take(dpre) if ctx.link is not None else None  # dpre's 1x128, if fused
        # dx first, from dpre's 1x128 copy (with b_up's gradient from the same read), its copy and
        # W_up's cast freed (and, gathered, the rows' dx summed per token) before the weight
        # gradient's operands and dW are allocated: the FP8 weight gradient's 128x128 copy of
        # dpre is made only then (the layer's peak stays below bf16's; docs/perf-notes.md, 41)
        dx = db = None
        if need_x:
            if copy is None and need_b:  # dpre's 1x128 copy and b_up's gradient from one read
                dq, d_scale, db = quantize_1x128_column_sums(dpre, offs)
                db = db.to(ctx.bias_dtype)
            else:
                dq, d_scale = copy if copy is not None else quantize_1x128(dpre)
            dx = grouped_mm_unchecked(dq, d_scale, *backward_operand(w_up), offs)
            del dq, d_scale
            if rows is not None:
                dx = _token_grads(dx, rows, token_rows, ctx.num_tokens)
        del copy
        if xq_t is None:  # the bf16 weight gradient (or none)
            if rows is not None and need_w:
                x = _gather(x, rows)
            dw, db_w, _ = _param_grads(x, dpre, offs, w_up, need_w,
                                       ctx.bias_dtype if need_b and db is None else None)
            return dx, dw, None, db if db is not None else db_w, *none[4:]
        dq_t, d_scale_t = quantize_128x1(dpre, offs, tile_scales=True)
        dw = grouped_mm_wgrad(xq_t, x_scale_t, dq_t, d_scale_t, offs)  # (E, H, 2I) bf16, w_up's layout
        if need_b and db is None:
            db = _column_sum(dpre, offs).to(ctx.bias_dtype)
        return dx, dw, None, db, *none[4:]


class _Fp8DownProj(torch.autograd.Function):
    """(h_q, h_scale, W_down, offs, b_down, pre, prob, act, link, combine, train, weight_grads_fp8) ->
    y = prob * (h W_down + b_down), FP8 (h by its 1x128 copy), with a combine (row_token,
    token_rows) summed per token (out[t] = sum_j y[token_rows[t, j]]). Keeps pre, not h: the
    backward's one FP8 kernel gives (dpre, prob * h, dprob) (dh = prob * Q(dy) W_down^T, dpre =
    act'(pre) dh, dprob = <act(pre), Q(dy) W_down^T> + <dy, b_down>, dy = dout[row_token] after a
    combine) and returns dpre as pre's gradient, none for h. Autograd frees pre after this
    backward, before _Fp8UpProj's allocates dW_up (as the bf16 block does). W_down's casts as
    _Fp8UpProj's W_up."""

    @staticmethod
    def forward(ctx, h_q, h_scale, w_down, offs, b_down, pre, prob, act, link, combine, train,
                weight_grads_fp8):
        _, _, need_w, _, need_b, need_pre, need_prob = ctx.needs_input_grad[:7]
        down = forward_operand(w_down, backward_too=train and (need_pre or need_prob))
        y = grouped_mm_unchecked(h_q, h_scale, *down, offs, b_down, prob)
        row_token = None
        if combine is not None:  # the tokens' outputs: out[t] = sum_j y[token_rows[t, j]]
            row_token, token_rows = combine
            y = _combine(y, token_rows)
        ctx.act = act
        ctx.link = link
        ctx.fp8_weight_grads = weight_grads_fp8
        ctx.bias_dtype = b_down.dtype if b_down is not None else None
        ctx.save_for_backward(pre if (need_w or need_pre or need_prob) else None, w_down, offs,
                              b_down if need_prob else None, prob, row_token)
        return y

    @staticmethod
    def backward(ctx, dout):
        pre, w_down, offs, b_down, prob, row_token = ctx.saved_tensors
        _, _, need_w, _, need_b, need_pre, need_prob = ctx.needs_input_grad[:7]
        act = ctx.act
        dout = dout.contiguous()
        dpre = hp = dprob = None
        fp8_w = need_w and ctx.fp8_weight_grads
        fused = need_pre or need_prob
        # dy: dout, or its rows gathered after a combine (row_token). The bias side comes from
        # one pass over dy (as the bf16 DownProj): db where prob scales the rows (else the
        # weight-gradient op sums dy), and the bias term of prob's gradient (b_down is kept
        # only where prob needs a gradient). After a combine, when the fused kernel reads dy
        # before the weight gradient does, dy's 1x128 copy gathers dout's rows itself and the
        # bf16 dy is gathered after the kernel: W_down's cast and dy's copy are never live beside
        # the bf16 dy, and the peak stays the bf16 block's (docs/perf-notes.md, session 27). The
        # FP8 weight gradient's copies are made as late as their bf16 tensors allow and each bf16
        # tensor freed once its copies exist: p h's 128x1 before dy is gathered, dy's 128x128
        # after; without a combine dy's copies come from one pass before the kernel and dy is
        # freed then (session 41).
        late = fused and row_token is not None
        dy_t = hp_t = None  # the FP8 weight gradient's copies of dy (128x128) and p h (128x1)

        def output_grads():
            return _output_grads(dout, offs, prob, b_down, need_b and prob is not None, row_token)

        def bias_grad(dy):  # b_down's gradient where output_grads did not give it
            bias_dtype = ctx.bias_dtype if need_b and db is None else None
            return _column_sum(dy, offs, prob).to(bias_dtype) if bias_dtype is not None else None

        db_w = None
        if not late:
            dy, db, bias_dot = output_grads()
        if fused:
            if late:
                dyq, dy_scale = quantize_1x128(dout, row_token)
            else:
                dyq, dy_scale, *both = _quantized(dy, offs, fp8_w, True)
                if fp8_w:  # dy's last use is b_down's gradient: taken now, dy freed before the
                    # kernel allocates dpre and p h
                    dy_t, db_w, dy = tuple(both), bias_grad(dy), None
            # dpre's 1x128 for the up projection's dx, from this kernel's epilogue
            fused_copy = ctx.link is not None and ctx.link.wanted and need_pre and is_gated(act.name)
            dpre, hp, dprob, *copy = grouped_mm_act_bwd_unchecked(
                dyq, dy_scale, *backward_operand(w_down), offs, pre, prob, None, None, need_prob,
                act.name, act.alpha, act.limit, fused_copy)
            if fused_copy:
                ctx.link.put(dpre, *copy)
            del dyq, dy_scale, copy
            if late:
                if fp8_w:
                    hp_t, hp = quantize_128x1(hp, offs), None
                dy, db, bias_dot = output_grads()
            if bias_dot is not None:
                dprob = dprob + bias_dot
        elif need_w:
            h = act_ref(pre, act.name, act.alpha, act.limit)
            hp = (h * prob[:, None] if prob is not None else h).to(pre.dtype)
        if fp8_w:
            if dy is not None:
                dy_t, db_w, dy = quantize_128x1(dy, offs, tile_scales=True), bias_grad(dy), None
            if hp_t is None:
                hp_t, hp = quantize_128x1(hp, offs), None
            dw = grouped_mm_wgrad(*hp_t, *dy_t, offs)  # (E, I, H), w_down's
        else:
            bias_dtype = ctx.bias_dtype if need_b and db is None else None
            dw, db_w, _ = _param_grads(hp, dy, offs, w_down, need_w, bias_dtype, row_scale=prob)
        db = db.to(ctx.bias_dtype) if db is not None else db_w
        return (None, None, dw, None, db, dpre if need_pre else None, dprob if need_prob else None,
                None, None, None, None, None)


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
               gather=None, combine=None, gate_linear: str = "interleaved") -> torch.Tensor:
    """The expert block of cute_moe.expert_ffn with its four ragged-M GEMMs in FP8 (e4m3 x e4m3,
    DeepSeek-V3's block scales: docs/fp8.md). The same math and argument conventions:
        pre = x[r] @ w_up[e] + b_up[e];  h = act(pre);  y = prob[r] * (h @ w_down[e] + b_down[e])
    for the rows r of expert e (rows sorted by expert; offs (E,) int32 cumulative end offsets;
    experts may be empty; rows at or past offs[-1] are padding and give zero output and
    gradients). Returns y (M, H) bf16 ((T, H) with combine, as cute_moe.expert_ffn's: the
    rows summed per token), differentiable with respect to x, w_up, w_down, b_up, b_down and
    prob.

    Layout (the default one of cute_moe.expert_ffn): x (M, H); w_up (E, H, 2I) row-major
    with gate and linear columns interleaved for the gated activations ("swiglu_oai", the
    default, "swiglu", "geglu"), (E, H, I) for "srelu" and "none"; w_down (E, I, H) row-major;
    b_up (E, 2I) / (E, I), b_down (E, H), optional; all bf16; H and I multiples of 16 (16-byte
    e4m3 rows). prob (M,) float32 (bf16 is converted). swiglu_alpha and limit as in
    cute_moe.expert_ffn ("default": the activation's own clamp, 7.0 for swiglu_oai; None: no
    clamp). gather (rows, token_rows) as in cute_moe.expert_ffn: x is then the (T, H) tokens,
    x's 1x128 copy gathers the rows itself (the sorted bf16 copy is never made; the backward
    gathers them again for the bf16 weight gradient, and first, in the forward, for the FP8
    one). Transposed weight views, gate_linear="halves" and scale_up / scale_down raise
    NotImplementedError: cute_moe.expert_ffn (bf16) serves them.

    What is FP8: the four ragged-M GEMMs (fp32 accumulation, bf16 out), each reading a
    1x128-quantized bf16 activation or gradient and a 128x128-quantized weight, in two fused
    kernels and two plain GEMMs: the up projection (x, W_up; bias in its epilogue) writing pre,
    then one pass over pre giving h = act(pre)'s 1x128 copy (h itself is never stored); the
    down projection (h, W_down; bias and prob in its epilogue); the down
    projection's input gradient (dy, W_down^T) with the activation's backward in its epilogue:
    dpre = act'(pre) * prob * (Q(dy) W_down^T), prob * h for the weight gradient, and
    dprob = <act(pre), Q(dy) W_down^T> + <dy, b_down>, from one kernel; and the up
    projection's (dpre, W_up^T). Each weight is cast to e4m3 in the forward (its transposed
    copy) and again in the backward (its as-is copy): the block keeps no FP8 copy of a weight
    between the two (what it keeps is the bf16 block's: pre and its inputs).
    The weight gradients dW_up = x^T dpre and dW_down = (prob h)^T dy run on the FP8 ragged-K GEMM,
    x and prob h by 128x1 blocks of each expert's rows, dpre and dy by 128x128 (x's copy made in
    the forward and kept for the backward instead of x); the bias gradients are fp32 column sums of dpre and
    prob * dy. The quantizations of x, dy, dpre and prob * h are separate passes (x and dy
    both ways in one), h's is the activation's pass; dpre's 1x128 copy can come from the fused
    backward's epilogue instead (fp8_ffn.FUSED_DPRE_COPY, off: slower today; docs/fp8.md).

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
    rows = token_rows = None
    if gather is not None:
        rows, token_rows = checked_gather(_OP, gather, x)
    m = x.shape[0] if rows is None else rows.shape[0]
    weight_grads_fp8 = fp8_weight_grads_for(m, num_experts, hidden, inter, gathered=rows is not None)
    if w_down.dim() != 3 or tuple(w_down.shape) != (num_experts, inter, hidden):
        raise ValueError(f"cute_moe.{_OP}: w_down: expected shape {(num_experts, inter, hidden)} "
                         f"(E, I, H), got shape {tuple(w_down.shape)}")
    _check_row_major("w_down", w_down, "(E, I, H)")
    check_grouped_mm_args(x.new_empty_strided((m, inter), (0, 1)), w_down, offs, b_down,
                          op=_OP, names={"x": "h", "w": "w_down", "bias": "b_down"})
    if hidden % 16 or inter % 16:
        raise ValueError(f"cute_moe.{_OP}: expected H and I multiples of 16 (16-byte e4m3 rows), "
                         f"got H = {hidden}, I = {inter}")
    check_offs_values(_OP, offs, m, "x" if rows is None else "rows")
    if isinstance(prob, torch.Tensor) and prob.dtype != torch.float32:
        prob = prob.to(torch.float32)
    check_scales(_OP, "prob", prob, m, "one per routed row", "x", x)
    b_up = b_up.contiguous() if b_up is not None else None
    b_down = b_down.contiguous() if b_down is not None else None
    prob = prob.contiguous() if prob is not None else None
    act = Act(activation, float(swiglu_alpha), None if limit is None else float(limit))
    # dpre's 1x128 copy from the fused backward's epilogue, handed over in eager mode (traced by
    # torch.compile, the up projection quantizes dpre itself: the same bits)
    link = None if torch.compiler.is_compiling() or not FUSED_DPRE_COPY else _DpreCopy()
    train = torch.is_grad_enabled()  # a backward may follow (the Functions' forwards run without)
    h_q, h_scale, pre = _Fp8UpProj.apply(x, w_up, offs, b_up, act, link, rows, token_rows, train,
                                         weight_grads_fp8)
    combine = checked_combine(_OP, combine, m, hidden, x)  # behind the GEMM's launch
    return _Fp8DownProj.apply(h_q, h_scale, w_down, offs, b_down, pre, prob, act, link, combine,
                              train, weight_grads_fp8)

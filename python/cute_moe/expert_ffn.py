"""expert_ffn: the fused expert block of an MoE layer (up projection, activation, down)."""
# Two fused grouped GEMMs under the autograd of ffn_autograd.py; this module checks the
# arguments, resolves the activation's defaults and picks the route (the token gather
# fused into the up projection, or gathered first).
from __future__ import annotations

import torch

from . import fp8 as _fp8
from .activation_args import (LIMIT_DEFAULT, check_act_params, check_activation, is_gated,
                              resolve_limit)
from .activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from . import ffn_autograd as _autograd
from .ffn_autograd import Act, DownProj, ScaledMM, UpProj, gathered_ok
from . import _library
from .ops.checks import check_offs_values, check_same_device, check_scales, check_tensor
from .ops.gemm import check_grouped_mm_args
from .ops.glu import check_gate_linear, check_gated_width
from .ops.permute import checked_combine, checked_gather
from .permute import gather_rows

__all__ = ["expert_ffn", "PRECISIONS", "check_precision"]

PRECISIONS = ("bf16", "fp8")


def check_precision(op: str, precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"cute_moe.{op}: precision: expected one of {PRECISIONS}, got {precision!r}")


def expert_ffn(x: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, offs: torch.Tensor,
               b_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None, *,
               activation: str = DEFAULT_ACTIVATION, prob: torch.Tensor | None = None,
               scale_up: torch.Tensor | None = None, scale_down: torch.Tensor | None = None,
               swiglu_alpha: float = DEFAULT_ALPHA, limit: float | str | None = LIMIT_DEFAULT,
               gather: tuple[torch.Tensor, torch.Tensor | None] | None = None,
               combine: tuple[torch.Tensor, torch.Tensor] | None = None,
               gate_linear: str = "interleaved", precision: str = "bf16") -> torch.Tensor:
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
    gate_linear: where the gated activations' gate and linear columns sit in w_up and b_up:
       "interleaved" (above) or "halves" ([gate | linear], column j gate j, I + j linear
       j: Qwen3-MoE, Mixtral, DeepSeek-V3). The gradients come back in the same layout.
       Halves are read in place from the transposed view of an (E, 2I, H) w_up with an
       (E, I, H)-contiguous w_down (HF's storage); other storages cost a copy per call.
       With "halves", w_up may also be a pair (w_gate, w_linear) of (E, H, I) tensors, the
       two halves kept apart (torchtitan's w1 and w3 (E, I, D), passed transposed): read in
       place by all three GEMMs that use them where both are transposed views of
       contiguous tensors with I a multiple of 128 and no gather or scale_up, else joined
       into one tensor per call; their gradients come back as two tensors either way.
    activation: one of cute_moe/activations.py: "swiglu_oai" (GPT-OSS, the default:
       g*sigmoid(swiglu_alpha*g)*(u+1)), "swiglu" (silu(g)*u), "geglu" (gelu_tanh(g)*u),
       "srelu" (relu(a)^2) or "none".
    limit: clamp of the gated activations (g = min(a, limit), u = clamp(b, -limit,
       limit)); "default" (LIMIT_DEFAULT) takes the activation's default limit, 7.0 for
       swiglu_oai and none for the others; None: no clamp.
    prob: (M,) router probability of each routed row (float32; bf16 is converted).
    scale_up, scale_down: (E,) float32 per-expert scalars on the GEMM results (a
       per-group alpha).
    gather: (rows, token_rows) to run the block on x[rows] with x the (T, H) tokens: rows
       (M,) int32, the token of each routed row; token_rows (T, k) int32, the routed row of
       each (token, choice) (cute_moe.permute's inverse; None: x's gradient is summed with
       index_add_, not bitwise deterministic). Where the gathered up projection runs (CUDA,
       a gated or srelu activation, w_up contiguous along 2I) the (M, H) sorted copy of x
       is freed once the up projection's GEMM has read it (ffn_autograd.GATHER_IN_GEMM:
       made by a gather pass, the default, or never made: the GEMM gathers, slower on
       Hopper; docs/perf-notes.md) and the backward gathers the rows again for the weight
       gradient: less memory held, one more gather pass; with precision="fp8" x's
       quantizer gathers the rows (no time lost); elsewhere x is gathered first. Same
       result either way.
    combine: (row_token (M,), token_rows (T, k)) int32 (cute_moe.permute's pair, M = T*k):
       return the tokens' outputs out[t] = sum_j y[token_rows[t, j]], (T, H), instead of y:
       cute_moe.permute.unpermute(y, token_rows, row_token) with its backward joined to the
       down projection's, which then gathers y's gradient and computes b_down's gradient and
       the bias term of prob's gradient in the same pass over it. Same result.
    precision: "bf16" (the fused bf16 kernels) or "fp8": the block's ragged-M GEMMs in FP8
       with DeepSeek-V3's block scales (cute_moe.fp8.expert_ffn, docs/fp8.md; it takes the
       default layout only and raises NotImplementedError naming this bf16 path for the rest:
       transposed weight views, halves, scale_up / scale_down).
    Returns y (M, H) bf16 ((T, H) with combine). Differentiable with respect to every tensor
    argument but offs.
    A bad offs (decreasing, negative or past M) stops the kernel with a message and a
    trap that leaves the CUDA context unusable; cute_moe.set_offs_check(True) (or
    CUTE_MOE_CHECK_OFFS=1) checks it on the host first and raises ValueError (a sync per
    call: for debugging).
    """
    op = "expert_ffn"
    check_precision(op, precision)
    w_linear = None
    if isinstance(w_up, (tuple, list)):  # the halves as two tensors
        w_up, w_linear = _halves_pair(op, w_up, gate_linear, x,
                                      precision == "bf16" and scale_up is None and gather is None)
    if precision == "fp8":
        return _fp8.expert_ffn(x, w_up, w_down, offs, b_up, b_down, activation=activation,
                               prob=prob, swiglu_alpha=swiglu_alpha, limit=limit,
                               scale_up=scale_up, scale_down=scale_down, gather=gather,
                               gate_linear=gate_linear, combine=combine)
    limit = resolve_limit(activation, limit)
    check_activation(activation, limit, op)
    check_act_params(swiglu_alpha, limit, op, {"alpha": "swiglu_alpha"})
    gated = is_gated(activation)
    # the checks see the whole up projection; a stand-in of the pair's (one element)
    whole = w_up if w_linear is None else _w_like(w_up, 2 * w_up.shape[2])
    check_grouped_mm_args(x, whole, offs, b_up, op=op, names={"w": "w_up", "bias": "b_up"})
    if gated:
        check_gated_width(op, whole, "w_up", activation)
    inter = whole.shape[2] // 2 if gated else whole.shape[2]
    num_experts, hidden = w_up.shape[0], x.shape[1]
    check_gate_linear(op, gate_linear, activation)
    act = Act(activation, float(swiglu_alpha), None if limit is None else float(limit), gate_linear)
    rows = token_rows = None
    if gather is not None:
        rows, token_rows = checked_gather(op, gather, x)
        if not gathered_ok(x, w_up, act):  # gather first: the same result
            x = gather_rows(x, rows, token_rows)
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
    up_bias = None  # b_up's gradient from the fused backward's epilogue (DownProj's up_bias)
    if activation == "none":  # h = pre: the down projection keeps h as its "pre"
        h = pre = ScaledMM.apply(x, w_up, offs, b_up, scale_up)
    else:
        up_bias = b_up
        h, pre = UpProj.apply(x, w_up, offs, b_up, scale_up, act, False, rows, token_rows,
                              up_bias is not None, w_linear, _autograd.GATHER_IN_GEMM)
    # checked behind the up projection's launch, whose GPU time hides the host's work
    combine = checked_combine(op, combine, m, hidden, x)
    return DownProj.apply(h, w_down, offs, b_down, pre, prob, scale_down, act, combine, up_bias)


class _JoinHalves(torch.autograd.Function):
    """[w_gate | w_linear] (E, H, I) x 2 -> (E, H, 2I), the transposed view of an (E, 2I, H)
    tensor where both are transposed views (the layout the halves kernels read in place)."""

    @staticmethod
    def forward(ctx, w_gate, w_linear):
        if w_gate.stride(1) == 1 and w_linear.stride(1) == 1:
            return torch.cat([w_gate.transpose(1, 2), w_linear.transpose(1, 2)], 1).transpose(1, 2)
        return torch.cat([w_gate, w_linear], 2)

    @staticmethod
    def backward(ctx, grad):
        inter = grad.shape[2] // 2
        return grad[..., :inter], grad[..., inter:]


def _halves_pair(op, pair, gate_linear, x, in_place_ok):
    """w_up given as (w_gate, w_linear): the two tensors where the kernels read them in
    place (UpProj's w_linear), else (the joined tensor, None)."""
    if len(pair) != 2 or not all(isinstance(t, torch.Tensor) for t in pair):
        raise ValueError(f"cute_moe.{op}: w_up: expected a tensor or a pair (w_gate, w_linear) of "
                         f"tensors, got {type(pair).__name__} of {len(pair)}")
    if gate_linear != "halves":
        raise ValueError(f"cute_moe.{op}: w_up as a pair (w_gate, w_linear) needs "
                         f"gate_linear='halves', got {gate_linear!r}")
    w_gate, w_linear = pair
    check_tensor(op, "x", x, 2, torch.bfloat16)
    for name, t in (("w_up[0]", w_gate), ("w_up[1]", w_linear)):
        check_tensor(op, name, t, 3, torch.bfloat16)
    if tuple(w_linear.shape) != tuple(w_gate.shape):
        raise ValueError(f"cute_moe.{op}: w_up: the pair's tensors must have one shape (E, H, I), "
                         f"got {tuple(w_gate.shape)} and {tuple(w_linear.shape)}")
    check_same_device(op, "x", x, **{"w_up[0]": w_gate, "w_up[1]": w_linear})
    inter = w_gate.shape[2]
    in_place = (in_place_ok and _library.library_loaded() and x.is_cuda
                and w_gate.stride(1) == 1 and w_linear.stride() == w_gate.stride()
                and inter % 128 == 0 and inter > 0)
    if in_place:
        return w_gate, w_linear
    return _JoinHalves.apply(w_gate, w_linear), None


def _w_like(w, n):
    """A stand-in of an (E, H, n) weight like w for the shape checks (strides (0, 1, 0))."""
    return w.new_empty_strided((w.shape[0], w.shape[1], n), (0, 1, 0))


def _h_like(x, m, inter):
    """A stand-in of h (M, I) for the shape checks (one row of memory: row stride 0)."""
    return x.new_empty_strided((m, inter), (0, 1))


"""References of the GEMM-plus-activation ops (grouped_mm_act*, grouped_mm_swiglu*)."""
# Each is the op's ground truth and its CPU kernel: the same roundings (pre rounded once,
# h computed from the rounded pre), padding rows zero.
from __future__ import annotations

import torch

from ..activation_args import default_limit
from ..activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from ..repack import halves_to_interleaved, interleaved_to_halves
from .activation import act_bwd_ref, act_ref, swiglu_oai_bwd_ref, swiglu_oai_ref
from .gemm import grouped_bias_grad_ref, grouped_mm_ref, grouped_mm_scaled_ref
from .groups import per_row, zero_padding

__all__ = ["GATE_LINEAR", "as_interleaved", "as_gate_linear", "grouped_mm_swiglu_ref",
           "grouped_mm_swiglu_bwd_ref", "grouped_mm_act_ref", "grouped_mm_act_gathered_ref",
           "grouped_mm_act_bwd_ref", "act_bwd_epilogue_ref"]

GATE_LINEAR = ("interleaved", "halves")  # where a gated up projection's (gate, linear) columns sit


def as_interleaved(t: torch.Tensor | None, gate_linear: str) -> torch.Tensor | None:
    """t (its last dimension the 2I columns in the gate_linear layout) interleaved."""
    return t if t is None or gate_linear == "interleaved" else halves_to_interleaved(t, -1)


def as_gate_linear(t: torch.Tensor, gate_linear: str) -> torch.Tensor:
    """The inverse of as_interleaved: interleaved t in the gate_linear layout."""
    return t if gate_linear == "interleaved" else interleaved_to_halves(t, -1)


def grouped_mm_swiglu_ref(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                          bias: torch.Tensor | None = None, alpha: float = DEFAULT_ALPHA,
                          limit: float | None = default_limit("swiglu_oai")
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """cute_moe::grouped_mm_swiglu: pre = round(x[rows_e] @ w[e] + bias[e]) (M, 2I),
    h = round(swiglu_oai(pre)) (M, I) from the rounded pre; padding rows zero in both.
    x (M, K), w (E, K, 2I) interleaved, bias (E, 2I). Returns (h, pre) in x's dtype.
    Differentiable."""
    pre = grouped_mm_ref(x, w, offs, bias)
    return swiglu_oai_ref(pre, alpha, limit).to(x.dtype), pre


def grouped_mm_swiglu_bwd_ref(dy: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                              pre: torch.Tensor, alpha: float = DEFAULT_ALPHA,
                              limit: float | None = default_limit("swiglu_oai")
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """cute_moe::grouped_mm_swiglu_bwd: dh = dy[rows_e] @ w[e] in float32 (not rounded),
    dpre = round(swiglu_oai_bwd(dh, pre)) (M, 2I) and h = round(swiglu_oai(pre)) (M, I)
    exactly as grouped_mm_swiglu_ref computes it; padding rows zero in both, whatever pre
    holds there. dy (M, N), w (E, N, I), pre (M, 2I). Returns (dpre, h) in pre's dtype."""
    dh = grouped_mm_ref(dy, w, offs, out_dtype=torch.float32)
    dpre = swiglu_oai_bwd_ref(dh, pre, alpha, limit).to(pre.dtype)
    h = swiglu_oai_ref(pre, alpha, limit).to(pre.dtype)
    return zero_padding(dpre, offs), zero_padding(h, offs)


def grouped_mm_act_ref(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                       bias: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                       activation: str = DEFAULT_ACTIVATION, alpha: float = DEFAULT_ALPHA,
                       limit: float | None = None, gate_linear: str = "interleaved"
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """cute_moe::grouped_mm_act: pre = round(scale[e] * (x[rows_e] @ w[e]) + bias[e]),
    h = round(act(pre)) from the rounded pre; padding rows zero in both. Returns (h, pre)
    in x's dtype. gate_linear "halves": w's and bias's 2I columns are [gate | linear]; pre
    comes out interleaved all the same. Differentiable."""
    pre = grouped_mm_scaled_ref(x, as_interleaved(w, gate_linear), offs, as_interleaved(bias, gate_linear),
                                scale)
    return zero_padding(act_ref(pre, activation, alpha, limit).to(x.dtype), offs), pre


def grouped_mm_act_gathered_ref(x: torch.Tensor, rows: torch.Tensor, w: torch.Tensor,
                                offs: torch.Tensor, bias: torch.Tensor | None = None,
                                scale: torch.Tensor | None = None,
                                activation: str = DEFAULT_ACTIVATION,
                                alpha: float = DEFAULT_ALPHA, limit: float | None = None):
    """cute_moe::grouped_mm_act_gathered: grouped_mm_act_ref over x[rows] (routed row r is
    token row rows[r] of x). Returns (h, pre). Differentiable."""
    return grouped_mm_act_ref(x[rows.long()], w, offs, bias, scale, activation, alpha, limit)


def grouped_mm_act_bwd_ref(dy: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                           pre: torch.Tensor, scale: torch.Tensor | None = None,
                           prob: torch.Tensor | None = None,
                           out_bias: torch.Tensor | None = None, prob_grad: bool = False,
                           activation: str = DEFAULT_ACTIVATION, alpha: float = DEFAULT_ALPHA,
                           limit: float | None = None, gate_linear: str = "interleaved",
                           bias_grad: bool = False):
    """cute_moe::grouped_mm_act_bwd. With u = dy[rows_e] @ w[e] (float32, w = W_down[e]^T),
    s = scale[e], p = prob[r] (1 where absent): dh = p * s * u, dpre = round(act'(pre) dh),
    hp = round(p * act(pre)), with prob_grad dprob = sum_j act(pre) * s * u + sum_n
    dy * out_bias[e] (float32), and with bias_grad db[e] = the sum of dpre over rows_e
    (float32, (E, width of dpre)). Padding rows zero. Returns (dpre, hp, dprob, db) (dprob,
    db empty without prob_grad, bias_grad). pre is interleaved; gate_linear "halves" returns
    dpre (and db) as [dgate | dlinear]."""
    u = grouped_mm_ref(dy, w, offs, out_dtype=torch.float32)
    dpre, hp, dprob = act_bwd_epilogue_ref(u, dy, offs, pre, scale, prob, out_bias, prob_grad,
                                           activation, alpha, limit, gate_linear)
    db = grouped_bias_grad_ref(dpre, offs) if bias_grad else u.new_empty(0, 0)
    return dpre, hp, dprob, db


def act_bwd_epilogue_ref(u: torch.Tensor, dy: torch.Tensor, offs: torch.Tensor, pre: torch.Tensor,
                         scale: torch.Tensor | None, prob: torch.Tensor | None,
                         out_bias: torch.Tensor | None, prob_grad: bool, activation: str,
                         alpha: float, limit: float | None, gate_linear: str = "interleaved"):
    """The fused backward's epilogue on u = dy @ W_down^T (float32, before scale and prob):
    (dpre, hp, dprob) as grouped_mm_act_bwd_ref says; dy is read for out_bias's term only."""
    m = u.shape[0]
    if scale is not None:
        u = u * per_row(scale, offs, m, torch.float32)[:, None]
    p = prob.to(torch.float32)[:, None] if prob is not None else None
    dh = u * p if p is not None else u
    dpre = act_bwd_ref(dh, pre, activation, alpha, limit).to(pre.dtype)
    h = act_ref(pre, activation, alpha, limit).to(torch.float32)
    hp = (h * p if p is not None else h).to(pre.dtype)
    dprob = u.new_empty(0)
    if prob_grad:
        dprob = (h * u).sum(-1)
        if out_bias is not None:
            bias = per_row(out_bias, offs, m, torch.float32)
            dprob = dprob + (dy.to(torch.float32) * bias).sum(-1)
        dprob = zero_padding(dprob, offs)
    return zero_padding(as_gate_linear(dpre, gate_linear), offs), zero_padding(hp, offs), dprob


"""grouped_mm_swiglu / grouped_mm_downproj: the GPT-OSS SwiGLU expert FFN as two calls."""
# grouped_mm_swiglu runs the up projection, bias and activation in one grouped GEMM and
# also returns the pre-activations; grouped_mm_downproj, handed those, runs the SwiGLU
# backward inside the down projection's input-gradient GEMM and recomputes the activation
# there instead of keeping it. Both are thin wrappers of the autograd.Functions of
# ffn_autograd.py (the import path cutlass_op.bf16_grouped_mm re-exports them).
from __future__ import annotations

import warnings

import torch

from .activation_args import check_act_params, default_limit
from .activations import DEFAULT_ALPHA
from .ffn_autograd import Act, DownProj, UpProj
from .functional import grouped_mm
from .ops.checks import check_offs_values
from .ops.gemm import check_grouped_mm_args
from .ops.glu import check_grouped_mm_swiglu_args, check_pre_args

__all__ = ["grouped_mm_swiglu", "grouped_mm_downproj"]

_UP_NAMES = {"w": "W_up", "alpha": "swiglu_alpha", "limit": "swiglu_limit"}
_DOWN_NAMES = {"x": "swiglu_out", "w": "W_down", "alpha": "swiglu_alpha",
               "limit": "swiglu_limit"}
_LIMIT = default_limit("swiglu_oai")


def _fused_pair(swiglu_out, aux, alpha, limit, op) -> bool:
    """Whether the fused backward may route swiglu_out's gradient through aux: always
    when swiglu_out takes no gradient, else only when both are the outputs of one
    grouped_mm_swiglu call. Also checks alpha and limit against that call's. Under
    torch.compile, which cannot trace autograd history, the pairing is assumed."""
    if torch.compiler.is_compiling():
        return True
    node = aux.grad_fn
    if isinstance(node, UpProj._backward_cls):
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
                      bias: torch.Tensor | None = None, swiglu_alpha: float = DEFAULT_ALPHA,
                      swiglu_limit: float | None = _LIMIT) -> tuple[torch.Tensor, torch.Tensor]:
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
    act = Act("swiglu_oai", float(swiglu_alpha), _float(swiglu_limit))
    return UpProj.apply(x, W_up, offs, bias, None, act, True)


def grouped_mm_downproj(swiglu_out: torch.Tensor, W_down: torch.Tensor, offs: torch.Tensor,
                        bias: torch.Tensor | None = None,
                        aux_biased_acc: torch.Tensor | None = None,
                        swiglu_alpha: float = DEFAULT_ALPHA,
                        swiglu_limit: float | None = _LIMIT) -> torch.Tensor:
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
    check_act_params(swiglu_alpha, swiglu_limit, op, _DOWN_NAMES)
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
    act = Act("swiglu_oai", alpha, limit)
    return DownProj.apply(swiglu_out, W_down, offs, bias, aux_biased_acc, None, None, act)

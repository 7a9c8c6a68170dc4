"""Reference of one MoE expert block (up projection, activation, down projection), per group."""
# The ground truth of cute_moe.expert_ffn and of grouped_mm_swiglu / grouped_mm_downproj,
# written like HF transformers' GPT-OSS experts, in a chosen compute dtype with the
# kernels' roundings.
from __future__ import annotations

import torch

from ..activation_args import default_limit
from ..activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from .activation import act_ref
from .groups import group_bounds

__all__ = ["expert_ffn_ref"]


def _round_straight_through(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """t rounded to dtype and back in the forward pass; identity for the gradient."""
    if dtype is None:
        return t
    return t + (t.to(dtype).to(t.dtype) - t).detach()


def expert_ffn_ref(x: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor | None,
                   w_down: torch.Tensor, b_down: torch.Tensor | None, offs: torch.Tensor,
                   alpha: float = DEFAULT_ALPHA,
                   limit: float | None = default_limit("swiglu_oai"),
                   compute_dtype: torch.dtype = torch.float32,
                   round_dtype: torch.dtype | None = torch.bfloat16,
                   return_activation: bool = False, *,
                   activation: str = DEFAULT_ACTIVATION,
                   prob: torch.Tensor | None = None, scale_up: torch.Tensor | None = None,
                   scale_down: torch.Tensor | None = None):
    """One MoE expert block, group by group, written like HF transformers' experts:
    pre = scale_up[e] * (x @ W_up[e]) + b_up[e]; h = act(pre) (act_ref: for swiglu_oai
    gate = pre[..., ::2].clamp(max=limit), up = pre[..., 1::2].clamp(-limit, limit),
    h = (up + 1) * gate * sigmoid(gate * alpha)); out = prob[r] * (scale_down[e] *
    (h @ W_down[e]) + b_down[e]). Every optional tensor may be None. Computed in
    compute_dtype; pre and h are rounded to round_dtype in the forward pass only (as the
    kernels store them), which keeps the clamp masks where the kernels have them.
    Returns out (M, H) in compute_dtype, padding rows zero, and with return_activation
    also h. Differentiable with respect to every tensor."""
    m, inter, hidden = x.shape[0], w_down.shape[-2], w_down.shape[-1]
    xc, wu, wd = x.to(compute_dtype), w_up.to(compute_dtype), w_down.to(compute_dtype)
    bu = b_up.to(compute_dtype) if b_up is not None else None
    bd = b_down.to(compute_dtype) if b_down is not None else None
    pieces, acts = [], []
    bounds = group_bounds(offs, m)
    for e, (start, end) in enumerate(bounds):
        pre = xc[start:end] @ wu[e]
        if scale_up is not None:
            pre = pre * scale_up[e].to(compute_dtype)
        if bu is not None:
            pre = pre + bu[e]
        pre = _round_straight_through(pre, round_dtype)
        act = _round_straight_through(act_ref(pre, activation, alpha, limit).to(compute_dtype),
                                      round_dtype)
        acts.append(act)
        out = act @ wd[e]
        if scale_down is not None:
            out = out * scale_down[e].to(compute_dtype)
        if bd is not None:
            out = out + bd[e]
        if prob is not None:
            out = out * prob[start:end, None].to(compute_dtype)
        pieces.append(out)
    pad = m - (bounds[-1][1] if bounds else 0)
    out = torch.cat(pieces + [xc.new_zeros(pad, hidden)])
    if return_activation:
        return out, torch.cat(acts + [xc.new_zeros(pad, inter)])
    return out

# The router's gate, logits = x @ W^T + b in float32, on bf16 tensor cores.
#
# torchtitan computes the gate in float32: x and W are copied to float32 and multiplied by
# a SIMT SGEMM (at GPT-OSS-20B, 24576 tokens: a 283 MB copy and 0.2 ms of SGEMM forward,
# 0.45 ms backward on an H100; docs/perf-notes.md, session 14). The product of two bf16
# numbers is exact in float32 (8 + 8 significant bits), and Hopper's bf16 MMA accumulates
# in float32, so torch.mm(x, W^T, out_dtype=float32) computes the same sums from the same
# exact products; only the order and rounding of the additions differ (measured on an H100:
# 3e-6 relative to float64, against 1e-7 for the SGEMM; bf16 logits, HF's, are 2e-3 off).
#
# The backward's dlogits are float32, not bf16. Each is split into two bf16 parts,
# hi = bf16(g) and lo = bf16(g - hi), which carry 16 of its 24 significant bits (relative
# error <= 2^-17); dx and dW are then bf16 GEMMs over [hi | lo]. dx and dW are rounded to
# bf16 at the end, 2^-9, so the split is invisible in them.
from __future__ import annotations

import torch

__all__ = ["gate_logits", "serves_on_tensor_cores"]


def serves_on_tensor_cores(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """bf16 x and W on a CUDA device (torch.mm's out_dtype needs CUDA)."""
    return (x.is_cuda and x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16
            and weight.device == x.device)


def _split(g: torch.Tensor) -> torch.Tensor:
    """(T, E) float32 -> (T, 2E) bf16 [hi | lo] with hi + lo = g to 16 bits."""
    hi = g.to(torch.bfloat16)
    lo = (g - hi.float()).to(torch.bfloat16)
    return torch.cat([hi, lo], dim=1)


class _GateLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        logits = torch.mm(x, weight.t(), out_dtype=torch.float32)
        if bias is not None:
            logits = logits + bias.float()
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return logits

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        e = weight.shape[0]
        dx = dw = db = None
        g = g.float()
        split = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            split = _split(g)
        if ctx.needs_input_grad[0]:
            # [hi | lo] @ [W; W]: one bf16 GEMM accumulating both parts in float32
            dx = torch.mm(split, torch.cat([weight, weight], dim=0))
        if ctx.needs_input_grad[1]:
            both = torch.mm(split.t(), x, out_dtype=torch.float32)
            dw = (both[:e] + both[e:]).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g.sum(0).to(ctx.bias_dtype)
        return dx, dw, db


def gate_logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (T, H) bf16, weight (E, H) bf16, bias (E,) or None -> logits (T, E) float32, as
    F.linear(x.float(), weight.float(), bias.float()) up to float32 rounding. Only where
    serves_on_tensor_cores(x, weight)."""
    return _GateLogits.apply(x, weight, bias)

# The usage snippet of the seed API (cutlass_op.bf16_grouped_mm), kept verbatim (but for
# the device and the sizes) so the tests run exactly what its users run; shared by the CPU
# and GPU SwiGLU tests.
from __future__ import annotations

import torch

from cute_moe import testing


def run_seed_snippet(device: str, E: int, H: int, I: int, counts: list[int]):
    """Runs the seed's forward and backward; returns (problem, out, swiglu_out,
    aux_biased_acc), the problem holding the snippet's leaves with their gradients."""
    from cutlass_op.bf16_grouped_mm import grouped_mm_downproj, grouped_mm_swiglu

    torch.manual_seed(0)
    dtype = torch.bfloat16
    tokens_per_expert = torch.tensor(  # ragged-M distribution
        counts, device=device, dtype=torch.int32
    )
    offs = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
    total_M = int(tokens_per_expert.sum())
    x = torch.randn(total_M, H, device=device, dtype=dtype, requires_grad=True)
    W_up = torch.randn(E, H, 2 * I, device=device, dtype=dtype, requires_grad=True)
    b_up = torch.randn(E, 2 * I, device=device, dtype=dtype, requires_grad=True)
    W_down = torch.randn(E, I, H, device=device, dtype=dtype, requires_grad=True)
    b_down = torch.randn(E, H, device=device, dtype=dtype, requires_grad=True)
    # === Forward: two fused kernels — aux_biased_acc must be threaded through ===
    swiglu_out, aux_biased_acc = grouped_mm_swiglu(
        x, W_up, offs=offs, bias=b_up,
        swiglu_alpha=1.702, swiglu_limit=7.0,
    )
    out = grouped_mm_downproj(
        swiglu_out, W_down, offs=offs, bias=b_down,
        aux_biased_acc=aux_biased_acc,  # <- fused-only contract
        swiglu_alpha=1.702, swiglu_limit=7.0,
    )
    assert out.shape == (total_M, H)
    # === Backward: autograd flows back through the fused aux route ===
    out.sum().backward()
    assert W_up.grad is not None and W_down.grad is not None

    p = testing.ExpertFFN(x, W_up, b_up, W_down, b_down, offs, list(counts), "kn")
    return p, out, swiglu_out, aux_biased_acc

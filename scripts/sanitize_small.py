"""Small forward/backward runs of every op for compute-sanitizer (memcheck, racecheck):
both weight layouts, bias, empty groups, padding rows, fp32 and bf16 weight gradients,
the fused SwiGLU forward and backward.
    compute-sanitizer --tool memcheck python3 scripts/sanitize_small.py
"""
import torch

import cute_moe
from cute_moe import testing

assert cute_moe.library_loaded(), "op library not loaded"
g = torch.Generator().manual_seed(0)
for layout in ("kn", "nk"):
    for routing in ("skewed", "empty"):
        p = testing.random_problem(301, 72, 144, 7, routing, pad=13, layout=layout, bias=True,
                                   device="cuda", generator=g, requires_grad=True)
        y = cute_moe.grouped_mm(p.x, p.w, p.offs, p.bias)
        y.backward(torch.randn_like(y))
        for dtype in (torch.bfloat16, torch.float32):
            torch.ops.cute_moe.grouped_mm_wgrad(p.x.detach(), y.detach(), p.offs, dtype, True)
        torch.ops.cute_moe.grouped_column_sum(y.detach(), p.offs)
        if hasattr(torch.ops.cute_moe, "grouped_mm_swiglu"):  # fused SwiGLU pair (w is (E, K, 2I))
            h, pre = torch.ops.cute_moe.grouped_mm_swiglu(p.x.detach(), p.w.detach(), p.offs,
                                                          p.bias.detach(), 1.702, 7.0)
            w_down = torch.randn(7, 8, 72, device="cuda", dtype=torch.bfloat16)  # (E, H, I), I = 144 / 2
            dy = torch.randn(301, 8, device="cuda", dtype=torch.bfloat16)
            torch.ops.cute_moe.grouped_mm_swiglu_bwd(dy, w_down, p.offs, pre, 1.702, None)
torch.cuda.synchronize()
print("sanitize_small: done")

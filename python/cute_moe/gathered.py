# The expert up projection over gathered token rows: the MoE dispatch's gather fused into
# the GEMM's A load (cute_moe::grouped_mm_act_gathered), so the (M, H) sorted copy of the
# tokens is never made. On the H200 it is slower than gathering first (docs/perf-notes.md:
# the cp.async row loads are issue-bound in the kernel's two loader warps). expert_ffn's `gather`
# (cute_moe.nn.MoE's fuse_gather) saves that copy's memory the cheaper way by default, a gather
# pass whose copy is freed after the GEMM (ffn_autograd.GATHER_IN_GEMM selects this kernel).
from __future__ import annotations

import torch

from . import _library
from .activation_args import LIMIT_DEFAULT, resolve_limit
from .activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from .ffn_autograd import Act, UpProj
from .ops.checks import check_offs_values
from .ops.glu import check_grouped_mm_act_gathered_args
from .reference.glu import grouped_mm_act_gathered_ref

__all__ = ["grouped_mm_act_gathered"]


def grouped_mm_act_gathered(x: torch.Tensor, rows: torch.Tensor, w: torch.Tensor,
                            offs: torch.Tensor, bias: torch.Tensor | None = None,
                            scale: torch.Tensor | None = None,
                            activation: str = DEFAULT_ACTIVATION, alpha: float = DEFAULT_ALPHA,
                            limit: float | str | None = LIMIT_DEFAULT):
    """The up projection of an expert FFN over gathered rows: with xs = x[rows],
    pre = scale[e] * (xs[rows_e] @ w[e]) + bias[e] and h = act(pre), for routed rows
    sorted by expert (offs as in grouped_mm). Returns (h, pre), equal bit for bit to
    cute_moe::grouped_mm_act on x[rows].

    x: (T, H) bf16 tokens; rows: (M,) int32 on x's device, the token of each routed row
    (values in [0, T): checked on the device); w: (E, H, N) bf16, row-major per expert;
    bias (E, N), scale (E,) float32 optional; activation one of swiglu_oai (the default),
    swiglu, geglu, srelu; limit the clamp of the gated ones ("default": the activation's
    default limit, 7.0 for swiglu_oai; None: no clamp). Differentiable in x, w, bias and
    scale (x's gradient sums each token's rows with index_add_, so it is not bitwise
    deterministic on CUDA; expert_ffn's `gather` takes the inverse permutation for a
    deterministic sum). Without the compiled
    op it runs the reference (x[rows] then grouped_mm_act) under plain autograd."""
    limit = resolve_limit(activation, limit)
    check_grouped_mm_act_gathered_args(x, rows, w, offs, bias, scale, activation, alpha, limit)
    check_offs_values("grouped_mm_act_gathered", offs, rows.shape[0], "rows")
    if _library.library_loaded():
        act = Act(activation, float(alpha), None if limit is None else float(limit))
        return UpProj.apply(x, w, offs, bias, scale, act, True, rows, None)
    return grouped_mm_act_gathered_ref(x, rows, w, offs, bias, scale, activation, alpha, limit)

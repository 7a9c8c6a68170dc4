# The FP8 expert block a PyTorch user can build today, forward and backward (issue 14, must-have
# 5's peer): all six GEMMs on torch._scaled_grouped_mm with rowwise scales, quantization, bias
# gathers and the activation unfused in PyTorch, autograd through one Function per projection.
# torch has no backward for _scaled_grouped_mm; this is the recipe torchao's FP8 MoE training
# follows (the bf16 inputs saved, re-quantized along each GEMM's reduction in the backward):
#   forward       y  = x @ W_e             x by rows, W_e by output columns (amax over K)
#   input grad    dx = dy @ W_e^T          dy by rows, W_e by rows of K (amax over N)
#   weight grad   dW_e = x_e^T @ dy_e      x and dy by (expert, column): amax over the
#                                          expert's rows (the 2d x 2d, ragged-K form)
# Each group's rows must be a multiple of 16 (the ragged-K form's alignment); the benchmark's
# balanced routing is. Scales are amax / 448 (e4m3's largest), as in cute_moe's recipe. The
# activation runs in bf16 as torchtitan's eager block does (reference.activation_ref);
# `compiled=True` runs the quantizers through torch.compile (fused amax / scale / cast passes,
# as torchao's kernels do), eager PyTorch otherwise.
from __future__ import annotations

import torch

F8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
E4M3_MAX = 448.0


def rowwise(t: torch.Tensor, dim: int):
    """e4m3 of t with one fp32 scale per slice along `dim` (amax / 448), and the scales. The
    amax in t's own dtype (exact: a max of its values) and t / s by type promotion: fp32 math
    without an fp32 copy of t."""
    s = t.abs().amax(dim=dim, keepdim=True).float().clamp_min(1e-12) / E4M3_MAX
    return (t / s).to(F8).contiguous(), s.squeeze(dim).contiguous()


def group_colwise(t: torch.Tensor, offs: torch.Tensor):
    """e4m3 of t (m, n) with one fp32 scale per (group, column): amax over the group's rows
    (rows past offs[-1] in a last, dropped segment), and the scales (groups, n)."""
    m = t.shape[0]
    lengths = torch.diff(offs.long(), prepend=offs.new_zeros(1).long())
    lengths = torch.cat([lengths, (m - offs[-1:]).long()])
    amax = torch.segment_reduce(t.abs(), "max", lengths=lengths, axis=0).float()
    s = amax.clamp_min(1e-12) / E4M3_MAX  # (groups + 1, n)
    per_row = torch.repeat_interleave(s, lengths, dim=0, output_size=m)
    return (t / per_row).to(F8), s[:-1].contiguous()


_EAGER = {"rowwise": rowwise, "group_colwise": group_colwise}
_COMPILED = {}


def _quantizers(compiled: bool):
    if not compiled:
        return _EAGER
    if not _COMPILED:
        # one graph per (call site, shape): 4 rowwise and 2 group_colwise shapes per block
        # and benchmark shape, past dynamo's default limit of 8 recompilations
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _COMPILED.update({k: torch.compile(f, dynamic=False) for k, f in _EAGER.items()})
    return _COMPILED


class ScaledGroupedMM(torch.autograd.Function):
    """y (m, n) = x (m, k) @ w[e] (k, n) for the rows of group e (offs: cumulative ends),
    every GEMM of forward and backward on torch._scaled_grouped_mm, bf16 in and out."""

    @staticmethod
    def forward(ctx, x, w, offs, compiled=False):
        q = _quantizers(compiled)
        xq, xs = q["rowwise"](x, 1)
        wq, ws = q["rowwise"](w.transpose(-2, -1), 2)  # (E, n, k): one scale per output column
        ctx.save_for_backward(x, w, offs)
        ctx.compiled = compiled
        return torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), xs, ws, offs=offs, out_dtype=BF16)

    @staticmethod
    def backward(ctx, dy):
        x, w, offs = ctx.saved_tensors
        q = _quantizers(ctx.compiled)
        dyq, dys = q["rowwise"](dy, 1)
        wq, ws = q["rowwise"](w, 2)  # (E, k, n): one scale per row of k (dx's output column)
        dx = torch._scaled_grouped_mm(dyq, wq.transpose(-2, -1), dys, ws, offs=offs, out_dtype=BF16)
        xq, xs = q["group_colwise"](x, offs)
        gq, gs = q["group_colwise"](dy, offs)
        # A = x^T (k, m) row-major, B = dy (m, n) column-major; scales per (group, row of A)
        # and (group, column of B), flattened group-major
        dw = torch._scaled_grouped_mm(xq.t().contiguous(), gq.t().contiguous().t(), xs.reshape(-1),
                                      gs.reshape(-1), offs=offs, out_dtype=BF16)
        return dx, dw, None, None


def expert_block(x, w_up, w_down, offs, b_up, b_down, prob, activation, compiled=False):
    """The expert block (GPT-OSS / Qwen3 layout: w_up (E, H, 2I) interleaved gate/linear,
    w_down (E, I, H)) in PyTorch FP8: differentiable in every input."""
    from cute_moe.activations import ACTIVATIONS
    from cute_moe.reference.activation import activation_ref
    counts = torch.diff(offs, prepend=offs.new_zeros(1))
    pre = ScaledGroupedMM.apply(x, w_up, offs, compiled)
    if b_up is not None:
        pre = pre + torch.repeat_interleave(b_up, counts, dim=0, output_size=pre.shape[0])
    h = activation_ref(pre, activation, limit=ACTIVATIONS[activation].default_limit)
    y = ScaledGroupedMM.apply(h, w_down, offs, compiled)
    if b_down is not None:
        y = y + torch.repeat_interleave(b_down, counts, dim=0, output_size=y.shape[0])
    return y * prob[:, None].to(y.dtype)

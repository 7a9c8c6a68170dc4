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


def expert_block(x, w_up, w_down, offs, b_up, b_down, prob, activation, compiled=False, *, alpha=None,
                 limit="default"):
    """The expert block (GPT-OSS / Qwen3 layout: w_up (E, H, 2I) interleaved gate/linear,
    w_down (E, I, H)) in PyTorch FP8: differentiable in every input. offs[-1] must be x's
    rows. alpha None, limit "default": the activation's own."""
    from cute_moe.activations import ACTIVATIONS, DEFAULT_ALPHA
    from cute_moe.reference.activation import activation_ref
    counts = torch.diff(offs, prepend=offs.new_zeros(1))
    pre = ScaledGroupedMM.apply(x, w_up, offs, compiled)
    if b_up is not None:
        pre = pre + torch.repeat_interleave(b_up, counts, dim=0, output_size=pre.shape[0])
    h = activation_ref(pre, activation, DEFAULT_ALPHA if alpha is None else alpha,
                       ACTIVATIONS[activation].default_limit if limit == "default" else limit)
    y = ScaledGroupedMM.apply(h, w_down, offs, compiled)
    if b_down is not None:
        y = y + torch.repeat_interleave(b_down, counts, dim=0, output_size=y.shape[0])
    return y * prob[:, None].to(y.dtype)


def moe_layer(ref, x, compiled=False):
    """The MoE layer `ref` (a cute_moe.reference.ReferenceMoE: torchtitan's router, dispatch and
    combine) with its experts on expert_block, differentiable in x and every parameter. The
    routed rows are laid out with each expert's padded to a multiple of 16 (the FP8 ragged-K
    GEMM's alignment, as torchao's FP8 MoE training pads them) in a buffer of a static bound,
    m + 16 E rows, whose tail the last expert takes (zero rows: they add nothing to any
    gradient); no host sync."""
    from cute_moe.reference.moe import route_ref
    shape = x.shape
    x = x.reshape(-1, ref.hidden)
    t, k, e = x.shape[0], ref.top_k, ref.num_experts
    r = ref.router
    weights, experts, _ = route_ref(x, r.gate.weight, r.gate.bias, k, score_func=ref.score_func,
                                    renormalize=ref.renormalize, route_scale=ref.route_scale,
                                    expert_bias=r.expert_bias, compute_dtype=ref.router_dtype)
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    counts = torch.zeros(e, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + 15) // 16 * 16
    m = t * k
    rows = (m + 16 * e + 15) // 16 * 16
    start = torch.cumsum(counts, 0) - counts
    pstart = torch.cumsum(padded, 0) - padded
    sorted_expert = flat[order]
    dest = torch.arange(m, device=x.device) - start[sorted_expert] + pstart[sorted_expert]
    offs = torch.cumsum(padded, 0).to(torch.int32)
    offs[-1] = rows
    ex = ref.experts
    dt = ex.gate_up_proj.dtype
    xp = x.new_zeros(rows, ref.hidden, dtype=dt).index_copy(0, dest, x[token].to(dt))
    prob = weights.new_zeros(rows).index_copy(0, dest, weights.reshape(-1)[order])
    y = expert_block(xp, ex.gate_up_proj, ex.down_proj, offs, ex.gate_up_proj_bias, ex.down_proj_bias, prob,
                     ref.activation, compiled, alpha=ref.swiglu_alpha, limit=ref.limit)[dest]
    out = torch.zeros(t, y.shape[1], dtype=y.dtype, device=y.device).index_add(0, token, y)
    return out.to(x.dtype).reshape(shape)


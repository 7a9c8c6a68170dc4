"""Reference MoE layer with torchtitan's math: router, sort by expert, expert FFN, combine."""
# fp32 router (softmax or sigmoid scores, top-k on scores + load-balancing bias, gather,
# optional renormalisation and scale), stable sort of routed rows by expert, expert FFN
# (per-expert loop, or torch._grouped_mm as torchtitan runs it on Hopper),
# router-probability scaling and an index_add combine. It is the ground truth of the
# cute_moe.nn tests and the baseline of `python -m cute_moe.bench`, so it shares no code
# with cute_moe.nn's router, dispatch or combine, only the parameter layout (same names
# and shapes: state dicts load both ways). cute_moe.nn runs its expert loop for dtypes
# the fused kernels do not take.
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..activation_args import LIMIT_DEFAULT, check_activation, resolve_limit, up_width
from ..activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from .activation import activation_ref
from .glu import as_interleaved

__all__ = ["experts_ref", "route_ref", "ReferenceMoE"]

IMPLS = ("loop", "grouped_mm")


def _row_expert(offs: torch.Tensor, m: int) -> torch.Tensor:
    """Expert of every routed row, built on the device (output_size: no host sync); rows
    at or past offs[-1] get index E (a zero bias row appended by the caller)."""
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).long()
    counts = torch.cat([counts, (m - offs[-1:]).long()])
    experts = torch.arange(offs.shape[0] + 1, device=offs.device)
    return torch.repeat_interleave(experts, counts, output_size=m)


def experts_ref(x: torch.Tensor, offs: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                b_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None,
                prob: torch.Tensor | None = None, *, activation: str = DEFAULT_ACTIVATION,
                alpha: float = DEFAULT_ALPHA, limit: float | None = None,
                impl: str = "loop", gate_linear: str = "interleaved") -> torch.Tensor:
    """y[r] = prob[r] * (act(x[r] @ w_up[e] + b_up[e]) @ w_down[e] + b_down[e]) for the
    rows r of expert e (sorted, offs cumulative end offsets); rows past offs[-1] zero.
    w_up (E, H, 2I or I), w_down (E, I, H), or transposed views; gate_linear: the layout
    of w_up's and b_up's gate and linear columns ("interleaved" or "halves"; the weights
    are read as they are, pre is reordered). Differentiable.
      impl "loop": one matmul per expert in x's dtype (reads offs on the host; any dtype
        and device).
      impl "grouped_mm": torchtitan's block: torch._grouped_mm, biases gathered per row,
        elementwise activation, prob applied in fp32 (no host sync; bf16 on CUDA)."""
    if impl == "loop":
        bounds, start = [], 0
        for end in offs.tolist():
            bounds.append((start, end))
            start = end
        pieces = []
        for e, (s, t) in enumerate(bounds):
            pre = x[s:t] @ w_up[e]
            if b_up is not None:
                pre = pre + b_up[e]
            y = activation_ref(as_interleaved(pre, gate_linear), activation, alpha, limit) @ w_down[e]
            pieces.append(y + b_down[e] if b_down is not None else y)
        pieces.append(x.new_zeros(x.shape[0] - start, w_down.shape[-1]))
        y = torch.cat(pieces)
    elif impl == "grouped_mm":
        m = x.shape[0]
        row_expert = _row_expert(offs, m) if b_up is not None or b_down is not None else None
        pre = torch._grouped_mm(x, w_up, offs=offs)
        if b_up is not None:
            pre = pre + torch.cat([b_up, b_up.new_zeros(1, b_up.shape[1])])[row_expert]
        h = activation_ref(as_interleaved(pre, gate_linear), activation, alpha, limit)
        y = torch._grouped_mm(h, w_down, offs=offs)
        if b_down is not None:
            y = y + torch.cat([b_down, b_down.new_zeros(1, b_down.shape[1])])[row_expert]
    else:
        raise ValueError(f"experts_ref: impl: expected one of {IMPLS}, got {impl!r}")
    if prob is not None:
        y = (y.to(torch.promote_types(y.dtype, prob.dtype)) * prob[:, None]).to(y.dtype)
    return y


def route_ref(x: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor | None,
              top_k: int, *, score_func: str = "softmax", renormalize: bool = True,
              route_scale: float = 1.0, expert_bias: torch.Tensor | None = None,
              compute_dtype: torch.dtype | None = torch.float32):
    """torchtitan's TokenChoiceTopKRouter: logits in compute_dtype (None: x's dtype;
    float64 inputs stay float64), scores = softmax or sigmoid of them, experts = top-k of
    scores + expert_bias (the bias picks experts, it does not weight them), weights =
    the chosen scores, divided by their sum (+1e-20) when renormalize, times
    route_scale. Returns (weights (T, k), experts (T, k) int64, logits (T, E))."""
    cd = x.dtype if compute_dtype is None else torch.promote_types(compute_dtype, x.dtype)
    logits = F.linear(x.to(cd), gate_weight.to(cd),
                      gate_bias.to(cd) if gate_bias is not None else None)
    if score_func == "softmax":
        scores = F.softmax(logits, dim=-1)
    elif score_func == "sigmoid":
        scores = torch.sigmoid(logits)
    else:
        raise ValueError(f"route_ref: score_func: expected 'softmax' or 'sigmoid', got "
                         f"{score_func!r}")
    choice = scores if expert_bias is None else scores + expert_bias
    _, experts = torch.topk(choice, top_k, dim=-1, sorted=False)
    weights = scores.gather(-1, experts)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * route_scale, experts, logits


class _Router(nn.Module):
    def __init__(self, hidden, num_experts, bias, load_balance, dtype, device):
        super().__init__()
        self.gate = nn.Linear(hidden, num_experts, bias=bias, dtype=dtype, device=device)
        if load_balance:
            self.register_buffer("expert_bias", torch.zeros(num_experts, dtype=torch.float32,
                                                            device=device))
        else:
            self.expert_bias = None


class _Experts(nn.Module):
    def __init__(self, hidden, inter, num_experts, activation, bias, dtype, device):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        up = up_width(activation, inter)
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden, up, **kw))
        self.down_proj = nn.Parameter(torch.empty(num_experts, inter, hidden, **kw))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(num_experts, up, **kw)) if bias else None
        self.down_proj_bias = nn.Parameter(torch.zeros(num_experts, hidden, **kw)) if bias else None


class ReferenceMoE(nn.Module):
    """The MoE layer of cute_moe.nn.MoE written as torchtitan writes it. Same constructor
    arguments and parameter names (router.gate.weight/bias, router.expert_bias,
    experts.gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias), so
    `ReferenceMoE.like(moe)` shares or copies a cute_moe.nn.MoE's weights. forward(x)
    takes (T, H) or (B, S, H). impl "loop" (any dtype/device; reads offs on the host) or
    "grouped_mm" (torchtitan's Hopper path; bf16 on CUDA; no host sync)."""

    def __init__(self, hidden: int, inter: int, num_experts: int, top_k: int = 4, *,
                 activation: str = DEFAULT_ACTIVATION, bias: bool = True,
                 router_bias: bool = True, score_func: str = "softmax", renormalize: bool = True,
                 route_scale: float = 1.0, swiglu_alpha: float = DEFAULT_ALPHA,
                 limit: float | str | None = LIMIT_DEFAULT,
                 load_balance_coeff: float | None = None,
                 router_dtype: torch.dtype | None = torch.float32, impl: str = "loop",
                 dtype=None, device=None):
        super().__init__()
        limit = resolve_limit(activation, limit)
        check_activation(activation, limit, "ReferenceMoE")
        if impl not in IMPLS:
            raise ValueError(f"ReferenceMoE: impl: expected one of {IMPLS}, got {impl!r}")
        self.hidden, self.inter, self.num_experts, self.top_k = hidden, inter, num_experts, top_k
        self.activation, self.swiglu_alpha, self.limit = activation, swiglu_alpha, limit
        self.score_func, self.renormalize, self.route_scale = score_func, renormalize, route_scale
        self.router_dtype, self.impl = router_dtype, impl
        self.router = _Router(hidden, num_experts, router_bias, load_balance_coeff is not None,
                              dtype, device)
        self.experts = _Experts(hidden, inter, num_experts, activation, bias, dtype, device)
        nn.init.normal_(self.experts.gate_up_proj, std=0.02)
        nn.init.normal_(self.experts.down_proj, std=0.02)

    @classmethod
    def like(cls, moe: nn.Module, *, share: bool = True, impl: str = "loop",
             dtype: torch.dtype | None = None) -> "ReferenceMoE":
        """A reference of a cute_moe.nn.MoE with the same configuration. share=True uses
        moe's own parameter and buffer tensors (one set of weights, gradients land in
        moe's .grad); share=False copies them, cast to `dtype` when given."""
        if share and dtype is not None:
            raise ValueError("ReferenceMoE.like: dtype: shared parameters keep moe's dtype; "
                             "give dtype with share=False")
        cfg = moe.config()
        device = moe.experts.down_proj.device
        # shared: every tensor is replaced below, so nothing is allocated for it
        ref = cls(**cfg, impl=impl, dtype=dtype or moe.experts.down_proj.dtype,
                  device="meta" if share else device)
        if share:
            ref.router.gate = moe.router.gate
            if moe.router.expert_bias is not None:
                ref.router.expert_bias = moe.router.expert_bias
            for name in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"):
                setattr(ref.experts, name, getattr(moe.experts, name))
        else:
            ref.load_state_dict(moe.state_dict())  # copies, cast to ref's dtypes
        return ref

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.hidden)
        t, k = x.shape[0], self.top_k
        r = self.router
        weights, experts, _ = route_ref(
            x, r.gate.weight, r.gate.bias, k, score_func=self.score_func,
            renormalize=self.renormalize, route_scale=self.route_scale,
            expert_bias=r.expert_bias, compute_dtype=self.router_dtype)
        # dispatch: routed rows sorted by expert, stable (ties keep token order)
        order = torch.argsort(experts.reshape(-1), stable=True)
        token = order // k
        counts = torch.zeros(self.num_experts, dtype=torch.int64, device=x.device)
        counts.scatter_add_(0, experts.reshape(-1), torch.ones_like(order))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        ex = self.experts
        dt = ex.gate_up_proj.dtype if self.impl == "grouped_mm" else x.dtype

        def cast(p):
            return p if p is None else p.to(dt)

        y = experts_ref(x[token].to(dt), offs, cast(ex.gate_up_proj), cast(ex.down_proj),
                        cast(ex.gate_up_proj_bias), cast(ex.down_proj_bias),
                        weights.reshape(-1)[order], activation=self.activation,
                        alpha=self.swiglu_alpha, limit=self.limit, impl=self.impl)
        out = torch.zeros(t, y.shape[1], dtype=y.dtype, device=y.device)
        out = out.index_add(0, token, y)
        return out.to(x.dtype).reshape(shape)

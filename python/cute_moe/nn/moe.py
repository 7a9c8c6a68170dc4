# The MoE FFN layer: router -> dispatch (sort routed rows by expert, on the device) ->
# experts (cute_moe.expert_ffn, the router weight fused into the down projection) ->
# combine (deterministic gather-sum back to tokens). A drop-in replacement for the MoE
# block of GPT-OSS / Qwen3-MoE style models in training; no host sync on the bf16 path.
from __future__ import annotations

import torch
from torch import nn

from ..activation_args import LIMIT_DEFAULT
from ..activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from .dispatch import permute, sort_by_expert, tokens_per_expert
from .experts import GroupedExperts
from .router import RouterOutput, TopKRouter

__all__ = ["MoE"]


class MoE(nn.Module):
    """Mixture-of-experts FFN: out[t] = sum over the top_k experts e chosen for token t of
    w[t, e] * expert_e(x[t]).

    hidden H, inter I (each expert's intermediate width), num_experts E, top_k k.
    Router: see TopKRouter (score_func, renormalize, route_scale, router_bias,
      load_balance_coeff, router_dtype = its compute_dtype). Experts: see GroupedExperts
      (activation, bias, swiglu_alpha, limit, impl).
    Defaults are GPT-OSS's: swiglu_oai (alpha 1.702, limit 7.0) with expert biases, a
    biased gate, softmax top-4 renormalised. Qwen3-MoE: activation="swiglu", bias=False,
    router_bias=False, top_k=8 (halves-layout checkpoints: cute_moe.repack).

    fuse_gather: gather the routed rows inside the experts' up projection instead of
      copying them out first: in bf16 by a gather pass whose copy is freed once the up
      projection's GEMM has read it (on the fused path with a gated or srelu activation),
      in FP8 inside the pass that quantizes them. The (T*k, H) sorted copy of the tokens
      (566 MB per GPT-OSS-20B layer at 24576 tokens) is then not held from the forward to
      the backward, which gathers the rows again for the weight gradient; the result is
      the same. None (the default): on where the experts' precision is "fp8" (read at each
      forward), where it takes the layer's peak 0.4-0.5 GiB lower and costs no time; off
      in bf16, where the second gather costs 1-4% of the layer's forward + backward on an
      H100 for the same saving (docs/perf-notes.md, session 29).
    precision: "bf16" (default) or "fp8": the experts' GEMMs in FP8 (GroupedExperts); the
      router and the dispatch stay as they are.

    forward(x): x (T, H) or (B, S, H) -> same shape and dtype. With
    return_router_output=True also the RouterOutput (for auxiliary losses). In training
    mode the routed rows per expert are added to router.tokens_per_expert.
    Submodules: router (gate: nn.Linear(H, E)), experts; state dict keys
    router.gate.weight, router.gate.bias, [router.expert_bias], experts.gate_up_proj,
    experts.gate_up_proj_bias, experts.down_proj, experts.down_proj_bias.
    """

    def __init__(self, hidden: int, inter: int, num_experts: int, top_k: int = 4, *,
                 activation: str = DEFAULT_ACTIVATION, bias: bool = True,
                 router_bias: bool = True, score_func: str = "softmax", renormalize: bool = True,
                 route_scale: float = 1.0, swiglu_alpha: float = DEFAULT_ALPHA,
                 limit: float | str | None = LIMIT_DEFAULT,
                 load_balance_coeff: float | None = None,
                 router_dtype: torch.dtype | None = torch.float32, impl: str = "auto",
                 precision: str = "bf16", fuse_gather: bool | None = None,
                 init_std: float = 0.02,
                 dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.hidden, self.num_experts, self.top_k = hidden, num_experts, top_k
        self.fuse_gather = None if fuse_gather is None else bool(fuse_gather)
        self.router = TopKRouter(hidden, num_experts, top_k, score_func=score_func,
                                 renormalize=renormalize, route_scale=route_scale,
                                 bias=router_bias, load_balance_coeff=load_balance_coeff,
                                 compute_dtype=router_dtype, init_std=init_std, dtype=dtype,
                                 device=device)
        self.experts = GroupedExperts(hidden, inter, num_experts, activation=activation,
                                      bias=bias, swiglu_alpha=swiglu_alpha, limit=limit,
                                      impl=impl, precision=precision, init_std=init_std,
                                      dtype=dtype, device=device)

    def config(self) -> dict:
        """The constructor arguments that define the math in full precision (not impl,
        precision, init, dtype, device)."""
        r, x = self.router, self.experts
        return dict(hidden=self.hidden, inter=x.inter, num_experts=self.num_experts,
                    top_k=self.top_k, activation=x.activation,
                    bias=x.down_proj_bias is not None, router_bias=r.gate.bias is not None,
                    score_func=r.score_func, renormalize=r.renormalize,
                    route_scale=r.route_scale, swiglu_alpha=x.swiglu_alpha, limit=x.limit,
                    load_balance_coeff=r.load_balance_coeff, router_dtype=r.compute_dtype)

    def reset_parameters(self) -> None:
        self.router.reset_parameters()
        self.experts.reset_parameters()

    def update_expert_bias(self) -> None:
        """The load-balancing step: see TopKRouter.update_expert_bias."""
        self.router.update_expert_bias()

    def forward(self, x: torch.Tensor, return_router_output: bool = False):
        if x.shape[-1] != self.hidden or x.dim() not in (2, 3):
            raise ValueError(f"MoE: x: expected (T, {self.hidden}) or (B, S, {self.hidden}), "
                             f"got shape {tuple(x.shape)}")
        shape = x.shape
        x = x.reshape(-1, self.hidden)
        routing: RouterOutput = self.router(x)
        d = sort_by_expert(routing.experts, self.num_experts, routing.weights)
        if self.training:
            self.router.record_load(tokens_per_expert(d.offs))
        # the combine joins the experts' down projection, whose backward then gathers the
        # rows' gradient and the bias-side gradients in one pass (cute_moe.expert_ffn)
        combine = (d.row_token, d.token_rows)
        fuse_gather = (self.experts.precision == "fp8" if self.fuse_gather is None
                       else self.fuse_gather)
        if fuse_gather:
            out = self.experts(x, d.offs, d.prob, gather=combine, combine=combine)
        else:
            out = self.experts(permute(x, d), d.offs, d.prob, combine=combine)
        out = out.reshape(shape)
        return (out, routing) if return_router_output else out

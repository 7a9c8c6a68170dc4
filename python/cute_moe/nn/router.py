# Token-choice top-k router of an MoE layer: a linear gate, softmax or sigmoid scores,
# top-k experts per token, optional renormalisation and route scale, and torchtitan's
# auxiliary-loss-free load balancing (an expert bias that moves selection only, plus
# the per-expert token counts that the update outside the module reads).
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .gate_logits import gate_logits, serves_on_tensor_cores
from .top_k import top_k

__all__ = ["RouterOutput", "TopKRouter"]

SCORE_FUNCS = ("softmax", "sigmoid")


class RouterOutput(NamedTuple):
    weights: torch.Tensor  # (T, k) float32 (float64 for float64 inputs): the gate of each choice
    experts: torch.Tensor  # (T, k) int64: chosen expert of each (token, choice)
    logits: torch.Tensor   # (T, E) gate output in the router's compute dtype (for aux losses)


class TopKRouter(nn.Module):
    """Routes each of T tokens to `top_k` of `num_experts` experts.

    logits = gate(x) computed in compute_dtype (default float32, as torchtitan does for
    stable load balancing; None: x's dtype, as HF does; float32 with bf16 x and gate on a
    GPU runs on tensor cores, same products, see gate_logits.py), scores = softmax or sigmoid of
    the logits; the experts are the top-k of scores (+ expert_bias when load balancing;
    the bias chooses, it never weights); the weights are the chosen scores, divided by
    their sum when `renormalize`, times `route_scale`. On a GPU the top-k of float32 scores
    is cute_moe::top_k (nn/top_k.py): torch.topk's result, equal values lower expert first.

    The defaults (softmax, renormalize, gate bias) are GPT-OSS's router: with
    compute_dtype=None they reproduce HF transformers' GptOssTopKRouter bit for bit
    (top-k of the logits, softmax over the k chosen logits, which is what
    softmax-then-renormalise equals), and with float32 inputs also with the default.

    load_balance_coeff: when set, a float32 buffer `expert_bias` (E,) takes part in the
    selection and `update_expert_bias()` moves it by coeff * sign(mean load - load)
    (centred), from the counts accumulated in `tokens_per_expert` (a non-persistent
    float32 buffer that the MoE layer adds each training forward to; torchtitan's
    scheme, meant to run before each optimizer step).
    """

    def __init__(self, hidden: int, num_experts: int, top_k: int, *,
                 score_func: str = "softmax", renormalize: bool = True,
                 route_scale: float = 1.0, bias: bool = True,
                 load_balance_coeff: float | None = None,
                 compute_dtype: torch.dtype | None = torch.float32, init_std: float = 0.02,
                 dtype: torch.dtype | None = None, device=None):
        super().__init__()
        if score_func not in SCORE_FUNCS:
            raise ValueError(f"TopKRouter: score_func: expected one of {SCORE_FUNCS}, got "
                             f"{score_func!r}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"TopKRouter: top_k: expected 1 <= top_k <= num_experts="
                             f"{num_experts}, got {top_k}")
        if load_balance_coeff is not None and not load_balance_coeff > 0:
            raise ValueError(f"TopKRouter: load_balance_coeff: expected None or > 0, got "
                             f"{load_balance_coeff}")
        self.num_experts, self.top_k = num_experts, top_k
        self.score_func, self.renormalize, self.route_scale = score_func, renormalize, route_scale
        self.load_balance_coeff, self.compute_dtype = load_balance_coeff, compute_dtype
        self.init_std = init_std
        self.gate = nn.Linear(hidden, num_experts, bias=bias, dtype=dtype, device=device)
        if load_balance_coeff is not None:
            self.register_buffer("expert_bias", torch.zeros(num_experts, dtype=torch.float32,
                                                            device=device))
        else:
            self.expert_bias = None
        self.register_buffer("tokens_per_expert",
                             torch.zeros(num_experts, dtype=torch.float32, device=device),
                             persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torchtitan's init: gate weight truncated normal (std init_std, +-3 std), gate
        bias zero; the load-balancing state back to zero."""
        s = self.init_std
        nn.init.trunc_normal_(self.gate.weight, std=s, a=-3 * s, b=3 * s)
        if self.gate.bias is not None:
            nn.init.zeros_(self.gate.bias)
        with torch.no_grad():
            self.tokens_per_expert.zero_()
            if self.expert_bias is not None:
                self.expert_bias.zero_()

    def _apply(self, fn, recurse=True):
        # .to(bf16) / .half() would make the counts and the bias low precision (bf16 counts
        # stop being exact past 256): the load-balancing buffers stay float32.
        super()._apply(fn, recurse)
        for name in ("expert_bias", "tokens_per_expert"):
            buf = self._buffers.get(name)
            if buf is not None and buf.dtype != torch.float32:
                self._buffers[name] = buf.float()
        return self

    def _scores(self, logits: torch.Tensor) -> torch.Tensor:
        return F.softmax(logits, dim=-1) if self.score_func == "softmax" else torch.sigmoid(logits)

    def forward(self, x: torch.Tensor) -> RouterOutput:
        """x (T, H) -> RouterOutput(weights (T, k), experts (T, k), logits (T, E)).
        Everything stays on x's device; nothing is read on the host."""
        cd = x.dtype if self.compute_dtype is None else torch.promote_types(self.compute_dtype,
                                                                             x.dtype)
        b, w = self.gate.bias, self.gate.weight
        if cd == torch.float32 and serves_on_tensor_cores(x, w):
            logits = gate_logits(x, w, b)  # float32 sums of exact bf16 products (gate_logits.py)
        else:
            logits = F.linear(x.to(cd), w.to(cd), None if b is None else b.to(cd))
        k = self.top_k
        if self.expert_bias is None:
            # both score functions are monotone, so the top-k logits are the top-k scores
            top, experts = top_k(logits, k)
        else:
            _, experts = top_k(self._scores(logits) + self.expert_bias, k)
            top = logits.gather(-1, experts)
        if self.score_func == "softmax" and self.renormalize:
            # softmax over all E, gathered and renormalised, is the softmax of the chosen
            # logits (HF's formula); no E-wide softmax needed
            weights = F.softmax(top, dim=-1)
        elif self.score_func == "softmax":
            weights = F.softmax(logits, dim=-1).gather(-1, experts)
        else:
            weights = torch.sigmoid(top)
            if self.renormalize:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        if self.route_scale != 1.0:
            weights = weights * self.route_scale
        return RouterOutput(weights.to(torch.promote_types(weights.dtype, torch.float32)),
                            experts, logits)

    @torch.no_grad()
    def record_load(self, counts: torch.Tensor) -> None:
        """Adds routed rows per expert (E,) to tokens_per_expert (on the device)."""
        self.tokens_per_expert.add_(counts)

    @torch.no_grad()
    def update_expert_bias(self) -> None:
        """torchtitan's load-balancing step (call before optimizer.step(); with data
        parallelism all-reduce tokens_per_expert first): experts above the mean load get
        their bias lowered by load_balance_coeff, those below raised, the change centred
        to zero mean; then the counts restart. No host sync."""
        if self.expert_bias is None:
            raise RuntimeError("TopKRouter.update_expert_bias: the router was built without "
                               "load_balance_coeff, so it has no expert_bias")
        load = self.tokens_per_expert
        delta = self.load_balance_coeff * torch.sign(load.mean() - load)
        self.expert_bias.add_(delta - delta.mean())
        load.zero_()

    def extra_repr(self) -> str:
        return (f"top_k={self.top_k}, score_func={self.score_func}, "
                f"renormalize={self.renormalize}, route_scale={self.route_scale}, "
                f"load_balance_coeff={self.load_balance_coeff}, "
                f"compute_dtype={self.compute_dtype}")

# The routed experts of an MoE layer as a module: E expert FFNs whose weights are held
# stacked in HF transformers' GPT-OSS layout, run over rows already sorted by expert
# with cute_moe.expert_ffn (the fused SM90 kernels), or with the pure-PyTorch
# reference for dtypes the kernels do not take.
from __future__ import annotations

import torch
from torch import nn

from ..activation_args import LIMIT_DEFAULT, check_activation, is_gated, resolve_limit, up_width
from ..activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from ..expert_ffn import check_precision, expert_ffn
from ..reference.moe import experts_ref
from ..permute import unpermute

__all__ = ["GroupedExperts"]

IMPLS = ("auto", "fused", "reference")


class GroupedExperts(nn.Module):
    """E expert FFNs over routed rows sorted by expert:
    y[r] = prob[r] * (act(x[r] @ gate_up_proj[e] + gate_up_proj_bias[e]) @ down_proj[e]
    + down_proj_bias[e]) for the rows r in [offs[e-1], offs[e]).

    Parameters (HF transformers GPT-OSS names and layout):
      gate_up_proj (E, H, 2I): gate and linear columns interleaved (column 2j gate j,
        2j+1 linear j) for gated activations; (E, H, I) for "srelu" and "none".
      gate_up_proj_bias (E, 2I or I), down_proj (E, I, H), down_proj_bias (E, H); the
        biases exist when bias=True.
    activation: "swiglu_oai" (GPT-OSS: g = min(a, L), u = clamp(b, -L, L),
      h = g * sigmoid(alpha * g) * (u + 1)), "swiglu" (silu(a) * b), "geglu"
      (gelu_tanh(a) * b), "srelu" (relu^2) or "none" (cute_moe/activations.py). limit: the
      clamp L of gated activations; "default" (LIMIT_DEFAULT) is the activation's default
      limit, 7.0 for swiglu_oai and None (no clamp) otherwise.
    impl: "fused" runs cute_moe.expert_ffn (bf16; no host sync, CUDA-graph safe);
      "reference" the pure-PyTorch loop (any dtype; reads offs on the host); "auto" the
      first for bf16 inputs, the second otherwise. Parameters are cast to the input's
      dtype in forward (a no-op when they already match), so fp32 master weights work.
    precision: "bf16" or "fp8" (the expert GEMMs in FP8 with block scales: cute_moe.expert_ffn's
      precision, docs/fp8.md). "fp8" takes bf16 inputs and impl "auto" or "fused" (on the CPU,
      or without the op library, the FP8 references run). With gradient accumulation, run an
      optimizer step's micro-batches inside cute_moe.fp8.reuse_weight_casts() to cast the
      weights once per step (fp32 masters are cast to bf16 anew by every forward, so their
      FP8 casts are made once per micro-batch, in one pass).
    """

    def __init__(self, hidden: int, inter: int, num_experts: int, *,
                 activation: str = DEFAULT_ACTIVATION, bias: bool = True,
                 swiglu_alpha: float = DEFAULT_ALPHA, limit: float | str | None = LIMIT_DEFAULT,
                 impl: str = "auto", precision: str = "bf16",
                 init_std: float = 0.02, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        limit = resolve_limit(activation, limit)
        check_activation(activation, limit, "GroupedExperts")
        if impl not in IMPLS:
            raise ValueError(f"GroupedExperts: impl: expected one of {IMPLS}, got {impl!r}")
        check_precision("nn.GroupedExperts", precision)
        if precision == "fp8" and impl == "reference":
            raise ValueError("GroupedExperts: precision='fp8' runs the FP8 expert block "
                             "(cute_moe.fp8.expert_ffn); impl='reference' is the bf16/fp32 loop: "
                             "use impl='auto' or 'fused' with it")
        self.hidden, self.inter, self.num_experts = hidden, inter, num_experts
        self.activation, self.swiglu_alpha, self.limit = activation, float(swiglu_alpha), limit
        self.impl, self.precision, self.init_std = impl, precision, init_std
        kw = dict(dtype=dtype, device=device)
        up = up_width(activation, inter)
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden, up, **kw))
        self.down_proj = nn.Parameter(torch.empty(num_experts, inter, hidden, **kw))
        if bias:
            self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, up, **kw))
            self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden, **kw))
        else:
            self.register_parameter("gate_up_proj_bias", None)
            self.register_parameter("down_proj_bias", None)
        self.reset_parameters()

    @property
    def gated(self) -> bool:
        return is_gated(self.activation)

    def reset_parameters(self) -> None:
        """torchtitan's expert init: weights truncated normal with std init_std (+-3 std);
        biases zero (the layer starts as the bias-free FFN)."""
        s = self.init_std
        for w in (self.gate_up_proj, self.down_proj):
            nn.init.trunc_normal_(w, std=s, a=-3 * s, b=3 * s)
        for b in (self.gate_up_proj_bias, self.down_proj_bias):
            if b is not None:
                nn.init.zeros_(b)

    def _use_fused(self, x: torch.Tensor) -> bool:
        if self.precision == "fp8":
            if x.dtype != torch.bfloat16:
                raise ValueError(f"GroupedExperts: precision='fp8' takes bf16 inputs, got x of "
                                 f"{x.dtype} (cast the input, or use precision='bf16')")
            return True
        return self.impl == "fused" or (self.impl == "auto" and x.dtype == torch.bfloat16)

    def forward(self, x: torch.Tensor, offs: torch.Tensor,
                prob: torch.Tensor | None = None,
                gather: tuple[torch.Tensor, torch.Tensor | None] | None = None,
                combine: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x (M, H) routed rows sorted by expert; offs (E,) int32 cumulative end offsets
        on x's device; prob (M,) optional router weight per row (fused into the down
        projection's epilogue on the fused path). Returns (M, H) in x's dtype; rows at or
        past offs[-1] are zero.
        gather (row_token (M,), token_rows (T, k) or None): x is then the (T, H) tokens and
        routed row r is x[row_token[r]], gathered inside the up projection's GEMM on the
        fused path (see cute_moe.expert_ffn).
        combine (row_token (M,), token_rows (T, k)): return the (T, H) token outputs
        out[t] = sum_j y[token_rows[t, j]] (the layer's combine, fused with the down
        projection's backward on the fused path; see cute_moe.expert_ffn)."""
        dt = x.dtype

        def cast(p):
            return None if p is None else p.to(dt)

        w_up, w_down = cast(self.gate_up_proj), cast(self.down_proj)
        b_up, b_down = cast(self.gate_up_proj_bias), cast(self.down_proj_bias)
        if self._use_fused(x):
            kwargs = dict(activation=self.activation, prob=prob, limit=self.limit,
                          precision=self.precision)
            if self.activation == "swiglu_oai":
                kwargs["swiglu_alpha"] = self.swiglu_alpha
            if prob is not None and prob.dtype != torch.float32:
                kwargs["prob"] = prob.float()
            if gather is not None:
                kwargs["gather"] = gather
            if combine is not None:
                kwargs["combine"] = combine
            return expert_ffn(x, w_up, w_down, offs, b_up, b_down, **kwargs)
        if gather is not None:
            x = x[gather[0].long()]
        y = experts_ref(x, offs, w_up, w_down, b_up, b_down, prob,
                        activation=self.activation, alpha=self.swiglu_alpha,
                        limit=self.limit, impl="loop")
        return y if combine is None else unpermute(y, combine[1], combine[0])

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden}, inter={self.inter}, num_experts={self.num_experts}, "
                f"activation={self.activation}, bias={self.down_proj_bias is not None}, "
                f"swiglu_alpha={self.swiglu_alpha}, limit={self.limit}, impl={self.impl}"
                + (f", precision={self.precision}" if self.precision != "bf16" else ""))

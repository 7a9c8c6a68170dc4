# Named MoE layer shapes for `python -m cute_moe.bench`: one layer of the public models
# the project targets, and the example block of the seed API (grouped_mm_swiglu /
# grouped_mm_downproj), at the token counts of a training micro-batch on one GPU.
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..activation_args import is_gated
from ..activations import DEFAULT_ACTIVATION

__all__ = ["BenchConfig", "CONFIGS", "DEFAULT_CONFIGS"]


@dataclass(frozen=True)
class BenchConfig:
    name: str
    tokens: int        # T
    hidden: int        # H
    inter: int         # I, each expert's intermediate width
    experts: int       # E
    topk: int          # k
    activation: str = DEFAULT_ACTIVATION
    bias: bool = True          # expert biases
    router_bias: bool = True
    score_func: str = "softmax"
    renormalize: bool = True
    note: str = ""

    @property
    def rows(self) -> int:
        """M = T * k routed rows."""
        return self.tokens * self.topk

    @property
    def gated(self) -> bool:
        return is_gated(self.activation)

    def flops(self) -> tuple[int, int]:
        """(forward, backward) FLOPs of the expert GEMMs (router and elementwise work
        not counted): forward 2*M*H*up + 2*M*I*H with up = 2I gated, I otherwise;
        backward twice that (input and weight gradients of both GEMMs)."""
        up = 2 * self.inter if self.gated else self.inter
        fwd = 2 * self.rows * self.hidden * up + 2 * self.rows * self.inter * self.hidden
        return fwd, 2 * fwd

    def moe_kwargs(self) -> dict:
        """Constructor arguments of cute_moe.nn.MoE / ReferenceMoE."""
        return dict(hidden=self.hidden, inter=self.inter, num_experts=self.experts,
                    top_k=self.topk, activation=self.activation, bias=self.bias,
                    router_bias=self.router_bias, score_func=self.score_func,
                    renormalize=self.renormalize)

    def with_(self, **changes) -> "BenchConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)


CONFIGS = {c.name: c for c in (
    BenchConfig("gpt-oss-20b", tokens=24576, hidden=2880, inter=2880, experts=32, topk=4,
                note="GPT-OSS-20B layer: swiglu_oai (alpha 1.702, limit 7), biases, softmax "
                     "top-4 renormalised"),
    BenchConfig("gpt-oss-120b", tokens=24576, hidden=2880, inter=2880, experts=128, topk=4,
                note="GPT-OSS-120B layer: as gpt-oss-20b with 128 experts"),
    BenchConfig("qwen3-30b-a3b", tokens=16384, hidden=2048, inter=768, experts=128, topk=8,
                activation="swiglu", bias=False, router_bias=False,
                note="Qwen3-30B-A3B layer: SwiGLU, no biases, softmax top-8 renormalised"),
    # The seed API's example block (H, I, E) with top-2, at 24K tokens per GPU.
    BenchConfig("seed-example", tokens=24576, hidden=2048, inter=1024, experts=8, topk=2,
                note="the seed API's example block (H=2048, I=1024, E=8), top-2, swiglu_oai "
                     "with biases, 24K tokens"),
)}

DEFAULT_CONFIGS = ("gpt-oss-20b", "gpt-oss-120b", "qwen3-30b-a3b", "seed-example")

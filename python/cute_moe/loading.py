# Building cute_moe.nn layers from the weights of other implementations: HF transformers'
# GPT-OSS MoE block (GptOssMLP: router + GptOssExperts, our layout already) and
# torchtitan's GroupedExperts (w1/w2/w3, SwiGLU in halves) and GptOssGroupedExperts
# (mlp1/mlp2, transposed, interleaved). Conversions happen once here, so the layer
# itself only knows the interleaved (E, H, 2I) / (E, I, H) layout. See docs/loading.md.
from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from .activation_args import LIMIT_DEFAULT
from .activations import DEFAULT_ALPHA
from .nn import GroupedExperts, MoE
from .repack import halves_to_interleaved

__all__ = ["from_hf_gpt_oss", "to_hf_gpt_oss", "HFGptOssMLPAdapter",
           "load_torchtitan_grouped_experts", "from_torchtitan_moe"]

_HF_KEYS = ("router.weight", "router.bias", "experts.gate_up_proj", "experts.gate_up_proj_bias",
            "experts.down_proj", "experts.down_proj_bias")


def _find(sd: Mapping[str, torch.Tensor], pattern: str, what: str, fn: str,
          required: bool = True):
    """The one value whose key is `pattern` (a regex for the last key components) after
    any prefix; None when absent and not required."""
    rx = re.compile(r"(?:^|\.)" + pattern + r"$")
    hits = [k for k in sd if rx.search(k)]
    if len(hits) > 1:
        raise ValueError(f"cute_moe.loading.{fn}: several {what} in the state dict ({hits}); "
                         "pass one layer's keys (e.g. prefix='model.layers.0.mlp.')")
    if not hits:
        if required:
            raise KeyError(f"cute_moe.loading.{fn}: no {what} (a key ending in "
                           f"{pattern!r}) in the state dict; keys: {sorted(sd)[:12]}")
        return None
    return sd[hits[0]]


def _layer(sd: Mapping[str, torch.Tensor], prefix: str, fn: str) -> dict:
    if not isinstance(sd, Mapping):
        raise TypeError(f"cute_moe.loading.{fn}: expected a module or a state dict, got "
                        f"{type(sd).__name__}")
    out = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    if not out:
        raise KeyError(f"cute_moe.loading.{fn}: no key starts with prefix {prefix!r}")
    return out


@torch.no_grad()
def _copy(dst: torch.nn.Parameter | torch.Tensor, src: torch.Tensor, name: str, fn: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"cute_moe.loading.{fn}: {name}: expected shape {tuple(dst.shape)}, "
                         f"got {tuple(src.shape)}")
    dst.copy_(src)


def _target(src: torch.Tensor, dtype, device) -> dict:
    return dict(dtype=dtype or src.dtype, device=device if device is not None else src.device)


def from_hf_gpt_oss(mlp, *, top_k: int | None = None, prefix: str = "",
                    swiglu_alpha: float | None = None,
                    limit: float | str | None = LIMIT_DEFAULT,
                    dtype: torch.dtype | None = None, device=None, **moe_kwargs) -> MoE:
    """A cute_moe.nn.MoE computing what HF transformers' GPT-OSS MoE block computes.

    mlp: a GptOssMLP module (reads router.weight/bias/top_k, experts.gate_up_proj,
      gate_up_proj_bias, down_proj, down_proj_bias, alpha, limit), or its state dict
      (keys ending in those names; a whole model's state dict with `prefix` naming
      the layer, e.g. "model.layers.3.mlp."). Dequantized weights only: MXFP4
      checkpoints (`*_blocks`, `*_scales`) must be loaded with dequantization first.
    top_k: from the module, else required for a state dict (GPT-OSS uses 4).
    swiglu_alpha: from the module, else GPT-OSS's 1.702 (DEFAULT_ALPHA). limit: "default"
      (LIMIT_DEFAULT) takes the module's, else GPT-OSS's 7.0 (swiglu_oai's default
      limit); None: no clamp.
    dtype, device: of the new layer (default: the source's). moe_kwargs go to MoE
      (e.g. impl, router_dtype=None to round the router like HF in bf16).
    The layout is HF's own ((E, H, 2I) interleaved, (E, I, H)): weights are copied as is.
    """
    fn = "from_hf_gpt_oss"
    if isinstance(mlp, torch.nn.Module):
        router, experts = mlp.router, mlp.experts
        top_k = top_k or router.top_k
        swiglu_alpha = swiglu_alpha if swiglu_alpha is not None else getattr(experts, "alpha", None)
        if limit == LIMIT_DEFAULT:
            limit = getattr(experts, "limit", LIMIT_DEFAULT)
        sd = {"router.weight": router.weight, "router.bias": router.bias,
              "experts.gate_up_proj": experts.gate_up_proj,
              "experts.gate_up_proj_bias": experts.gate_up_proj_bias,
              "experts.down_proj": experts.down_proj,
              "experts.down_proj_bias": experts.down_proj_bias}
    else:
        sd = _layer(mlp, prefix, fn)
        if any(k.endswith(("_blocks", "_scales")) for k in sd):
            raise ValueError(f"cute_moe.loading.{fn}: the state dict holds MXFP4 expert weights "
                             "(*_blocks, *_scales); load the checkpoint dequantized (bf16) first")
        sd = {k: _find(sd, re.escape(k), k, fn) for k in _HF_KEYS}
        if top_k is None:
            raise ValueError(f"cute_moe.loading.{fn}: top_k: required with a state dict "
                             "(GPT-OSS: 4)")
    w_up = sd["experts.gate_up_proj"]
    e, h, two_i = w_up.shape
    moe = MoE(h, two_i // 2, e, top_k, activation="swiglu_oai", bias=True, router_bias=True,
              score_func="softmax", renormalize=True,
              swiglu_alpha=DEFAULT_ALPHA if swiglu_alpha is None else swiglu_alpha,
              limit=limit, **_target(w_up, dtype, device), **moe_kwargs)
    _copy(moe.router.gate.weight, sd["router.weight"], "router.weight", fn)
    _copy(moe.router.gate.bias, sd["router.bias"], "router.bias", fn)
    for name in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"):
        _copy(getattr(moe.experts, name), sd[f"experts.{name}"], f"experts.{name}", fn)
    return moe


def to_hf_gpt_oss(moe: MoE, prefix: str = "") -> dict:
    """The HF GptOssMLP state dict of a GPT-OSS style cute_moe.nn.MoE (swiglu_oai, biases,
    biased softmax router), keys prefixed with `prefix`; tensors detached, not copied."""
    cfg = moe.config()
    if not (cfg["activation"] == "swiglu_oai" and cfg["bias"] and cfg["router_bias"]
            and cfg["score_func"] == "softmax" and cfg["renormalize"]):
        raise ValueError(f"cute_moe.loading.to_hf_gpt_oss: not a GPT-OSS layer: {cfg}")
    x = moe.experts
    vals = (moe.router.gate.weight, moe.router.gate.bias, x.gate_up_proj, x.gate_up_proj_bias,
            x.down_proj, x.down_proj_bias)
    return {prefix + k: v.detach() for k, v in zip(_HF_KEYS, vals)}


class HFGptOssMLPAdapter(torch.nn.Module):
    """A cute_moe.nn.MoE behind HF GptOssMLP's forward contract, to replace `layer.mlp` in
    a transformers GPT-OSS model: forward(hidden_states (B, S, H)) returns
    (out (B, S, H), router_scores (T, E)), router_scores holding each token's k weights
    at its experts' columns and zeros elsewhere (transformers 4.x's form; 5.x returns the
    (T, k) weights there; the decoder layers of both discard it). transformers 5.x
    records router logits from its GptOssTopKRouter module, which this replaces: use
    `moe(x, return_router_output=True)` for them. Parameters live under `moe.`."""

    def __init__(self, moe: MoE):
        super().__init__()
        self.moe = moe

    def forward(self, hidden_states: torch.Tensor):
        out, r = self.moe(hidden_states, return_router_output=True)
        scores = torch.zeros_like(r.logits).scatter_(1, r.experts, r.weights.to(r.logits.dtype))
        return out, scores


# torchtitan's names, with or without the shape suffixes newer versions append
# (w1_EFD, mlp1_weight_EGD, ...); a key must end in one of them.
def _tt(name: str) -> str:
    return re.escape(name) + r"(?:_[A-Z]+)?"


def load_torchtitan_grouped_experts(state_dict: Mapping[str, torch.Tensor], *,
                                    prefix: str = "", swiglu_alpha: float = DEFAULT_ALPHA,
                                    limit: float | str | None = LIMIT_DEFAULT,
                                    dtype: torch.dtype | None = None, device=None,
                                    impl: str = "auto") -> GroupedExperts:
    """A cute_moe.nn.GroupedExperts from the parameters of one torchtitan expert module:
      GroupedExperts: w1 (E, I, H) gate, w3 (E, I, H) linear, w2 (E, H, I), used as
        silu(x @ w1[e].T) * (x @ w3[e].T) @ w2[e].T -> activation "swiglu", no biases;
        w1/w3 are interleaved into gate_up_proj (E, H, 2I) with cute_moe.repack.
      GptOssGroupedExperts: mlp1_weight (E, 2I, H) (gate/linear rows already
        interleaved), mlp1_bias (E, 2I), mlp2_weight (E, H, I), mlp2_bias (E, H) ->
        "swiglu_oai" with biases, alpha swiglu_alpha, clamp `limit` (torchtitan's
        swiglu_limit; "default": swiglu_oai's default limit, 7.0, torchtitan's default).
    Keys may carry a prefix (`prefix` selects one layer of a model's state dict) and
    torchtitan's shape suffixes (w1_EFD, mlp1_weight_EGD, ...). Weights are copied into
    our layout once (contiguous)."""
    fn = "load_torchtitan_grouped_experts"
    sd = _layer(state_dict, prefix, fn)
    w1 = _find(sd, _tt("w1"), "w1", fn, required=False)
    mlp1 = _find(sd, _tt("mlp1_weight"), "mlp1_weight", fn, required=False)
    if (w1 is None) == (mlp1 is None):
        raise KeyError(f"cute_moe.loading.{fn}: expected the keys of one GroupedExperts (w1, "
                       f"w2, w3) or one GptOssGroupedExperts (mlp1_weight, mlp1_bias, "
                       f"mlp2_weight, mlp2_bias); keys: {sorted(sd)[:12]}")
    if w1 is not None:
        w2, w3 = _find(sd, _tt("w2"), "w2", fn), _find(sd, _tt("w3"), "w3", fn)
        e, inter, hidden = w1.shape
        if tuple(w3.shape) != tuple(w1.shape) or tuple(w2.shape) != (e, hidden, inter):
            raise ValueError(f"cute_moe.loading.{fn}: expected w1, w3 (E, I, H) and w2 "
                             f"(E, H, I), got {tuple(w1.shape)}, {tuple(w3.shape)}, "
                             f"{tuple(w2.shape)}")
        experts = GroupedExperts(hidden, inter, e, activation="swiglu", bias=False, impl=impl,
                                 **_target(w1, dtype, device))
        # [w1 | w3] along I is the halves layout of the (E, 2I, H) up projection
        up = halves_to_interleaved(torch.cat([w1, w3], dim=1), dim=1)
        _copy(experts.gate_up_proj, up.transpose(1, 2), "gate_up_proj (from w1, w3)", fn)
        _copy(experts.down_proj, w2.transpose(1, 2), "down_proj (from w2)", fn)
        return experts
    b1 = _find(sd, _tt("mlp1_bias"), "mlp1_bias", fn)
    w2 = _find(sd, _tt("mlp2_weight"), "mlp2_weight", fn)
    b2 = _find(sd, _tt("mlp2_bias"), "mlp2_bias", fn)
    e, two_i, hidden = mlp1.shape
    experts = GroupedExperts(hidden, two_i // 2, e, activation="swiglu_oai", bias=True,
                             swiglu_alpha=swiglu_alpha, limit=limit, impl=impl,
                             **_target(mlp1, dtype, device))
    _copy(experts.gate_up_proj, mlp1.transpose(1, 2), "gate_up_proj (from mlp1_weight)", fn)
    _copy(experts.gate_up_proj_bias, b1, "gate_up_proj_bias (from mlp1_bias)", fn)
    _copy(experts.down_proj, w2.transpose(1, 2), "down_proj (from mlp2_weight)", fn)
    _copy(experts.down_proj_bias, b2, "down_proj_bias (from mlp2_bias)", fn)
    return experts


def from_torchtitan_moe(state_dict: Mapping[str, torch.Tensor], *, top_k: int,
                        score_func: str = "softmax", renormalize: bool = True,
                        route_scale: float = 1.0, load_balance_coeff: float | None = None,
                        prefix: str = "", swiglu_alpha: float = DEFAULT_ALPHA,
                        limit: float | str | None = LIMIT_DEFAULT,
                        dtype: torch.dtype | None = None, device=None,
                        **moe_kwargs) -> MoE:
    """A cute_moe.nn.MoE from one torchtitan MoE layer's state dict: router.gate.weight
    (E, H) [+ router.gate.bias], the expert_bias buffer when present, and the routed
    experts (see load_torchtitan_grouped_experts). torchtitan keeps the routing
    hyper-parameters in its config, not the state dict: pass top_k, score_func,
    renormalize (its route_norm), route_scale as the model's config has them (GPT-OSS:
    softmax, route_norm=True; Qwen3: softmax, route_norm=True; DeepSeek-V3: sigmoid,
    route_norm=True, route_scale=2.5). A state dict with expert_bias gets a router with
    load balancing (coefficient load_balance_coeff, default torchtitan's 1e-3).
    Shared experts are not part of cute_moe.nn.MoE and are ignored."""
    fn = "from_torchtitan_moe"
    sd = _layer(state_dict, prefix, fn)
    gate_w = _find(sd, r"router\.gate\.weight", "router.gate.weight", fn)
    gate_b = _find(sd, r"router\.gate\.bias", "router.gate.bias", fn, required=False)
    ebias = _find(sd, _tt("expert_bias"), "expert_bias", fn, required=False)
    experts = load_torchtitan_grouped_experts(sd, swiglu_alpha=swiglu_alpha, limit=limit,
                                              dtype=dtype, device=device)
    if ebias is not None and load_balance_coeff is None:
        load_balance_coeff = 1e-3
    p = experts.down_proj
    moe = MoE(experts.hidden, experts.inter, experts.num_experts, top_k,
              activation=experts.activation, bias=experts.down_proj_bias is not None,
              router_bias=gate_b is not None, score_func=score_func, renormalize=renormalize,
              route_scale=route_scale, swiglu_alpha=experts.swiglu_alpha, limit=experts.limit,
              load_balance_coeff=load_balance_coeff, dtype=p.dtype, device=p.device,
              **moe_kwargs)
    with torch.no_grad():
        moe.experts.load_state_dict(experts.state_dict())
    _copy(moe.router.gate.weight, gate_w, "router.gate.weight", fn)
    if gate_b is not None:
        _copy(moe.router.gate.bias, gate_b, "router.gate.bias", fn)
    if ebias is not None:
        _copy(moe.router.expert_bias, ebias, "expert_bias", fn)
    return moe

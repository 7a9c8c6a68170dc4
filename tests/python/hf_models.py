# Tiny random HF transformers MoE models for the integration tests of
# cute_moe.integrations.transformers (test_integration_transformers_{cpu,gpu}.py), built
# from configs (no downloads): GPT-OSS (interleaved gate/up with biases, its clamped
# SwiGLU), Qwen3-MoE, Mixtral and DeepSeek-V3 ([gate; up] halves, SiLU). Also: one
# training step's logits, loss and gradients; the routing hooks that let a run take the
# routing of an fp32 reference run (bf16 rounding flips near-tied top-k choices, and one
# flipped choice moves a token's output by O(1): that would say nothing about the
# experts); one experts module run on its own; a few AdamW steps.
from __future__ import annotations

import contextlib
import copy

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, GptOssConfig,
                          GptOssForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

from cute_moe import testing

__all__ = ["ARCHS", "ROUTES", "config", "model", "experts_modules", "inputs", "step",
           "record_routing", "pinned_routing", "experts_inputs", "eager_experts",
           "experts_grads", "masked", "pinned_steps", "flat",
           "assert_steps_close", "assert_model_within_noise", "noise_bar", "adamw_losses",
           "WeightCopies", "BF16_TOL"]

transformers.logging.set_verbosity_error()

ARCHS = ("gpt_oss", "qwen3_moe", "mixtral", "deepseek_v3")
BF16_TOL = 2e-2  # relative Frobenius error of a bf16 result against fp32
# the route the integration takes for each (cute_moe/integrations/transformers.py)
ROUTES = {"gpt_oss": "fused", "qwen3_moe": "halves", "mixtral": "halves", "deepseek_v3": "halves"}


def config(arch: str, *, hidden: int = 32, inter: int = 16, experts: int = 4, top_k: int = 2,
           layers: int = 2, vocab: int = 64, **overrides):
    """A tiny config of `arch`: every layer MoE, `experts` routed experts of width `inter`,
    eager attention (the same on every machine)."""
    heads, head_dim = 2, hidden // 2
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=1, head_dim=head_dim,
                  max_position_embeddings=128, num_experts_per_tok=top_k,
                  attn_implementation="eager")
    if arch == "gpt_oss":
        kw = dict(num_local_experts=experts, intermediate_size=inter, sliding_window=16,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        cls = GptOssConfig
    elif arch == "qwen3_moe":
        kw = dict(num_experts=experts, moe_intermediate_size=inter, intermediate_size=2 * inter,
                  norm_topk_prob=True)
        cls = Qwen3MoeConfig
    elif arch == "mixtral":
        kw = dict(num_local_experts=experts, intermediate_size=inter)
        cls = MixtralConfig
    elif arch == "deepseek_v3":
        # the MLA attention needs its own head sizes (and a key per head); one shared
        # expert beside the routed ones
        common.pop("head_dim")
        kw = dict(num_key_value_heads=heads, n_routed_experts=experts, moe_intermediate_size=inter,
                  intermediate_size=2 * inter, first_k_dense_replace=0, n_shared_experts=1,
                  kv_lora_rank=16, q_lora_rank=None,
                  qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=head_dim, n_group=1,
                  topk_group=1, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        cls = DeepseekV3Config
    else:
        raise ValueError(f"unknown arch {arch!r}")
    return cls(**{**common, **kw, **overrides})


_MODELS = {GptOssConfig: GptOssForCausalLM, Qwen3MoeConfig: Qwen3MoeForCausalLM,
           MixtralConfig: MixtralForCausalLM, DeepseekV3Config: DeepseekV3ForCausalLM}


def model(arch: str, *, seed: int = 0, expert_scale: float = 1.0, **kw):
    """A tiny fp32 CPU model of `arch` with O(1) router logits and pre-activations
    (transformers' init, std 0.02, would leave the router near ties and the activations
    near linear), expert pre-activations of std `expert_scale` and random biases."""
    cfg = config(arch, **kw)
    torch.manual_seed(seed)
    m = _MODELS[type(cfg)](cfg).float()
    h = cfg.hidden_size
    with torch.no_grad():
        for ex in experts_modules(m):
            inter = ex.down_proj.shape[-1] if not ex.is_transposed else ex.down_proj.shape[-2]
            ex.gate_up_proj.normal_(0, expert_scale * h ** -0.5)
            ex.down_proj.normal_(0, inter ** -0.5)
            for name in ("gate_up_proj_bias", "down_proj_bias"):
                if getattr(ex, name, None) is not None:
                    getattr(ex, name).normal_(0, 0.1)
        for name, p in m.named_parameters():
            if ".mlp.router." in name or ".mlp.gate." in name:  # the routers
                p.normal_(0, h ** -0.5 if p.dim() == 2 else 0.1)
    return m


def experts_modules(m: torch.nn.Module) -> list[torch.nn.Module]:
    """The @use_experts_implementation modules of m, in module order."""
    return [x for x in m.modules() if hasattr(x, "is_concatenated")]


def inputs(vocab: int = 64, batch: int = 2, seq: int = 16, seed: int = 1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)


def step(m: torch.nn.Module, ids: torch.Tensor):
    """(logits, loss, grads): one forward and backward of the LM loss; grads by parameter
    name (zeros where a parameter got none)."""
    m.zero_grad(set_to_none=True)
    out = m(input_ids=ids, labels=ids)
    out.loss.backward()
    # (torch.compile's wrapper names them _orig_mod.<name>)
    grads = {n.removeprefix("_orig_mod."):
             (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
             for n, p in m.named_parameters()}
    return out.logits.detach(), out.loss.detach(), grads


@contextlib.contextmanager
def record_routing(m: torch.nn.Module, into: list):
    """Appends each experts module's top_k_index (T, k) to `into` as m runs."""
    def hook(module, args):
        into.append(args[1].detach().clone())
    handles = [x.register_forward_pre_hook(hook) for x in experts_modules(m)]
    try:
        yield into
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def pinned_routing(m: torch.nn.Module, routing: list):
    """Each experts module gets the top_k_index recorded by record_routing (one forward,
    same module order) in place of its router's; the router weights stay its own, so
    their gradient still reaches the router."""
    mods = experts_modules(m)
    if len(routing) != len(mods):
        raise ValueError(f"pinned_routing: {len(routing)} recorded routings for {len(mods)} "
                         "experts modules")

    def make(index):
        def hook(module, args):
            return (args[0], index.to(args[1].device), *args[2:])
        return hook
    handles = [x.register_forward_pre_hook(make(r)) for x, r in zip(mods, routing)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# --- one experts module on its own --------------------------------------------------------

def experts_inputs(module, tokens: int = 96, seed: int = 0, sentinels: bool = False):
    """(hidden (T, H), top_k_index (T, k), top_k_weights (T, k), dy (T, H)) in fp32 on the
    module's device for its top_k: distinct experts per token, softmax weights. With
    sentinels, some choices (all of token 0's) are expert-parallel sentinels, ids
    num_experts and num_experts + 3, and keep a nonzero weight."""
    e, h, k = module.num_experts, module.config.hidden_size, module.config.num_experts_per_tok
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, h, generator=g)
    index = torch.rand(tokens, e, generator=g).argsort(-1)[:, :k]
    weights = torch.randn(tokens, k, generator=g).softmax(-1)
    if sentinels:
        index[0] = e
        index[1::5, -1] = e + 3
    dy = torch.randn(tokens, h, generator=g)
    dev = module.down_proj.device
    return hidden.to(dev), index.to(dev), weights.to(dev), dy.to(dev)


def eager_experts(module, hidden, index, weights):
    """transformers' own per-expert loop of the module's class (its "eager")."""
    return type(module).forward.__wrapped__(module, hidden, index, weights)


def experts_grads(forward, module, hidden, index, weights, dy, dtype):
    """{name: tensor}: forward(module, hidden, index, weights) in `dtype` (module and
    inputs cast; index as given) and the gradients of <out, dy> with respect to hidden,
    weights and every parameter."""
    module = copy.deepcopy(module).to(dtype)
    hidden = hidden.detach().to(dtype).requires_grad_()
    weights = weights.detach().to(dtype).requires_grad_()
    out = forward(module, hidden, index, weights)
    names = ["hidden", "weights"] + [n for n, _ in module.named_parameters()]
    leaves = [hidden, weights] + list(module.parameters())
    grads = torch.autograd.grad(out, leaves, dy.to(out.dtype))
    return {"out": out.detach(), **{n: g.detach() for n, g in zip(names, grads)}}


def masked(index, weights, num_experts):
    """The routing transformers' eager loops accept in place of sentinels: expert 0 with
    weight 0."""
    sentinel = index >= num_experts
    return index.masked_fill(sentinel, 0), weights.masked_fill(sentinel, 0.0), sentinel


# --- whole models ---------------------------------------------------------------------------

def pinned_steps(m, ids, runs):
    """The fp32 "eager" step of model m (on its device) and, for each (implementation,
    dtype) of `runs`, the step of a copy in that dtype with the reference's routing:
    {"eager": (logits, loss, grads), (impl, dtype): ..., "routing": the routing}."""
    ref = copy.deepcopy(m)
    ref.set_experts_implementation("eager")
    routing = []
    with record_routing(ref, routing):
        out = {"eager": step(ref, ids), "routing": routing}
    for impl, dtype in runs:
        b = copy.deepcopy(m).to(dtype)
        b.set_experts_implementation(impl)
        with pinned_routing(b, routing):
            out[impl, dtype] = step(b, ids)
    return out


def flat(grads: dict) -> torch.Tensor:
    """All gradients as one float64 vector, in name order."""
    return torch.cat([grads[n].double().reshape(-1) for n in sorted(grads)])


def assert_steps_close(got, want, tol: float, what: str) -> None:
    """(logits, loss, grads) of two steps: every tensor within tol (relative)."""
    testing.assert_rel_close(got[0], want[0], f"{what}: logits", tol=tol)
    testing.assert_rel_close(got[1], want[1], f"{what}: loss", tol=tol)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        testing.assert_rel_close(got[2][name], want[2][name], f"{what}: grad {name}", tol=tol)


def assert_model_within_noise(runs, what: str) -> None:
    """runs: pinned_steps with ("cute_moe", bf16) and ("grouped_mm", bf16), one per model
    seed (or a single one). bf16 rounding anywhere in the model (attention included) moves
    some gradients by 10-50% (routers, attention sinks, norms: sums that cancel), for
    transformers' own implementations too, so the bar is theirs: logits and loss within
    BF16_TOL of fp32 "eager" (or, should the bf16 model as a whole be further off, within
    noise_bar of "grouped_mm"'s error), and the whole gradient and the experts' gradients,
    averaged over the seeds, within noise_bar of "grouped_mm"'s average. (Averaged: a
    router's gradient is a difference of nearly equal terms, so its error at one seed is
    nearly a coin flip for either implementation; measured at Qwen3-MoE's tiny config:
    ours 5.6% / theirs 2.2% at one seed, 12.0% / 12.7% at the next.)"""
    bf16 = torch.bfloat16
    runs = [runs] if isinstance(runs, dict) else list(runs)
    for steps in runs:
        ref, ours, theirs = steps["eager"], steps["cute_moe", bf16], steps["grouped_mm", bf16]
        for i, part in ((0, "logits"), (1, "loss")):
            bar = max(BF16_TOL, noise_bar(testing.rel_error(theirs[i], ref[i])))
            testing.assert_rel_close(ours[i], ref[i], f"{what}: {part}", tol=bar)

    def err(steps, impl, names):
        ref, got = steps["eager"], steps[impl, bf16]
        return testing.rel_error(flat({n: got[2][n] for n in names}),
                                 flat({n: ref[2][n] for n in names}))
    names_all = list(runs[0]["eager"][2])
    experts = [n for n in names_all if ".experts." in n]
    for part, names in (("all gradients", names_all), ("expert gradients", experts)):
        ours = sum(err(s, "cute_moe", names) for s in runs) / len(runs)
        theirs = sum(err(s, "grouped_mm", names) for s in runs) / len(runs)
        assert ours <= noise_bar(theirs), (what, part, ours, noise_bar(theirs))


def noise_bar(baseline: float) -> float:
    """How far from fp32 a bf16 result may be when a baseline bf16 implementation is
    `baseline` away: a quarter more, plus a little (the bf16 noise of the two differs)."""
    return 1.25 * baseline + 5e-3


def adamw_losses(m, impl: str, dtype, ids, steps: int = 5, lr: float = 3e-3) -> list[float]:
    """Losses of `steps` AdamW steps on one batch (it memorises it), from a copy of m."""
    b = copy.deepcopy(m).to(dtype)
    b.set_experts_implementation(impl)
    opt = torch.optim.AdamW(b.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = b(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses



class WeightCopies(TorchDispatchMode):
    """Records the ops whose output holds as many elements as one of `weights` without
    sharing its storage: a copy of a weight."""

    def __init__(self, weights):
        super().__init__()
        self.sizes = {w.numel(): w.untyped_storage().data_ptr() for w in weights}
        self.copies = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (isinstance(t, torch.Tensor) and t.numel() in self.sizes and t.device.type != "meta"
                    and t.untyped_storage().data_ptr() != self.sizes[t.numel()]):
                self.copies.append(str(func))
        return out

# Tests on CPU of the MoE layer (cute_moe.nn) and what surrounds it: the router against
# hand-computed routing and HF transformers' GptOssTopKRouter, the dispatch metadata
# (empty experts included), the layer against the torchtitan-style ReferenceMoE with the
# gradients of the input and of every parameter (router included) in float64, a
# numerical gradient check, the weight loaders against small re-implementations of HF's
# GptOssMLP and torchtitan's GroupedExperts / GptOssGroupedExperts, and the benchmark
# command line without a GPU.
import importlib
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import cute_moe
from cute_moe import loading, testing
from cute_moe.bench import CONFIGS
from cute_moe.bench.report import format_table, write_png
from cute_moe.nn import GroupedExperts, MoE, TopKRouter, sort_by_expert
from cute_moe.nn import dispatch as dispatch_mod
from cute_moe.activation_args import LIMIT_DEFAULT
from cute_moe.activations import DEFAULT_ACTIVATION, DEFAULT_ALPHA
from cute_moe.reference import ReferenceMoE, activation_ref, experts_ref
from cute_moe.permute import unpermute

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

# (name, MoE kwargs): the activations, score functions and bias switches the layer has
LAYERS = [
    ("gpt-oss", dict()),
    ("qwen3", dict(activation="swiglu", bias=False, router_bias=False, top_k=3)),
    ("sigmoid-geglu", dict(activation="geglu", score_func="sigmoid", renormalize=True,
                           route_scale=2.5)),
    ("softmax-norenorm-srelu", dict(activation="srelu", renormalize=False, bias=False)),
    # top-1 with renormalisation would give weight 1 and no router gradient
    ("none-loadbalance", dict(activation="none", load_balance_coeff=1e-3, top_k=1,
                              renormalize=False)),
    ("oai-nolimit", dict(limit=None, swiglu_alpha=1.3, score_func="sigmoid",
                         renormalize=False)),
]


def _moe(kw, h=24, i=16, e=6, dtype=F64, seed=0):
    torch.manual_seed(seed)
    kw = dict(kw)
    top_k = kw.pop("top_k", 2)
    # larger init than the default so that outputs and gradients are O(1)
    moe = MoE(h, i, e, top_k, init_std=0.3, dtype=dtype, **kw)
    with torch.no_grad():
        for p in (moe.router.gate.bias, moe.experts.gate_up_proj_bias, moe.experts.down_proj_bias):
            if p is not None:
                p.normal_()
        if moe.router.expert_bias is not None:
            moe.router.expert_bias.copy_(torch.randn(e) * 0.3)
    return moe


def _leaves(moe):
    return [p for _, p in moe.named_parameters()]


# --- router ------------------------------------------------------------------------------

def hf_gpt_oss_router(x, weight, bias, top_k):
    """HF transformers' GptOssTopKRouter.forward, re-implemented: logits in the weights'
    dtype, top-k of the logits, softmax of the k chosen logits, scattered into (T, E)."""
    logits = F.linear(x, weight, bias)
    top, idx = torch.topk(logits, top_k, dim=-1)
    top = F.softmax(top, dim=1, dtype=top.dtype)
    return torch.zeros_like(logits).scatter_(1, idx, top), idx


@pytest.mark.parametrize("dtype,compute", [(F32, F32), (BF16, None), (F64, F32)])
def test_router_default_is_hf_gpt_oss(dtype, compute):
    torch.manual_seed(1)
    r = TopKRouter(32, 8, 4, compute_dtype=compute, dtype=dtype)
    with torch.no_grad():
        r.gate.bias.normal_()
    x = torch.randn(40, 32, dtype=dtype)
    out = r(x)
    scores, idx = hf_gpt_oss_router(x, r.gate.weight, r.gate.bias, 4)
    assert torch.equal(out.experts, idx)
    assert out.weights.dtype == (F64 if dtype == F64 else F32)
    assert torch.equal(out.weights, scores.gather(1, idx).to(out.weights.dtype))


def test_router_by_hand():
    """Each score function and switch against the formulas written out on the logits."""
    torch.manual_seed(2)
    x = torch.randn(30, 16, dtype=F64)
    for score_func in ("softmax", "sigmoid"):
        for renorm in (False, True):
            r = TopKRouter(16, 7, 3, score_func=score_func, renormalize=renorm,
                           route_scale=1.7, dtype=F64)
            out = r(x)
            logits = x @ r.gate.weight.T + r.gate.bias
            scores = logits.softmax(-1) if score_func == "softmax" else logits.sigmoid()
            idx = scores.argsort(-1, descending=True)[:, :3]
            assert torch.equal(out.experts.sort(-1).values, idx.sort(-1).values)
            w = scores.gather(-1, out.experts)
            if renorm:
                w = w / w.sum(-1, keepdim=True)
            torch.testing.assert_close(out.weights, w * 1.7, rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(out.logits, logits, rtol=1e-12, atol=1e-14)


def test_router_expert_bias_selects_but_does_not_weight():
    torch.manual_seed(3)
    r = TopKRouter(16, 6, 2, load_balance_coeff=1e-3, dtype=F64)
    x = torch.randn(50, 16, dtype=F64)
    with torch.no_grad():
        r.expert_bias.copy_(torch.tensor([0, 0, 5.0, 0, 0, -5.0]))  # 2 always, 5 never
    out = r(x)
    assert (out.experts == 2).any(-1).all() and not (out.experts == 5).any()
    scores = r(x).logits.softmax(-1)
    w = scores.gather(-1, out.experts)
    torch.testing.assert_close(out.weights, w / w.sum(-1, keepdim=True))


def test_router_load_balancing_update():
    r = TopKRouter(8, 4, 1, load_balance_coeff=0.01)
    r.record_load(torch.tensor([10, 0, 3, 3], dtype=torch.int32))
    r.record_load(torch.tensor([2, 0, 1, 1], dtype=torch.int32))
    assert r.tokens_per_expert.tolist() == [12, 0, 4, 4]
    r.update_expert_bias()
    # mean load 5: expert 0 over (-), the others under (+); centred: -0.015, +0.005 x 3
    torch.testing.assert_close(r.expert_bias, torch.tensor([-0.015, 0.005, 0.005, 0.005]))
    assert r.tokens_per_expert.tolist() == [0, 0, 0, 0]
    with pytest.raises(RuntimeError, match="load_balance_coeff"):
        TopKRouter(8, 4, 1).update_expert_bias()


def test_router_buffers_stay_float32():
    r = TopKRouter(8, 4, 2, load_balance_coeff=1e-3).to(BF16)
    assert r.gate.weight.dtype == BF16
    assert r.expert_bias.dtype == F32 and r.tokens_per_expert.dtype == F32
    assert "router.expert_bias" in MoE(8, 8, 4, 2, load_balance_coeff=1e-3).state_dict()
    assert "router.tokens_per_expert" not in MoE(8, 8, 4, 2).state_dict()


def test_router_rejects_bad_arguments():
    with pytest.raises(ValueError, match="top_k"):
        TopKRouter(8, 4, 5)
    with pytest.raises(ValueError, match="score_func"):
        TopKRouter(8, 4, 2, score_func="relu")


# --- dispatch ----------------------------------------------------------------------------

@pytest.mark.parametrize("tokens,k,e", [(37, 2, 8), (64, 4, 32), (1, 1, 3), (0, 2, 4)])
def test_dispatch_metadata(tokens, k, e):
    g = torch.Generator().manual_seed(tokens)
    # a few experts only, so most are empty
    experts = torch.stack([torch.randperm(min(e, 5), generator=g)[:k] for _ in range(tokens)]) \
        if tokens else torch.empty(0, k, dtype=torch.int64)
    weights = torch.rand(tokens, k, generator=g, dtype=F64)
    d = sort_by_expert(experts, e, weights)
    m = tokens * k
    assert d.row_token.dtype == d.token_rows.dtype == d.offs.dtype == torch.int32
    assert d.token_rows.shape == (tokens, k) and d.row_token.shape == (m,)
    counts = torch.bincount(experts.reshape(-1), minlength=e)
    assert torch.equal(d.offs, counts.cumsum(0).to(torch.int32))
    assert torch.equal(dispatch_mod.tokens_per_expert(d.offs), counts.to(torch.int32))
    rows = d.token_rows.reshape(-1).long()
    assert torch.equal(rows.sort().values, torch.arange(m))  # a permutation
    assert torch.equal(d.row_token[rows].long(), torch.arange(m) // k)  # inverse of row_token
    row_expert = experts.reshape(-1)[rows.argsort()]
    assert torch.equal(row_expert, row_expert.sort().values)  # sorted by expert
    for ex in range(e):  # stable: token order kept within an expert
        toks = d.row_token[row_expert == ex]
        assert torch.equal(toks, toks.sort().values)
    assert torch.equal(d.prob, weights.reshape(-1)[rows.argsort()])


@pytest.mark.parametrize("counts", [[[4, 2, 1, 3], [1, 2, 3, 4]], [[0, 5, 0], [2, 0, 0], [0, 1, 7]],
                                    [[0, 0], [0, 0]], [[9]]])
def test_sort_received_orders_by_expert_then_rank(counts):
    """Expert parallelism: rows arrive by (source rank, expert); sorted by (expert, rank),
    each chunk's rows in their arrival order (a loop over the chunks says where)."""
    c = torch.tensor(counts)
    ranks, e = c.shape
    m = int(c.sum())
    d = dispatch_mod.sort_received(c, m)
    start = {}
    pos = 0
    for r in range(ranks):
        for ex in range(e):
            start[r, ex] = pos
            pos += counts[r][ex]
    want = [start[r, ex] + i for ex in range(e) for r in range(ranks) for i in range(counts[r][ex])]
    assert d.row_token.dtype == d.token_rows.dtype == d.offs.dtype == torch.int32
    assert d.row_token.tolist() == want and d.token_rows.shape == (m, 1)
    assert torch.equal(d.token_rows.view(-1)[d.row_token.long()], torch.arange(m, dtype=torch.int32))
    assert torch.equal(d.offs, c.sum(0).cumsum(0).to(torch.int32)) and d.prob is None
    x = torch.randn(m, 8, dtype=F64, requires_grad=True)
    xs = dispatch_mod.permute(x, d)
    assert torch.equal(xs, x[torch.tensor(want, dtype=torch.long)])
    assert torch.equal(dispatch_mod.unpermute(xs, d), x)  # the combine puts them back


def test_sort_received_padding_rows_and_bad_arguments():
    c = torch.tensor([[2, 1], [1, 3]])
    d = dispatch_mod.sort_received(c, 9)  # two padding rows past the 7 counted: in place
    assert d.row_token.tolist() == [0, 1, 3, 2, 4, 5, 6, 7, 8] and d.offs.tolist() == [3, 7]
    assert d.token_rows.view(-1).tolist() == [0, 1, 3, 2, 4, 5, 6, 7, 8]
    for counts, rows, what in ((torch.tensor([2, 1]), 3, "counts"), (torch.ones(2, 2), 4, "counts"),
                               (torch.ones(2, 0, dtype=torch.int64), 0, "counts"),
                               (c, -1, "rows"), (c, 6.0, "rows"), (c, True, "rows")):
        with pytest.raises(ValueError, match=what):
            dispatch_mod.sort_received(counts, rows)


def test_permute_unpermute():
    """Values and gradients of the row gather and the combine on the dispatch metadata."""
    torch.manual_seed(4)
    t, k, e, h = 20, 3, 5, 16
    experts = torch.stack([torch.randperm(e)[:k] for _ in range(t)])
    d = sort_by_expert(experts, e)
    x = torch.randn(t, h, dtype=F64, requires_grad=True)
    xs = dispatch_mod.permute(x, d)
    assert torch.equal(xs, x[d.row_token.long()])
    y = torch.randn(t * k, h, dtype=F64, requires_grad=True)
    w = torch.rand(t, k, dtype=F64, requires_grad=True)
    out = dispatch_mod.unpermute(y, d, w)
    want = (y[d.token_rows.long()] * w[..., None]).sum(1)
    torch.testing.assert_close(out, want)
    assert torch.autograd.gradcheck(lambda a: dispatch_mod.permute(a, d), (x,))
    assert torch.autograd.gradcheck(lambda a, b: dispatch_mod.unpermute(a, d, b), (y, w))


# --- the layer against the reference ---------------------------------------------------

@pytest.mark.parametrize("name,kw", LAYERS, ids=[n for n, _ in LAYERS])
def test_moe_matches_reference_float64(name, kw):
    moe = _moe(kw)
    ref = ReferenceMoE.like(moe, share=False)
    assert moe.experts.impl == "auto"  # float64: the reference expert loop
    x = torch.randn(2, 19, 24, dtype=F64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref_out = moe(xa), ref(xb)
    assert out.shape == x.shape
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    dy = torch.randn_like(out)
    grads = torch.autograd.grad(out, [xa] + _leaves(moe), dy)
    ref_grads = torch.autograd.grad(ref_out, [xb] + _leaves(ref), dy)
    names = ["x"] + [n for n, _ in moe.named_parameters()]
    assert [n for n, _ in ref.named_parameters()] == names[1:]
    assert "router.gate.weight" in names
    for n, a, b in zip(names, grads, ref_grads):
        assert a.abs().sum() > 0, n
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda m: f"{n}: {m}")


def test_moe_gradcheck():
    """Analytic against numerical gradients of x, the router and the expert weights (the
    routing stays fixed under the small perturbations)."""
    moe = _moe(dict(), h=8, i=8, e=4)
    params = dict(moe.named_parameters())
    names = ["router.gate.weight", "router.gate.bias", "experts.gate_up_proj",
             "experts.down_proj_bias"]
    x = torch.randn(6, 8, dtype=F64, requires_grad=True)

    def f(x, *ps):
        return torch.func.functional_call(moe, {**params, **dict(zip(names, ps))}, (x,))

    assert torch.autograd.gradcheck(f, (x, *[params[n].detach().clone().requires_grad_()
                                             for n in names]))


def test_moe_shared_reference_and_unused_experts():
    """A shared-weight reference sees the same tensors; experts nobody picks get exactly
    zero gradients; training mode counts tokens per expert, eval does not."""
    moe = _moe(dict(), e=8)
    with torch.no_grad():
        moe.router.gate.bias.copy_(torch.tensor([4.0, 3, 2, 1, 0, -50, -50, -50]))
    ref = ReferenceMoE.like(moe)
    assert ref.experts.down_proj is moe.experts.down_proj
    x = torch.randn(30, 24, dtype=F64)
    moe.train()
    out, routing = moe(x, return_router_output=True)
    torch.testing.assert_close(out, ref(x))
    assert moe.router.tokens_per_expert.sum() == 30 * 2
    assert moe.router.tokens_per_expert[5:].sum() == 0 and not (routing.experts >= 5).any()
    out.square().sum().backward()
    for p in (moe.experts.gate_up_proj, moe.experts.down_proj_bias):
        assert torch.all(p.grad[5:] == 0) and p.grad[:5].abs().sum() > 0
    moe.eval()
    moe(x)
    assert moe.router.tokens_per_expert.sum() == 30 * 2


def test_moe_config_and_repr():
    moe = MoE(16, 8, 4, 2, activation="srelu", bias=False)
    assert moe.experts.gate_up_proj.shape == (4, 16, 8)  # not gated: (E, H, I)
    assert moe.config()["limit"] is None and "srelu" in repr(moe)
    assert MoE(16, 8, 4).experts.gate_up_proj.shape == (4, 16, 16)
    assert MoE(16, 8, 4).experts.limit == 7.0
    with pytest.raises(ValueError, match="limit"):
        MoE(16, 8, 4, activation="none", limit=3.0)
    with pytest.raises(ValueError, match="activation"):
        MoE(16, 8, 4, activation="gelu")
    with pytest.raises(ValueError, match="x: expected"):
        MoE(16, 8, 4)(torch.randn(3, 15))
    moe = MoE(16, 8, 4)
    before = moe.experts.down_proj.detach().clone()
    moe.reset_parameters()
    assert not torch.equal(before, moe.experts.down_proj)
    assert torch.all(moe.experts.down_proj_bias == 0) and moe.experts.down_proj.std() < 0.03


def test_fused_call_contract(monkeypatch):
    """What GroupedExperts hands cute_moe.expert_ffn on the bf16 path: interleaved (E, H,
    2I) / (E, I, H) weights cast to the input's dtype, int32 offs, float32 prob, the
    activation and its parameters."""
    calls = []

    def fake(x, w_up, w_down, offs, b_up=None, b_down=None, *, activation=DEFAULT_ACTIVATION,
             prob=None, scale_up=None, scale_down=None, swiglu_alpha=DEFAULT_ALPHA,
             limit=LIMIT_DEFAULT, precision="bf16", combine=None):
        calls.append(dict(x=x, w_up=w_up, w_down=w_down, offs=offs, b_up=b_up, b_down=b_down,
                          activation=activation, prob=prob, alpha=swiglu_alpha, limit=limit,
                          precision=precision, combine=combine))
        y = experts_ref(x.float(), offs, w_up.float(), w_down.float(),
                        None if b_up is None else b_up.float(),
                        None if b_down is None else b_down.float(), prob,
                        activation=activation, alpha=swiglu_alpha, limit=limit).to(x.dtype)
        return unpermute(y, combine[1], combine[0])

    monkeypatch.setattr(importlib.import_module("cute_moe.nn.experts"), "expert_ffn", fake)
    moe = _moe(dict(swiglu_alpha=1.5), dtype=F32)  # fp32 master weights, bf16 compute
    x = torch.randn(10, 24, dtype=BF16)
    out = moe(x)
    (c,) = calls
    assert out.dtype == BF16 and out.shape == (10, 24)
    assert c["x"].shape == (20, 24) and c["w_up"].shape == (6, 24, 32)
    assert c["w_up"].dtype == c["w_down"].dtype == c["b_up"].dtype == BF16
    assert c["offs"].dtype == torch.int32 and c["prob"].dtype == F32
    assert (c["activation"], c["alpha"], c["limit"]) == ("swiglu_oai", 1.5, 7.0)
    assert c["precision"] == "bf16"
    # the layer's combine goes into the block (its backward fused with the down projection's)
    row_token, token_rows = c["combine"]
    assert row_token.shape == (20,) and token_rows.shape == (10, 2)
    # the same through the reference expert loop
    ref = ReferenceMoE.like(moe, share=False, dtype=F64)
    assert testing.rel_error(out, ref(x.double())) < 1e-2
    calls.clear()
    moe.experts.impl = "reference"
    moe(x)
    assert not calls


@pytest.mark.parametrize("name,kw", LAYERS[:4], ids=[n for n, _ in LAYERS[:4]])
def test_moe_bf16_fused_path_cpu(name, kw):
    """The bf16 layer through cute_moe.expert_ffn (its CPU implementation) against the
    float64 reference: output and every gradient within the bf16 tolerance."""
    moe = _moe(kw, h=32, i=16, e=6, dtype=BF16)
    ref = ReferenceMoE.like(moe, share=False, dtype=F64)
    x = torch.randn(48, 32, dtype=BF16, requires_grad=True)
    xr = x.detach().double().requires_grad_()
    out, ref_out = moe(x), ref(xr)
    testing.assert_rel_close(out, ref_out, "out", BF16)
    dy = torch.randn_like(ref_out)
    grads = torch.autograd.grad(out, [x] + _leaves(moe), dy.to(BF16))
    ref_grads = torch.autograd.grad(ref_out, [xr] + _leaves(ref), dy)
    for n, a, b in zip(["x"] + [n for n, _ in moe.named_parameters()], grads, ref_grads):
        testing.assert_rel_close(a, b, f"d{n}", BF16)


@pytest.mark.parametrize("dtype", [BF16, F64])
@pytest.mark.parametrize("name,kw", [LAYERS[0], ("srelu", dict(activation="srelu", bias=False))],
                         ids=["default", "srelu"])
def test_moe_fuse_gather_gives_the_same_result(name, kw, dtype):
    """fuse_gather hands the tokens and the permutation to the experts (bf16: expert_ffn's
    gather, which on CPU gathers first; float64: the reference path): the same output
    and gradients, bit for bit, as permuting first."""
    moe = _moe(kw, h=32, i=16, e=6, dtype=dtype)
    fused = _moe(dict(kw, fuse_gather=True), h=32, i=16, e=6, dtype=dtype)
    fused.load_state_dict(moe.state_dict())
    assert fused.fuse_gather and not moe.fuse_gather
    x = torch.randn(40, 32, dtype=dtype, requires_grad=True)
    dy = torch.randn(40, 32, dtype=dtype)
    a, b = moe(x), fused(x)
    assert torch.equal(a, b)
    ga = torch.autograd.grad(a, [x] + _leaves(moe), dy)
    gb = torch.autograd.grad(b, [x] + _leaves(fused), dy)
    for n, u, v in zip(["x"] + [n for n, _ in moe.named_parameters()], ga, gb):
        assert torch.equal(u, v), n


# --- loading -----------------------------------------------------------------------------

class HFGptOssMLP(torch.nn.Module):
    """HF transformers' GptOssMLP (GptOssTopKRouter + GptOssExperts, training branch),
    re-implemented from its source: per hit expert, the tokens choosing it, gate_up with
    bias, clamped GPT-OSS GLU, down projection with bias, times the router score,
    index_add into the output."""

    def __init__(self, h, i, e, top_k, dtype=F64):
        super().__init__()
        self.router = torch.nn.Module()
        self.router.top_k = top_k
        self.router.weight = torch.nn.Parameter(torch.randn(e, h, dtype=dtype) * 0.3)
        self.router.bias = torch.nn.Parameter(torch.randn(e, dtype=dtype))
        self.experts = torch.nn.Module()
        self.experts.alpha, self.experts.limit = 1.702, 7.0
        self.experts.gate_up_proj = torch.nn.Parameter(torch.randn(e, h, 2 * i, dtype=dtype))
        self.experts.gate_up_proj_bias = torch.nn.Parameter(torch.randn(e, 2 * i, dtype=dtype))
        self.experts.down_proj = torch.nn.Parameter(torch.randn(e, i, h, dtype=dtype) * 0.3)
        self.experts.down_proj_bias = torch.nn.Parameter(torch.randn(e, h, dtype=dtype))

    def forward(self, hidden):
        r, ex = self.router, self.experts
        x = hidden.reshape(-1, hidden.shape[-1])
        scores, idx = hf_gpt_oss_router(x, r.weight, r.bias, r.top_k)
        out = torch.zeros_like(x)
        for e in range(scores.shape[1]):
            tok, _ = torch.where(idx == e)  # idx is (T, k)
            if tok.numel() == 0:
                continue
            gate_up = x[tok] @ ex.gate_up_proj[e] + ex.gate_up_proj_bias[e]
            gate = gate_up[..., ::2].clamp(max=ex.limit)
            up = gate_up[..., 1::2].clamp(min=-ex.limit, max=ex.limit)
            h = (up + 1) * (gate * torch.sigmoid(gate * ex.alpha))
            y = (h @ ex.down_proj[e] + ex.down_proj_bias[e]) * scores[tok, e, None]
            out.index_add_(0, tok, y)
        return out.view(hidden.shape), scores


@pytest.mark.parametrize("source", ["module", "state_dict"])
def test_from_hf_gpt_oss(source):
    torch.manual_seed(5)
    hf = HFGptOssMLP(24, 16, 8, 4)
    if source == "module":
        moe = loading.from_hf_gpt_oss(hf)
    else:
        sd = {f"model.layers.{n}.mlp.{k}": v for n in (0, 1) for k, v in hf.state_dict().items()}
        with pytest.raises(ValueError, match="several"):
            loading.from_hf_gpt_oss(sd, top_k=4)
        with pytest.raises(ValueError, match="top_k"):
            loading.from_hf_gpt_oss(sd, prefix="model.layers.1.mlp.")
        moe = loading.from_hf_gpt_oss(sd, prefix="model.layers.1.mlp.", top_k=4)
    assert moe.experts.gate_up_proj.dtype == F64 and moe.top_k == 4
    x = torch.randn(2, 15, 24, dtype=F64)
    want, _ = hf(x)
    torch.testing.assert_close(moe(x), want, rtol=1e-10, atol=1e-12)
    # HF's (out, router_scores) contract
    out, scores = loading.HFGptOssMLPAdapter(moe)(x)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(scores.to(F64), hf(x)[1], rtol=1e-12, atol=1e-14)
    # and back
    back = loading.to_hf_gpt_oss(moe, prefix="mlp.")
    for k, v in hf.state_dict().items():
        assert torch.equal(back["mlp." + k], v)


def test_from_hf_gpt_oss_errors():
    sd = {k: v for k, v in HFGptOssMLP(8, 8, 4, 2).state_dict().items()}
    with pytest.raises(KeyError, match="router.bias"):
        loading.from_hf_gpt_oss({k: v for k, v in sd.items() if k != "router.bias"}, top_k=2)
    with pytest.raises(ValueError, match="MXFP4"):
        loading.from_hf_gpt_oss({**sd, "experts.gate_up_proj_blocks": torch.zeros(1)}, top_k=2)
    with pytest.raises(ValueError, match="not a GPT-OSS"):
        loading.to_hf_gpt_oss(MoE(8, 8, 4, 2, activation="swiglu"))


def tt_route(x, gate_w, gate_b, top_k, score_func, route_norm, route_scale, expert_bias):
    """torchtitan's TokenChoiceTopKRouter.forward, re-implemented."""
    scores = F.linear(x.float() if x.dtype != F64 else x, gate_w, gate_b)
    scores = scores.softmax(-1) if score_func == "softmax" else scores.sigmoid()
    choice = scores if expert_bias is None else scores + expert_bias
    _, idx = torch.topk(choice, top_k, dim=-1, sorted=False)
    w = scores.gather(-1, idx)
    if route_norm:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * route_scale, idx


def tt_moe(sd, x, top_k, score_func="softmax", route_norm=True, route_scale=1.0):
    """torchtitan's MoE forward (local dispatcher) for GroupedExperts (w1/w2/w3) or
    GptOssGroupedExperts (mlp1/mlp2) state dicts, re-implemented: route, argsort the
    flattened choices, per-expert FFN as x @ W.T, score, scatter_add back."""
    def get(suffix):
        hits = [v for k, v in sd.items() if k.endswith(suffix)]
        return hits[0] if hits else None

    w, idx = tt_route(x, get("router.gate.weight"), get("router.gate.bias"), top_k, score_func,
                      route_norm, route_scale, get("expert_bias_E"))
    order = torch.argsort(idx.reshape(-1), stable=True)
    tok = order // top_k
    counts = torch.bincount(idx.reshape(-1), minlength=get("router.gate.weight").shape[0])
    xs, ys, start = x[tok], [], 0
    for e, n in enumerate(counts.tolist()):
        xe = xs[start:start + n]
        start += n
        if get("w1_EFD") is not None:
            h = F.silu(xe @ get("w1_EFD")[e].T) * (xe @ get("w3_EFD")[e].T)
            ys.append(h @ get("w2_EDF")[e].T)
        else:
            gu = xe @ get("mlp1_weight")[e].T + get("mlp1_bias")[e]
            g, lin = gu[..., ::2].clamp(max=7.0), gu[..., 1::2].clamp(-7.0, 7.0)
            og = g * torch.sigmoid(1.702 * g)
            ys.append(torch.addcmul(og, og, lin) @ get("mlp2_weight")[e].T + get("mlp2_bias")[e])
    y = torch.cat(ys) * w.reshape(-1)[order][:, None]
    return torch.zeros_like(x).scatter_add(0, tok[:, None].expand(-1, x.shape[1]), y)


def _tt_state(kind, h=24, i=16, e=6, dtype=F64):
    g = torch.Generator().manual_seed(6)

    def rnd(*s, scale=1.0):
        return torch.randn(*s, generator=g, dtype=dtype) * scale

    p = "layers.2.moe."
    sd = {p + "router.gate.weight": rnd(e, h, scale=0.3)}
    if kind == "grouped":  # newer torchtitan names, with shape suffixes
        sd.update({p + "routed_experts.inner_experts.w1_EFD": rnd(e, i, h, scale=0.3),
                   p + "routed_experts.inner_experts.w2_EDF": rnd(e, h, i, scale=0.3),
                   p + "routed_experts.inner_experts.w3_EFD": rnd(e, i, h, scale=0.3),
                   p + "expert_bias_E": rnd(e, scale=0.1).float(),
                   p + "shared_experts.w1.weight": rnd(i, h)})  # not ours: ignored
    else:  # GPT-OSS, older names without suffixes
        sd.update({p + "router.gate.bias": rnd(e),
                   p + "experts.mlp1_weight": rnd(e, 2 * i, h, scale=0.5),
                   p + "experts.mlp1_bias": rnd(e, 2 * i),
                   p + "experts.mlp2_weight": rnd(e, h, i, scale=0.3),
                   p + "experts.mlp2_bias": rnd(e, h)})
    return sd


@pytest.mark.parametrize("kind", ["grouped", "gpt_oss"])
def test_from_torchtitan_moe(kind):
    sd = _tt_state(kind)
    kw = dict(top_k=2, score_func="sigmoid", route_norm=True, route_scale=2.5) \
        if kind == "grouped" else dict(top_k=3)
    moe = loading.from_torchtitan_moe(sd, prefix="layers.2.moe.", top_k=kw["top_k"],
                                      score_func=kw.get("score_func", "softmax"),
                                      renormalize=kw.get("route_norm", True),
                                      route_scale=kw.get("route_scale", 1.0))
    cfg = moe.config()
    if kind == "grouped":
        assert (cfg["activation"], cfg["bias"], cfg["router_bias"]) == ("swiglu", False, False)
        assert cfg["load_balance_coeff"] == 1e-3 and cfg["limit"] is None
    else:
        assert (cfg["activation"], cfg["bias"], cfg["limit"]) == ("swiglu_oai", True, 7.0)
    x = torch.randn(40, 24, dtype=F64)
    want = tt_moe(sd, x, **kw)
    torch.testing.assert_close(moe(x), want, rtol=1e-10, atol=1e-12)


def test_load_torchtitan_grouped_experts_alone():
    sd = _tt_state("grouped")
    with pytest.raises(ValueError, match="several"):
        loading.load_torchtitan_grouped_experts({**sd, "layers.3.moe.w1": sd[next(
            k for k in sd if k.endswith("w1_EFD"))]})
    ex = loading.load_torchtitan_grouped_experts(sd, prefix="layers.2.moe.routed_experts.")
    assert isinstance(ex, GroupedExperts) and ex.gate_up_proj.is_contiguous()
    w1, w3 = (sd[f"layers.2.moe.routed_experts.inner_experts.w{n}_EFD"] for n in (1, 3))
    assert torch.equal(ex.gate_up_proj[:, :, 0::2], w1.transpose(1, 2))  # interleaved
    assert torch.equal(ex.gate_up_proj[:, :, 1::2], w3.transpose(1, 2))
    counts = [5, 0, 7, 3, 0, 9]
    offs = testing.offsets_from_counts(counts)
    xs = torch.randn(24, 24, dtype=F64)
    w2 = sd["layers.2.moe.routed_experts.inner_experts.w2_EDF"]
    want, s = [], 0
    for e, n in enumerate(counts):
        xe = xs[s:s + n]
        s += n
        want.append((F.silu(xe @ w1[e].T) * (xe @ w3[e].T)) @ w2[e].T)
    torch.testing.assert_close(ex(xs, offs), torch.cat(want))
    with pytest.raises(KeyError, match="w1"):
        loading.load_torchtitan_grouped_experts({"router.gate.weight": torch.zeros(2, 2)})


# --- benchmark command line --------------------------------------------------------------

def _run_bench(*args, env_extra=None):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.path.join(ROOT, "python"))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "cute_moe.bench", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_bench_without_gpu_exits_clearly():
    r = _run_bench("--config", "seed-example")
    assert r.returncode == 2
    assert "needs an NVIDIA Hopper GPU" in r.stderr and "Nothing was measured" in r.stderr
    assert r.stdout == ""


def test_bench_arguments():
    r = _run_bench("--config", "gpt-oss-7b")
    assert r.returncode == 2 and "unknown config 'gpt-oss-7b'" in r.stderr
    r = _run_bench("--hidden", "100")
    assert r.returncode == 2 and "multiples of 8" in r.stderr
    r = _run_bench("--list")
    assert r.returncode == 0 and all(name in r.stdout for name in CONFIGS)


def test_bench_configs():
    c = CONFIGS["gpt-oss-20b"]
    assert (c.tokens, c.hidden, c.inter, c.experts, c.topk, c.activation, c.bias) == \
        (24576, 2880, 2880, 32, 4, "swiglu_oai", True)
    assert CONFIGS["gpt-oss-120b"].experts == 128
    q = CONFIGS["qwen3-30b-a3b"]
    assert (q.activation, q.bias, q.router_bias, q.topk, q.experts) == ("swiglu", False, False,
                                                                          8, 128)
    s = CONFIGS["seed-example"]
    assert (s.hidden, s.inter, s.experts, s.topk) == (2048, 1024, 8, 2)
    fwd, bwd = c.flops()
    assert fwd == 2 * 98304 * 2880 * 5760 + 2 * 98304 * 2880 * 2880 and bwd == 2 * fwd
    assert c.with_(activation="srelu").flops()[0] == 4 * 98304 * 2880 * 2880
    MoE(**CONFIGS["seed-example"].with_(hidden=16, inter=8).moe_kwargs())


def test_bench_cpu_smoke(tmp_path):
    """The whole command on the CPU at a tiny shape (the hidden --cpu-smoke switch): the
    table, the JSON record, and the chart or the message saying why there is none."""
    out = tmp_path / "r.json"
    r = _run_bench("--cpu-smoke", "--config", "qwen3-30b-a3b", "--tokens", "40", "--hidden",
                   "32", "--inter", "16", "--experts", "12", "--reps", "5", "--warmup", "1",
                   "--check", "--fuse-gather", "--json", str(out),
                   env_extra={"CUTE_MOE_GIT_COMMIT": "abc123"})
    assert r.returncode == 0, r.stderr
    assert "custom(qwen3-30b-a3b)" in r.stdout and "relative differences" in r.stdout
    assert "[1/1] custom(qwen3-30b-a3b): cute-moe: backward" in r.stderr
    rec = json.loads(out.read_text())
    assert rec["meta"]["git_commit"] == "abc123" and rec["meta"]["fuse_gather"] is True
    (row,) = rec["results"]
    assert row["config"]["activation"] == "swiglu" and row["config"]["tokens"] == 40
    assert row["rel_diff"]["out"] < 2e-2 and not row["mismatch"]
    assert (tmp_path / "r.png").exists() or "matplotlib is not installed" in r.stderr


def test_bench_table_and_chart_without_matplotlib(tmp_path, monkeypatch):
    row = dict(config=CONFIGS["gpt-oss-20b"].to_dict(), rows=98304, rel_diff={"out": 3e-3},
               speedup_fwd=1.6, speedup_bwd=1.9, speedup_fwd_bwd=1.8)
    for impl, f, b in (("ours", 9.0, 19.0), ("torch", 15.4, 36.9)):
        row.update({f"{impl}_fwd_ms": f, f"{impl}_bwd_ms": b, f"{impl}_fwd_bwd_ms": f + b,
                    f"{impl}_peak_bytes": 2 ** 31, f"{impl}_fwd_tflops": 500.0,
                    f"{impl}_bwd_tflops": 480.0})
    table = format_table([row])
    assert "gpt-oss-20b" in table and "15.40" in table and "1.60x" in table
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    assert write_png(str(tmp_path / "c.png"), [row], "t") is False
    assert not (tmp_path / "c.png").exists()


def test_activation_reference_formulas():
    pre = torch.randn(5, 8, dtype=F64) * 5
    a, b = pre[:, 0::2], pre[:, 1::2]
    g, u = a.clamp(max=7.0), b.clamp(-7.0, 7.0)
    torch.testing.assert_close(activation_ref(pre, "swiglu_oai", 1.702, 7.0),
                               g * torch.sigmoid(1.702 * g) * (u + 1))
    torch.testing.assert_close(activation_ref(pre, "swiglu"), F.silu(a) * b)
    torch.testing.assert_close(activation_ref(pre, "geglu"), F.gelu(a, approximate="tanh") * b)
    torch.testing.assert_close(activation_ref(pre, "srelu"), F.relu(pre) ** 2)
    assert torch.equal(activation_ref(pre, "none"), pre)
    assert cute_moe.reference.default_limit("swiglu_oai") == 7.0

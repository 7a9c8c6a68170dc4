# GPU tests of the MoE layer (cute_moe.nn.MoE, bf16, fused expert kernels) against the
# fp32 torchtitan-style ReferenceMoE holding copies of its weights: output and the
# gradients of the input and of every parameter (router included) for several configs,
# with balanced, skewed and single-expert routing and experts nobody picks (whose
# gradients must be exact zeros); no host sync in forward + backward; determinism; one
# CUDA graph holding forward + backward, replayed with new inputs (so new routing).
# Needs a CUDA device and the op library.
import pytest
import torch

import cute_moe
from cute_moe import ffn_autograd, testing
from cute_moe.nn import MoE
from cute_moe.reference import ReferenceMoE

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded "
                       "(pip install --no-build-isolation .)"),
]

BF16, F32 = torch.bfloat16, torch.float32

# name, tokens, hidden, inter, experts, top_k, routing, MoE kwargs
CASES = [
    ("gpt-oss", 1000, 256, 128, 16, 4, "balanced", dict()),
    ("gpt-oss-skewed", 777, 256, 136, 16, 4, "skewed", dict()),
    ("gpt-oss-single", 512, 128, 64, 8, 2, "single", dict()),
    ("qwen3-skewed", 900, 128, 72, 32, 8, "skewed",
     dict(activation="swiglu", bias=False, router_bias=False, load_balance_coeff=1e-3)),
    ("geglu-sigmoid", 640, 192, 96, 12, 3, "skewed",
     dict(activation="geglu", score_func="sigmoid", route_scale=2.0, limit=5.0)),
    ("srelu", 500, 128, 256, 8, 2, "balanced", dict(activation="srelu", bias=False,
                                                     renormalize=False)),
    ("none-3d", 2 * 300, 64, 64, 6, 2, "skewed", dict(activation="none")),
]


def _make(case, seed=0, scale=1.0):
    """A bf16 MoE with O(1) pre-activations and outputs, and its routing pushed to
    `routing`: skewed (a few favourite experts, the last quarter never chosen), single
    (one expert in nearly every token's choices) or balanced. The pre-activations stay
    clear of the clamps: there the fp32 reference, which does not round them to bf16,
    would take the other side of the clamp for some (the expert tests cover the clamps
    with a reference that rounds like the kernels)."""
    name, t, h, i, e, k, routing, kw = case
    torch.manual_seed(seed)
    moe = MoE(h, i, e, k, dtype=BF16, device="cuda", **kw)
    x = moe.experts
    with torch.no_grad():
        moe.router.gate.weight.normal_(0, h ** -0.5)
        x.gate_up_proj.normal_(0, scale * h ** -0.5)
        x.down_proj.normal_(0, i ** -0.5)
        for b in (x.gate_up_proj_bias, x.down_proj_bias, moe.router.gate.bias):
            if b is not None:
                b.normal_(0, 0.5)
        if routing != "balanced":
            push = torch.zeros(e, device="cuda")
            if routing == "skewed":
                push[: e // 4] = torch.linspace(2.0, 0.5, e // 4)
                push[e - e // 4:] = -40.0
            else:  # enough to lead, not so much that the other weights vanish
                push[0] = 6.0
            # through the gate bias, or the load-balancing bias (selection only)
            if moe.router.gate.bias is not None:
                moe.router.gate.bias.add_(push.to(BF16))
            else:
                moe.router.expert_bias.copy_(push.clamp(-1, 1))
    return moe


def _inputs(case, seed=1):
    name, t, h = case[:3]
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (2, t // 2, h) if name.endswith("-3d") else (t, h)
    x = torch.randn(*shape, device="cuda", generator=g).to(BF16)
    dy = torch.randn(*shape, device="cuda", generator=g).to(BF16)
    return x, dy


def _params(moe):
    return [p for _, p in moe.named_parameters()]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_moe_matches_reference(case):
    moe = _make(case)
    ref = ReferenceMoE.like(moe, share=False, dtype=F32)
    x, dy = _inputs(case)
    x = x.requires_grad_()
    xr = x.detach().float().requires_grad_()
    out, routing = moe(x, return_router_output=True)
    ref_out = ref(xr)
    testing.assert_rel_close(out, ref_out, "out", BF16)
    grads = torch.autograd.grad(out, [x] + _params(moe), dy)
    ref_grads = torch.autograd.grad(ref_out, [xr] + _params(ref), dy.float())
    names = ["x"] + [n for n, _ in moe.named_parameters()]
    assert "router.gate.weight" in names
    for n, a, b in zip(names, grads, ref_grads):
        assert a.dtype == BF16 and a.shape == b.shape, n
        testing.assert_rel_close(a, b, f"d{n}", BF16)
    # experts nobody picked: exact zero gradients
    e = case[4]
    used = torch.zeros(e, dtype=torch.bool, device="cuda")
    used[routing.experts.reshape(-1)] = True
    counts = torch.bincount(routing.experts.reshape(-1), minlength=e)
    if case[6] == "skewed":
        assert not used.all()
    if case[6] == "single":
        assert counts[0] >= 0.9 * routing.experts.shape[0]
    for n, g in zip(names, grads):
        if n.startswith("experts."):
            assert torch.all(g[~used] == 0), n


@pytest.mark.parametrize("in_gemm", [False, True], ids=["gather_pass", "gathered_gemm"])
@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[5], CASES[6]], ids=lambda c: c[0])
def test_fuse_gather_gives_the_same_bits(case, in_gemm, monkeypatch):
    """MoE(fuse_gather=True): the token gather by a pass whose copy is freed after the up
    projection's GEMM, or inside that GEMM (the gathered kernel; ffn_autograd.GATHER_IN_GEMM;
    'none' gathers first). Same kernels otherwise, so the same bits: output and every
    gradient."""
    monkeypatch.setattr(ffn_autograd, "GATHER_IN_GEMM", in_gemm)
    moe = _make(case)
    fused = MoE(*case[2:5], case[5], dtype=BF16, device="cuda", fuse_gather=True, **case[7])
    fused.load_state_dict(moe.state_dict())
    x, dy = _inputs(case)
    x.requires_grad_()
    a, b = moe(x), fused(x)
    assert torch.equal(a, b)
    ga = torch.autograd.grad(a, [x] + _params(moe), dy)
    gb = torch.autograd.grad(b, [x] + _params(fused), dy)
    for (n, _), u, v in zip([("x", None)] + list(moe.named_parameters()), ga, gb):
        assert torch.equal(u, v), n


@pytest.mark.parametrize("in_gemm", [False, True], ids=["gather_pass", "gathered_gemm"])
def test_fuse_gather_saves_the_sorted_copy(in_gemm, monkeypatch):
    """The forward keeps no (T*k, H) sorted copy of the tokens, either way."""
    monkeypatch.setattr(ffn_autograd, "GATHER_IN_GEMM", in_gemm)
    case = ("gpt-oss", 4096, 512, 256, 8, 4, "balanced", dict())
    moe = _make(case)
    fused = MoE(*case[2:5], case[5], dtype=BF16, device="cuda", fuse_gather=True)
    fused.load_state_dict(moe.state_dict())
    x, _ = _inputs(case)
    x.requires_grad_()

    def held_after_forward(layer):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out = layer(x)
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() - before, out

    plain, out_a = held_after_forward(moe)
    del out_a
    gathered, out_b = held_after_forward(fused)
    del out_b
    sorted_copy = 4096 * 4 * 512 * 2  # T * k * H bf16
    assert plain - gathered >= sorted_copy, (plain, gathered)


def test_no_host_sync_and_deterministic():
    case = CASES[1]
    moe = _make(case)
    x, dy = _inputs(case)
    x.requires_grad_()
    leaves = [x] + _params(moe)
    first = torch.autograd.grad(moe(x), leaves, dy)  # warm-up: lazy inits may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = moe(x)
        grads = torch.autograd.grad(out, leaves, dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(first, grads):
        assert torch.equal(a, b)


def test_cuda_graph_forward_backward_replay():
    """Forward + backward captured once, replayed with inputs that route differently: every
    output equals an eager run on the same inputs."""
    case = CASES[3]
    moe = _make(case)
    static_x, static_dy = _inputs(case, seed=10)
    static_x.requires_grad_()
    leaves = [static_x] + _params(moe)
    def step():
        out = moe(static_x)
        return out, torch.autograd.grad(out, leaves, static_dy)

    graph, (static_out, static_grads) = testing.capture_graph(step, warmup=3)

    counts = []
    for seed in (11, 12, 13):
        x, dy = _inputs(case, seed=seed)
        x[: x.shape[0] // 3] *= 3.0  # some tokens much louder: a different load
        with torch.no_grad():
            static_x.copy_(x)
            static_dy.copy_(dy)
        graph.replay()
        xe = x.clone().requires_grad_()
        out = moe(xe)
        grads = torch.autograd.grad(out, [xe] + _params(moe), dy)
        torch.cuda.synchronize()
        assert torch.equal(static_out, out)
        for a, b in zip(static_grads, grads):
            assert torch.equal(a, b)
        routing = moe.router(x)
        counts.append(torch.bincount(routing.experts.reshape(-1), minlength=case[4]))
    assert any(not torch.equal(counts[0], c) for c in counts[1:])  # routing did change


def test_fp32_master_weights():
    """fp32 parameters, bf16 activations: the layer casts for the kernels and the
    gradients arrive in fp32."""
    case = CASES[0]
    moe = _make(case).float()
    x, dy = _inputs(case)
    out = moe(x)
    assert out.dtype == BF16
    out.backward(dy)
    assert all(p.grad is not None and p.grad.dtype == F32 for p in moe.parameters())
    ref = ReferenceMoE.like(moe, share=False)
    testing.assert_rel_close(out, ref(x.float()), "out", BF16)

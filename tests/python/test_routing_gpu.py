# GPU tests of the routing ops against their references, bit for bit: top_k over row widths
# around a warp's 32 columns (1..512), k = 1..32, equal values, NaN, -0 and infinities;
# sort_by_expert over random routings (T = 0, k = 1..8, experts 1..1024, int64 and int32
# ids, out-of-range ids as padding rows, slices of the counting sort's scan table), outputs
# in poisoned memory, prob's gradient, host-sync freedom and CUDA-graph replay with new
# routing; the MoE layer's router and dispatch on the kernels against the torch path.
# Needs a CUDA device and a library with the ops.

import pytest
import torch

import cute_moe
from cute_moe import testing
from cute_moe.nn import MoE, dispatch
from cute_moe.nn import top_k as top_k_mod
from cute_moe.reference.routing import sort_by_expert_ref, top_k_ref

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded "
                       "(pip install --no-build-isolation .)"),
]

ops = torch.ops.cute_moe
F32 = torch.float32


def _poisoned_empty_cache():
    """Fill the allocator's free blocks with a pattern, so that an output which reuses one
    and leaves elements unwritten shows them (0x7f7f7f7f: a large int32, a float NaN-free
    huge value)."""
    junk = torch.full((64 << 20,), 0x7F, dtype=torch.uint8, device="cuda")
    del junk


# --- top_k -----------------------------------------------------------------------------

@pytest.mark.parametrize("cols", [1, 5, 32, 33, 64, 100, 128, 256, 384, 512])
@pytest.mark.parametrize("k", [1, 2, 4, 8, 32])
def test_top_k_matches_a_stable_descending_sort(cols, k):
    if k > cols:
        pytest.skip("k > cols is rejected (below)")
    g = torch.Generator(device="cuda").manual_seed(cols * 100 + k)
    logits = torch.randn(1037, cols, device="cuda", generator=g)
    # equal values in a third of the rows (a few levels only), and special values
    logits[::3] = torch.randint(-2, 3, (logits[::3].shape), device="cuda", generator=g).float()
    logits[1, 0] = float("nan")
    logits[2, -1] = float("-inf")
    logits[4, 0] = float("inf")
    logits[5] = -0.0
    logits[5, cols // 2] = 0.0
    _poisoned_empty_cache()
    values, indices = ops.top_k(logits, k)
    want_v, want_i = top_k_ref(logits, k)
    assert indices.dtype == torch.int64 and values.shape == (1037, k)
    assert torch.equal(indices, want_i)
    assert torch.equal(values.view(torch.int32), want_v.view(torch.int32))  # bits: -0, NaN too


def test_top_k_empty_and_bad_arguments():
    v, i = ops.top_k(torch.empty(0, 16, device="cuda"), 4)
    assert v.shape == (0, 4) and i.shape == (0, 4)
    x = torch.randn(8, 16, device="cuda")
    for call, what in ((lambda: ops.top_k(x, 17), "k"), (lambda: ops.top_k(x, 0), "k"),
                       (lambda: ops.top_k(torch.randn(4, 513, device="cuda"), 2), "cols"),
                       (lambda: ops.top_k(x.t(), 2), "contiguous"),
                       (lambda: ops.top_k(x.double(), 2), "float32")):
        with pytest.raises((RuntimeError, ValueError), match=what):
            call()


def test_top_k_gradient_is_torch_topks():
    logits = torch.randn(300, 128, device="cuda", requires_grad=True)
    dv = torch.randn(300, 8, device="cuda")
    v, i = top_k_mod.top_k(logits, 8)
    (g,) = torch.autograd.grad(v, logits, dv)
    ref = logits.detach().clone().requires_grad_()
    v2, i2 = torch.topk(ref, 8, dim=-1)
    (g2,) = torch.autograd.grad(v2, ref, dv)
    assert torch.equal(i, i2) and torch.equal(v, v2) and torch.equal(g, g2)


# --- sort_by_expert --------------------------------------------------------------------

def _choices(tokens, k, experts, seed, dtype=torch.int64, sentinels=False):
    g = torch.Generator().manual_seed(seed)
    if tokens == 0:
        return torch.empty(0, k, dtype=dtype, device="cuda")
    # distinct experts per token where possible (a router's top-k), skewed toward a few
    scores = torch.rand(tokens, max(experts, k), generator=g) ** 3
    ids = scores.topk(k, dim=1).indices
    if sentinels:  # expert-parallel sentinels and negative ids: padding rows
        ids[::7, 0] = experts + 3
        ids[1::11, -1] = -1
    return ids.to(dtype).cuda()


@pytest.mark.parametrize("tokens,k,experts", [(0, 4, 8), (1, 1, 1), (37, 2, 8), (1000, 4, 32),
                                              (4099, 8, 128), (3000, 6, 1024), (50000, 1, 3),
                                              (24576, 4, 32)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("sentinels", [False, True])
def test_sort_by_expert_matches_the_stable_sort(tokens, k, experts, dtype, sentinels):
    ids = _choices(tokens, k, experts, seed=tokens + k, dtype=dtype, sentinels=sentinels)
    weights = torch.rand(tokens, k, device="cuda")
    _poisoned_empty_cache()
    row_token, token_rows, offs, prob = ops.sort_by_expert(ids, experts, weights)
    want = sort_by_expert_ref(ids, experts, weights)
    assert torch.equal(row_token, want.row_token)
    assert torch.equal(token_rows, want.token_rows)
    assert torch.equal(offs, want.offs)
    assert torch.equal(prob, want.prob)
    _, _, _, none = ops.sort_by_expert(ids, experts)
    assert none.numel() == 0


def test_sort_by_expert_bad_arguments():
    ids = torch.zeros(4, 2, dtype=torch.int64, device="cuda")
    for call, what in ((lambda: ops.sort_by_expert(ids, 0), "num_experts"),
                       (lambda: ops.sort_by_expert(ids, 1025), "num_experts"),
                       (lambda: ops.sort_by_expert(ids.float(), 4), "int64 or int32"),
                       (lambda: ops.sort_by_expert(ids.t(), 4), "contiguous"),
                       (lambda: ops.sort_by_expert(ids, 4, torch.rand(4, 3, device="cuda")), "shape"),
                       (lambda: ops.sort_by_expert(ids, 4, torch.rand(4, 2, device="cuda").double()),
                        "float32")):
        with pytest.raises((RuntimeError, ValueError), match=what):
            call()


def test_dispatch_prob_gradient_and_dtypes():
    """prob's gradient reaches the weights (bf16 weights too: the kernel sorts them as
    float32, their gradient comes back in bf16), as through the reference's gather."""
    ids = _choices(500, 4, 16, seed=3)
    for dtype in (F32, torch.bfloat16):
        w = torch.rand(500, 4, device="cuda").to(dtype).requires_grad_()
        d = dispatch.sort_by_expert(ids, 16, w)
        dprob = torch.randn(2000, device="cuda")
        (g,) = torch.autograd.grad(d.prob, w, dprob.to(d.prob.dtype))
        w_ref = w.detach().clone().requires_grad_()
        ref = sort_by_expert_ref(ids, 16, w_ref)
        (g_ref,) = torch.autograd.grad(ref.prob, w_ref, dprob.to(ref.prob.dtype))
        assert g.dtype == dtype and torch.equal(g, g_ref)
        assert torch.equal(d.prob, ref.prob.float())


def test_routing_takes_no_host_sync():
    logits = torch.randn(4096, 128, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        top, ids = top_k_mod.top_k(logits, 8)
        d = dispatch.sort_by_expert(ids, 128, torch.softmax(top, -1))
        torch.autograd.grad(d.prob.sum(), logits)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_cuda_graph_replay_with_new_routing():
    tokens, k, experts = 3000, 4, 32
    logits = torch.randn(tokens, experts, device="cuda")
    graph, outs = testing.capture_graph(
        lambda: (*ops.top_k(logits, k), *ops.sort_by_expert(ops.top_k(logits, k)[1], experts)[:3]))
    for seed in (1, 2):
        with torch.no_grad():
            logits.copy_(torch.randn(tokens, experts, device="cuda",
                                     generator=torch.Generator(device="cuda").manual_seed(seed)))
        graph.replay()
        torch.cuda.synchronize()
        values, indices, row_token, token_rows, offs = outs
        want_v, want_i = top_k_ref(logits, k)
        want = sort_by_expert_ref(want_i, experts)
        assert torch.equal(values, want_v) and torch.equal(indices, want_i)
        assert torch.equal(row_token, want.row_token) and torch.equal(token_rows, want.token_rows)
        assert torch.equal(offs, want.offs)


@pytest.mark.parametrize("kw", [dict(), dict(activation="swiglu", bias=False, router_bias=False,
                                            top_k=8, num_experts=64)])
def test_moe_layer_routes_as_the_torch_path(kw, monkeypatch):
    """The layer with the routing kernels and with torch.topk / torch.sort: the same output
    and gradients, bit for bit (random float32 logits have no ties)."""
    args = dict(hidden=256, inter=128, num_experts=16, top_k=4)
    args.update(kw)
    torch.manual_seed(0)
    moe = MoE(**args, dtype=torch.bfloat16, device="cuda").train()
    x = torch.randn(777, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)

    def run():
        out = moe(x)
        return (out, *torch.autograd.grad(out, [x, *moe.parameters()], dy))

    fused = run()
    monkeypatch.setattr(top_k_mod, "_on_device", lambda logits, k: False)
    monkeypatch.setattr(dispatch, "_sort_on_device", lambda *a: False)
    plain = run()
    for a, b in zip(fused, plain):
        assert torch.equal(a, b)


def test_moe_layer_compiles_with_the_routing_kernels():
    """torch.compile(fullgraph=True) traces the routing ops (their fake kernels) and their
    autograd; the compiled layer gives the eager layer's output and gradients."""
    torch.manual_seed(1)
    moe = MoE(hidden=256, inter=128, num_experts=16, top_k=4, dtype=torch.bfloat16,
              device="cuda").train()
    x = torch.randn(300, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    params = [x, *moe.parameters()]
    eager_out = moe(x)
    eager = torch.autograd.grad(eager_out, params, dy)
    compiled_out = torch.compile(moe, fullgraph=True)(x)
    compiled = torch.autograd.grad(compiled_out, params, dy)
    testing.assert_rel_close(compiled_out, eager_out, "out", torch.bfloat16)
    for i, (a, b) in enumerate(zip(compiled, eager)):
        testing.assert_rel_close(a, b, f"grad {i}", torch.bfloat16)

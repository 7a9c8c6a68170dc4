# GPU tests of the fused SwiGLU expert FFN (grouped_mm_swiglu + grouped_mm_downproj with
# aux_biased_acc) against an fp32 HF-style reference block: the seed snippet at its own
# sizes, a sweep of random problems (E from 1 to 256, sizes off the tile grid, values far
# past the limit, limit None, no bias, empty experts, padding rows, both weight layouts),
# the two fused ops against their references, host-sync freedom and CUDA-graph replay
# with new routing. Needs a CUDA device and a library with the fused SwiGLU ops.
import random

import pytest
import torch

import cute_moe
from cute_moe import testing
from cute_moe import reference as ref
from seed_snippet import run_seed_snippet

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded "
                       "(pip install --no-build-isolation .)"),
    pytest.mark.skipif(not hasattr(torch.ops.cute_moe, "grouped_mm_swiglu"),
                       reason="the op library has no grouped_mm_swiglu"),
]

BF16, F32 = torch.bfloat16, torch.float32
TOL = testing.tolerance(BF16)
NAMES = ("x", "W_up", "b_up", "W_down", "b_down")


def _make_cases(count=30, seed=90):
    rng = random.Random(seed)
    experts = [1, 2, 3, 7, 16, 32, 64, 128, 200, 256]
    dims = [8, 40, 72, 136, 200, 264, 520]  # multiples of 8, not of 64
    cases = []
    for i in range(count):
        pad = rng.choice([0, 1, rng.randrange(1, 150)])
        cases.append(dict(
            m=(rng.randrange(1, 2501) | 1) + pad, h=rng.choice(dims), i=rng.choice(dims),
            e=experts[i % len(experts)], pad=pad,
            routing="skewed" if i % 3 == 0 else rng.choice(testing.ROUTINGS),
            layout=("kn", "nk")[(i // len(experts)) % 2], bias=i % 4 != 3,
            limit=None if i % 5 == 4 else 7.0, scale=rng.choice([1.0, 4.0, 16.0]),
            swiglu_out_too=i % 6 == 5, seed=i))
    return cases


CASES = _make_cases()


def _case_id(c):
    return (f"m{c['m']}-h{c['h']}-i{c['i']}-E{c['e']}-{c['routing']}-pad{c['pad']}-{c['layout']}"
            f"{'-bias' if c['bias'] else ''}-lim{c['limit']}-s{c['scale']:g}"
            f"{'-hgrad' if c['swiglu_out_too'] else ''}")


def _problem(c):
    g = torch.Generator().manual_seed(c["seed"])
    p = testing.random_expert_ffn(c["m"], c["h"], c["i"], c["e"], c["routing"], pad=c["pad"],
                                  layout=c["layout"], bias=c["bias"], scale=c["scale"],
                                  device="cuda", generator=g, requires_grad=True)
    dy = torch.randn(c["m"], c["h"], generator=g).to(device="cuda", dtype=BF16)
    return p, dy


def _poison(*shapes):
    """Fill freed allocator blocks of these shapes with NaN, so that an output that
    reuses one and leaves elements unwritten shows them."""
    blocks = [torch.full(s, float("nan"), dtype=BF16, device="cuda") for s in shapes]
    del blocks


def _loss(out, h, dy, swiglu_out_too):
    loss = (out.float() * dy.float()).sum()
    return loss + h.float().square().sum() / h.shape[1] if swiglu_out_too else loss


def _fused(p, dy, limit=7.0, swiglu_out_too=False):
    """out, swiglu_out, aux_biased_acc and the gradients of p.leaves (None for no bias)."""
    h, pre = cute_moe.grouped_mm_swiglu(p.x, p.w_up, offs=p.offs, bias=p.b_up,
                                        swiglu_alpha=1.702, swiglu_limit=limit)
    out = cute_moe.grouped_mm_downproj(h, p.w_down, offs=p.offs, bias=p.b_down,
                                       aux_biased_acc=pre, swiglu_alpha=1.702,
                                       swiglu_limit=limit)
    grads = iter(torch.autograd.grad(_loss(out, h, dy, swiglu_out_too), p.leaves))
    full = [next(grads) if t is not None else None
            for t in (p.x, p.weight_up, p.b_up, p.weight_down, p.b_down)]
    return out, h, pre, full


def _reference(p, dy, limit=7.0, swiglu_out_too=False):
    """The same in fp32 through the HF-style block (pre and the activation rounded to
    bf16 in the forward pass, like the kernels store them)."""
    leaves = [t.detach().float().requires_grad_() if t is not None else None
              for t in (p.x, p.weight_up, p.b_up, p.weight_down, p.b_down)]
    x, w_up, b_up, w_down, b_down = leaves
    if p.layout == "nk":
        w_up, w_down = w_up.transpose(-2, -1), w_down.transpose(-2, -1)
    out, h = ref.expert_ffn_ref(x, w_up, b_up, w_down, b_down, p.offs, 1.702, limit,
                                compute_dtype=F32, return_activation=True)
    present = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(_loss(out, h, dy, swiglu_out_too), present))
    return out.detach(), h.detach(), [next(grads) if t is not None else None for t in leaves]


def _check(p, fused, reference):
    out, h, pre, grads = fused
    out_ref, h_ref, grads_ref = reference
    used = p.used_rows
    empty = torch.tensor(p.sizes, device="cuda") == 0
    for name, t, r in zip(("out", "swiglu_out") + NAMES, [out, h] + grads, [out_ref, h_ref]
                          + grads_ref):
        if r is None:
            assert t is None
            continue
        assert not t.isnan().any(), f"{name} has NaNs"
        err = testing.rel_error(t, r)
        assert err <= TOL, f"{name}: relative error {err:.3e} > {TOL:.0e}"
    for name, t in (("out", out), ("swiglu_out", h), ("aux_biased_acc", pre), ("dx", grads[0])):
        assert torch.all(t[used:] == 0), f"{name}: padding rows not zero"
    for name, t in zip(NAMES[1:], grads[1:]):
        if t is not None:
            assert torch.all(t[empty] == 0), f"d{name}: empty experts not exactly zero"


def test_seed_snippet_at_seed_sizes():
    p, out, swiglu_out, aux_biased_acc = run_seed_snippet(
        "cuda", 8, 2048, 1024, [128, 64, 0, 256, 192, 32, 128, 64])
    fused = (out, swiglu_out, aux_biased_acc, [t.grad for t in p.leaves])
    _check(p, fused, _reference(p, torch.ones_like(out)))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_fused_block_matches_reference(case):
    p, dy = _problem(case)
    m, h, i = case["m"], case["h"], case["i"]
    _poison((m, 2 * i), (m, i), (m, h))
    fused = _fused(p, dy, case["limit"], case["swiglu_out_too"])
    out, hh, pre, grads = fused
    assert (out.shape, hh.shape, pre.shape) == ((m, h), (m, i), (m, 2 * i))
    for t, leaf in zip(grads, (p.x, p.weight_up, p.b_up, p.weight_down, p.b_down)):
        if leaf is not None:
            assert t.dtype == BF16 and t.stride() == leaf.stride()
    if case["scale"] >= 4.0 and p.used_rows * i >= 4096:
        assert (pre[: p.used_rows].float().abs() > 7).float().mean() > 0.05
    _check(p, fused, _reference(p, dy, case["limit"], case["swiglu_out_too"]))


@pytest.mark.parametrize("limit", [7.0, None])
@pytest.mark.parametrize("case", [c for c in CASES if c["pad"] > 0][:6], ids=_case_id)
def test_ops_match_references(case, limit):
    p, dy = _problem(case)
    ops = torch.ops.cute_moe
    used, m, i = p.used_rows, case["m"], case["i"]
    x, w_up, b_up, w_down = p.x.detach(), p.w_up.detach(), p.b_up, p.w_down.detach()
    b_up = b_up.detach() if b_up is not None else None
    _poison((m, 2 * i), (m, i))
    h, pre = ops.grouped_mm_swiglu(x, w_up, p.offs, b_up, 1.702, limit)
    assert (h.shape, h.dtype, pre.shape, pre.dtype) == ((m, i), BF16, (m, 2 * i), BF16)
    pre_ref = ref.grouped_mm_ref(x, w_up, p.offs, b_up, out_dtype=F32)
    testing.assert_rel_close(pre, pre_ref, "pre", BF16)
    testing.assert_rel_close(h, ref.swiglu_oai_ref(pre, 1.702, limit), "h", BF16)

    pre_garbage = pre.clone()
    pre_garbage[used:] = float("nan")
    _poison((m, 2 * i), (m, i))
    dpre, h_bwd = ops.grouped_mm_swiglu_bwd(dy, w_down.transpose(-2, -1), p.offs, pre_garbage,
                                            1.702, limit)
    assert (dpre.shape, dpre.dtype, h_bwd.shape) == ((m, 2 * i), BF16, (m, i))
    assert torch.equal(h_bwd, h), "h recomputed by grouped_mm_swiglu_bwd differs from the forward's"
    dh = ref.grouped_mm_ref(dy, w_down.transpose(-2, -1), p.offs, out_dtype=F32)
    dpre_ref = ref.swiglu_oai_bwd_ref(dh, pre, 1.702, limit)
    testing.assert_rel_close(dpre[:used], dpre_ref[:used], "dpre", BF16)
    for name, t in (("h", h), ("pre", pre), ("dpre", dpre), ("h_bwd", h_bwd)):
        assert not t.isnan().any(), f"{name} has NaNs"
        assert torch.all(t[used:] == 0), f"{name}: padding rows not zero"


def test_deterministic():
    p, dy = _problem(CASES[7])
    first, second = _fused(p, dy), _fused(p, dy)
    for a, b in zip(first[:3] + tuple(first[3]), second[:3] + tuple(second[3])):
        assert a is None or torch.equal(a, b)


@pytest.mark.parametrize("swiglu_out_too", [False, True])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_no_host_sync(layout, swiglu_out_too):
    c = dict(CASES[4], layout=layout, bias=True, swiglu_out_too=swiglu_out_too)
    p, dy = _problem(c)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fused = _fused(p, dy, c["limit"], swiglu_out_too)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _check(p, fused, _reference(p, dy, c["limit"], swiglu_out_too))


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_cuda_graph_replay_with_new_routing(layout):
    m, h, i, e = 1531, 136, 200, 16
    c = dict(m=m, h=h, i=i, e=e, routing="balanced", pad=11, layout=layout, bias=True,
             limit=7.0, scale=4.0, swiglu_out_too=False, seed=9)
    p, dy = _problem(c)
    graph, fused = testing.capture_graph(lambda: _fused(p, dy))

    g = torch.Generator().manual_seed(10)
    for routing, pad in (("skewed", 0), ("empty", 40), ("single", 300), ("balanced", m)):
        p.sizes = testing.group_sizes(m - pad, e, routing, generator=g)
        with torch.no_grad():
            p.offs.copy_(ref.offsets_from_counts(p.sizes, device="cuda"))
            p.x.copy_(torch.randn(m, h, generator=g).to(BF16))
            dy.copy_(torch.randn(m, h, generator=g).to(BF16))
        graph.replay()
        torch.cuda.synchronize()
        _check(p, fused, _reference(p, dy))

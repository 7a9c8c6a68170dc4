# Reliability of the GPU path: torch.compile(fullgraph=True) of the whole MoE layer
# forward and backward, zero tokens, NaN propagation through every fused activation,
# offsets checked on the device by every op that reads them (grouped_column_sum
# included), the opt-in host check of offsets, and bit-for-bit determinism of the layer
# in both gather modes.

import pytest
import torch

import cute_moe
from cute_moe import reference as ref
from cute_moe import testing
from cute_moe.nn import MoE

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded"),
]

BF16, F32 = torch.bfloat16, torch.float32
LAYERS = [
    ("gpt-oss", dict()),
    ("qwen3", dict(activation="swiglu", bias=False, router_bias=False)),
    ("srelu", dict(activation="srelu", bias=False)),
    ("none", dict(activation="none")),
]


def _moe(kw, fuse_gather=False, h=256, i=128, e=16, k=4, seed=0):
    torch.manual_seed(seed)
    moe = MoE(h, i, e, k, dtype=BF16, device="cuda", fuse_gather=fuse_gather, **kw)
    with torch.no_grad():
        moe.router.gate.weight.normal_(0, h ** -0.5)
        moe.experts.gate_up_proj.normal_(0, h ** -0.5)
        moe.experts.down_proj.normal_(0, i ** -0.5)
    return moe


def _grads(moe, x, dy):
    x = x.clone().requires_grad_()
    out = moe(x)
    return out, torch.autograd.grad(out, [x] + list(moe.parameters()), dy)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fuse_gather", [False, True])
@pytest.mark.parametrize("name,kw", LAYERS[:3], ids=[n for n, _ in LAYERS[:3]])
def test_compile_fullgraph_forward_and_backward(name, kw, fuse_gather, backend):
    """No graph break anywhere in the layer or its backward (fullgraph=True raises on
    one); aot_eager gives eager's bits, inductor (which fuses the router's elementwise
    ops) agrees within bf16 rounding."""
    torch._dynamo.reset()
    moe = _moe(kw, fuse_gather)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(300, 256, device="cuda", generator=g).to(BF16)
    dy = torch.randn(300, 256, device="cuda", generator=g).to(BF16)
    eager_out, eager_grads = _grads(moe, x, dy)
    out, grads = _grads(torch.compile(moe, fullgraph=True, backend=backend), x, dy)
    if backend == "aot_eager":
        assert torch.equal(out, eager_out)
        for a, b in zip(grads, eager_grads):
            assert torch.equal(a, b)
    else:
        testing.assert_rel_close(out, eager_out.float(), "out", BF16)
        for n, a, b in zip(["x"] + [n for n, _ in moe.named_parameters()], grads, eager_grads):
            testing.assert_rel_close(a, b.float(), f"d{n}", BF16)


@pytest.mark.parametrize("fuse_gather", [False, True])
@pytest.mark.parametrize("name,kw", LAYERS, ids=[n for n, _ in LAYERS])
def test_moe_on_zero_tokens(name, kw, fuse_gather):
    """An empty micro-batch (an empty shard): a (0, H) output and exact zero gradients
    for every parameter."""
    moe = _moe(kw, fuse_gather)
    testing.assert_empty_batch(moe, [(0, 256), (3, 0, 256)], BF16, device="cuda")


@pytest.mark.parametrize("activation", tuple(ref.ACTIVATIONS))
def test_nan_stays_visible_through_every_fused_activation(activation):
    """A NaN in one routed row's input gives NaN in that row's output (the reference
    propagates it; srelu's epilogue used to turn it into relu(nan) = 0) and in the
    gradients that depend on it; the other rows stay finite."""
    torch.manual_seed(0)
    gated = activation in ref.GATED_ACTIVATIONS
    e, m, hidden, inter = 4, 256, 128, 64
    up = 2 * inter if gated else inter
    x = torch.randn(m, hidden, device="cuda", dtype=BF16)
    x[77, 5] = float("nan")
    w_up = (torch.randn(e, hidden, up, device="cuda") * hidden ** -0.5).to(BF16).requires_grad_()
    w_down = (torch.randn(e, inter, hidden, device="cuda") * inter ** -0.5).to(BF16).requires_grad_()
    b_down = torch.randn(e, hidden, device="cuda", dtype=BF16, requires_grad=True)
    offs = torch.tensor([60, 130, 200, 256], device="cuda", dtype=torch.int32)
    x.requires_grad_()
    out = cute_moe.expert_ffn(x, w_up, w_down, offs, None, b_down, activation=activation)
    want = ref.expert_ffn_ref(x, w_up, None, w_down, b_down, offs, 1.702, ref.default_limit(activation),
                              activation=activation)
    assert torch.equal(torch.isnan(out), torch.isnan(want)), "NaN pattern differs from the reference"
    assert torch.isnan(out[77]).all()
    assert torch.isfinite(torch.cat([out[:77], out[78:]])).all()
    dy = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x, w_up, w_down, b_down], dy)
    want_grads = torch.autograd.grad(want, [x, w_up, w_down, b_down], dy.float())
    for name, a, b in zip(("dx", "dw_up", "dw_down", "db_down"), grads, want_grads):
        assert torch.equal(torch.isnan(a), torch.isnan(b)), f"{name}: NaN pattern differs from the reference"
    # row 77 belongs to expert 1: its weight gradients see the NaN, the others do not
    assert torch.isnan(grads[2][1]).any() and torch.isfinite(grads[2][[0, 2, 3]]).all()


def test_grouped_column_sum_checks_offsets_on_the_device():
    """Decreasing offsets used to give garbage silently; now they stop the kernel with the
    same message as the GEMMs (in a child process: the trap poisons the CUDA context)."""
    out = testing.device_trap_output("""
        src = torch.randn(64, 16, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor([10, 5, 64], device="cuda", dtype=torch.int32)
    """, "torch.ops.cute_moe.grouped_column_sum(src, offs)")
    assert "cute_moe group_column_sum: invalid offs at group 1" in out, out


def test_checked_offsets_mode_raises_before_any_kernel_runs():
    x = torch.randn(64, 16, device="cuda", dtype=BF16)
    w = torch.randn(3, 16, 8, device="cuda", dtype=BF16)
    try:
        cute_moe.set_offs_check(True)
        with pytest.raises(ValueError, match=r"offs\[1\] = 5 is below offs\[0\] = 10"):
            cute_moe.grouped_mm(x, w, torch.tensor([10, 5, 64], device="cuda", dtype=torch.int32))
        # nothing trapped: the context still works
        y = cute_moe.grouped_mm(x, w, torch.tensor([10, 20, 64], device="cuda", dtype=torch.int32))
        torch.cuda.synchronize()
        assert y.shape == (64, 8)
    finally:
        cute_moe.set_offs_check(None)


@pytest.mark.parametrize("fuse_gather", [False, True])
def test_layer_is_deterministic_bit_for_bit(fuse_gather):
    """Forward and backward twice on the same inputs: the same bits (no atomics anywhere:
    the permute/combine gather-sums, the column sums and the GEMMs have fixed orders)."""
    moe = _moe(dict(), fuse_gather, e=32)
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2000, 256, device="cuda", generator=g).to(BF16)
    dy = torch.randn(2000, 256, device="cuda", generator=g).to(BF16)
    first_out, first = _grads(moe, x, dy)
    for _ in range(2):
        out, grads = _grads(moe, x, dy)
        assert torch.equal(out, first_out)
        for a, b in zip(grads, first):
            assert torch.equal(a, b)

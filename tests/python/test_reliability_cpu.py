# Reliability on the CPU (the references, or the library's CPU kernels): the MoE layer on
# zero tokens, NaN propagation through every activation, the checked-offsets mode,
# torch.compile(fullgraph=True) of the whole layer forward and backward (no graph break),
# and the distributed tests' process runner.
# The GPU twins of these are in test_reliability_gpu.py.
import pytest
import torch

import cute_moe
from cute_moe import reference as ref, testing
from cute_moe.nn import MoE

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64

LAYERS = [
    ("gpt-oss", dict()),
    ("qwen3", dict(activation="swiglu", bias=False, router_bias=False)),
    ("srelu", dict(activation="srelu", bias=False)),
    ("none", dict(activation="none")),
]


@pytest.mark.parametrize("fuse_gather", [False, True])
@pytest.mark.parametrize("dtype", [BF16, F64])
@pytest.mark.parametrize("name,kw", LAYERS, ids=[n for n, _ in LAYERS])
def test_moe_on_zero_tokens(name, kw, dtype, fuse_gather):
    """An empty micro-batch: a (0, H) output and exact zero gradients for every parameter."""
    torch.manual_seed(0)
    moe = MoE(32, 16, 6, 2, dtype=dtype, fuse_gather=fuse_gather, **kw)
    testing.assert_empty_batch(moe, [(0, 32), (2, 0, 32)], dtype)


@pytest.mark.parametrize("activation", tuple(ref.ACTIVATIONS))
def test_reference_activations_propagate_nan(activation):
    """A NaN pre-activation gives a NaN output and a NaN gradient (torch's relu, clamp
    and sigmoid all keep it); srelu used to be the exception in the kernels' functor."""
    width = 4
    pre = torch.tensor([[float("nan"), 1.0, -2.0, 0.5]], dtype=F32)
    h = ref.act_ref(pre, activation, 1.702, ref.default_limit(activation))
    assert h.shape[1] == (width // 2 if activation in ref.GATED_ACTIVATIONS else width)
    assert torch.isnan(h[0, 0])
    # and the gradient is autograd's, NaNs in the same places
    pre.requires_grad_()
    dh = torch.ones_like(h)
    (want,) = torch.autograd.grad(ref.act_ref(pre, activation, 1.702, ref.default_limit(activation)),
                                  pre, dh)
    dpre = ref.act_bwd_ref(dh, pre.detach(), activation, 1.702, ref.default_limit(activation))
    assert torch.equal(torch.isnan(dpre), torch.isnan(want))
    assert torch.allclose(dpre, want, equal_nan=True)
    if activation in ("srelu", "swiglu", "geglu"):
        assert torch.isnan(dpre[0, 0])


def test_checked_offsets_mode_raises_naming_the_first_bad_entry():
    x = torch.randn(64, 16, dtype=BF16)
    w = torch.randn(3, 16, 8, dtype=BF16)
    cases = {
        (10, 5, 64): r"offs\[1\] = 5 is below offs\[0\] = 10",
        (10, 20, 65): r"offs\[2\] = 65 is past the 64 rows of x",
        (-4, 20, 30): r"offs\[0\] = -4 is negative",
    }
    try:
        cute_moe.set_offs_check(True)
        assert cute_moe.offs_check_enabled()
        for offs, message in cases.items():
            with pytest.raises(ValueError, match=message):
                cute_moe.grouped_mm(x, w, torch.tensor(offs, dtype=torch.int32))
        good = torch.tensor([10, 20, 64], dtype=torch.int32)
        assert cute_moe.grouped_mm(x, w, good).shape == (64, 8)
        w_up = torch.randn(3, 16, 16, dtype=BF16)
        w_down = torch.randn(3, 8, 16, dtype=BF16)
        with pytest.raises(ValueError, match=r"cute_moe.expert_ffn: offs\[1\] = 5"):
            cute_moe.expert_ffn(x, w_up, w_down, torch.tensor([10, 5, 64], dtype=torch.int32))
        with pytest.raises(ValueError, match=r"cute_moe.grouped_mm_swiglu: offs\[2\] = 65"):
            cute_moe.grouped_mm_swiglu(x, w_up, torch.tensor([1, 2, 65], dtype=torch.int32))
    finally:
        cute_moe.set_offs_check(None)


def test_checked_offsets_mode_follows_the_environment(monkeypatch):
    cute_moe.set_offs_check(None)
    monkeypatch.delenv("CUTE_MOE_CHECK_OFFS", raising=False)
    assert not cute_moe.offs_check_enabled()
    monkeypatch.setenv("CUTE_MOE_CHECK_OFFS", "1")
    assert cute_moe.offs_check_enabled()
    monkeypatch.setenv("CUTE_MOE_CHECK_OFFS", "0")
    assert not cute_moe.offs_check_enabled()
    cute_moe.set_offs_check(True)
    assert cute_moe.offs_check_enabled()
    cute_moe.set_offs_check(None)


@pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library's ops are what torch.compile "
                    "traces (the library-less fallback reads offs on the host)")
@pytest.mark.parametrize("fuse_gather", [False, True])
@pytest.mark.parametrize("name,kw", LAYERS[:3], ids=[n for n, _ in LAYERS[:3]])
def test_compile_fullgraph_forward_and_backward(name, kw, fuse_gather):
    """torch.compile(fullgraph=True) traces the whole layer (router, dispatch, experts,
    combine) and its backward without a graph break, and computes what eager does."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    moe = MoE(32, 16, 6, 2, dtype=BF16, fuse_gather=fuse_gather, **kw)
    compiled = torch.compile(moe, fullgraph=True, backend="aot_eager")
    x = torch.randn(40, 32, dtype=BF16)
    dy = torch.randn(40, 32, dtype=BF16)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager_out = moe(xe)
    eager_grads = torch.autograd.grad(eager_out, [xe] + list(moe.parameters()), dy)
    out = compiled(xc)
    grads = torch.autograd.grad(out, [xc] + list(moe.parameters()), dy)
    assert torch.equal(out, eager_out)
    for a, b in zip(grads, eager_grads):
        assert torch.equal(a, b)


# --- the distributed tests' process runner ------------------------------------------------

def _worker_reporting_on_rank_1(rank, world, port, errors):
    if rank == 1:
        errors.put("rank 1: reported")
        raise RuntimeError("rank 1 failed")


def _worker_exiting_on_rank_0(rank, world, port, errors):
    if rank == 0:
        raise SystemExit(3)


def _worker_passing(rank, world, port, errors):
    assert 0 <= rank < world and port > 0


@pytest.mark.parametrize("worker,expected", [
    (_worker_reporting_on_rank_1, r"rank 1: reported"),
    (_worker_exiting_on_rank_0, r"\[3, 0\]"),
])
def test_run_workers_fails_on_a_report_or_an_exit_code(worker, expected):
    """run_workers ends its processes without the interpreter's teardown: a worker's
    report and a worker's failing exit still fail the test."""
    with pytest.raises(AssertionError, match=expected):
        testing.run_workers(worker, 2, timeout=120)
    testing.run_workers(_worker_passing, 2, timeout=120)

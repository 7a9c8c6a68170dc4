# GPU tests of the permute / unpermute gathers against the references: the three ops over
# random routings (T = 0, k = 1..8 and past a warp's 32 choices, row lengths that are odd
# multiples of 8 around the kernels' unroll widths, strided views), outputs in poisoned
# memory, bitwise determinism, host-sync freedom, CUDA-graph replay with new routing, the
# gradients of permute / unpermute, and bad indices stopping the kernel with a message (in
# a child process). Needs a CUDA device and a library with the ops.

import pytest
import torch

import cute_moe
from cute_moe import reference as ref
from cute_moe import permute as perm
from cute_moe import testing

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded "
                       "(pip install --no-build-isolation .)"),
]

BF16, F32, F64, I32 = torch.bfloat16, torch.float32, torch.float64, torch.int32
ops = torch.ops.cute_moe
# 8 (one vector), 24, 264 = 8*33 and 520 = 8*65 (just past a warp's / two warps' vectors),
# 1032 = 8*129 (past one unrolled pass of the copy), 2880 (GPT-OSS).
HIDDEN = [8, 24, 264, 520, 1032, 2880]


def _routing(tokens, k, experts=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    experts = max(experts, k)
    scores = torch.rand(tokens, experts, generator=g)
    expert = scores.topk(k, dim=1).indices if tokens else torch.empty(0, k, dtype=torch.int64)
    row_token, token_rows, _ = ref.routing_indices(expert.cuda(), experts)
    return row_token, token_rows


def _poison(*shapes, dtype=BF16):
    """Fill freed allocator blocks of these shapes with NaN, so that an output that reuses
    one and leaves elements unwritten shows them."""
    blocks = [torch.full(s, float("nan"), dtype=dtype, device="cuda") for s in shapes]
    del blocks


def _randn(*shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda").to(BF16)


def _rand(*shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.rand(*shape, generator=g, device="cuda")


def _assert_close_to_rounded(out, want, magnitude, name):
    """out (bf16) is want (fp64) rounded to bf16: within one bf16 ulp, plus the fp32
    accumulation error, which scales with `magnitude`, the sum of the terms' sizes."""
    assert not out.isnan().any(), f"{name} has NaNs"
    err = (out.double() - want).abs()
    tol = torch.finfo(BF16).eps * want.abs() + 2.0 ** -20 * magnitude
    assert torch.all(err <= tol), f"{name}: max error {(err / tol).max().item():.2f} x the tolerance"


# ---- the ops ------------------------------------------------------------------------------------

@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("tokens, rows", [(0, 0), (1, 5), (300, 1201), (4096, 513)])
def test_gather_rows(tokens, rows, hidden, scaled):
    src = _randn(tokens, hidden, seed=hidden)
    g = torch.Generator(device="cuda").manual_seed(rows)
    index = torch.randint(max(tokens, 1), (rows if tokens else 0,), generator=g, device="cuda",
                          dtype=I32)
    scale = _rand(index.shape[0], seed=3) * 4 - 2 if scaled else None
    _poison((index.shape[0], hidden))
    out = ops.gather_rows(src, index, scale)
    assert out.shape == (index.shape[0], hidden) and out.dtype == BF16 and out.is_contiguous()
    # The kernel's arithmetic is the reference's (one fp32 product, one rounding): same bits.
    assert torch.equal(out, ref.gather_rows_ref(src, index, scale))


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 5, 6, 7, 8, 33, 40])
@pytest.mark.parametrize("weighted", [False, True])
def test_gather_sum_rows(k, hidden, weighted):
    tokens, rows = 257, 700
    src = _randn(rows, hidden, seed=k)
    g = torch.Generator(device="cuda").manual_seed(k + hidden)
    index = torch.randint(rows, (tokens, k), generator=g, device="cuda", dtype=I32)
    weight = _rand(tokens, k, seed=k) if weighted else None
    _poison((tokens, hidden))
    out = ops.gather_sum_rows(src, index, weight)
    assert out.shape == (tokens, hidden) and out.dtype == BF16
    w64 = weight.double() if weighted else None
    want = ref.gather_sum_rows_ref(src.double(), index, w64)
    magnitude = ref.gather_sum_rows_ref(src.double().abs(), index, w64)
    _assert_close_to_rounded(out, want, magnitude, "gather_sum_rows")
    if k == 0:
        assert torch.all(out == 0)
    if k == 1 and not weighted:
        assert torch.equal(out, src[index[:, 0].long()])


@pytest.mark.parametrize("hidden", HIDDEN + [0])
@pytest.mark.parametrize("k", [1, 2, 4, 5, 8, 33, 40])
def test_gather_rows_dot(k, hidden):
    tokens, rows = 131, 600
    a = _randn(tokens, hidden, seed=1)
    src = _randn(rows, hidden, seed=2)
    g = torch.Generator(device="cuda").manual_seed(k)
    index = torch.randint(rows, (tokens, k), generator=g, device="cuda", dtype=I32)
    _poison((tokens, k), dtype=F32)
    out = ops.gather_rows_dot(a, src, index)
    assert out.shape == (tokens, k) and out.dtype == F32
    assert not out.isnan().any()
    want = ref.gather_rows_dot_ref(a.double(), src.double(), index)
    testing.assert_rel_close(out, want, "gather_rows_dot", F32)
    if hidden == 0:
        assert torch.all(out == 0)


def test_empty_shapes():
    src = _randn(10, 16, seed=0)
    empty_index = torch.empty(0, dtype=I32, device="cuda")
    assert ops.gather_rows(src, empty_index).shape == (0, 16)
    assert ops.gather_rows(src[:0], empty_index).shape == (0, 16)
    assert ops.gather_sum_rows(src[:0], torch.empty(0, 3, dtype=I32, device="cuda")).shape == (0, 16)
    assert ops.gather_rows_dot(src[:0], src, torch.empty(0, 3, dtype=I32, device="cuda")).shape == (0, 3)
    zero_width = torch.empty(10, 0, dtype=BF16, device="cuda")
    index = torch.zeros(4, 2, dtype=I32, device="cuda")
    assert ops.gather_sum_rows(zero_width, index).shape == (4, 0)


def test_strided_views_and_layout_errors():
    wide = _randn(64, 48, seed=4)
    view = wide[:, 8:32]  # row stride 48, 16-byte aligned start
    index = torch.randint(64, (100,), device="cuda", dtype=I32)
    assert torch.equal(ops.gather_rows(view, index), view[index.long()])
    two = torch.randint(64, (50, 3), device="cuda", dtype=I32)
    _assert_close_to_rounded(ops.gather_sum_rows(view, two), ref.gather_sum_rows_ref(view.double(), two),
                             ref.gather_sum_rows_ref(view.double().abs(), two), "gather_sum_rows (view)")
    with pytest.raises(RuntimeError, match=r"src must start 16-byte aligned"):
        ops.gather_rows(wide[:, 1:9], index)
    with pytest.raises(RuntimeError, match=r"src must have a multiple of 8 columns"):
        ops.gather_rows(wide[:, :12], index)
    with pytest.raises(RuntimeError, match=r"index must be contiguous"):
        ops.gather_sum_rows(view, two.t().contiguous().t())
    with pytest.raises(RuntimeError, match=r"index must be a CUDA tensor, got device cpu"):
        ops.gather_rows(view, index.cpu())
    with pytest.raises(RuntimeError, match=r"weight must be Float"):
        ops.gather_sum_rows(view, two, torch.ones(50, 3, device="cuda", dtype=BF16))


def test_deterministic():
    src = _randn(4096, 2880, seed=5)
    a = _randn(1024, 2880, seed=6)
    index = torch.randint(4096, (1024, 8), device="cuda", dtype=I32)
    weight = _rand(1024, 8, seed=7)
    first = (ops.gather_sum_rows(src, index, weight), ops.gather_rows_dot(a, src, index))
    for _ in range(3):
        again = (ops.gather_sum_rows(src, index, weight), ops.gather_rows_dot(a, src, index))
        assert all(torch.equal(x, y) for x, y in zip(first, again)), "results differ between runs"


# ---- permute / unpermute ----------------------------------------------------------------------

def _layer(tokens, k, hidden, seed, weight_dtype=F32):
    row_token, token_rows = _routing(tokens, k, seed=seed)
    x = _randn(tokens, hidden, seed=seed).requires_grad_()
    w = _rand(tokens, k, seed=seed + 1).to(weight_dtype).requires_grad_()
    expert_scale = _randn(1, hidden, seed=seed + 2)  # a stand-in for the experts: y = x_sorted * s
    dout = _randn(tokens, hidden, seed=seed + 3)
    return x, w, expert_scale, row_token, token_rows, dout


def _forward_backward(x, w, expert_scale, row_token, token_rows, dout):
    xs = perm.permute(x, row_token, token_rows)
    out = perm.unpermute(xs * expert_scale, token_rows, row_token, w)
    return (out, *torch.autograd.grad(out, (x, w), dout))


def _reference(x, w, expert_scale, row_token, token_rows, dout):
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    xs = ref.permute_ref(x64, row_token)
    out = ref.unpermute_ref(xs * expert_scale.double(), token_rows, w64)
    return (out, *torch.autograd.grad(out, (x64, w64), dout.double()))


@pytest.mark.parametrize("tokens, k, hidden", [(0, 4, 2880), (1, 1, 8), (77, 2, 264), (333, 4, 2880),
                                               (1000, 8, 520), (64, 6, 1032)])
@pytest.mark.parametrize("weight_dtype", [F32, BF16])
def test_permute_unpermute_gradients(tokens, k, hidden, weight_dtype):
    layer = _layer(tokens, k, hidden, seed=tokens + k, weight_dtype=weight_dtype)
    outs = _forward_backward(*layer)
    refs = _reference(*layer)
    for name, got, want in zip(("out", "dx", "dweight"), outs, refs):
        assert not got.isnan().any(), name
        testing.assert_rel_close(got, want, name, BF16)
    assert outs[2].dtype == weight_dtype


def test_permute_unpermute_deterministic_without_host_sync():
    layer = _layer(2048, 4, 2880, seed=8)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        first = _forward_backward(*layer)
        second = _forward_backward(*layer)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for name, a, b in zip(("out", "dx", "dweight"), first, second):
        assert torch.equal(a, b), f"{name} differs between two runs"
    for name, got, want in zip(("out", "dx", "dweight"), first, _reference(*layer)):
        testing.assert_rel_close(got, want, name, BF16)


def test_cuda_graph_replay_with_new_routing():
    tokens, k, hidden = 500, 4, 264
    x, w, s, row_token, token_rows, dout = _layer(tokens, k, hidden, seed=9)
    graph, outs = testing.capture_graph(
        lambda: _forward_backward(x, w, s, row_token, token_rows, dout))
    for seed in (10, 11):
        new_row_token, new_token_rows = _routing(tokens, k, seed=seed)
        with torch.no_grad():
            row_token.copy_(new_row_token)
            token_rows.copy_(new_token_rows)
            x.copy_(_randn(tokens, hidden, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        for name, got, want in zip(("out", "dx", "dweight"), outs,
                                   _reference(x, w, s, row_token, token_rows, dout)):
            testing.assert_rel_close(got, want, name, BF16)


_BAD_INDEX_CALLS = {
    "gather_rows": "ops.gather_rows(src, index.reshape(-1))",
    "gather_sum_rows": "ops.gather_sum_rows(src, index.reshape(2, -1))",
    "gather_rows_dot": "ops.gather_rows_dot(src[:2], src, index.reshape(2, -1))",
}


@pytest.mark.parametrize("op", ["gather_rows", "gather_sum_rows", "gather_rows_dot"])
@pytest.mark.parametrize("bad", ["[0, 1, 2, 8]", "[0, -1, 2, 3]"], ids=["past-end", "negative"])
def test_invalid_index_stops_the_kernel_with_a_message(op, bad):
    # A device-side check cannot raise like a host check: it prints and traps, which
    # poisons the CUDA context, so it runs in a child process.
    out = testing.device_trap_output(f"""
        ops = torch.ops.cute_moe
        src = torch.randn(8, 16, device="cuda", dtype=torch.bfloat16)
        index = torch.tensor({bad}, device="cuda", dtype=torch.int32)
    """, _BAD_INDEX_CALLS[op])
    assert f"cute_moe {op}: invalid index at position" in out, out
    assert "not a row of src, which has 8 rows" in out, out

# cute_moe::grouped_bias_grads on the GPU: one pass over dy (or over the combine's output
# gradient, gathered by index) giving the bias gradient (the same bits as
# grouped_column_sum over the same rows), each row's dot product with its expert's bias
# (against float64; padding rows exactly 0) and the gathered rows (src[index], every row).
# Widths that are not multiples of the kernels' 256-column warps or 1024-column blocks,
# rows past the groups, empty experts, m = 0, and a bad index (in a child process: the
# trap poisons the CUDA context).

import pytest
import torch

import cute_moe
from cute_moe import testing
from cute_moe.reference.gemm import grouped_bias_grads_ref

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded"),
]

BF16 = torch.bfloat16


def _offs(m_used, e, g, empties=True):
    sizes = torch.rand(e, generator=g) + 0.05
    if empties and e > 2:
        sizes[1] = 0
        sizes[e - 1] = 0
    sizes = (sizes / sizes.sum() * m_used).floor().long()
    sizes[0] += m_used - sizes.sum()
    return torch.cumsum(sizes, 0).to(torch.int32).cuda()


# rows of src (gather) or None, rows m, used rows, n, experts
CASES = [(3000, 12000, 12000, 2880, 32), (None, 1000, 900, 264, 5), (500, 1000, 1000, 8, 3),
         (None, 257, 130, 1032, 7), (10, 0, 0, 64, 4), (None, 4096, 4096, 2048, 128)]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}-{c[4]}" for c in CASES])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("with_prob", [True, False])
def test_matches_column_sum_and_float64(case, with_bias, with_prob):
    src_rows, m, used, n, e = case
    g = torch.Generator().manual_seed(m + n + e)
    offs = _offs(used, e, g)
    gather = src_rows is not None
    src = torch.randn(src_rows if gather else m, n, generator=g).to(BF16).cuda()
    index = (torch.randint(0, src_rows, (m,), generator=g, dtype=torch.int32).cuda() if gather
             else None)
    prob = torch.rand(m, generator=g).cuda() if with_prob else None
    bias = torch.randn(e, n, generator=g).to(BF16).cuda() if with_bias else None

    db, bias_dot, gathered = torch.ops.cute_moe.grouped_bias_grads(src, offs, prob, bias, index)
    dy = src[index.long()] if gather else src
    assert db.shape == (e, n) and db.dtype == torch.float32
    if gather:
        assert gathered.shape == (m, n) and torch.equal(gathered, dy)
    else:
        assert gathered.shape == (0, n)
    # the bias gradient: grouped_column_sum's bits over the same rows
    want_db = (torch.ops.cute_moe.grouped_column_sum(dy, offs, prob) if prob is not None
               else torch.ops.cute_moe.grouped_column_sum(dy, offs))
    assert torch.equal(db, want_db)
    ref_db, ref_dot, _ = grouped_bias_grads_ref(dy.double(), offs, prob, bias, None)
    if m:
        assert ((db.double() - ref_db).norm() / ref_db.norm().clamp_min(1e-30)).item() < 1e-5
    if not with_bias:
        assert bias_dot.shape == (0,)
        return
    assert bias_dot.shape == (m,) and bias_dot.dtype == torch.float32
    assert torch.all(bias_dot[used:] == 0)
    if used:
        err = ((bias_dot[:used].double() - ref_dot[:used]).norm() / ref_dot[:used].norm()).item()
        assert err < 1e-5, err


def test_deterministic():
    g = torch.Generator().manual_seed(5)
    offs = _offs(8192, 16, g)
    src = torch.randn(2048, 2880, generator=g).to(BF16).cuda()
    index = torch.randint(0, 2048, (8192,), generator=g, dtype=torch.int32).cuda()
    prob, bias = torch.rand(8192).cuda(), torch.randn(16, 2880).to(BF16).cuda()
    first = torch.ops.cute_moe.grouped_bias_grads(src, offs, prob, bias, index)
    for _ in range(3):
        again = torch.ops.cute_moe.grouped_bias_grads(src, offs, prob, bias, index)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


# Pass 2 shares a group's partials among a block's warps (8 warps, 4 chunks or 2 tiles loaded
# together): a deep group (133 chunks) wraps that loop several times and ends mid-unroll;
# widths end inside a block's columns.
DEEP_SIZES = [17000, 0, 1531, 37, 0]


def _deep_offs(pad):
    return torch.tensor(DEEP_SIZES, device="cuda").cumsum(0).to(torch.int32), sum(DEEP_SIZES) + pad


def _per_group_error(got, want):
    return max(((got[e].double() - want[e]).norm() / want[e].norm().clamp_min(1e-30)).item()
               for e in range(len(DEEP_SIZES)) if DEEP_SIZES[e])


@pytest.mark.parametrize("n", [264, 2880])
@pytest.mark.parametrize("with_prob", [False, True])
def test_deep_groups_column_sums(n, with_prob):
    offs, m = _deep_offs(pad=200)
    g = torch.Generator().manual_seed(n)
    dy = torch.randn(m, n, generator=g).to(BF16).cuda()
    prob = torch.rand(m, generator=g).cuda() if with_prob else None
    db = (torch.ops.cute_moe.grouped_column_sum(dy, offs, prob) if with_prob
          else torch.ops.cute_moe.grouped_column_sum(dy, offs))
    want, _, _ = grouped_bias_grads_ref(dy.double(), offs, prob, None, None)
    assert _per_group_error(db, want) < 1e-5
    assert torch.all(db[[e for e, c in enumerate(DEEP_SIZES) if c == 0]] == 0)
    again = (torch.ops.cute_moe.grouped_column_sum(dy, offs, prob) if with_prob
             else torch.ops.cute_moe.grouped_column_sum(dy, offs))
    assert torch.equal(db, again)


@pytest.mark.parametrize("inter", [136, 1024])
def test_deep_groups_fused_backward_bias_grad(inter):
    """db_up from the fused backward's epilogue partials (tile_column_sum's pass)."""
    offs, m = _deep_offs(pad=70)
    g = torch.Generator().manual_seed(inter)
    e, hidden = len(DEEP_SIZES), 128
    dy = torch.randn(m, hidden, generator=g).to(BF16).cuda()
    w_down = (torch.randn(e, inter, hidden, generator=g) * hidden ** -0.5).to(BF16).cuda()
    pre = torch.randn(m, 2 * inter, generator=g).to(BF16).cuda()
    args = (dy, w_down.transpose(-2, -1), offs, pre, None, None, None, False, "swiglu", 1.702, None,
            "interleaved", True)
    dpre, _, _, db = torch.ops.cute_moe.grouped_mm_act_bwd(*args)
    want, _, _ = grouped_bias_grads_ref(dpre.double(), offs, None, None, None)
    assert _per_group_error(db, want) < 1e-2  # db sums the fp32 dpre the kernel rounds to bf16
    assert torch.all(db[[e for e, c in enumerate(DEEP_SIZES) if c == 0]] == 0)
    assert torch.equal(torch.ops.cute_moe.grouped_mm_act_bwd(*args)[3], db)


def test_bad_index_stops_the_kernel():
    out = testing.device_trap_output("""
        src = torch.randn(64, 16, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor([40, 100], device="cuda", dtype=torch.int32)
        index = torch.zeros(100, device="cuda", dtype=torch.int32)
        index[77] = 64
    """, "torch.ops.cute_moe.grouped_bias_grads(src, offs, None, None, index)")
    assert "invalid index at row 77: 64 is not a row of src, which has 64 rows" in out, out


def test_host_checks():
    src = torch.randn(64, 16, device="cuda", dtype=BF16)
    offs = torch.tensor([40, 64], device="cuda", dtype=torch.int32)
    with pytest.raises(RuntimeError, match="bias must be"):
        torch.ops.cute_moe.grouped_bias_grads(src, offs, None,
                                              torch.zeros(3, 16, device="cuda", dtype=BF16))
    with pytest.raises(RuntimeError, match="index must be"):
        torch.ops.cute_moe.grouped_bias_grads(src, offs, None, None, torch.zeros(10, device="cuda"))
    with pytest.raises(RuntimeError, match="row_scale"):
        torch.ops.cute_moe.grouped_bias_grads(src, offs, torch.rand(10, device="cuda"))

# Tests of the pure-PyTorch references (cute_moe.reference) and the test-data helpers
# (cute_moe.testing) against naive float64 computations written independently of them.
import zlib

import pytest
import torch

from cute_moe import reference as ref
from cute_moe import testing

BF16 = torch.bfloat16


def group_of_rows(sizes, m):
    """Group id of every row; len(sizes) for padding rows."""
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return torch.cat([ids, torch.full((m - len(ids),), len(sizes))])


def naive_rows(x, w, sizes, bias=None):
    """y row by row in float64."""
    gid = group_of_rows(sizes, x.shape[0])
    y = torch.zeros(x.shape[0], w.shape[-1], dtype=torch.float64)
    for r, e in enumerate(gid.tolist()):
        if e < len(sizes):
            y[r] = x[r].double() @ w[e].double()
            if bias is not None:
                y[r] += bias[e].double()
    return y


def dense_grads(x, w, sizes, bias, dy):
    """Weight and bias gradients by autograd of a dense, masked float64 computation."""
    gid = group_of_rows(sizes, x.shape[0])
    w64 = w.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_()
    y = sum((gid == e).double()[:, None] * (x.double() @ w64[e] + b64[e])
            for e in range(len(sizes)))
    (y * dy.double()).sum().backward()
    return w64.grad, b64.grad


CASES = [  # m, k, n, E, routing, pad
    (64, 16, 24, 4, "balanced", 0),
    (77, 24, 8, 6, "skewed", 5),
    (50, 8, 40, 9, "empty", 3),
    (33, 32, 16, 5, "single", 0),
    (20, 8, 8, 1, "balanced", 7),
    (41, 16, 16, 64, "balanced", 0),  # more groups than rows: many empty
]


@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[4]}-E{c[3]}-m{c[0]}-pad{c[5]}")
def test_grouped_mm_ref_matches_rowwise(case, layout, bias):
    m, k, n, e, routing, pad = case
    g = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    p = testing.random_problem(m, k, n, e, routing, pad=pad, layout=layout, bias=bias,
                               generator=g)
    expected = naive_rows(p.x, p.w, p.sizes, p.bias)
    y = ref.grouped_mm_ref(p.x, p.w, p.offs, p.bias)
    assert y.dtype == BF16 and y.shape == (m, n)
    testing.assert_rel_close(y, expected, "y")
    y64 = ref.grouped_mm_ref(p.x, p.w, p.offs, p.bias, compute_dtype=torch.float64,
                             out_dtype=torch.float64)
    testing.assert_rel_close(y64, expected, "y64")
    assert torch.all(y[p.used_rows:] == 0)


def test_grouped_mm_ref_no_rows_used():
    p = testing.random_problem(12, 8, 8, 3, pad=12)
    assert p.sizes == [0, 0, 0]
    assert torch.equal(ref.grouped_mm_ref(p.x, p.w, p.offs), torch.zeros(12, 8, dtype=BF16))


def test_grouped_mm_ref_is_differentiable():
    p = testing.random_problem(30, 8, 16, 4, "empty", pad=2, bias=True, dtype=torch.float64,
                               requires_grad=True)
    dy = torch.randn(30, 16, dtype=torch.float64)
    y = ref.grouped_mm_ref(p.x, p.w, p.offs, p.bias, compute_dtype=torch.float64)
    y.backward(dy)
    dw, db = dense_grads(p.x, p.w, p.sizes, p.bias, dy)
    testing.assert_rel_close(p.weight.grad, dw, "dw")
    testing.assert_rel_close(p.bias.grad, db, "db")
    assert torch.all(p.x.grad[p.used_rows:] == 0)


@pytest.mark.parametrize("out_dtype", [BF16, torch.float32])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[4]}-E{c[3]}-m{c[0]}-pad{c[5]}")
def test_wgrad_and_bias_grad_ref_match_dense_autograd(case, out_dtype):
    m, k, n, e, routing, pad = case
    g = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    p = testing.random_problem(m, k, n, e, routing, pad=pad, bias=True, generator=g)
    dy = torch.randn(m, n, generator=g).to(BF16)
    dw_dense, db_dense = dense_grads(p.x, p.w, p.sizes, p.bias, dy)

    dw = ref.grouped_mm_wgrad_ref(p.x, dy, p.offs, out_dtype=out_dtype)
    assert dw.dtype == out_dtype and dw.shape == (e, k, n)
    testing.assert_rel_close(dw, dw_dense, "dw", dtype=BF16)
    dw64 = ref.grouped_mm_wgrad_ref(p.x, dy, p.offs, torch.float64, torch.float64)
    testing.assert_rel_close(dw64, dw_dense, "dw64")

    db = ref.grouped_bias_grad_ref(dy, p.offs)
    assert db.dtype == torch.float32 and db.shape == (e, n)
    testing.assert_rel_close(db, db_dense, "db", dtype=BF16)

    empty = torch.tensor(p.sizes) == 0
    assert torch.all(dw[empty] == 0) and torch.all(db[empty] == 0)


def test_padding_rows_are_ignored_by_wgrad():
    p = testing.random_problem(40, 8, 8, 3, pad=10)
    dy = torch.randn(40, 8).to(BF16)
    dy_clean = dy.clone()
    dy_clean[30:] = 0
    x_nan = p.x.clone()
    x_nan[30:] = float("nan")
    assert torch.equal(ref.grouped_mm_wgrad_ref(x_nan, dy, p.offs, torch.float32),
                       ref.grouped_mm_wgrad_ref(p.x, dy_clean, p.offs, torch.float32))
    assert torch.equal(ref.grouped_bias_grad_ref(dy, p.offs),
                       ref.grouped_bias_grad_ref(dy_clean, p.offs))


def test_offsets_from_counts():
    offs = ref.offsets_from_counts([3, 0, 2, 5])
    assert offs.dtype == torch.int32 and offs.tolist() == [3, 3, 5, 10]
    assert ref.offsets_from_counts(torch.tensor([1, 2])).tolist() == [1, 3]
    assert ref.offsets_from_counts([]).tolist() == []


@pytest.mark.parametrize("offs, message", [([3, 2, 5], r"offs\[1\]=2 after 3"),
                                           ([2, 4, 11], r"offs\[2\]=11"),
                                           ([-1, 4, 5], r"offs\[0\]=-1")])
def test_group_bounds_rejects_bad_offsets(offs, message):
    with pytest.raises(ValueError, match=message):
        ref.group_bounds(torch.tensor(offs, dtype=torch.int32), 10)


@pytest.mark.parametrize("routing", testing.ROUTINGS)
@pytest.mark.parametrize("total, groups", [(1000, 7), (5, 16), (0, 3), (4096, 1024)])
def test_group_sizes(routing, total, groups):
    sizes = testing.group_sizes(total, groups, routing, generator=torch.Generator().manual_seed(1))
    assert len(sizes) == groups and sum(sizes) == total and min(sizes) >= 0
    if routing == "balanced":
        assert max(sizes) - min(sizes) <= 1
    if routing == "single" and total:
        assert sorted(sizes)[-2:] == [0, total] if groups > 1 else sizes == [total]
    if routing in ("skewed", "empty") and groups >= 8:
        assert 0 in sizes


def test_group_sizes_cap():
    sizes = testing.group_sizes(4 * 1000, 16, "skewed", max_size=1000,
                                generator=torch.Generator().manual_seed(0))
    assert sum(sizes) == 4000 and max(sizes) <= 1000
    with pytest.raises(ValueError, match="max_size"):
        testing.group_sizes(100, 4, "single", max_size=50)


def test_rel_error():
    ref_t = torch.tensor([3.0, 4.0])
    assert testing.rel_error(ref_t, ref_t) == 0.0
    assert testing.rel_error(torch.tensor([3.0, 4.5]), ref_t) == pytest.approx(0.1)
    assert testing.rel_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert testing.rel_error(torch.ones(2), torch.zeros(2)) > 0
    with pytest.raises(AssertionError, match="relative error nan"):
        testing.assert_rel_close(torch.tensor([float("nan"), 1.0]), ref_t, "t")
    assert testing.tolerance(BF16) == 1e-2

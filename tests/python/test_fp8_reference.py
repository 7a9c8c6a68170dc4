# The FP8 recipe's quantizers and reference GEMMs (cute_moe.reference.fp8, docs/fp8.md)
# against naive float64 loops written independently of them: scales, the round-trip error
# e4m3 allows, the block grid along each group's rows, and the GEMMs on dequantized inputs.
import math

import pytest
import torch

from cute_moe.reference import fp8
from cute_moe.reference import grouped_mm_ref, grouped_mm_wgrad_ref, offsets_from_counts


def gen(seed):
    return torch.Generator().manual_seed(seed)


def assert_e4m3_roundtrip(x, deq, scale_of):
    """|deq - x| within half an e4m3 step: 2^-4 relative for normals, 2^-10 of the scale
    for subnormals (e4m3: 3 mantissa bits, smallest normal 2^-6)."""
    x, deq, s = x.double(), deq.double(), scale_of.double()
    bound = torch.maximum(x.abs() * 2.0 ** -4, s * 2.0 ** -10) * (1 + 1e-6)
    assert bool(((deq - x).abs() <= bound).all()), float(((deq - x).abs() - bound).max())


@pytest.mark.parametrize("k", [128, 384, 200, 7])
def test_quantize_1x128_scales_and_roundtrip(k):
    x = torch.randn(37, k, generator=gen(k)) * torch.logspace(-3, 2, 37)[:, None]
    q, s = fp8.quantize_1x128(x)
    assert q.dtype == fp8.FP8_DTYPE and q.shape == x.shape
    assert s.shape == (37, math.ceil(k / 128)) and s.dtype == torch.float32
    for r in range(37):
        for b in range(s.shape[1]):
            block = x[r, b * 128:(b + 1) * 128].double()
            assert s[r, b].item() == pytest.approx(block.abs().max().item() / 448.0, rel=1e-6)
            assert q[r, b * 128:(b + 1) * 128].float().abs().max().item() == 448.0
    col_scale = s.repeat_interleave(128, dim=1)[:, :k]
    assert_e4m3_roundtrip(x, fp8.dequantize_1x128(q, s), col_scale)


def test_zero_blocks_get_scale_one_and_stay_zero():
    x = torch.zeros(4, 256)
    x[1, 130] = 3.0
    q, s = fp8.quantize_1x128(x)
    expect = torch.ones(4, 2)
    expect[1, 1] = 3.0 / 448.0  # in fp32, as the scales are
    assert torch.equal(s, expect)
    assert torch.equal(fp8.dequantize_1x128(q, s), x)


@pytest.mark.parametrize("shape", [(3, 256, 384), (2, 200, 130), (128, 128)])
def test_quantize_128x128_blocks(shape):
    w = torch.randn(*shape, generator=gen(len(shape)))
    q, s = fp8.quantize_128x128(w)
    *lead, k, n = shape
    assert s.shape == (*lead, math.ceil(k / 128), math.ceil(n / 128))
    flat_w, flat_s = w.reshape(-1, k, n), s.reshape(-1, *s.shape[-2:])
    for e in range(flat_w.shape[0]):
        for i in range(flat_s.shape[1]):
            for j in range(flat_s.shape[2]):
                tile = flat_w[e, i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].double()
                assert flat_s[e, i, j].item() == pytest.approx(tile.abs().max().item() / 448.0, rel=1e-6)
    full = s.repeat_interleave(128, -2).repeat_interleave(128, -1)[..., :k, :n]
    assert_e4m3_roundtrip(w, fp8.dequantize_128x128(q, s), full)


def test_quantize_128x1_blocks_start_at_each_groups_first_row():
    counts = [130, 0, 5, 256, 1]
    m = sum(counts) + 9  # 9 padding rows
    offs = offsets_from_counts(counts)
    x = torch.randn(m, 24, generator=gen(3))
    q, s = fp8.quantize_128x1(x, offs)
    assert s.shape == (math.ceil(m / 128) + len(counts), 24)
    # naive: walk the groups, 128 rows at a time from each group's start
    start, block, used = 0, 0, []
    for c in counts:
        for r in range(start, start + c, 128):
            rows = x[r:min(r + 128, start + c)].double()
            expect = rows.abs().amax(0) / 448.0
            assert torch.allclose(s[block].double(), expect, rtol=1e-6)
            used.append(block)
            block += 1
        start += c
    assert block == sum(math.ceil(c / 128) for c in counts) == len(used)
    assert torch.equal(s[block:], torch.ones_like(s[block:]))  # unused blocks
    assert bool((q[sum(counts):].float() == 0).all())          # padding rows
    deq = fp8.dequantize_128x1(q, s, offs)
    row_scale = torch.ones(m, 24)
    start, block = 0, 0
    for c in counts:
        for r in range(start, start + c, 128):
            row_scale[r:min(r + 128, start + c)] = s[block]
            block += 1
        start += c
    assert_e4m3_roundtrip(x[:sum(counts)], deq[:sum(counts)], row_scale[:sum(counts)])
    assert bool((deq[sum(counts):] == 0).all())


def test_fp8_gemm_references_compute_on_the_dequantized_operands():
    counts = [64, 0, 200, 17]
    offs = offsets_from_counts(counts)
    m, k, n = sum(counts) + 3, 256, 136
    x = torch.randn(m, k, generator=gen(5))
    w = torch.randn(len(counts), k, n, generator=gen(6)) * k ** -0.5
    xq, xs = fp8.quantize_1x128(x)
    wq, ws = fp8.quantize_128x128(w)
    y = fp8.grouped_mm_fp8_ref(xq, xs, wq, ws, offs)
    exact = grouped_mm_ref(fp8.dequantize_1x128(xq, xs).double(),
                           fp8.dequantize_128x128(wq, ws).double(), offs, compute_dtype=torch.float64)
    assert (y.double() - exact).norm() / exact.norm() < 1e-6
    # against the unquantized product: e4m3's error, a few percent, never zero
    full = grouped_mm_ref(x.double(), w.double(), offs, compute_dtype=torch.float64)
    err = ((y.double() - full).norm() / full.norm()).item()
    assert 1e-3 < err < 6e-2, err

    dy = torch.randn(m, n, generator=gen(7))
    aq, a_s = fp8.quantize_128x1(x, offs)
    bq, b_s = fp8.quantize_128x1(dy, offs)
    dw = fp8.grouped_mm_wgrad_fp8_ref(aq, a_s, bq, b_s, offs)
    assert dw.shape == (len(counts), k, n)
    assert bool((dw[1] == 0).all())  # an empty expert: exact zeros
    exact_dw = grouped_mm_wgrad_ref(x.double(), dy.double(), offs, out_dtype=torch.float64,
                                    compute_dtype=torch.float64)
    err = ((dw.double() - exact_dw).norm() / exact_dw.norm()).item()
    assert 1e-3 < err < 6e-2, err


def test_bad_shapes_say_what_was_expected():
    with pytest.raises(ValueError, match=r"quantize_1x128: expected a 2-D"):
        fp8.quantize_1x128(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"quantize_128x1: expected a 2-D"):
        fp8.quantize_128x1(torch.zeros(5), offsets_from_counts([5]))
    with pytest.raises(ValueError, match=r"offs"):
        fp8.quantize_128x1(torch.zeros(5, 2), offsets_from_counts([3, 4]))


# cute_moe.fp8's wrappers on the CPU run the references; their argument checks are the ops'.
def test_fp8_wrappers_on_cpu_and_their_checks():
    import cute_moe
    x = torch.randn(3, 256).bfloat16()
    q, s = cute_moe.fp8.quantize_1x128(x)
    rq, rs = fp8.quantize_1x128(x)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    w = torch.randn(2, 144, 32).bfloat16()
    q, s, qt, st = cute_moe.fp8.quantize_128x128(w, as_is=False, transposed=True)
    rq, rs = fp8.quantize_128x128(w)
    assert q.numel() == 0 and s.numel() == 0
    assert torch.equal(qt.view(torch.uint8), rq.view(torch.uint8).transpose(-2, -1))
    assert torch.equal(st, rs.transpose(-2, -1))
    with pytest.raises(ValueError, match="multiple of 16"):
        cute_moe.fp8.quantize_1x128(torch.randn(3, 40).bfloat16())
    with pytest.raises(ValueError, match="bfloat16"):
        cute_moe.fp8.quantize_128x128(torch.randn(2, 16, 16))
    with pytest.raises(ValueError, match="at least one output"):
        cute_moe.fp8.quantize_128x128(w, as_is=False, transposed=False)


# The ops' CPU kernels (the references) and fake kernels (shapes for tracing); needs the
# op library, as CI has it.
@pytest.mark.skipif(not __import__("cute_moe").library_loaded(), reason="the op library is not loaded")
def test_fp8_ops_cpu_and_fake_kernels():
    from torch._subclasses.fake_tensor import FakeTensorMode
    ops = torch.ops.cute_moe
    assert str(ops.quantize_fp8_128x128.default._schema) == (
        "cute_moe::quantize_fp8_128x128(Tensor w, bool as_is=True, bool transposed=False) -> "
        "(Tensor, Tensor, Tensor, Tensor)")
    x = torch.randn(5, 272).bfloat16()
    q, s = ops.quantize_fp8_1x128(x)
    rq, rs = fp8.quantize_1x128(x)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    w = torch.randn(3, 160, 48).bfloat16()
    out = ops.quantize_fp8_128x128(w, True, True)
    assert [tuple(t.shape) for t in out] == [(3, 160, 48), (3, 2, 1), (3, 48, 160), (3, 1, 2)]
    # q_t's rows padded to whole 128-byte lines, as the CUDA op allocates them (its test checks
    # the same strides there), so that the fake kernel's strides hold on every device
    assert out[2].stride() == (48 * 256, 256, 1)
    assert torch.equal(out[2].float(), fp8.quantize_128x128(w)[0].transpose(-2, -1).float())
    with FakeTensorMode() as mode:
        fw = mode.from_tensor(w)
        fake_out = ops.quantize_fp8_128x128(fw, False, True)
        assert [tuple(t.shape) for t in fake_out] == [(0,), (0,), (3, 48, 160), (3, 1, 2)]
        assert fake_out[2].stride() == (48 * 256, 256, 1)
        fq, fs = ops.quantize_fp8_1x128(mode.from_tensor(x))
        assert fq.dtype == fp8.FP8_DTYPE and tuple(fs.shape) == (5, 3)


def test_quantize_128x1_t_is_the_k_major_layout_of_quantize_128x1():
    """The weight-gradient operand layout: each group's blocks transposed into their own 128
    columns, zeros after the group's rows and in unused blocks; the dequantized values are
    quantize_128x1's, moved."""
    counts = [0, 130, 0, 5, 256]
    offs = offsets_from_counts(counts)
    x = torch.randn(sum(counts) + 4, 48).to(torch.bfloat16)
    q, s = fp8.quantize_128x1(x, offs)
    q_t, s_t = fp8.quantize_128x1_t(x, offs)
    assert torch.equal(s_t, s) and q_t.shape == (48, 128 * s.shape[0])
    deq = fp8.dequantize_128x1(q, s, offs)
    deq_t = fp8.dequantize_128x1_t(q_t, s_t)
    col = 0
    for start, end, first in fp8.group_row_blocks(offs, x.shape[0]):
        assert first * 128 == col
        n_blocks = (end - start + 127) // 128
        assert torch.equal(deq_t[:, col:col + end - start], deq[start:end].T)
        assert bool((deq_t[:, col + end - start:col + 128 * n_blocks] == 0).all())
        col += 128 * n_blocks
    assert bool((deq_t[:, col:] == 0).all())


def test_quantize_128x1_wrapper_on_cpu_and_its_checks():
    import cute_moe
    offs = offsets_from_counts([3, 0, 140])
    x = torch.randn(145, 32).to(torch.bfloat16)
    q_t, s = cute_moe.fp8.quantize_128x1(x, offs)
    rq, rs = fp8.quantize_128x1_t(x, offs)
    assert torch.equal(q_t.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    with pytest.raises(ValueError, match=r"quantize_fp8_128x1: x: expected its last dimension a "
                                         r"multiple of 16"):
        cute_moe.fp8.quantize_128x1(x[:, :24], offs)
    with pytest.raises(ValueError, match=r"quantize_fp8_128x1: offs"):
        cute_moe.fp8.quantize_128x1(x, offs.to(torch.int64))
    if cute_moe.library_loaded():  # the op's CPU and fake kernels
        from torch._subclasses.fake_tensor import FakeTensorMode
        got = torch.ops.cute_moe.quantize_fp8_128x1(x, offs)
        assert torch.equal(got[0].view(torch.uint8), rq.view(torch.uint8))
        with FakeTensorMode() as mode:
            fq, fs = torch.ops.cute_moe.quantize_fp8_128x1(mode.from_tensor(x), mode.from_tensor(offs))
        assert tuple(fq.shape) == (32, 128 * 5) and tuple(fs.shape) == (5, 32)


def test_quantize_1x128_128x1_wrapper_on_cpu_and_its_checks():
    import cute_moe
    offs = offsets_from_counts([3, 0, 140])
    x = torch.randn(150, 32).to(torch.bfloat16)  # 7 padding rows
    got = cute_moe.fp8.quantize_1x128_128x1(x, offs)
    want = fp8.quantize_1x128(x) + fp8.quantize_128x1_t(x, offs)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    with pytest.raises(ValueError, match=r"quantize_fp8_1x128: x: expected its last dimension a "
                                         r"multiple of 16"):
        cute_moe.fp8.quantize_1x128_128x1(x[:, :24], offs)
    with pytest.raises(ValueError, match=r"quantize_fp8_128x1: offs"):
        cute_moe.fp8.quantize_1x128_128x1(x, offs.to(torch.int64))
    if cute_moe.library_loaded():  # the op's CPU and fake kernels
        from torch._subclasses.fake_tensor import FakeTensorMode
        op = torch.ops.cute_moe.quantize_fp8_1x128_128x1
        for a, b in zip(op(x, offs), want):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        with FakeTensorMode() as mode:
            shapes = [tuple(t.shape) for t in op(mode.from_tensor(x), mode.from_tensor(offs))]
        assert shapes == [(150, 32), (150, 1), (32, 128 * 5), (5, 32)]


def test_quantize_1x128_128x1_gathering_on_cpu_and_its_checks():
    """With an index: the copies of x[index] (the reference gathers first), the index's checks,
    and the op's CPU and fake kernels (M = the index's length rows)."""
    import cute_moe
    offs = offsets_from_counts([3, 0, 140])
    x = torch.randn(40, 32).to(torch.bfloat16)
    index = torch.randint(0, 40, (150,), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    got = cute_moe.fp8.quantize_1x128_128x1(x, offs, True, index)
    rows = x[index.long()]
    want = fp8.quantize_1x128(rows) + fp8.quantize_128x1_t(rows, offs, True)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    with pytest.raises(ValueError, match=r"quantize_fp8_1x128: index: expected"):
        cute_moe.fp8.quantize_1x128_128x1(x, offs, False, index.long())
    with pytest.raises(ValueError, match=r"index: expected values in \[0, 40\) \(rows of src\), got 40"):
        cute_moe.fp8.quantize_1x128_128x1(x, offs, False, index.clone().fill_(40))
    if cute_moe.library_loaded():
        from torch._subclasses.fake_tensor import FakeTensorMode
        op = torch.ops.cute_moe.quantize_fp8_1x128_128x1
        for a, b in zip(op(x, offs, True, index), want):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        with FakeTensorMode() as mode:
            shapes = [tuple(t.shape) for t in op(mode.from_tensor(x), mode.from_tensor(offs), False,
                                                  mode.from_tensor(index))]
        assert shapes == [(150, 32), (150, 1), (32, 128 * 5), (5, 32)]


def test_quantize_1x128_column_sums_wrapper_on_cpu_and_its_checks():
    """The CPU path: quantize_1x128 of every row and each group's fp32 column sums (padding rows
    quantized, not summed; an empty group's sums zero), the argument checks named as this op's,
    and the op's CPU and fake kernels."""
    import cute_moe
    offs = offsets_from_counts([3, 0, 140])
    x = torch.randn(150, 32).to(torch.bfloat16)  # 7 padding rows
    q, s, sums = cute_moe.fp8.quantize_1x128_column_sums(x, offs)
    rq, rs = fp8.quantize_1x128(x)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    want = torch.stack([x[:3].double().sum(0), torch.zeros(32, dtype=torch.float64), x[3:143].double().sum(0)])
    assert sums.dtype == torch.float32 and torch.allclose(sums.double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"quantize_fp8_1x128_column_sums: x: expected its last "
                                         r"dimension a multiple of 16"):
        cute_moe.fp8.quantize_1x128_column_sums(x[:, :24], offs)
    with pytest.raises(ValueError, match=r"quantize_fp8_1x128_column_sums: offs"):
        cute_moe.fp8.quantize_1x128_column_sums(x, offs.to(torch.int64))
    if cute_moe.library_loaded():  # the op's CPU and fake kernels
        from torch._subclasses.fake_tensor import FakeTensorMode
        op = torch.ops.cute_moe.quantize_fp8_1x128_column_sums
        got = op(x, offs)
        assert torch.equal(got[0].view(torch.uint8), rq.view(torch.uint8)) and torch.equal(got[2], sums)
        with FakeTensorMode() as mode:
            shapes = [tuple(t.shape) for t in op(mode.from_tensor(x), mode.from_tensor(offs))]
        assert shapes == [(150, 32), (150, 1), (3, 32)]


def test_quantize_128x1_tile_scales_one_per_128_columns():
    """tile_scales: one scale per 128 x 128 block (a 128-row block of one group, 128 columns): its
    amax / 448, so each block's largest magnitude maps to 448; the dequantized values within
    e4m3's half step of that scale; the op's CPU kernel and the wrapper agree."""
    import cute_moe
    counts = [0, 130, 5, 0]
    offs = offsets_from_counts(counts)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(sum(counts) + 3, 272, generator=g) * torch.linspace(0.1, 10, 272)).to(torch.bfloat16)
    q_t, s = fp8.quantize_128x1_t(x, offs, tile_scales=True)
    assert tuple(s.shape) == (fp8._blocks(x.shape[0]) + 4, 3)
    deq = fp8.dequantize_128x1_t(q_t, s)
    for start, end, first in fp8.group_row_blocks(offs, x.shape[0]):
        for b, r in enumerate(range(start, end, 128)):
            rows = x[r:min(r + 128, end)].float()
            for j in range(3):
                tile = rows[:, 128 * j:128 * (j + 1)]
                assert s[first + b, j] == tile.abs().max() / 448
                got = deq[128 * j:128 * (j + 1), 128 * (first + b):128 * (first + b) + rows.shape[0]].T
                # half of e4m3's widest step (32 scale units, just below 448), and the fp32 roundings
                assert bool(((got - tile).abs() <= s[first + b, j] * 16 * (1 + 2 ** -16)).all())
    got = cute_moe.fp8.quantize_128x1(x, offs, tile_scales=True)
    assert torch.equal(got[0].view(torch.uint8), q_t.view(torch.uint8)) and torch.equal(got[1], s)
    both = cute_moe.fp8.quantize_1x128_128x1(x, offs, tile_scales=True)
    assert torch.equal(both[2].view(torch.uint8), q_t.view(torch.uint8)) and torch.equal(both[3], s)
    if cute_moe.library_loaded():
        from torch._subclasses.fake_tensor import FakeTensorMode
        op = torch.ops.cute_moe.quantize_fp8_128x1
        assert torch.equal(op(x, offs, True)[1], s)
        with FakeTensorMode() as mode:
            shapes = [tuple(t.shape) for t in op(mode.from_tensor(x), mode.from_tensor(offs), True)]
        assert shapes == [(272, 128 * 6), (6, 3)]

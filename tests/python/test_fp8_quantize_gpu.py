# GPU tests of the FP8 quantizer ops against cute_moe.reference.fp8: the same e4m3 bits and
# the same scales (the kernels compute exactly the reference's fp32 expressions), on shapes
# with partial blocks, all-zero blocks, large and tiny magnitudes, strided rows, batches,
# both outputs of the weight quantizer; and the argument checks. Needs a CUDA device and
# the compiled library.
import pytest
import torch

import cute_moe
from cute_moe import testing
from cute_moe.reference import fp8 as ref

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded"),
]


def _bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


def _data(shape, seed, special=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=g)
    # magnitudes across the range: blocks whose scale is tiny or huge, and exact zeros
    x = x * torch.exp2(torch.randint(-20, 20, shape[:-1] + (1,), device="cuda", generator=g).float())
    if special:
        x.view(-1, shape[-1])[0, :64] = 0.0  # an all-zero block (at least within its half)
        x.view(-1, shape[-1])[-1, :] = 0.0   # an all-zero row: every block of it zero
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("rows,cols", [(1, 16), (7, 128), (300, 2880), (1000, 1040), (33, 4096)])
def test_quantize_1x128_matches_reference(rows, cols):
    x = _data((rows, cols), rows + cols)
    q = torch.full((rows, cols), 0x55, dtype=torch.uint8, device="cuda")  # poison, then drop
    del q
    q, s = torch.ops.cute_moe.quantize_fp8_1x128(x)
    rq, rs = ref.quantize_1x128(x)
    assert q.dtype == ref.FP8_DTYPE and q.shape == (rows, cols)
    assert s.dtype == torch.float32 and s.shape == (rows, (cols + 127) // 128)
    assert torch.equal(s, rs)
    assert torch.equal(_bits(q), _bits(rq))
    # the round trip: within e4m3's half-ulp (2^-4 relative) of each element
    err = (ref.dequantize_1x128(q, s) - x.float()).abs()
    assert torch.all(err <= x.float().abs() * 2.0 ** -4 + s.repeat_interleave(128, 1)[:, :cols] * 2.0 ** -9)


def test_quantize_1x128_strided_rows():
    big = _data((64, 3072), 5)
    x = big[:, :2048]  # row stride 3072
    q, s = torch.ops.cute_moe.quantize_fp8_1x128(x)
    rq, rs = ref.quantize_1x128(x)
    assert torch.equal(s, rs) and torch.equal(_bits(q), _bits(rq))


@pytest.mark.parametrize("e,k,n", [(1, 16, 16), (3, 128, 256), (4, 2880, 768), (2, 400, 1040), (32, 256, 192)])
def test_quantize_128x128_matches_reference(e, k, n):
    w = _data((e, k, n), e * k + n)
    q, s, qt, st = torch.ops.cute_moe.quantize_fp8_128x128(w, True, True)
    rq, rs = ref.quantize_128x128(w)
    kp = (k + 127) // 128 * 128  # q_t's rows padded to whole 128-byte lines
    assert q.shape == (e, k, n) and qt.shape == (e, n, k)
    assert q.is_contiguous() and qt.stride() == (n * kp, kp, 1)
    assert s.shape == (e, (k + 127) // 128, (n + 127) // 128) and st.shape == s.shape[:1] + s.shape[:0:-1]
    assert torch.equal(s, rs) and torch.equal(st, rs.transpose(-2, -1))
    assert torch.equal(_bits(q), _bits(rq))
    assert torch.equal(_bits(qt), _bits(rq).transpose(-2, -1))
    # one output alone is the same
    q1, s1, qt1, st1 = torch.ops.cute_moe.quantize_fp8_128x128(w, False, True)
    assert q1.numel() == 0 and s1.numel() == 0
    assert torch.equal(_bits(qt1), _bits(qt)) and torch.equal(st1, st)
    q2, s2, qt2, _ = torch.ops.cute_moe.quantize_fp8_128x128(w)
    assert torch.equal(_bits(q2), _bits(q)) and torch.equal(s2, s) and qt2.numel() == 0


def test_quantize_128x128_strided_batches():
    big = _data((3, 256, 384), 9)
    w = big[:, :, :256]  # row stride 384
    q, s, qt, st = torch.ops.cute_moe.quantize_fp8_128x128(w, True, True)
    rq, rs = ref.quantize_128x128(w)
    assert torch.equal(s, rs) and torch.equal(_bits(q), _bits(rq))
    assert torch.equal(_bits(qt), _bits(rq).transpose(-2, -1))


def test_public_wrappers_and_no_host_sync():
    x = _data((256, 512), 3)
    w = _data((4, 256, 512), 4)
    torch.cuda.set_sync_debug_mode("error")
    try:
        q, s = cute_moe.fp8.quantize_1x128(x)
        wq = cute_moe.fp8.quantize_128x128(w, transposed=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(_bits(q), _bits(ref.quantize_1x128(x)[0]))
    assert torch.equal(_bits(wq[2]), _bits(ref.quantize_128x128(w)[0]).transpose(-2, -1))


@pytest.mark.parametrize("make,message", [
    (lambda: torch.zeros(4, 40, dtype=torch.bfloat16, device="cuda"), "multiple of 16"),
    (lambda: torch.zeros(4, 64, dtype=torch.float16, device="cuda"), "BFloat16"),
    (lambda: torch.zeros(64, 4, dtype=torch.bfloat16, device="cuda").t(), "unit stride"),
])
def test_quantize_1x128_rejects_bad_input(make, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.cute_moe.quantize_fp8_1x128(make())


@pytest.mark.parametrize("src_rows,rows", [(1, 1), (300, 900), (1000, 97), (64, 0)])
def test_quantize_1x128_gathers_rows(src_rows, rows):
    """With an index the kernel reads row index[r] of x: the bits of quantize_1x128(x[index])
    (repeats, any order; the combine's backward gathers dy this way)."""
    x = _data((src_rows, 2880), src_rows + rows)
    g = torch.Generator(device="cuda").manual_seed(rows)
    index = torch.randint(0, src_rows, (rows,), device="cuda", generator=g, dtype=torch.int32)
    q, s = torch.ops.cute_moe.quantize_fp8_1x128(x, index)
    rq, rs = ref.quantize_1x128(x[index.long()])
    assert q.shape == (rows, 2880) and s.shape == (rows, 23)
    assert torch.equal(s, rs) and torch.equal(_bits(q), _bits(rq))
    pub = cute_moe.fp8.quantize_1x128(x, index)
    assert torch.equal(_bits(pub[0]), _bits(q)) and torch.equal(pub[1], s)


def test_quantize_1x128_index_rules():
    x = torch.zeros(8, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match=r"index must be Int"):
        torch.ops.cute_moe.quantize_fp8_1x128(x, torch.zeros(4, dtype=torch.int64, device="cuda"))
    with pytest.raises(RuntimeError, match=r"index must be a CUDA tensor"):
        torch.ops.cute_moe.quantize_fp8_1x128(x, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"index must be contiguous"):
        torch.ops.cute_moe.quantize_fp8_1x128(x, torch.zeros(8, dtype=torch.int32, device="cuda")[::2])


@pytest.mark.parametrize("bad", ["[0, 1, 2, 8]", "[0, -1, 2, 3]"], ids=["past-end", "negative"])
def test_quantize_1x128_invalid_index_stops_the_kernel_with_a_message(bad):
    # printed and trapped on the device, as the permute kernels do: in a child process
    out = testing.device_trap_output(f"""
        x = torch.randn(8, 128, device="cuda", dtype=torch.bfloat16)
        index = torch.tensor({bad}, device="cuda", dtype=torch.int32)
    """, "torch.ops.cute_moe.quantize_fp8_1x128(x, index)")
    assert "cute_moe quantize_fp8_1x128: invalid index at position" in out, out
    assert "not a row of src, which has 8 rows" in out, out


def test_quantize_128x128_rejects_bad_input():
    w = torch.zeros(2, 48, 40, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="multiple of 16"):
        torch.ops.cute_moe.quantize_fp8_128x128(w)
    with pytest.raises(RuntimeError, match="ask for q"):
        torch.ops.cute_moe.quantize_fp8_128x128(torch.zeros(2, 48, 48, dtype=torch.bfloat16, device="cuda"),
                                                False, False)


# --- quantize_fp8_128x1: the weight gradients' operands, transposed and blocked per group ---

def _offs(counts):
    return torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)


@pytest.mark.parametrize("counts,pad,cols", [
    ([300, 0, 517, 180], 3, 2880),     # GPT-OSS-like: partial blocks, an empty group
    ([0, 0, 1, 127, 128, 129], 0, 16),  # block edges, empty groups first
    ([0, 0], 9, 48),                     # no routed rows: every block unused
    ([1000], 0, 1040),                   # one group, a partial column tile
])
@pytest.mark.parametrize("tile_scales", [False, True], ids=["", "tile_scales"])
def test_quantize_128x1_matches_reference(counts, pad, cols, tile_scales):
    m = sum(counts) + pad
    x = _data((m, cols), m + cols, special=m > 0)
    x[sum(counts):] = float("nan")  # padding rows: never read
    offs = _offs(counts)
    q_t, s = torch.ops.cute_moe.quantize_fp8_128x1(x, offs, tile_scales)
    rq, rs = ref.quantize_128x1_t(x, offs, tile_scales)  # reads the groups' rows only
    blocks = (m + 127) // 128 + len(counts)
    assert q_t.dtype == ref.FP8_DTYPE and q_t.shape == (cols, 128 * blocks)
    assert s.shape == (blocks, (cols + 127) // 128 if tile_scales else cols)
    assert torch.equal(s, rs) and torch.equal(_bits(q_t), _bits(rq))
    used = sum((c + 127) // 128 for c in counts)  # blocks past these: zeros, scale 1
    assert bool((s[used:] == 1).all()) and bool((_bits(q_t[:, 128 * used:]) == 0).all())


def test_quantize_128x1_many_groups_and_strided_rows():
    counts = [int(c) for c in torch.randint(0, 300, (200,), generator=torch.Generator().manual_seed(8))]
    big = _data((sum(counts), 384), 9, special=False)
    x = big[:, :256]  # row stride 384
    offs = _offs(counts)
    q_t, s = cute_moe.fp8.quantize_128x1(x, offs)
    rq, rs = ref.quantize_128x1_t(x, offs)
    assert torch.equal(s, rs) and torch.equal(_bits(q_t), _bits(rq))
    torch.cuda.set_sync_debug_mode("error")
    try:
        cute_moe.fp8.quantize_128x1(x, offs)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_quantize_128x1_rejects_bad_input():
    x = torch.zeros(40, 48, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="multiple of 16"):
        torch.ops.cute_moe.quantize_fp8_128x1(x[:, :40], _offs([40]))
    with pytest.raises(RuntimeError, match="offs must be"):
        torch.ops.cute_moe.quantize_fp8_128x1(x, _offs([20, 20]).to(torch.int64))


@pytest.mark.parametrize("counts,pad,cols", [
    ([300, 0, 517, 180], 3, 2880),     # GPT-OSS-like: partial blocks, an empty group
    ([0, 0, 1, 127, 128, 129], 0, 16),  # block edges, empty groups first
    ([0, 0], 9, 48),                     # no routed rows: every row is padding
    ([5, 0], 700, 144),                  # padding rows over many of the unused blocks
    ([1] * 64, 2000, 32),                # 64 one-row groups, then 2000 padding rows
    ([1000], 0, 1040),                   # one group, a partial column tile
])
@pytest.mark.parametrize("tile_scales", [False, True], ids=["", "tile_scales"])
def test_quantize_1x128_128x1_is_both_quantizers(counts, pad, cols, tile_scales):
    """One read, both copies: the bits of quantize_fp8_1x128 (every row, padding rows too) and
    of quantize_fp8_128x1."""
    m = sum(counts) + pad
    x = _data((m, cols), 7 * m + cols, special=m > 0)
    offs = _offs(counts)
    q, s, q_t, s_t = torch.ops.cute_moe.quantize_fp8_1x128_128x1(x, offs, tile_scales)
    rq, rs = torch.ops.cute_moe.quantize_fp8_1x128(x)
    rq_t, rs_t = torch.ops.cute_moe.quantize_fp8_128x1(x, offs, tile_scales)
    assert torch.equal(s, rs) and torch.equal(_bits(q), _bits(rq))
    assert torch.equal(s_t, rs_t) and torch.equal(_bits(q_t), _bits(rq_t))
    want = ref.quantize_1x128(x) + ref.quantize_128x1_t(x, offs, tile_scales)
    got = cute_moe.fp8.quantize_1x128_128x1(x, offs, tile_scales)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(_bits(a) if a.dtype == ref.FP8_DTYPE else a, _bits(b) if b.dtype == ref.FP8_DTYPE else b)


@pytest.mark.parametrize("src_rows,counts,pad,cols", [
    (900, [300, 0, 517, 180], 3, 2880),  # GPT-OSS-like, rows repeated (top-k) in any order
    (5, [0, 0, 1, 127, 128, 129], 0, 16),  # block edges; few source rows, each many times
    (64, [0, 0], 9, 48),                   # no routed rows: every row is padding
    (64, [0, 0], 0, 48),                   # an empty index: no rows at all
    (1, [1] * 64, 2000, 32),               # 64 one-row groups, then 2000 padding rows
])
@pytest.mark.parametrize("tile_scales", [False, True], ids=["", "tile_scales"])
def test_quantize_1x128_128x1_gathers_rows(src_rows, counts, pad, cols, tile_scales):
    """With an index the pass reads row index[r] of x for both copies: the bits of
    quantize_fp8_1x128_128x1(x[index]) (the FP8 weight gradient's x under a fused gather)."""
    m = sum(counts) + pad
    x = _data((src_rows, cols), 5 * m + cols, special=True)
    g = torch.Generator(device="cuda").manual_seed(m + cols)
    index = torch.randint(0, src_rows, (m,), device="cuda", generator=g, dtype=torch.int32)
    offs = _offs(counts)
    sorted_rows = x[index.long()]
    want = torch.ops.cute_moe.quantize_fp8_1x128_128x1(sorted_rows, offs, tile_scales)
    outs = [torch.ops.cute_moe.quantize_fp8_1x128_128x1(x, offs, tile_scales, index),
            cute_moe.fp8.quantize_1x128_128x1(x, offs, tile_scales, index)]
    ref_outs = ref.quantize_1x128(sorted_rows) + ref.quantize_128x1_t(sorted_rows, offs, tile_scales)
    for got in outs:
        for a, b, r in zip(got, want, ref_outs):
            assert a.dtype == b.dtype and a.shape == b.shape == r.shape
            if a.dtype == ref.FP8_DTYPE:
                assert torch.equal(_bits(a), _bits(b)) and torch.equal(_bits(a), _bits(r))
            else:
                assert torch.equal(a, b) and torch.equal(a, r)
    torch.cuda.set_sync_debug_mode("error")  # no host sync with the index either
    try:
        cute_moe.fp8.quantize_1x128_128x1(x, offs, tile_scales, index)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_quantize_1x128_128x1_index_rules():
    x = torch.zeros(8, 128, dtype=torch.bfloat16, device="cuda")
    offs = _offs([4])
    op = torch.ops.cute_moe.quantize_fp8_1x128_128x1
    with pytest.raises(RuntimeError, match=r"index must be Int"):
        op(x, offs, False, torch.zeros(4, dtype=torch.int64, device="cuda"))
    with pytest.raises(RuntimeError, match=r"index must be a CUDA tensor"):
        op(x, offs, False, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"index must be contiguous"):
        op(x, offs, False, torch.zeros(8, dtype=torch.int32, device="cuda")[::2])


@pytest.mark.parametrize("bad", ["[0, 1, 2, 8]", "[0, -1, 2, 3]"], ids=["past-end", "negative"])
def test_quantize_1x128_128x1_invalid_index_stops_the_kernel_with_a_message(bad):
    # a padding row's index too (row 3 is past offs[-1] = 3): every row read is checked
    out = testing.device_trap_output(f"""
        x = torch.randn(8, 128, device="cuda", dtype=torch.bfloat16)
        index = torch.tensor({bad}, device="cuda", dtype=torch.int32)
        offs = torch.tensor([2, 3], device="cuda", dtype=torch.int32)
    """, "torch.ops.cute_moe.quantize_fp8_1x128_128x1(x, offs, False, index)")
    assert "cute_moe quantize_fp8_1x128_128x1: invalid index at position" in out, out
    assert "not a row of src, which has 8 rows" in out, out


@pytest.mark.parametrize("counts,pad,cols", [
    ([300, 0, 517, 180], 3, 2880),     # GPT-OSS-like: partial blocks, an empty group
    ([0, 0, 1, 127, 128, 129], 0, 16),  # block edges, empty groups first, one column block
    ([0, 0], 9, 48),                     # no routed rows: every row is padding, every sum zero
    ([5, 0], 700, 1168),                 # padding rows over many chunks; 9 blocks and a half
    ([1] * 64, 2000, 32),                # 64 one-row groups, then 2000 padding rows
    ([1000], 0, 5760),                   # one group, the up projection's width
])
def test_quantize_1x128_column_sums_is_both_ops(counts, pad, cols):
    """One read of x: the bits of quantize_fp8_1x128 (every row, padding rows too) and of
    grouped_column_sum (each group's rows summed in the same fixed order), and close to the
    fp64 sums."""
    m = sum(counts) + pad
    x = _data((m, cols), 3 * m + cols, special=m > 0)
    offs = _offs(counts)
    q, s, sums = torch.ops.cute_moe.quantize_fp8_1x128_column_sums(x, offs)
    rq, rs = torch.ops.cute_moe.quantize_fp8_1x128(x)
    assert q.dtype == ref.FP8_DTYPE and q.shape == (m, cols) and s.shape == rs.shape
    assert torch.equal(s, rs) and torch.equal(_bits(q), _bits(rq))
    assert sums.dtype == torch.float32 and sums.shape == (len(counts), cols)
    assert torch.equal(sums, torch.ops.cute_moe.grouped_column_sum(x, offs))
    want = torch.zeros(len(counts), cols, dtype=torch.float64, device="cuda")
    begin = 0
    for g, c in enumerate(counts):
        want[g] = x[begin:begin + c].double().sum(0)
        begin += c
    scale = x.double().abs().sum(0).clamp_min(1e-30)
    assert float(((sums.double() - want).abs() / scale).max()) < 1e-5
    got = cute_moe.fp8.quantize_1x128_column_sums(x, offs)  # the public wrapper: no host sync
    assert all(torch.equal(a.view(torch.uint8) if a.dtype == ref.FP8_DTYPE else a,
                           b.view(torch.uint8) if b.dtype == ref.FP8_DTYPE else b)
               for a, b in zip(got, (q, s, sums)))


def test_quantize_1x128_column_sums_no_host_sync_and_bad_input():
    x = _data((4000, 1024), 11, special=False)
    offs = _offs([1000, 0, 2500, 400])
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.ops.cute_moe.quantize_fp8_1x128_column_sums(x, offs)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        torch.ops.cute_moe.quantize_fp8_1x128_column_sums(x[:, :1000], offs)
    with pytest.raises(RuntimeError, match="offs must be"):
        torch.ops.cute_moe.quantize_fp8_1x128_column_sums(x, offs.to(torch.int64))
    with pytest.raises(RuntimeError, match="x must be"):
        torch.ops.cute_moe.quantize_fp8_1x128_column_sums(x.float(), offs)
    with pytest.raises(ValueError, match="1 to 65536 groups"):
        cute_moe.fp8.quantize_1x128_column_sums(x, offs[:0])


def _naive_disagrees(x: torch.Tensor, scale: torch.Tensor) -> int:
    """Elements whose x * (1 / scale) converts to another e4m3 value than x / scale."""
    def e4m3(v):
        return v.clamp(-448, 448).to(ref.FP8_DTYPE).view(torch.uint8)
    return int((e4m3(x * (1.0 / scale)) != e4m3(x / scale)).sum())


def test_quantizers_divide_where_a_reciprocal_would_round_otherwise():
    """x / scale, not x * (1 / scale): on these 2^25 elements the product converts to another
    e4m3 value in dozens of places (counted here, near e4m3's rounding midpoints), and every
    quantizer gives the reference's bits (a guard for any faster conversion; session 14 tried
    one with an exact fallback near the midpoints, bit-exact but slower)."""
    g = torch.Generator(device="cuda").manual_seed(7)
    rows, cols = 16384, 2048
    x = torch.randn(rows, cols, device="cuda", generator=g)
    x = (x * torch.exp2(torch.randint(-8, 8, (rows, 1), device="cuda", generator=g).float())).bfloat16()
    q, s = torch.ops.cute_moe.quantize_fp8_1x128(x)
    rq, rs = ref.quantize_1x128(x)
    assert torch.equal(s, rs) and torch.equal(_bits(q), _bits(rq))
    blocks = x.float().view(rows, cols // 128, 128)
    assert _naive_disagrees(blocks, rs.view(rows, cols // 128, 1)) >= 5
    w = x.view(8, 2048, 2048)
    q, s, qt, st = torch.ops.cute_moe.quantize_fp8_128x128(w, True, True)
    rq, rs = ref.quantize_128x128(w)
    assert torch.equal(s, rs) and torch.equal(_bits(q), _bits(rq))
    assert torch.equal(_bits(qt), _bits(rq).transpose(-2, -1))
    offs = _offs([5000, 0, 7000, 4384])
    q_t, s = torch.ops.cute_moe.quantize_fp8_128x1(x, offs)
    rq, rs = ref.quantize_128x1_t(x, offs)
    assert torch.equal(s, rs) and torch.equal(_bits(q_t), _bits(rq))


def test_quantizers_keep_the_sign_of_zero():
    """-0 quantizes to e4m3's -0 (0x80), +0 to 0x00, in every quantizer: the division's
    correction step keeps a zero's sign without a copysign (fp8_block_math.cuh)."""
    g = torch.Generator(device="cuda").manual_seed(11)
    rows, cols = 384, 256
    x = torch.randn(rows, cols, device="cuda", generator=g).bfloat16()
    zeros = torch.rand(rows, cols, device="cuda", generator=g) < 0.25
    signs = torch.rand(rows, cols, device="cuda", generator=g) < 0.5
    zeros[:128, :128] = signs[:128, :128] = True  # a whole block of -0: amax 0, scale 1
    x = torch.where(zeros, torch.where(signs, -0.0, 0.0).bfloat16(), x)
    assert bool(torch.signbit(x[zeros & signs]).all()) and not bool(torch.signbit(x[zeros & ~signs]).any())
    offs = _offs([200, 0, 184])
    q, s = torch.ops.cute_moe.quantize_fp8_1x128(x)
    rq, rs = ref.quantize_1x128(x)
    assert torch.equal(s, rs) and torch.equal(_bits(q), _bits(rq))
    assert bool((_bits(q)[zeros & signs] == 0x80).all()) and bool((_bits(q)[zeros & ~signs] == 0).all())
    for tile_scales in (False, True):
        q, s, q_t, s_t = torch.ops.cute_moe.quantize_fp8_1x128_128x1(x, offs, tile_scales)
        rq_t, rs_t = ref.quantize_128x1_t(x, offs, tile_scales)
        assert torch.equal(_bits(q), _bits(rq))
        assert torch.equal(s_t, rs_t) and torch.equal(_bits(q_t), _bits(rq_t))
    w = x.view(3, 128, 256)
    q, s, qt, st = torch.ops.cute_moe.quantize_fp8_128x128(w, True, True)
    rq, rs = ref.quantize_128x128(w)
    assert torch.equal(s, rs) and torch.equal(_bits(q), _bits(rq))
    assert torch.equal(_bits(qt), _bits(rq).transpose(-2, -1))

# The FP8 ragged-M grouped GEMM on the CPU (cute_moe.fp8.grouped_mm's fallback, the op's
# reference): against a float64 loop written apart from it, padding rows and empty groups,
# both layouts of the weight's scales, and every argument rule of cute_moe::grouped_mm_fp8
# (the checks the fallback, the fake and the CPU kernels share). The op's CPU and fake
# kernels themselves need the op library (skipped without it).
import math

import pytest
import torch

import cute_moe
from cute_moe.ops.fp8 import check_grouped_mm_fp8_args, reference_grouped_mm_fp8
from cute_moe.reference import fp8 as ref

from fp8_gemm_cases import BF16, check_output, expected, magnitude, make_problem

F32 = torch.float32


def naive64(p):
    """y[r] = row_scale[r] * (sum_c x[r, c] xs[r, c // 128] w[e, c, j] ws[e, c // 128, j // 128]
    + bias[e, j]) in float64, group by group; padding rows zero."""
    m, k = p.x.shape
    num_groups, _, n = p.w.shape
    xs = p.x_scale.double().repeat_interleave(128, dim=1)[:, :k]
    ws = p.w_scale.double().repeat_interleave(128, dim=1).repeat_interleave(128, dim=2)[:, :k, :n]
    y = torch.zeros(m, n, dtype=torch.float64)
    start = 0
    for e, end in enumerate(p.offs.tolist()):
        for r in range(start, end):
            row = (p.x[r].double() * xs[r]) @ (p.w[e].double() * ws[e])
            if p.bias is not None:
                row = row + p.bias[e].double()
            y[r] = row * (p.row_scale[r].double() if p.row_scale is not None else 1.0)
        start = end
    return y


@pytest.mark.parametrize("counts,k,n,pad", [
    ([7, 0, 12, 5], 256, 128, 3),     # whole blocks, an empty group, padding rows
    ([0, 9, 0, 6, 0], 80, 200, 4),    # one short k-block, n not a multiple of 128; first and last empty
    ([13], 208, 24, 0),               # one group, k = 1.625 blocks, n a multiple of 8 only
    ([3, 4], 16, 8, 1),               # the smallest k and n
])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("row_scale", [False, True])
def test_fallback_matches_float64(counts, k, n, pad, bias, row_scale):
    p = make_problem(counts, k, n, pad=pad, bias=bias, row_scale=row_scale, seed=k + n + pad)
    out = cute_moe.fp8.grouped_mm(*p.args())
    ref32 = expected(p)
    # the fp32 reference within fp32 rounding of the float64 sums; the fallback is it, rounded once
    y64 = naive64(p)
    assert bool((ref32.double() - y64).abs().le(magnitude(p).double() * 1e-6).all())
    assert torch.equal(out, ref32.to(BF16))
    assert torch.equal(reference_grouped_mm_fp8(*p.args()), out)
    check_output(out, p, ref32)


def test_scale_layouts_and_weight_copies_agree():
    # w_scale as the weight's own scale or as the transposed view of the (E, n, k) copy's;
    # w as the transposed view of q_t or of a strided (E, n, k) tensor with padded rows
    a = make_problem([5, 0, 11], 272, 136, pad=2, bias=True, row_scale=True, seed=3)
    b = make_problem([5, 0, 11], 272, 136, pad=2, bias=True, row_scale=True, seed=3, w_scale="t")
    assert a.w_scale.is_contiguous() and not b.w_scale.is_contiguous()
    assert torch.equal(a.w_scale, b.w_scale)
    out = cute_moe.fp8.grouped_mm(*a.args())
    assert torch.equal(out, cute_moe.fp8.grouped_mm(*b.args()))
    q_t = a.w.transpose(-2, -1)
    padded = torch.zeros(q_t.shape[:-1] + (q_t.shape[-1] + 16,), dtype=torch.uint8).view(ref.FP8_DTYPE)
    padded[..., :q_t.shape[-1]] = q_t
    w = padded[..., :q_t.shape[-1]].transpose(-2, -1)  # row pitch k + 16
    assert w.stride() == (q_t.shape[1] * (q_t.shape[2] + 16), 1, q_t.shape[2] + 16)
    out_w = cute_moe.fp8.grouped_mm(a.x, a.x_scale, w, a.w_scale, a.offs, a.bias, a.row_scale)
    assert torch.equal(out, out_w)


def test_padding_rows_and_empty_groups():
    p = make_problem([0, 6, 0, 0, 9, 0], 144, 64, pad=7, bias=True, row_scale=True, seed=5)
    out = cute_moe.fp8.grouped_mm(*p.args())  # padding rows of x, x_scale and row_scale are NaN
    check_output(out, p)
    assert bool((out[15:] == 0).all())
    # every row padding; no rows at all
    p = make_problem([0, 0, 0], 64, 32, pad=10, bias=True, row_scale=True, seed=6)
    out = cute_moe.fp8.grouped_mm(*p.args())
    assert out.shape == (10, 32) and bool((out == 0).all())
    p = make_problem([0, 0], 64, 32, bias=True, seed=7)
    out = cute_moe.fp8.grouped_mm(*p.args())
    assert out.shape == (0, 32) and out.dtype == BF16


def test_row_scale_multiplies_the_biased_result():
    p = make_problem([4, 5], 128, 16, bias=True, row_scale=True, seed=8)
    unscaled = reference_grouped_mm_fp8(p.x, p.x_scale, p.w, p.w_scale, p.offs, p.bias, out_dtype=F32)
    scaled = reference_grouped_mm_fp8(*p.args(), out_dtype=F32)
    assert torch.equal(scaled, unscaled * p.row_scale[:, None])


# ---- argument checks ------------------------------------------------------------------------------

M, K, N, E = 12, 208, 24, 3  # k = 1.625 blocks: ceil(k / 128) = 2, ceil(n / 128) = 1


def _args():
    p = make_problem([4, 0, 6], K, N, pad=2, bias=True, row_scale=True, seed=9)
    return dict(x=p.x, x_scale=p.x_scale, w=p.w, w_scale=p.w_scale, offs=p.offs, bias=p.bias,
                row_scale=p.row_scale)


def _fp8(*shape):
    return torch.randn(*shape).to(ref.FP8_DTYPE)


def _strided_rows(rows, cols, pitch):
    return _fp8(rows, pitch)[:, :cols]


def _w_with_group_stride(stride0):
    buf = torch.randn(E * stride0).to(ref.FP8_DTYPE)
    return buf.as_strided((E, K, N), (stride0, 1, K))


BAD = {
    # x
    "x not a tensor": (dict(x=[[0.0]]), r"x: expected a tensor"),
    "x bf16": (dict(x=torch.randn(M, K).to(BF16)), r"x: expected dtype torch.float8_e4m3fn"),
    "x e5m2": (dict(x=torch.randn(M, K).to(torch.float8_e5m2)), r"x: expected dtype torch.float8_e4m3fn"),
    "x 3-D": (dict(x=_fp8(1, M, K)), r"x: expected a 2-D tensor"),
    "x columns": (dict(x=_fp8(M, K - 16)), r"x: expected 208 columns \(w.shape\[1\], k\)"),
    "x column stride": (dict(x=_fp8(K, M).t()), r"x: expected unit stride along k"),
    "x row stride": (dict(x=_strided_rows(M, K, K + 8)),
                     r"x: expected a row stride that is a multiple of 16"),
    # w
    "w bf16": (dict(w=torch.randn(E, N, K).to(BF16).transpose(-2, -1)),
               r"w: expected dtype torch.float8_e4m3fn"),
    "w 2-D": (dict(w=_fp8(N, K).t()), r"w: expected a 3-D tensor"),
    "w no groups": (dict(w=_fp8(0, N, K).transpose(-2, -1)), r"w: expected 1 to 65536 groups"),
    "w row-major": (dict(w=_fp8(E, K, N)), r"w: expected w.stride\(1\) == 1, k-contiguous"),
    "w row pitch": (dict(w=_fp8(E, N, K + 8)[..., :K].transpose(-2, -1)),
                    r"w: expected w.stride\(2\) \(its row pitch\) a multiple of 16"),
    "w group stride": (dict(w=_w_with_group_stride(N * K + 8)),
                       r"w: expected w.stride\(0\) a non-negative multiple of 16"),
    # x_scale, w_scale
    "x_scale bf16": (dict(x_scale=torch.ones(M, 2, dtype=BF16)), r"x_scale: expected dtype torch.float32"),
    "x_scale blocks": (dict(x_scale=torch.ones(M, 1)), r"x_scale: expected shape \(12, 2\)"),
    "x_scale rows": (dict(x_scale=torch.ones(M + 1, 2)), r"x_scale: expected shape \(12, 2\)"),
    "x_scale 1-D": (dict(x_scale=torch.ones(M * 2)), r"x_scale: expected a 2-D tensor"),
    "w_scale bf16": (dict(w_scale=torch.ones(E, 2, 1, dtype=BF16)), r"w_scale: expected dtype torch.float32"),
    "w_scale (E, n, k) blocks": (dict(w_scale=torch.ones(E, 1, 2)), r"w_scale: expected shape \(3, 2, 1\)"),
    "w_scale groups": (dict(w_scale=torch.ones(E + 1, 2, 1)), r"w_scale: expected shape \(3, 2, 1\)"),
    # offs
    "offs int64": (dict(offs=torch.tensor([4, 4, 10])), r"offs: expected dtype torch.int32"),
    "offs length": (dict(offs=torch.tensor([4, 10], dtype=torch.int32)), r"offs: expected length 3"),
    "offs 2-D": (dict(offs=torch.tensor([[4, 4, 10]], dtype=torch.int32)), r"offs: expected a 1-D tensor"),
    # bias, row_scale
    "bias shape": (dict(bias=torch.zeros(E, N + 8, dtype=BF16)), r"bias: expected shape \(3, 24\)"),
    "bias per-row": (dict(bias=torch.zeros(M, N, dtype=BF16)), r"bias: expected shape \(3, 24\)"),
    "bias fp32": (dict(bias=torch.zeros(E, N)), r"bias: expected dtype torch.bfloat16"),
    "bias column stride": (dict(bias=torch.zeros(N, E, dtype=BF16).t()),
                           r"bias: expected unit stride along n"),
    "bias row stride": (dict(bias=torch.zeros(E, N + 4, dtype=BF16)[:, :N]),
                        r"bias: expected a row stride that is a multiple of 8"),
    "row_scale length": (dict(row_scale=torch.ones(M + 1)), r"row_scale: expected shape \(12,\)"),
    "row_scale per-group": (dict(row_scale=torch.ones(E)), r"row_scale: expected shape \(12,\)"),
    "row_scale bf16": (dict(row_scale=torch.ones(M, dtype=BF16)), r"row_scale: expected torch.float32"),
    "row_scale strided": (dict(row_scale=torch.ones(2 * M)[::2]), r"row_scale: expected a contiguous tensor"),
    # another device (meta stands in for a GPU)
    "offs on meta": (dict(offs=torch.empty(E, dtype=torch.int32, device="meta")),
                     r"offs: expected a tensor on x's device cpu"),
    "w_scale on meta": (dict(w_scale=torch.empty(E, 2, 1, device="meta")),
                        r"w_scale: expected a tensor on x's device"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_argument_checks(case):
    change, message = BAD[case]
    args = dict(_args(), **change)
    with pytest.raises((ValueError, TypeError), match=message):
        cute_moe.fp8.grouped_mm(**args)
    with pytest.raises((ValueError, TypeError), match=r"^cute_moe\.grouped_mm_fp8: " + message):
        check_grouped_mm_fp8_args(**args)


def test_k_not_a_multiple_of_16():
    p = make_problem([4, 6], 48, 16, seed=10)
    x = _fp8(10, 40)
    w = _fp8(2, 16, 40).transpose(-2, -1)
    with pytest.raises(ValueError, match=r"x: expected k = x.shape\[1\] a positive multiple of 16"):
        cute_moe.fp8.grouped_mm(x, torch.ones(10, 1), w, torch.ones(2, 1, 1), p.offs)
    w = _fp8(2, 20, 48).transpose(-2, -1)  # n = 20
    with pytest.raises(ValueError, match=r"w: expected n = w.shape\[2\] a positive multiple of 8"):
        cute_moe.fp8.grouped_mm(p.x, p.x_scale, w, torch.ones(2, 1, 1), p.offs)


def test_accepted_layouts():
    """What the rules let through: strides along dimensions of size 1, scales of any
    non-negative strides (broadcast ones too), a padded row pitch of x."""
    a = _args()
    kb = math.ceil(K / 128)
    ok = [
        dict(x_scale=a["x_scale"].t().contiguous().t()),                 # column-major scales
        dict(x_scale=torch.ones(1, kb).expand(M, kb)),                    # stride 0
        dict(w_scale=torch.ones(1, kb, 1).expand(E, kb, 1)),
        dict(x=torch.cat([a["x"].view(torch.uint8), torch.zeros(M, 16, dtype=torch.uint8)], 1)
             .view(ref.FP8_DTYPE)[:, :K]),                                # row pitch k + 16
        dict(bias=None, row_scale=None),
    ]
    for change in ok:
        check_grouped_mm_fp8_args(**dict(a, **change))
    one = make_problem([1], 32, 16, row_scale=True, seed=11)
    x = _fp8(1, 48)[:, :32]                                               # one row: any row stride
    w = _fp8(1, 16, 32).transpose(-2, -1).as_strided((1, 32, 16), (7, 1, 32))  # one group: any group stride
    check_grouped_mm_fp8_args(x, one.x_scale, w, one.w_scale, one.offs, None, torch.ones(2)[::2])
    check_grouped_mm_fp8_args(_fp8(0, 32), torch.ones(0, 1), one.w, one.w_scale,
                              torch.zeros(1, dtype=torch.int32))


# ---- the op's CPU and fake kernels (need the op library) -------------------------------------------

needs_ops = pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded")


@needs_ops
def test_op_schema_and_cpu_kernel():
    op = torch.ops.cute_moe.grouped_mm_fp8
    assert str(op.default._schema) == (
        "cute_moe::grouped_mm_fp8(Tensor x, Tensor x_scale, Tensor w, Tensor w_scale, Tensor offs, "
        "Tensor? bias=None, Tensor? row_scale=None) -> Tensor")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("cute_moe::grouped_mm_fp8", "CPU")
    p = make_problem([0, 6, 9], 80, 200, pad=3, bias=True, row_scale=True, seed=12)
    assert torch.equal(op(*p.args()), cute_moe.fp8.grouped_mm(*p.args()))
    q = make_problem([5, 2], 128, 16, pad=1, seed=13)
    assert torch.equal(op(q.x, q.x_scale, q.w, q.w_scale, q.offs), expected(q).to(BF16))
    with pytest.raises(ValueError, match=r"w: expected w.stride\(1\) == 1"):
        op(q.x, q.x_scale, q.w.contiguous(), q.w_scale, q.offs)


@needs_ops
def test_op_fake_kernel_and_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode
    p = make_problem([4, 0, 6], K, N, pad=2, bias=True, row_scale=True, seed=14)
    with FakeTensorMode() as mode:
        args = [mode.from_tensor(t) if t is not None else None for t in p.args()]
        y = torch.ops.cute_moe.grouped_mm_fp8(*args)
        y2 = torch.ops.cute_moe.grouped_mm_fp8(*args[:5])
        with pytest.raises(ValueError, match=r"x_scale: expected shape"):
            torch.ops.cute_moe.grouped_mm_fp8(args[0], args[1][:, :1], *args[2:])
    for out in (y, y2):
        assert (tuple(out.shape), out.dtype, out.is_contiguous()) == ((M, N), BF16, True)
    # the op traced through its fake kernel (cute_moe.fp8.grouped_mm calls it on CUDA tensors
    # only: on the CPU it is the reference, which reads offs on the host)
    compiled = torch.compile(torch.ops.cute_moe.grouped_mm_fp8, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*p.args()), cute_moe.fp8.grouped_mm(*p.args()))

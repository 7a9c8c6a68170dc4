# The FP8 weight-gradient GEMM on the CPU (cute_moe.fp8.grouped_mm_wgrad's fallback, the op's
# reference): against a float64 loop over the untransposed 128 x 1 quantization, groups around
# the block edges and empty ones, and every argument rule of cute_moe::grouped_mm_fp8_wgrad
# (the checks the fallback, the fake and the CPU kernels share). The op's CPU and fake kernels
# themselves need the op library (skipped without it).
import pytest
import torch

import cute_moe
from cute_moe.ops.fp8 import check_grouped_mm_fp8_wgrad_args
from cute_moe.reference import fp8 as ref

from fp8_wgrad_cases import BF16, check_wgrad, make_wgrad_problem


def naive64(p):
    """dw[e] = sum over e's rows r of deq(x)[r]^T deq(dy)[r] in float64, from the untransposed
    quantizations (cute_moe.reference.fp8.quantize_128x1: x by 128 x 1 blocks, dy by 128 x 128),
    group by group."""
    m = p.x.shape[0]
    xq, xs = ref.quantize_128x1(p.x, p.offs)
    dq, ds = ref.quantize_128x1(p.dy, p.offs, tile_scales=True)
    ds = ds.repeat_interleave(128, dim=1)[:, :p.dy.shape[1]]
    dw = torch.zeros(len(p.counts), p.x.shape[1], p.dy.shape[1], dtype=torch.float64)
    for e, (start, end, first) in enumerate(ref.group_row_blocks(p.offs, m)):
        for r in range(start, end):
            block = first + (r - start) // 128
            dw[e] += torch.outer(xq[r].double() * xs[block].double(), dq[r].double() * ds[block].double())
    return dw


@pytest.mark.parametrize("counts,k,n,pad", [
    ([7, 0, 130, 5], 48, 32, 3),       # a group over a block edge, an empty one, padding rows
    ([0, 128, 0, 129, 0], 16, 64, 0),  # whole blocks, first and last groups empty
    ([300], 32, 16, 1),                # one group, three blocks
    ([0, 0], 16, 16, 4),               # every group empty
])
def test_fallback_matches_float64(counts, k, n, pad):
    p = make_wgrad_problem(counts, k, n, pad=pad, seed=k + n)
    out = cute_moe.fp8.grouped_mm_wgrad(*p.args())
    check_wgrad(out, p)
    torch.testing.assert_close(ref.grouped_mm_wgrad_fp8_t_ref(*p.args()).double(), naive64(p),
                               rtol=1e-5, atol=1e-5)


def test_transposed_reference_agrees_with_the_untransposed_one():
    p = make_wgrad_problem([40, 0, 200, 129], 64, 48, pad=2, seed=3)
    xq, xs = ref.quantize_128x1(p.x, p.offs)
    dq, ds = ref.quantize_128x1(p.dy, p.offs, tile_scales=True)
    ds = ds.repeat_interleave(128, dim=1)[:, :p.dy.shape[1]]
    torch.testing.assert_close(ref.grouped_mm_wgrad_fp8_t_ref(*p.args()),
                               ref.grouped_mm_wgrad_fp8_ref(xq, xs, dq, ds, p.offs), rtol=1e-5, atol=1e-4)  # fp32 sums


def _bad_cases():
    p = make_wgrad_problem([6, 0, 200], 32, 256, pad=2, seed=8)
    a = dict(zip(("a_t", "a_scale", "b_t", "b_scale", "offs"), p.args()))
    return [
        ("a_t", dict(a, a_t=p.a_t.float().to(BF16)), "dtype torch.float8_e4m3fn"),
        ("a_t", dict(a, a_t=p.a_t[:, :-16]), r"\(k, 128 \* blocks\)"),
        ("a_t", dict(a, a_t=p.a_t[:, :128]), r"blocks = ceil\(m / 128\) \+ E >= E = 3"),
        ("b_t", dict(a, b_t=p.b_t[:, :-128]), "as many columns as a_t"),
        ("b_t", dict(a, b_t=p.b_t[:8]), "a positive multiple of 16 rows"),
        ("a_t", dict(a, a_t=p.a_t.repeat_interleave(2, dim=1)[:, ::2]), "unit stride along its columns"),
        ("a_scale", dict(a, a_scale=p.a_scale[:-1]), "one per 128-row block and column"),
        ("b_scale", dict(a, b_scale=p.a_scale[:, :3]), "one per 128-row block and 128 columns"),
        ("b_scale", dict(a, b_scale=p.b_scale.t().contiguous().t()), "unit stride along its last"),
        ("b_scale", dict(a, b_scale=p.b_scale.double()), "float32"),
        ("offs", dict(a, offs=p.offs.long()), "int32"),
        ("offs", dict(a, offs=p.offs[:0]), "1 to 65536 groups"),
    ]


@pytest.mark.parametrize("case", range(12))
def test_argument_checks(case):
    name, args, why = _bad_cases()[case]
    with pytest.raises(ValueError, match=rf"cute_moe\.grouped_mm_fp8_wgrad: {name}: expected .*{why}"):
        check_grouped_mm_fp8_wgrad_args(**args)
    with pytest.raises(ValueError, match=rf"grouped_mm_fp8_wgrad: {name}"):
        cute_moe.fp8.grouped_mm_wgrad(**args)


# ---- the op's CPU and fake kernels (need the op library) -------------------------------------------

needs_ops = pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded")


@needs_ops
def test_op_schema_and_cpu_kernel():
    op = torch.ops.cute_moe.grouped_mm_fp8_wgrad
    assert str(op.default._schema) == (
        "cute_moe::grouped_mm_fp8_wgrad(Tensor a_t, Tensor a_scale, Tensor b_t, Tensor b_scale, "
        "Tensor offs) -> Tensor")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("cute_moe::grouped_mm_fp8_wgrad", "CPU")
    p = make_wgrad_problem([0, 60, 140], 32, 48, pad=3, seed=12)
    out = op(*p.args())
    check_wgrad(out, p)
    assert torch.equal(out, cute_moe.fp8.grouped_mm_wgrad(*p.args()))


@needs_ops
def test_op_fake_kernel_and_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode
    p = make_wgrad_problem([4, 0, 130], 32, 48, pad=2, seed=14)
    with FakeTensorMode() as mode:
        args = [mode.from_tensor(t) for t in p.args()]
        dw = torch.ops.cute_moe.grouped_mm_fp8_wgrad(*args)
        with pytest.raises(ValueError, match=r"a_scale: expected shape"):
            torch.ops.cute_moe.grouped_mm_fp8_wgrad(args[0], args[1][:-1], *args[2:])
    assert (tuple(dw.shape), dw.dtype, dw.is_contiguous()) == ((3, 32, 48), BF16, True)
    compiled = torch.compile(torch.ops.cute_moe.grouped_mm_fp8_wgrad, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*p.args()), cute_moe.fp8.grouped_mm_wgrad(*p.args()))

# The FP8 GEMMs with the activation fused into the epilogue on the CPU (cute_moe.fp8.grouped_mm_act
# and grouped_mm_act_bwd: their references): against a float64 evaluation written apart from
# them, padding rows and empty experts; the argument rules the fallback, the fake and the CPU
# kernels share; the ops' schemas, CPU and fake kernels (with the op library).
import pytest
import torch

import cute_moe
from cute_moe import fp8, testing
from cute_moe import reference as ref
from cute_moe.reference import fp8 as ref_fp8
from cute_moe.reference import offsets_from_counts

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64
ALPHA = 1.702
COUNTS, PAD, H, I = [0, 37, 64, 9], 3, 144, 80


def _randn(g, *shape, s=1.0):
    return (torch.randn(*shape, generator=g) * s).to(BF16)


def _forward_args(act, seed=0):
    g = torch.Generator().manual_seed(seed)
    m, e, n = sum(COUNTS) + PAD, len(COUNTS), ref.up_width(act, I)
    xq, xs = fp8.quantize_1x128(_randn(g, m, H))
    _, _, wq_t, ws_t = fp8.quantize_128x128(_randn(g, e, H, n, s=3.0 * H ** -0.5), False, True)
    return (xq, xs, wq_t.transpose(-2, -1), ws_t.transpose(-2, -1), offsets_from_counts(COUNTS),
            _randn(g, e, n, s=0.5))


def _backward_args(act, seed=0):
    g = torch.Generator().manual_seed(seed)
    m, e = sum(COUNTS) + PAD, len(COUNTS)
    dy = _randn(g, m, H)
    dyq, dys = fp8.quantize_1x128(dy)
    wq, ws, _, _ = fp8.quantize_128x128(_randn(g, e, I, H, s=H ** -0.5), True, False)
    pre = _randn(g, m, ref.up_width(act, I) if act != "none" else I, s=3.0)
    return (dyq, dys, wq.transpose(-2, -1), ws.transpose(-2, -1), offsets_from_counts(COUNTS), pre,
            torch.rand(m, generator=g), _randn(g, e, H, s=0.5), dy)


def _rows(offs):
    return [(0 if e == 0 else int(offs[e - 1]), int(offs[e])) for e in range(len(offs))]


@pytest.mark.parametrize("act", ["swiglu_oai", "swiglu", "geglu", "srelu"])
def test_forward_is_its_definition(act):
    x, xs, w, ws, offs, bias = _forward_args(act, seed=1)
    limit = ref.default_limit(act)
    h, pre = fp8.grouped_mm_act(x, xs, w, ws, offs, bias, activation=act, limit=limit)
    xd = ref_fp8.dequantize_1x128(x, xs).double()
    wd = ref_fp8.dequantize_128x128(w, ws).double()
    want_pre = torch.zeros(pre.shape, dtype=F64)
    for e, (s, t) in enumerate(_rows(offs)):
        want_pre[s:t] = xd[s:t] @ wd[e] + bias[e].double()
    assert torch.all(pre[sum(COUNTS):] == 0) and torch.all(h[sum(COUNTS):] == 0)
    testing.assert_rel_close(pre, want_pre, "pre", tol=4e-3)
    assert torch.equal(h, ref.act_ref(pre, act, ALPHA, limit).to(BF16))  # from the rounded pre


@pytest.mark.parametrize("act", ["swiglu_oai", "swiglu"])
def test_backward_dpre_fp8_is_dpre_quantized(act):
    """dpre_fp8: the same three outputs, and dpre's 1 x 128 copy (quantize_1x128 of that dpre);
    the op (its CPU kernel) without it returns empty fourth and fifth outputs."""
    dyq, dys, w, ws, offs, pre, prob, out_bias, dy = _backward_args(act, seed=5)
    limit = ref.default_limit(act)
    three = fp8.grouped_mm_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy, True,
                                   activation=act, limit=limit)
    five = fp8.grouped_mm_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy, True,
                                  activation=act, limit=limit, dpre_fp8=True)
    assert len(three) == 3 and len(five) == 5
    for a, b in zip(three, five):
        assert torch.equal(a, b)
    q, scale = ref_fp8.quantize_1x128(five[0])
    assert torch.equal(five[3].view(torch.uint8), q.view(torch.uint8)) and torch.equal(five[4], scale)
    from cute_moe.ops.fp8 import reference_grouped_mm_fp8_act_bwd  # the op's CPU kernel
    out = reference_grouped_mm_fp8_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy, True, act,
                                           ALPHA, limit)
    assert len(out) == 5 and out[3].numel() == 0 and out[4].numel() == 0
    if act == "swiglu":  # the copy is for the gated activations
        dyq, dys, w, ws, offs, pre, prob, out_bias, dy = _backward_args("srelu", seed=5)
        with pytest.raises(ValueError, match="dpre_fp8: expected a gated activation"):
            fp8.grouped_mm_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy, True, activation="srelu",
                                   dpre_fp8=True)


@pytest.mark.parametrize("act", ["swiglu_oai", "srelu", "none"])
def test_backward_is_its_definition(act):
    dyq, dys, w, ws, offs, pre, prob, out_bias, dy = _backward_args(act, seed=2)
    limit = ref.default_limit(act) if act != "none" else None
    dpre, hp, dprob = fp8.grouped_mm_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy, True,
                                             activation=act, limit=limit)
    u = torch.zeros(dy.shape[0], w.shape[2], dtype=F64)
    dyd = ref_fp8.dequantize_1x128(dyq, dys).double()
    wd = ref_fp8.dequantize_128x128(w, ws).double()
    bias = torch.zeros(dy.shape, dtype=F64)
    for e, (s, t) in enumerate(_rows(offs)):
        u[s:t] = dyd[s:t] @ wd[e]
        bias[s:t] = out_bias[e].double()
    p = prob.double()[:, None]
    h = ref.act_ref(pre.double(), act, ALPHA, limit)
    used = sum(COUNTS)
    want = (ref.act_bwd_ref(p * u, pre.double(), act, ALPHA, limit), p * h,
            (h * u).sum(-1) + (dy.double() * bias).sum(-1))
    for name, a, b in zip(("dpre", "hp", "dprob"), (dpre, hp, dprob), want):
        assert torch.all(a[used:] == 0), name
        testing.assert_rel_close(a[:used], b[:used], name, tol=4e-3)


def test_argument_rules():
    x, xs, w, ws, offs, bias = _forward_args("swiglu_oai")
    with pytest.raises(ValueError, match=r"activation: expected a fused activation \(not 'none'"):
        fp8.grouped_mm_act(x, xs, w, ws, offs, activation="none")
    with pytest.raises(ValueError, match=r"w: expected w.shape\[2\] \(2I\) a multiple of 16"):
        fp8.grouped_mm_act(x, xs, w[..., :152], ws[..., :2], offs, activation="swiglu")
    with pytest.raises(ValueError, match=r"limit: expected None for 'srelu'"):
        fp8.grouped_mm_act(x, xs, w, ws, offs, activation="srelu", limit=7.0)
    with pytest.raises(ValueError, match=r"w: expected w.stride\(1\) == 1"):
        fp8.grouped_mm_act(x, xs, w.contiguous(), ws, offs)
    # h's e4m3 copy from the epilogue: gated activations, 2I a multiple of 32
    with pytest.raises(ValueError, match=r"grouped_mm_fp8_act_quant: activation: expected a gated"):
        fp8.grouped_mm_act_quant(x, xs, w[..., :80], ws[..., :1], offs, activation="srelu")
    with pytest.raises(ValueError, match=r"w: expected w.shape\[2\] \(2I\) a multiple of 32"):
        fp8.grouped_mm_act_quant(x, xs, w[..., :144], ws[..., :2], offs, activation="swiglu")
    dyq, dys, w, ws, offs, pre, prob, out_bias, dy = _backward_args("swiglu_oai")
    with pytest.raises(ValueError, match=r"dy_scale: expected shape"):
        fp8.grouped_mm_act_bwd(dyq, dys[:, :1], w, ws, offs, pre)
    with pytest.raises(ValueError, match=r"pre: expected shape \(113, 160\)"):
        fp8.grouped_mm_act_bwd(dyq, dys, w, ws, offs, pre[:, :80])
    with pytest.raises(ValueError, match=r"prob: expected a tensor when prob_grad is set"):
        fp8.grouped_mm_act_bwd(dyq, dys, w, ws, offs, pre, prob_grad=True)
    with pytest.raises(ValueError, match=r"out_bias: expected None unless prob_grad"):
        fp8.grouped_mm_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy)
    with pytest.raises(ValueError, match=r"dy_bf16: expected the unquantized dy"):
        fp8.grouped_mm_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, None, True)
    with pytest.raises(ValueError, match=r"dy_bf16: expected dy's shape"):
        fp8.grouped_mm_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy[:5], True)


needs_ops = pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded")


@needs_ops
def test_op_schemas_cpu_and_fake_kernels():
    ops = torch.ops.cute_moe
    assert str(ops.grouped_mm_fp8_act.default._schema) == (
        'cute_moe::grouped_mm_fp8_act(Tensor x, Tensor x_scale, Tensor w, Tensor w_scale, Tensor offs, '
        'Tensor? bias=None, str activation="swiglu_oai", float alpha=1.702, float? limit=None) '
        '-> (Tensor, Tensor)')
    assert str(ops.grouped_mm_fp8_act_bwd.default._schema) == (
        'cute_moe::grouped_mm_fp8_act_bwd(Tensor dy, Tensor dy_scale, Tensor w, Tensor w_scale, '
        'Tensor offs, Tensor pre, Tensor? prob=None, Tensor? out_bias=None, Tensor? dy_bf16=None, '
        'bool prob_grad=False, str activation="swiglu_oai", float alpha=1.702, float? limit=None, '
        'bool dpre_fp8=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor)')
    assert str(ops.grouped_mm_fp8_act_quant.default._schema) == (
        'cute_moe::grouped_mm_fp8_act_quant(Tensor x, Tensor x_scale, Tensor w, Tensor w_scale, '
        'Tensor offs, Tensor? bias=None, str activation="swiglu_oai", float alpha=1.702, '
        'float? limit=None) -> (Tensor, Tensor, Tensor)')
    fwd, bwd = _forward_args("swiglu_oai", seed=3), _backward_args("swiglu_oai", seed=4)
    # h's copy: the pre of grouped_mm_act and act_quantize_1x128's copy of h from it
    h_q, h_scale, pre = ops.grouped_mm_fp8_act_quant(*fwd, "swiglu_oai", ALPHA, 7.0)
    assert torch.equal(pre, fp8.grouped_mm_act(*fwd, activation="swiglu_oai", limit=7.0)[1])
    want_q, want_s = fp8.act_quantize_1x128(pre, "swiglu_oai", ALPHA, 7.0)
    assert torch.equal(h_q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(h_scale, want_s)
    got = ops.grouped_mm_fp8_act(*fwd, "swiglu_oai", ALPHA, 7.0)
    want = fp8.grouped_mm_act(*fwd, activation="swiglu_oai", limit=7.0)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    got = ops.grouped_mm_fp8_act_bwd(*bwd, True, "swiglu_oai", ALPHA, 7.0)
    want = fp8.grouped_mm_act_bwd(*bwd, True, activation="swiglu_oai", limit=7.0)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in fwd]
        h, pre = ops.grouped_mm_fp8_act(*fake, "swiglu_oai", ALPHA, 7.0)
        fake_q, fake_s, fake_pre = ops.grouped_mm_fp8_act_quant(*fake, "swiglu_oai", ALPHA, 7.0)
        fake_b = [mode.from_tensor(t) for t in bwd]
        dpre, hp, dprob, no_q, no_scale = ops.grouped_mm_fp8_act_bwd(*fake_b, True, "swiglu_oai", ALPHA, 7.0)
        *_, dpre_q, dpre_scale = ops.grouped_mm_fp8_act_bwd(*fake_b, True, "swiglu_oai", ALPHA, 7.0, True)
        with pytest.raises(ValueError, match=r"pre: expected shape"):
            ops.grouped_mm_fp8_act_bwd(*fake_b[:5], fake_b[5][:, :8], *fake_b[6:], True)
    m = sum(COUNTS) + PAD
    assert (tuple(h.shape), tuple(pre.shape), h.dtype) == ((m, I), (m, 2 * I), BF16)
    assert (tuple(fake_q.shape), fake_q.dtype, tuple(fake_pre.shape)) == ((m, I), torch.float8_e4m3fn, (m, 2 * I))
    assert (tuple(fake_s.shape), fake_s.dtype) == ((m, (I + 127) // 128), torch.float32)
    assert (tuple(dpre.shape), tuple(hp.shape), tuple(dprob.shape)) == ((m, 2 * I), (m, I), (m,))
    assert no_q.numel() == 0 and no_scale.numel() == 0
    assert (tuple(dpre_q.shape), dpre_q.dtype) == ((m, 2 * I), torch.float8_e4m3fn)
    assert (tuple(dpre_scale.shape), dpre_scale.dtype) == ((m, (2 * I + 127) // 128), torch.float32)


def test_act_quantize_argument_rules():
    pre = torch.zeros(4, 96, dtype=BF16)
    with pytest.raises(ValueError, match=r"pre: expected pre.shape\[1\] \(2I\) a multiple of 32"):
        fp8.act_quantize_1x128(pre[:, :48], "swiglu")
    with pytest.raises(ValueError, match=r"pre: expected its last dimension a multiple of 16"):
        fp8.act_quantize_1x128(pre[:, :40], "srelu")
    with pytest.raises(ValueError, match=r"limit: expected None for 'srelu'"):
        fp8.act_quantize_1x128(pre, "srelu", limit=7.0)
    with pytest.raises(ValueError, match=r"activation: expected one of"):
        fp8.act_quantize_1x128(pre, "relu")
    with pytest.raises(ValueError, match=r"pre: expected a bfloat16 tensor"):
        fp8.act_quantize_1x128(pre.float(), "swiglu")


@needs_ops
def test_act_quantize_schema_cpu_and_fake_kernels():
    ops = torch.ops.cute_moe
    assert str(ops.act_quantize_fp8_1x128.default._schema) == (
        'cute_moe::act_quantize_fp8_1x128(Tensor pre, str activation="swiglu_oai", float alpha=1.702, '
        'float? limit=None) -> (Tensor, Tensor)')
    pre = (torch.randn(9, 2 * I, generator=torch.Generator().manual_seed(2)) * 3).to(BF16)
    got = ops.act_quantize_fp8_1x128(pre, "swiglu_oai", ALPHA, 7.0)
    want = fp8.act_quantize_1x128(pre, "swiglu_oai", ALPHA, 7.0)
    assert all(torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a,
                           b.view(torch.uint8) if b.dtype != torch.float32 else b) for a, b in zip(got, want))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        q, s = ops.act_quantize_fp8_1x128(mode.from_tensor(pre), "swiglu_oai", ALPHA, 7.0)
        q2, s2 = ops.act_quantize_fp8_1x128(mode.from_tensor(pre), "srelu", ALPHA, None)
    assert (tuple(q.shape), q.dtype, tuple(s.shape)) == ((9, I), torch.float8_e4m3fn, (9, (I + 127) // 128))
    assert (tuple(q2.shape), tuple(s2.shape)) == ((9, 2 * I), (9, (2 * I + 127) // 128))



def test_quantize_1x128_gathers_rows():
    """quantize_1x128(x, index): the bits of quantize_1x128(x[index]) (repeated, reordered and
    no rows), from the CPU fallback; bad indexes are refused."""
    g = torch.Generator().manual_seed(7)
    x = _randn(g, 10, 272, s=4.0)
    for index in ([3, 3, 0, 9, 1, 5, 5, 2, 8, 8, 8, 4, 7], [9], []):
        idx = torch.tensor(index, dtype=torch.int32)
        q, s = fp8.quantize_1x128(x, idx)
        rq, rs = ref_fp8.quantize_1x128(x[idx.long()])
        assert q.shape == (len(index), 272) and s.shape == (len(index), 3)
        assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    with pytest.raises(ValueError, match=r"index: expected values in \[0, 10\) \(rows of src\), got 10"):
        fp8.quantize_1x128(x, torch.tensor([0, 10], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"got -1"):
        fp8.quantize_1x128(x, torch.tensor([-1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"index: expected dtype torch.int32"):
        fp8.quantize_1x128(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"index: expected a 1-D tensor"):
        fp8.quantize_1x128(x, torch.zeros(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"index: expected a contiguous tensor"):
        fp8.quantize_1x128(x, torch.zeros(8, dtype=torch.int32)[::2])


@needs_ops
def test_quantize_1x128_schema_cpu_and_fake_kernels():
    ops = torch.ops.cute_moe
    assert str(ops.quantize_fp8_1x128.default._schema) == (
        'cute_moe::quantize_fp8_1x128(Tensor x, Tensor? index=None) -> (Tensor, Tensor)')
    x = _randn(torch.Generator().manual_seed(3), 6, 144)
    idx = torch.tensor([5, 0, 0, 2, 4, 1, 3, 5, 5], dtype=torch.int32)
    got = ops.quantize_fp8_1x128(x, idx)
    want = ref_fp8.quantize_1x128(x[idx.long()])
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        q, s = ops.quantize_fp8_1x128(mode.from_tensor(x), mode.from_tensor(idx))
        q0, s0 = ops.quantize_fp8_1x128(mode.from_tensor(x))
    assert (tuple(q.shape), q.dtype, tuple(s.shape)) == ((9, 144), torch.float8_e4m3fn, (9, 2))
    assert (tuple(q0.shape), tuple(s0.shape)) == ((6, 144), (6, 2))

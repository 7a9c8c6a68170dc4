# Tests of the torch.ops.cute_moe op layer on CPU: registrations, fake kernels under
# FakeTensorMode and torch.compile, the autograd formula (both weight layouts, only the
# needed gradients), and the op-level argument errors. Needs the compiled library; the
# CPU kernels are the references.
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_moe
from cute_moe import testing
from cute_moe.testing import OpLog
from cute_moe.reference import grouped_mm_ref

pytestmark = pytest.mark.skipif(
    not cute_moe.library_loaded(),
    reason="cute_moe op library not loaded (build: pip install --no-build-isolation .)")

BF16 = torch.bfloat16
ops = torch.ops.cute_moe if cute_moe.library_loaded() else None


def test_schemas_and_registrations():
    assert str(ops.grouped_mm.default._schema) == (
        "cute_moe::grouped_mm(Tensor x, Tensor w, Tensor offs, Tensor? bias=None, Tensor? w_hi=None) "
        "-> Tensor")
    assert str(ops.grouped_mm_wgrad.default._schema) == (
        "cute_moe::grouped_mm_wgrad(Tensor x, Tensor dy, Tensor offs, "
        "ScalarType? out_dtype=None, bool bias_grad=False) -> (Tensor, Tensor)")
    assert str(ops.grouped_column_sum.default._schema) == (
        "cute_moe::grouped_column_sum(Tensor src, Tensor offs, Tensor? row_scale=None) -> Tensor")
    assert str(ops.grouped_bias_grads.default._schema) == (
        "cute_moe::grouped_bias_grads(Tensor src, Tensor offs, Tensor? row_scale=None, "
        "Tensor? bias=None, Tensor? index=None) -> (Tensor db, Tensor bias_dot, Tensor gathered)")
    for name in ("cute_moe::grouped_mm", "cute_moe::grouped_mm_wgrad",
                 "cute_moe::grouped_column_sum", "cute_moe::grouped_bias_grads"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("cute_moe::grouped_mm", "Autograd")


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_fake_kernels(layout):
    p = testing.random_problem(50, 16, 24, 4, layout=layout, bias=True)
    real = (p.x, p.w, p.offs, p.bias, torch.randn(50, 24).to(BF16))
    mode = FakeTensorMode()
    x, w, offs, b, fdy = (mode.from_tensor(t) for t in real)
    assert w.stride() == p.w.stride()
    with mode:
        y = ops.grouped_mm(x, w, offs, b)
        dw, db = ops.grouped_mm_wgrad(x, fdy, offs, torch.float32, True)
        dw16, db0 = ops.grouped_mm_wgrad(x, fdy, offs)
        with pytest.raises(ValueError, match=r"x: expected 16 columns"):
            ops.grouped_mm(x[:, :8], w, offs)
        with pytest.raises(ValueError, match=r"offs: expected length 4"):
            ops.grouped_mm(x, w, offs[:3])
        with pytest.raises(ValueError, match=r"dy: expected 50 rows"):
            ops.grouped_mm_wgrad(x, fdy[:7], offs)
    assert (y.shape, y.dtype, y.is_contiguous()) == ((50, 24), BF16, True)
    assert (dw.shape, dw.dtype, db.shape, db.dtype) == ((4, 16, 24), torch.float32, (4, 24),
                                                        torch.float32)
    assert (dw16.shape, dw16.dtype, db0.shape, db0.dtype) == ((4, 16, 24), BF16, (0,),
                                                              torch.float32)


def test_bias_grads_op_fake_and_cpu_kernels():
    """grouped_bias_grads: shapes under FakeTensorMode, and on the CPU (the reference):
    db of the gathered rows, each row's dot with its expert's bias, the gathered rows."""
    p = testing.random_problem(60, 16, 24, 5, "empty", pad=4)
    src = torch.randn(30, 24).to(BF16)
    index = torch.randint(0, 30, (60,), dtype=torch.int32)
    prob = torch.rand(60)
    bias = torch.randn(5, 24).to(BF16)
    db, dot, gathered = ops.grouped_bias_grads(src, p.offs, prob, bias, index)
    dy = src[index.long()]
    assert torch.equal(gathered, dy)
    want_db = cute_moe.reference.grouped_bias_grad_ref(dy, p.offs, row_scale=prob)
    torch.testing.assert_close(db, want_db)
    rows = cute_moe.reference.groups.rows_to_groups(p.offs, 60)
    used = rows < 5
    want = (dy.float() * bias.float()[rows.clamp(max=4)]).sum(1) * used
    torch.testing.assert_close(dot, want)
    db2, dot2, none = ops.grouped_bias_grads(dy, p.offs)
    assert torch.equal(db2, cute_moe.reference.grouped_bias_grad_ref(dy, p.offs))
    assert dot2.shape == (0,) and none.shape == (0, 24)
    mode = FakeTensorMode()
    fs, fo, fi, fp, fb = (mode.from_tensor(t) for t in (src, p.offs, index, prob, bias))
    with mode:
        a, b, c = ops.grouped_bias_grads(fs, fo, fp, fb, fi)
        with pytest.raises(ValueError, match="bias: expected shape"):
            ops.grouped_bias_grads(fs, fo, fp, fb[:, :8], fi)
    assert (a.shape, b.shape, c.shape) == ((5, 24), (60,), (60, 24))


def test_wgrad_op_matches_reference():
    p = testing.random_problem(60, 16, 32, 5, "empty", pad=4)
    dy = torch.randn(60, 32).to(BF16)
    for out_dtype in (BF16, torch.float32):
        dw, db = ops.grouped_mm_wgrad(p.x, dy, p.offs, out_dtype, True)
        dw64 = cute_moe.reference.grouped_mm_wgrad_ref(p.x, dy, p.offs, torch.float64,
                                                        torch.float64)
        db64 = cute_moe.reference.grouped_bias_grad_ref(dy, p.offs, torch.float64)
        assert dw.dtype == out_dtype and db.dtype == torch.float32
        testing.assert_rel_close(dw, dw64, "dw", BF16)
        testing.assert_rel_close(db, db64, "db", BF16)
        assert torch.all(dw[torch.tensor(p.sizes) == 0] == 0)


def _reference_grads(p, dy):
    x = p.x.detach().float().requires_grad_()
    weight = p.weight.detach().float().requires_grad_()
    bias = p.bias.detach().float().requires_grad_() if p.bias is not None else None
    w = weight if p.layout == "kn" else weight.transpose(-2, -1)
    y = grouped_mm_ref(x, w, p.offs, bias, out_dtype=torch.float32)
    y.backward(dy.float())
    return y, x.grad, weight.grad, bias.grad if bias is not None else None


@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("grad_out", ["random", "sum"])
def test_autograd_matches_reference(layout, bias, grad_out):
    g = torch.Generator().manual_seed(3)
    p = testing.random_problem(90, 24, 40, 7, "skewed", pad=6, layout=layout, bias=bias,
                               generator=g, requires_grad=True)
    with OpLog() as log:
        y = ops.grouped_mm(p.x, p.w, p.offs, p.bias)
        if grad_out == "sum":
            dy = torch.ones(90, 40, dtype=BF16)
            y.sum().backward()
        else:
            dy = torch.randn(90, 40, generator=g).to(BF16)
            y.backward(dy)
    y_ref, dx_ref, dw_ref, db_ref = _reference_grads(p, dy)
    testing.assert_rel_close(y, y_ref, "y")
    testing.assert_rel_close(p.x.grad, dx_ref, "dx")
    testing.assert_rel_close(p.weight.grad, dw_ref, "dw")
    # The gradient has the weight's own layout: no copy on the way to .grad.
    assert p.weight.grad.is_contiguous() and p.weight.grad.dtype == BF16
    if bias:
        testing.assert_rel_close(p.bias.grad, db_ref, "db")
        assert p.bias.grad.dtype == BF16
    # db comes with dw from the wgrad op, except when dw is computed transposed ("nk").
    column_sums = ["grouped_column_sum"] if bias and layout == "nk" else []
    # the backward's input gradient through grouped_mm_scaled (grouped_mm's kernel, no autograd
    # layer)
    assert log.calls == ["grouped_mm", "grouped_mm_scaled", "grouped_mm_wgrad"] + column_sums


@pytest.mark.parametrize("needed, expected", [
    ("x", ["grouped_mm_scaled"]),
    ("w", ["grouped_mm_wgrad"]),
    ("bias", ["grouped_column_sum"]),
])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_backward_computes_only_needed_grads(needed, expected, layout):
    p = testing.random_problem(40, 16, 16, 3, layout=layout, bias=True)
    inputs = {"x": p.x, "w": p.weight, "bias": p.bias}
    inputs[needed].requires_grad_()
    y = ops.grouped_mm(p.x, p.w, p.offs, p.bias)
    with OpLog() as log:
        (grad,) = torch.autograd.grad(y.sum(), inputs[needed])
    assert log.calls == expected
    assert grad.shape == inputs[needed].shape
    assert all(t.grad is None for t in inputs.values())


def test_no_grad_forward_saves_nothing():
    p = testing.random_problem(40, 16, 16, 3)
    y = ops.grouped_mm(p.x, p.w, p.offs)
    assert y.grad_fn is None


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_torch_compile_fullgraph(backend, layout):
    torch._dynamo.reset()
    p = testing.random_problem(48, 16, 32, 4, "empty", pad=3, layout=layout, bias=True,
                               requires_grad=True)

    def step(x, weight, offs, bias):
        w = weight if layout == "kn" else weight.transpose(-2, -1)
        return cute_moe.grouped_mm(x, w, offs, bias).float().square().sum()

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    args = (p.x, p.weight, p.offs, p.bias)
    leaves = (p.x, p.weight, p.bias)
    eager_grads = torch.autograd.grad(step(*args), leaves)
    loss = compiled(*args)
    compiled_grads = torch.autograd.grad(loss, leaves)
    assert torch.equal(loss, step(*args))
    for a, b in zip(compiled_grads, eager_grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_split_weight(layout):
    """grouped_mm(x, w, offs, bias, w_hi): W's rows in two tensors, y = x @ [w; w_hi]: the
    CPU kernel, the fake kernel and the autograd formula (gradients to both tensors, in
    their layouts) against grouped_mm on the joined tensor."""
    g = torch.Generator().manual_seed(8)
    e, k1, k2, n, m = 3, 16, 8, 24, 40
    x = torch.randn(m, k1 + k2, generator=g).to(BF16).requires_grad_()

    def weight(k):
        w = torch.randn(e, k, n, generator=g).to(BF16)
        w = w if layout == "kn" else w.transpose(-2, -1).contiguous()
        return w.requires_grad_()

    w_lo, w_hi, bias = weight(k1), weight(k2), torch.randn(e, n, generator=g).to(BF16).requires_grad_()
    offs = torch.tensor([10, 10, 33], dtype=torch.int32)
    view = (lambda w: w) if layout == "kn" else (lambda w: w.transpose(-2, -1))
    dy = torch.randn(m, n, generator=g).to(BF16)
    y = ops.grouped_mm(x, view(w_lo), offs, bias, view(w_hi))
    got = torch.autograd.grad(y, [x, w_lo, w_hi, bias], dy)
    joined = torch.cat([view(w_lo), view(w_hi)], dim=1)
    y_ref = ops.grouped_mm(x, joined, offs, bias)
    want = torch.autograd.grad(y_ref, [x, w_lo, w_hi, bias], dy)
    assert torch.equal(y, y_ref)
    for name, a, b in zip(("dx", "dw", "dw_hi", "db"), got, want):
        assert a.shape == b.shape and torch.equal(a, b), name
    assert got[1].is_contiguous() and got[2].is_contiguous()  # each in its tensor's layout
    mode = FakeTensorMode()
    fx, fw, fh, foffs = (mode.from_tensor(t) for t in (x.detach(), view(w_lo), view(w_hi), offs))
    with mode:
        assert ops.grouped_mm(fx, fw, foffs, None, fh).shape == (m, n)
        with pytest.raises(ValueError, match=r"x: expected 24 columns \(w's rows and w_hi's\)"):
            ops.grouped_mm(fx[:, :20], fw, foffs, None, fh)
        with pytest.raises(ValueError, match=r"w_hi: expected shape \(E, K2, N\)"):
            ops.grouped_mm(fx, fw, foffs, None, fh[:2])


def test_op_errors():
    p = testing.random_problem(16, 8, 24, 3, bias=True)
    with pytest.raises(ValueError, match=r"cute_moe.grouped_mm: w: expected dtype"):
        ops.grouped_mm(p.x, p.w.float(), p.offs)
    with pytest.raises(ValueError, match=r"cute_moe.grouped_mm: bias: expected shape"):
        ops.grouped_mm(p.x, p.w, p.offs, p.bias[:, :8])
    with pytest.raises(ValueError, match=r"cute_moe.grouped_mm_wgrad: out_dtype"):
        ops.grouped_mm_wgrad(p.x, p.x, p.offs, torch.float16)
    with pytest.raises(ValueError, match=r"cute_moe.grouped_mm_wgrad: offs: expected dtype"):
        ops.grouped_mm_wgrad(p.x, p.x, p.offs.long())

# Tests on CPU of the token permute / unpermute: the references against naive loops, the
# reference router's index tensors, the autograd formulas (gradcheck in float64 on the
# reference path and through the autograd.Functions with the reference gathers), the public
# functions through the library's ops (the references behind their CPU kernels) and through
# the references alone, the argument errors, and, with a library that has the ops, the
# registrations, fake kernels and torch.compile(fullgraph=True).
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_moe
from cute_moe import _library, testing
from cute_moe import permute as perm
from cute_moe import reference as ref
from cute_moe.ops import permute as permute_ops
from cute_moe.testing import OpLog

BF16, F32, F64, I32 = torch.bfloat16, torch.float32, torch.float64, torch.int32
HAS_OPS = cute_moe.library_loaded()
needs_ops = pytest.mark.skipif(not HAS_OPS, reason="the op library is not loaded")


@pytest.fixture(params=["library", "reference"])
def backend(request, monkeypatch):
    """library: the loaded library's ops (when it is loaded); reference: as if it were not."""
    if request.param == "reference":
        monkeypatch.setattr(_library, "library_loaded", lambda: False)
    return request.param


def routing(tokens, k, experts=5, seed=0, device="cpu"):
    experts = max(experts, k)  # k distinct experts per token
    g = torch.Generator().manual_seed(seed)
    expert = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]) \
        if tokens else torch.empty(0, k, dtype=torch.int64)
    row_token, token_rows, offs = ref.routing_indices(expert.to(device), experts)
    return expert, row_token, token_rows, offs


# ---- references ----------------------------------------------------------------------------

def naive_gather_rows(src, index, scale):
    out = torch.zeros(index.shape[0], src.shape[1], dtype=F64)
    for r in range(index.shape[0]):
        out[r] = src[int(index[r])].double() * (1.0 if scale is None else float(scale[r]))
    return out


def naive_gather_sum_rows(src, index, weight):
    t_count, k = index.shape
    out = torch.zeros(t_count, src.shape[1], dtype=F64)
    for t in range(t_count):
        for j in range(k):
            w = 1.0 if weight is None else float(weight[t, j])
            out[t] += w * src[int(index[t, j])].double()
    return out


def naive_gather_rows_dot(a, src, index):
    out = torch.zeros(index.shape, dtype=F64)
    for t in range(index.shape[0]):
        for j in range(index.shape[1]):
            out[t, j] = (a[t].double() * src[int(index[t, j])].double()).sum()
    return out


@pytest.mark.parametrize("dtype", [BF16, F32, F64])
@pytest.mark.parametrize("scaled", [False, True])
def test_gather_rows_ref_is_naive(dtype, scaled):
    g = torch.Generator().manual_seed(1)
    src = torch.randn(9, 16, generator=g).to(dtype)
    index = torch.randint(9, (23,), generator=g, dtype=I32)
    scale = torch.rand(23, generator=g) if scaled else None
    out = ref.gather_rows_ref(src, index, scale)
    assert out.dtype == dtype and out.shape == (23, 16)
    expected = naive_gather_rows(src, index, scale)
    if scaled:
        testing.assert_rel_close(out, expected, "gather_rows_ref", dtype)
    else:
        assert torch.equal(out.double(), expected), "an unscaled gather must be an exact copy"
    assert ref.gather_rows_ref(src, index, scale, out_dtype=F32).dtype == F32


@pytest.mark.parametrize("dtype", [BF16, F64])
@pytest.mark.parametrize("k", [0, 1, 3, 8])
@pytest.mark.parametrize("weighted", [False, True])
def test_gather_sum_rows_ref_is_naive(dtype, k, weighted):
    g = torch.Generator().manual_seed(k)
    src = torch.randn(30, 24, generator=g).to(dtype)
    index = torch.randint(30, (7, k), generator=g, dtype=I32)
    weight = torch.rand(7, k, generator=g) if weighted else None
    out = ref.gather_sum_rows_ref(src, index, weight)
    assert out.dtype == dtype and out.shape == (7, 24)
    testing.assert_rel_close(out, naive_gather_sum_rows(src, index, weight), "gather_sum_rows_ref",
                             dtype)
    if k == 0:
        assert torch.all(out == 0)


@pytest.mark.parametrize("dtype", [BF16, F64])
def test_gather_rows_dot_ref_is_naive(dtype):
    g = torch.Generator().manual_seed(2)
    a = torch.randn(6, 40, generator=g).to(dtype)
    src = torch.randn(11, 40, generator=g).to(dtype)
    index = torch.randint(11, (6, 4), generator=g, dtype=I32)
    out = ref.gather_rows_dot_ref(a, src, index)
    assert out.dtype == (F64 if dtype == F64 else F32) and out.shape == (6, 4)
    expected = naive_gather_rows_dot(a, src, index)
    testing.assert_rel_close(out, expected, "gather_rows_dot_ref", out.dtype)


def test_reference_rejects_out_of_range_indices():
    src = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"index: expected values in \[0, 4\).*got 4"):
        ref.gather_rows_ref(src, torch.tensor([0, 4], dtype=I32))
    with pytest.raises(ValueError, match=r"got -1"):  # plain indexing would wrap it
        ref.gather_sum_rows_ref(src, torch.tensor([[0, -1]], dtype=I32))
    with pytest.raises(ValueError, match=r"got 9"):
        ref.gather_rows_dot_ref(src[:1], src, torch.tensor([[9]], dtype=I32))


@pytest.mark.parametrize("tokens, k", [(0, 2), (1, 1), (13, 4), (40, 5)])
def test_routing_indices(tokens, k):
    experts = 5
    expert, row_token, token_rows, offs = routing(tokens, k, experts, seed=tokens)
    m = tokens * k
    assert row_token.dtype == token_rows.dtype == offs.dtype == I32
    assert row_token.shape == (m,) and token_rows.shape == (tokens, k) and offs.shape == (experts,)
    # Inverse permutations: row_token[token_rows[t, j]] == t, and every row used once.
    assert sorted(token_rows.reshape(-1).tolist()) == list(range(m))
    assert torch.equal(row_token[token_rows.long()],
                       torch.arange(tokens, dtype=I32)[:, None].expand(tokens, k))
    # Rows sorted by expert, tokens in order within an expert, offs the group ends.
    row_expert = expert.reshape(-1)[token_rows.reshape(-1).argsort()]
    assert torch.all(row_expert[1:] >= row_expert[:-1])
    counts = torch.bincount(expert.reshape(-1), minlength=experts)
    assert torch.equal(offs, counts.cumsum(0).to(I32))
    for e in range(experts):
        start = 0 if e == 0 else int(offs[e - 1])
        assert torch.all(row_expert[start:int(offs[e])] == e)
        toks = row_token[start:int(offs[e])]
        assert torch.all(toks[1:] > toks[:-1])


# ---- autograd formulas -----------------------------------------------------------------------

def _f64_problem(tokens=6, k=3, hidden=5, seed=0):
    _, row_token, token_rows, _ = routing(tokens, k, seed=seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g, dtype=F64, requires_grad=True)
    y = torch.randn(tokens * k, hidden, generator=g, dtype=F64, requires_grad=True)
    w = torch.rand(tokens, k, generator=g, dtype=F64, requires_grad=True)
    return x, y, w, row_token, token_rows


def test_gradcheck_public_functions_on_reference_path():
    # float64 always runs the references with plain autograd.
    x, y, w, row_token, token_rows = _f64_problem()
    assert torch.autograd.gradcheck(lambda x: perm.permute(x, row_token, token_rows), (x,))
    assert torch.autograd.gradcheck(lambda y, w: perm.unpermute(y, token_rows, row_token, w), (y, w))
    assert torch.autograd.gradcheck(lambda y: perm.unpermute(y, token_rows, row_token), (y,))


@pytest.mark.parametrize("tokens, k", [(6, 3), (1, 1), (9, 8)])
def test_gradcheck_autograd_functions(tokens, k, monkeypatch):
    # The backward formulas of the ops path (gathers over the inverse index, the weight
    # scattered to rows, the dot products), run in float64 with the references in place of
    # the ops they call.
    refs = SimpleNamespace(gather_rows=ref.gather_rows_ref, gather_sum_rows=ref.gather_sum_rows_ref,
                           gather_rows_dot=ref.gather_rows_dot_ref)
    monkeypatch.setattr(torch.ops, "cute_moe", refs)
    x, y, w, row_token, token_rows = _f64_problem(tokens, k, seed=tokens)
    assert torch.autograd.gradcheck(lambda x: perm._Permute.apply(x, row_token, token_rows), (x,))
    assert torch.autograd.gradcheck(
        lambda y, w: perm._Unpermute.apply(y, token_rows, row_token, w), (y, w))
    assert torch.autograd.gradcheck(
        lambda y: perm._Unpermute.apply(y, token_rows, row_token, None), (y,))


# ---- public functions --------------------------------------------------------------------------

def _bf16_problem(tokens, k, hidden, seed, weight_dtype=F32):
    _, row_token, token_rows, _ = routing(tokens, k, experts=max(k, 6), seed=seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(BF16).requires_grad_()
    y = torch.randn(tokens * k, hidden, generator=g).to(BF16).requires_grad_()
    w = torch.rand(tokens, k, generator=g).to(weight_dtype).requires_grad_()
    dx_sorted = torch.randn(tokens * k, hidden, generator=g).to(BF16)
    dout = torch.randn(tokens, hidden, generator=g).to(BF16)
    return x, y, w, row_token, token_rows, dx_sorted, dout


def _leaf64(t):
    return t.detach().double().requires_grad_()


@pytest.mark.parametrize("tokens, k, hidden", [(0, 2, 16), (1, 1, 8), (17, 4, 24), (33, 8, 40)])
@pytest.mark.parametrize("weight_dtype", [F32, BF16, None])
def test_permute_unpermute_match_reference(backend, tokens, k, hidden, weight_dtype):
    x, y, w, row_token, token_rows, dxs, dout = _bf16_problem(tokens, k, hidden, tokens,
                                                               weight_dtype or F32)
    weight = w if weight_dtype is not None else None
    xs = perm.permute(x, row_token, token_rows)
    out = perm.unpermute(y, token_rows, row_token, weight)
    assert (xs.shape, xs.dtype, out.shape, out.dtype) == ((tokens * k, hidden), BF16,
                                                          (tokens, hidden), BF16)
    assert torch.equal(xs, x.detach()[row_token.long()])
    grads = torch.autograd.grad([xs, out], [x, y] + ([w] if weight is not None else []),
                                [dxs, dout])

    x64, y64 = _leaf64(x), _leaf64(y)
    w64 = _leaf64(w) if weight is not None else None
    xs64 = ref.permute_ref(x64, row_token)
    out64 = ref.unpermute_ref(y64, token_rows, w64)
    leaves64 = [x64, y64] + ([w64] if weight is not None else [])
    grads64 = torch.autograd.grad([xs64, out64], leaves64, [dxs.double(), dout.double()])
    testing.assert_rel_close(out, out64, "out", BF16)
    for name, got, want, leaf in zip(("dx", "dy", "dweight"), grads, grads64, (x, y, w)):
        assert got.dtype == leaf.dtype, name
        testing.assert_rel_close(got, want, name, BF16)


def test_permute_gradient_sums_the_k_copies(backend):
    x, _, _, row_token, token_rows, _, _ = _bf16_problem(10, 3, 16, 4)
    perm.permute(x, row_token, token_rows).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3.0))


def test_float_dtypes_take_the_reference(backend):
    x, y, w, row_token, token_rows, _, _ = _bf16_problem(5, 2, 12, 3)  # 12: not a multiple of 8
    with OpLog() as log:
        out = perm.unpermute(perm.permute(x.detach().float(), row_token, token_rows),
                             token_rows, row_token, w.detach())
    assert log.calls == [] and out.dtype == F32 and out.shape == (5, 12)


def test_strided_and_non_contiguous_inputs(backend):
    x, y, w, row_token, token_rows, _, _ = _bf16_problem(12, 2, 16, 5)
    wide = torch.randn(12, 48).to(BF16)
    wide[:, 8:24] = x.detach()
    x_view = wide[:, 8:24]                 # row stride 48, offset 8: the kernels read it as is
    x_odd = torch.randn(12, 17).to(BF16)[:, 1:]  # offset 1: copied first
    x_odd.copy_(x.detach())
    tr_t = token_rows.t().contiguous().t()    # non-contiguous index
    for xin in (x_view, x_odd):
        assert torch.equal(perm.permute(xin, row_token, tr_t), x.detach()[row_token.long()])
    w_t = w.detach().t().contiguous().t()
    out = perm.unpermute(y.detach(), tr_t, row_token, w_t)
    testing.assert_rel_close(out, ref.unpermute_ref(y.detach().double(), token_rows, w_t.double()),
                             "out", BF16)


# ---- errors --------------------------------------------------------------------------------

def test_public_argument_errors(backend):
    x, y, w, rt, tr, _, _ = _bf16_problem(6, 2, 16, 7)
    x, y, w = x.detach(), y.detach(), w.detach()
    cases = [
        (lambda: perm.permute(x.tolist(), rt, tr), TypeError, r"cute_moe.permute: x: expected a tensor"),
        (lambda: perm.permute(x[0], rt, tr), ValueError, r"x: expected a 2-D tensor"),
        (lambda: perm.permute(x.int(), rt, tr), ValueError, r"x: expected a floating-point dtype"),
        (lambda: perm.permute(x, rt.long(), tr), ValueError, r"row_token: expected dtype torch.int32"),
        (lambda: perm.permute(x, rt, tr[:5]), ValueError, r"token_rows: expected 6 rows"),
        (lambda: perm.permute(x, rt[:11], tr), ValueError,
         r"row_token: expected length T\*k = 6\*2 = 12"),
        (lambda: perm.permute(x, rt.to("meta"), tr), ValueError,
         r"row_token: expected a tensor on x's device"),
        (lambda: perm.unpermute(y, tr, rt, w[:, :1]), ValueError,
         r"weight: expected token_rows' shape \(6, 2\)"),
        (lambda: perm.unpermute(y[:11], tr, rt, w), ValueError, r"row_token: expected length 11"),
        (lambda: perm.unpermute(y, tr, rt, "w"), TypeError, r"cute_moe.unpermute: weight: expected a tensor"),
        (lambda: perm.unpermute(y, tr.float(), rt), ValueError, r"token_rows: expected dtype torch.int32"),
    ]
    for fn, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            fn()


@needs_ops
def test_ops_path_needs_rows_of_16_bytes():
    x, y, _, rt, tr, _, _ = _bf16_problem(4, 2, 12, 8)
    with pytest.raises(ValueError, match=r"cute_moe.permute: x: expected a multiple of 8 columns"):
        perm.permute(x, rt, tr)
    with pytest.raises(ValueError, match=r"cute_moe.unpermute: y: expected a multiple of 8 columns"):
        perm.unpermute(y, tr, rt)


@needs_ops
def test_bad_index_on_the_cpu_kernel():
    x = torch.randn(4, 8).to(BF16)
    with pytest.raises(ValueError, match=r"index: expected values in \[0, 4\)"):
        torch.ops.cute_moe.gather_rows(x, torch.tensor([1, 4], dtype=I32))


# ---- the op layer (needs a library with the ops) ----------------------------------------------

ops = torch.ops.cute_moe if HAS_OPS else None


@needs_ops
def test_schemas_and_registrations():
    assert str(ops.gather_rows.default._schema) == (
        "cute_moe::gather_rows(Tensor src, Tensor index, Tensor? scale=None) -> Tensor")
    assert str(ops.gather_sum_rows.default._schema) == (
        "cute_moe::gather_sum_rows(Tensor src, Tensor index, Tensor? weight=None) -> Tensor")
    assert str(ops.gather_rows_dot.default._schema) == (
        "cute_moe::gather_rows_dot(Tensor a, Tensor src, Tensor index) -> Tensor")
    for name in permute_ops.OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"cute_moe::{name}", "CPU")


@needs_ops
def test_op_cpu_kernels_match_naive():
    g = torch.Generator().manual_seed(11)
    src = torch.randn(20, 16, generator=g).to(BF16)
    a = torch.randn(5, 16, generator=g).to(BF16)
    i1 = torch.randint(20, (9,), generator=g, dtype=I32)
    i2 = torch.randint(20, (5, 3), generator=g, dtype=I32)
    scale, weight = torch.rand(9, generator=g), torch.rand(5, 3, generator=g)
    out = ops.gather_rows(src, i1, scale)
    testing.assert_rel_close(out, naive_gather_rows(src, i1, scale), "gather_rows", BF16)
    out = ops.gather_sum_rows(src, i2, weight)
    testing.assert_rel_close(out, naive_gather_sum_rows(src, i2, weight), "gather_sum_rows", BF16)
    out = ops.gather_rows_dot(a, src, i2)
    assert out.dtype == F32
    testing.assert_rel_close(out, naive_gather_rows_dot(a, src, i2), "gather_rows_dot", F32)


@needs_ops
def test_fake_kernels():
    g = torch.Generator().manual_seed(12)
    real = (torch.randn(20, 16, generator=g).to(BF16), torch.randn(5, 16, generator=g).to(BF16),
            torch.randint(20, (9,), generator=g, dtype=I32),
            torch.randint(20, (5, 3), generator=g, dtype=I32), torch.rand(9, generator=g),
            torch.rand(5, 3, generator=g))
    mode = FakeTensorMode()
    src, a, i1, i2, scale, weight = (mode.from_tensor(t) for t in real)
    with mode:
        rows = ops.gather_rows(src, i1, scale)
        sums = ops.gather_sum_rows(src, i2, weight)
        dots = ops.gather_rows_dot(a, src, i2)
        with pytest.raises(ValueError, match=r"gather_rows: scale: expected length 9"):
            ops.gather_rows(src, i1, scale[:4])
        with pytest.raises(ValueError, match=r"gather_sum_rows: src: expected a multiple of 8 columns"):
            ops.gather_sum_rows(src[:, :12], i2)
        with pytest.raises(ValueError, match=r"gather_sum_rows: weight: expected index's shape"):
            ops.gather_sum_rows(src, i2, weight[:, :2])
        with pytest.raises(ValueError, match=r"gather_rows_dot: index: expected 5 rows"):
            ops.gather_rows_dot(a, src, i2[:4])
        with pytest.raises(ValueError, match=r"gather_rows_dot: src: expected 16 columns"):
            ops.gather_rows_dot(a, src[:, :8], i2)
        with pytest.raises(ValueError, match=r"gather_rows: index: expected a contiguous tensor"):
            ops.gather_rows(src, i2.t()[0])
        with pytest.raises(ValueError, match=r"gather_rows: src: expected unit column stride"):
            ops.gather_rows(src[:, 1:9], i1)
    assert (rows.shape, rows.dtype, rows.is_contiguous()) == ((9, 16), BF16, True)
    assert (sums.shape, sums.dtype) == ((5, 16), BF16)
    assert (dots.shape, dots.dtype) == ((5, 3), F32)


@needs_ops
def test_autograd_calls_only_the_needed_ops():
    x, y, w, rt, tr, dxs, dout = _bf16_problem(8, 2, 16, 9)
    with OpLog() as log:
        xs = perm.permute(x, rt, tr)
        xs.backward(dxs)
    assert log.calls == ["gather_rows", "gather_sum_rows"]
    y, w = y.detach(), w.detach()
    cases = [("yw", ["gather_sum_rows", "gather_rows", "gather_rows_dot"]),
             ("y", ["gather_sum_rows", "gather_rows"]),
             ("w", ["gather_sum_rows", "gather_rows_dot"])]
    for needed, expected in cases:
        leaves = [t.clone().requires_grad_(name in needed) for name, t in (("y", y), ("w", w))]
        with OpLog() as log:
            out = perm.unpermute(leaves[0], tr, rt, leaves[1])
            grads = torch.autograd.grad(out, [t for t in leaves if t.requires_grad], dout)
        assert log.calls == expected, needed
        assert all(g.shape == t.shape for g, t in zip(grads, (t for t in leaves if t.requires_grad)))
    out = perm.unpermute(y, tr, rt, w)
    assert out.grad_fn is None


@needs_ops
@pytest.mark.parametrize("compile_backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph(compile_backend):
    torch._dynamo.reset()
    x, _, w, rt, tr, _, _ = _bf16_problem(16, 4, 24, 10)

    def step(x, w, rt, tr):
        xs = perm.permute(x, rt, tr)
        h = xs * 2 + 1  # stands in for the experts
        return perm.unpermute(h, tr, rt, w).float().square().sum()

    compiled = torch.compile(step, fullgraph=True, backend=compile_backend)
    eager_loss = step(x, w, rt, tr)
    eager_grads = torch.autograd.grad(eager_loss, (x, w))
    loss = compiled(x, w, rt, tr)
    compiled_grads = torch.autograd.grad(loss, (x, w))
    assert torch.equal(loss, eager_loss)
    for a, b in zip(compiled_grads, eager_grads):
        assert torch.equal(a, b)

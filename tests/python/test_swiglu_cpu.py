# Tests on CPU of the fused SwiGLU expert FFN: the reference activation and its closed-form
# backward (against autograd and HF transformers' GPT-OSS expert math), the op
# references, the halves/interleaved repack, and the public grouped_mm_swiglu /
# grouped_mm_downproj with their autograd against a plain-PyTorch float64 expert block.
# The public functions run through the library's ops (the references behind their CPU
# kernels) and through the references alone; the op-level tests need the library.
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_moe
from cute_moe import _library, repack, testing
from cute_moe.testing import OpLog
from cute_moe import reference as ref
from seed_snippet import run_seed_snippet

BF16, F64 = torch.bfloat16, torch.float64
HAS_OPS = cute_moe.library_loaded()
needs_ops = pytest.mark.skipif(not HAS_OPS, reason="the op library is not loaded")


@pytest.fixture(params=["library", "reference"])
def backend(request, monkeypatch):
    """library: the loaded op library (when it is loaded); reference: as if no library
    were loaded."""
    if request.param == "reference":
        monkeypatch.setattr(_library, "library_loaded", lambda: False)
    return request.param


def hf_gpt_oss_activation(gate_up, alpha, limit):
    """HF transformers' GptOssExperts activation, written out."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    if limit is not None:
        gate = gate.clamp(min=None, max=limit)
        up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return (up + 1) * glu


def pre_with_edges(rows, inter, limit, dtype=F64, seed=0):
    """Pre-activations of scale 10 with values at, just around and far past +-limit."""
    g = torch.Generator().manual_seed(seed)
    pre = torch.randn(rows, 2 * inter, generator=g, dtype=F64) * 10
    lim = 7.0 if limit is None else limit
    edges = torch.tensor([lim, -lim, lim * (1 + 1e-6), -lim * (1 + 1e-6), lim * (1 - 1e-6),
                          1e4, -1e4, 50.0, -50.0, 0.0], dtype=F64)
    flat = pre.view(-1)
    flat[: 4 * len(edges)] = edges.repeat_interleave(4)
    return pre.to(dtype)


# ---- reference activation --------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("limit", [7.0, None, 0.5])
def test_swiglu_oai_ref_is_hf_gpt_oss_math(limit, dtype):
    pre = pre_with_edges(12, 20, limit, dtype)
    h = ref.swiglu_oai_ref(pre, 1.702, limit)
    assert h.dtype == dtype and h.shape == (12, 20)
    assert torch.equal(h, hf_gpt_oss_activation(pre, 1.702, limit))
    assert ref.swiglu_oai_ref(pre.to(BF16), 1.702, limit).dtype == torch.float32


@pytest.mark.parametrize("alpha", [1.702, 0.5])
@pytest.mark.parametrize("limit", [7.0, None, 2.5])
def test_swiglu_oai_bwd_ref_is_autograd(limit, alpha):
    pre = pre_with_edges(16, 24, limit).requires_grad_()
    dh = torch.randn(16, 24, generator=torch.Generator().manual_seed(1), dtype=F64)
    ref.swiglu_oai_ref(pre, alpha, limit).backward(dh)
    dpre = ref.swiglu_oai_bwd_ref(dh, pre.detach(), alpha, limit)
    assert dpre.dtype == F64 and dpre.shape == pre.shape
    torch.testing.assert_close(dpre, pre.grad, rtol=1e-12, atol=1e-300)


def test_swiglu_oai_bwd_ref_clamp_boundaries():
    lim = 7.0
    a = torch.tensor([lim, lim * (1 + 1e-9), 1e4, -1e4, -lim, 3.0, 3.0, 3.0, 3.0, 3.0], dtype=F64)
    b = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, lim, -lim, lim * (1 + 1e-9), -1e4, 1e4], dtype=F64)
    pre = torch.stack((a, b), -1).flatten()[None]
    dpre = ref.swiglu_oai_bwd_ref(torch.ones(1, len(a), dtype=F64), pre, 1.702, lim)[0]
    da, db = dpre[0::2], dpre[1::2]
    assert da[0] != 0 and da[4] != 0 and da[5] != 0  # a == limit passes, no lower clamp
    assert da[1] == 0 and da[2] == 0                  # above the limit
    assert db[5] != 0 and db[6] != 0                  # b == +-limit passes
    assert db[7] == 0 and db[8] == 0 and db[9] == 0   # outside [-limit, limit]
    no_limit = ref.swiglu_oai_bwd_ref(torch.ones(1, len(a), dtype=F64), pre, 1.702, None)[0]
    assert no_limit[2] != 0 and no_limit[19] != 0


# ---- op references ---------------------------------------------------------------------

@pytest.mark.parametrize("limit", [7.0, None])
@pytest.mark.parametrize("bias", [False, True])
def test_grouped_mm_swiglu_ref(bias, limit):
    g = torch.Generator().manual_seed(5)
    p = testing.random_expert_ffn(60, 32, 24, 5, "empty", pad=7, bias=bias, scale=6.0,
                                  generator=g)
    h, pre = ref.grouped_mm_swiglu_ref(p.x, p.w_up, p.offs, p.b_up, 1.702, limit)
    assert (h.shape, h.dtype, pre.shape, pre.dtype) == ((60, 24), BF16, (60, 48), BF16)
    assert torch.equal(pre, ref.grouped_mm_ref(p.x, p.w_up, p.offs, p.b_up))
    assert torch.equal(h, ref.swiglu_oai_ref(pre, 1.702, limit).to(BF16))
    assert torch.all(h[p.used_rows:] == 0) and torch.all(pre[p.used_rows:] == 0)
    assert (pre.float().abs() > 7).float().mean() > 0.1
    dy = torch.randn(60, 32, generator=g).to(BF16)
    _, h_bwd = ref.grouped_mm_swiglu_bwd_ref(dy, p.w_down.transpose(-2, -1), p.offs, pre,
                                             1.702, limit)
    assert torch.equal(h_bwd, h)


@pytest.mark.parametrize("limit", [7.0, None])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_grouped_mm_swiglu_bwd_ref_is_autograd(layout, limit):
    g = torch.Generator().manual_seed(6)
    p = testing.random_expert_ffn(70, 40, 16, 6, "skewed", pad=9, layout=layout, scale=5.0,
                                  generator=g)
    _, pre = ref.grouped_mm_swiglu_ref(p.x, p.w_up, p.offs, p.b_up, 1.702, limit)
    pre[p.used_rows:] = float("nan")  # padding rows hold anything
    dy = torch.randn(70, 40, generator=g).to(BF16)
    dpre, h = ref.grouped_mm_swiglu_bwd_ref(dy, p.w_down.transpose(-2, -1), p.offs, pre,
                                            1.702, limit)
    assert (dpre.shape, dpre.dtype, h.shape, h.dtype) == ((70, 32), BF16, (70, 16), BF16)
    assert torch.all(dpre[p.used_rows:] == 0) and torch.all(h[p.used_rows:] == 0)

    pre64 = pre.double().requires_grad_()
    h64 = ref.swiglu_oai_ref(pre64, 1.702, limit)
    y = ref.grouped_mm_ref(h64, p.w_down, p.offs, compute_dtype=F64)
    y.backward(dy.double())
    used = p.used_rows
    testing.assert_rel_close(dpre[:used], pre64.grad[:used], "dpre")
    testing.assert_rel_close(h[:used], h64[:used], "h")


# ---- repack ----------------------------------------------------------------------------

def test_repack_example():
    halves = torch.tensor([[10, 11, 12, 20, 21, 22]])
    inter = repack.halves_to_interleaved(halves)
    assert inter.tolist() == [[10, 20, 11, 21, 12, 22]]
    assert torch.equal(repack.interleaved_to_halves(inter), halves)


@pytest.mark.parametrize("shape, dim", [((3, 8, 12), -1), ((3, 12, 8), 1), ((4, 6), -1),
                                        ((4, 6), 1), ((2, 5, 4, 2), 2), ((10,), 0)])
def test_repack_round_trip(shape, dim):
    t = torch.randn(*shape).to(BF16)
    inter = repack.halves_to_interleaved(t, dim)
    assert inter.shape == t.shape and inter.is_contiguous()
    assert torch.equal(repack.interleaved_to_halves(inter, dim), t)
    assert torch.equal(repack.halves_to_interleaved(repack.interleaved_to_halves(t, dim), dim), t)
    half = t.shape[dim] // 2
    assert torch.equal(inter.narrow(dim, 0, 1), t.narrow(dim, 0, 1))
    assert torch.equal(inter.narrow(dim, 1, 1), t.narrow(dim, half, 1))


def test_repacked_llama_layout_gives_the_same_block():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(20, 16, generator=g, dtype=F64)
    w_halves = torch.randn(3, 16, 24, generator=g, dtype=F64) * 3  # [gate | up] per expert
    b_halves = torch.randn(3, 24, generator=g, dtype=F64)
    offs = ref.offsets_from_counts([7, 0, 13])
    gate_up = ref.grouped_mm_ref(x, w_halves, offs, b_halves, compute_dtype=F64)
    gate, up = gate_up.chunk(2, -1)
    expected = gate.clamp(max=7.0) * torch.sigmoid(1.702 * gate.clamp(max=7.0)) * (
        up.clamp(-7.0, 7.0) + 1)
    w, b = repack.halves_to_interleaved(w_halves), repack.halves_to_interleaved(b_halves)
    h = ref.swiglu_oai_ref(ref.grouped_mm_ref(x, w, offs, b, compute_dtype=F64))
    torch.testing.assert_close(h, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", [repack.halves_to_interleaved, repack.interleaved_to_halves])
def test_repack_errors(fn):
    with pytest.raises(ValueError, match=fn.__name__ + r": t: expected an even size 2I along "
                       r"dim 1, got shape \(2, 5\)"):
        fn(torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"dim: expected a dimension of a 2-D tensor, got 2"):
        fn(torch.zeros(2, 4), dim=2)


# ---- the public fused functions --------------------------------------------------------

def run_block(p, alpha=1.702, limit=7.0, aux=True):
    h, pre = cute_moe.grouped_mm_swiglu(p.x, p.w_up, offs=p.offs, bias=p.b_up,
                                        swiglu_alpha=alpha, swiglu_limit=limit)
    out = cute_moe.grouped_mm_downproj(h, p.w_down, offs=p.offs, bias=p.b_down,
                                       aux_biased_acc=pre if aux else None,
                                       swiglu_alpha=alpha, swiglu_limit=limit)
    return out, h, pre


LEAF_NAMES = ("x", "weight_up", "b_up", "weight_down", "b_down")


def reference_block(p, alpha=1.702, limit=7.0):
    """float64 copies of p's leaves by name (absent biases skipped) and the HF-style
    block on them: (leaves, out, activation)."""
    leaves = {name: getattr(p, name).detach().double().requires_grad_()
              for name in LEAF_NAMES if getattr(p, name) is not None}
    w_up, w_down = leaves["weight_up"], leaves["weight_down"]
    if p.layout == "nk":
        w_up, w_down = w_up.transpose(-2, -1), w_down.transpose(-2, -1)
    out, act = ref.expert_ffn_ref(leaves["x"], w_up, leaves.get("b_up"), w_down,
                                  leaves.get("b_down"), p.offs, alpha, limit,
                                  compute_dtype=F64, return_activation=True)
    return leaves, out, act


def loss_of(out, h, grad_out, dy):
    if grad_out == "sum":
        return out.sum()
    if grad_out == "random":
        return (out * dy.to(out.dtype)).sum()
    return out.sum() + h.to(out.dtype if out.dtype == F64 else torch.float32).square().sum()


def check_against_reference(p, out, h, grad_out, dy, alpha=1.702, limit=7.0):
    leaves, out64, act64 = reference_block(p, alpha, limit)
    loss_of(out64, act64, grad_out, dy).backward()
    testing.assert_rel_close(out, out64, "out")
    testing.assert_rel_close(h, act64, "swiglu_out")
    for name, leaf64 in leaves.items():
        leaf = getattr(p, name)
        assert leaf.grad is not None, f"{name} has no gradient"
        assert leaf.grad.dtype == BF16 and leaf.grad.shape == leaf.shape
        assert leaf.grad.stride() == leaf.stride(), f"{name}: gradient not in the leaf's layout"
        testing.assert_rel_close(leaf.grad, leaf64.grad, f"d{name}")


@pytest.mark.parametrize("grad_out", ["sum", "random", "swiglu_out_too"])
@pytest.mark.parametrize("limit", [7.0, None])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_fused_block_matches_hf_reference(backend, layout, bias, limit, grad_out):
    g = torch.Generator().manual_seed(11)
    p = testing.random_expert_ffn(83, 40, 24, 7, "skewed", pad=6, layout=layout, bias=bias,
                                  scale=4.0, generator=g, requires_grad=True)
    dy = torch.randn(83, 40, generator=g).to(BF16)
    out, h, pre = run_block(p, limit=limit)
    assert (out.shape, out.dtype, h.shape, pre.shape) == ((83, 40), BF16, (83, 24), (83, 48))
    loss_of(out, h, grad_out, dy).backward()
    check_against_reference(p, out, h, grad_out, dy, limit=limit)
    used = p.used_rows
    assert torch.all(out[used:] == 0) and torch.all(h[used:] == 0) and torch.all(pre[used:] == 0)
    assert torch.all(p.x.grad[used:] == 0)


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_downproj_without_aux(backend, layout):
    g = torch.Generator().manual_seed(12)
    p = testing.random_expert_ffn(50, 24, 16, 4, "empty", pad=3, layout=layout, scale=4.0,
                                  generator=g, requires_grad=True)
    dy = torch.randn(50, 24, generator=g).to(BF16)
    out, h, _ = run_block(p, aux=False)
    (out * dy).sum().backward()
    check_against_reference(p, out, h, "random", dy)


@pytest.mark.parametrize("alpha, limit", [(1.702, 7.0), (1.0, None), (2.0, 3.0)])
def test_alpha_and_limit(backend, alpha, limit):
    p = testing.random_expert_ffn(40, 16, 16, 3, scale=6.0, requires_grad=True,
                                  generator=torch.Generator().manual_seed(13))
    out, h, _ = run_block(p, alpha, limit)
    out.sum().backward()
    check_against_reference(p, out, h, "sum", None, alpha, limit)


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_empty_experts_get_exactly_zero_grads(backend, layout):
    g = torch.Generator().manual_seed(14)
    p = testing.random_expert_ffn(64, 24, 16, 16, "empty", pad=5, layout=layout, scale=3.0,
                                  generator=g, requires_grad=True)
    empty = torch.tensor(p.sizes) == 0
    assert empty.sum() >= 4
    out, h, _ = run_block(p)
    (out.float().square().sum() + h.float().sum()).backward()
    for name, leaf in (("W_up", p.weight_up), ("b_up", p.b_up), ("W_down", p.weight_down),
                       ("b_down", p.b_down)):
        assert torch.all(leaf.grad[empty] == 0), f"{name}: empty experts got a gradient"
        assert torch.any(leaf.grad[~empty] != 0)
    assert torch.all(p.x.grad[p.used_rows:] == 0)


@pytest.mark.parametrize("wanted, ops_run", [
    (("x",), ["grouped_mm_act_bwd", "grouped_mm_scaled"]),
    (("weight_down",), ["grouped_mm_wgrad"]),
    (("b_down",), ["grouped_column_sum"]),
    (("b_up", "weight_down"), ["grouped_mm_act_bwd", "grouped_mm_wgrad", "grouped_column_sum"]),
])
def test_gradients_of_only_some_inputs(backend, wanted, ops_run):
    g = torch.Generator().manual_seed(15)
    p = testing.random_expert_ffn(40, 16, 16, 3, "skewed", scale=4.0, generator=g,
                                  requires_grad=True)
    dy = torch.randn(40, 16, generator=g).to(BF16)
    out, _, _ = run_block(p)
    all_grads = dict(zip(LEAF_NAMES, torch.autograd.grad(out, p.leaves, dy)))
    for name in LEAF_NAMES:
        getattr(p, name).requires_grad_(name in wanted)
    out, _, _ = run_block(p)
    with OpLog() as log:
        grads = torch.autograd.grad(out, [getattr(p, name) for name in wanted], dy)
    for name, grad in zip(wanted, grads):
        testing.assert_rel_close(grad, all_grads[name].float(), name)
    if backend == "library" and HAS_OPS:
        assert log.calls == ops_run


def test_no_grad_forward(backend):
    p = testing.random_expert_ffn(30, 16, 8, 3, requires_grad=True)
    with torch.no_grad():
        out, h, pre = run_block(p)
    assert out.grad_fn is None and h.grad_fn is None and pre.grad_fn is None
    ref_out = ref.expert_ffn_ref(p.x, p.w_up, p.b_up, p.w_down, p.b_down, p.offs)
    testing.assert_rel_close(out, ref_out, "out")


def test_unpaired_swiglu_out_falls_back_to_unfused(backend):
    g = torch.Generator().manual_seed(16)
    p = testing.random_expert_ffn(40, 16, 16, 3, "skewed", scale=4.0, generator=g,
                                  requires_grad=True)
    h, pre = cute_moe.grouped_mm_swiglu(p.x, p.w_up, p.offs, p.b_up)
    with pytest.warns(UserWarning, match=r"grouped_mm_downproj: swiglu_out needs a gradient but "
                      r"is not the output of the grouped_mm_swiglu call"):
        out = cute_moe.grouped_mm_downproj(h * 1, p.w_down, p.offs, p.b_down, aux_biased_acc=pre)
    out.sum().backward()
    check_against_reference(p, out, h, "sum", None)


def test_aux_only_needs_a_gradient():
    g = torch.Generator().manual_seed(17)
    p = testing.random_expert_ffn(40, 16, 16, 3, "skewed", scale=4.0, generator=g)
    h, pre = ref.grouped_mm_swiglu_ref(p.x, p.w_up, p.offs, p.b_up)
    pre.requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = cute_moe.grouped_mm_downproj(h, p.w_down, p.offs, p.b_down, aux_biased_acc=pre)
    dy = torch.randn(40, 16, generator=g).to(BF16)
    out.backward(dy)
    expected, _ = ref.grouped_mm_swiglu_bwd_ref(dy, p.w_down.transpose(-2, -1), p.offs,
                                                pre.detach())
    assert torch.equal(pre.grad, expected)


@pytest.mark.parametrize("change, message", [
    (dict(swiglu_alpha=1.0), r"swiglu_alpha: expected 1.702, the value grouped_mm_swiglu used "
     r"for aux_biased_acc, got 1.0"),
    (dict(swiglu_limit=None), r"swiglu_limit: expected 7.0, the value grouped_mm_swiglu used"),
])
def test_downproj_checks_swiglu_parameters(change, message):
    p = testing.random_expert_ffn(20, 16, 8, 2, requires_grad=True)
    h, pre = cute_moe.grouped_mm_swiglu(p.x, p.w_up, p.offs, p.b_up)
    with pytest.raises(ValueError, match="cute_moe.grouped_mm_downproj: " + message):
        cute_moe.grouped_mm_downproj(h, p.w_down, p.offs, p.b_down, aux_biased_acc=pre, **change)


def _up_args(**change):
    p = testing.random_expert_ffn(16, 8, 12, 3)
    args = dict(x=p.x, W_up=p.w_up, offs=p.offs, bias=p.b_up)
    args.update(change)
    return args


UP_ERRORS = [
    (dict(W_up=torch.randn(3, 8, 24)), r"W_up: expected dtype torch.bfloat16"),
    (dict(W_up=torch.randn(3, 8, 23).to(BF16), bias=None),
     r"W_up: expected an even W_up.shape\[2\] \(2I interleaved"),
    (dict(x=torch.randn(16, 9).to(BF16)), r"x: expected 8 columns \(W_up.shape\[1\]\)"),
    (dict(bias=torch.randn(3, 12).to(BF16)), r"bias: expected shape \(3, 24\)"),
    (dict(offs=torch.tensor([4, 8], dtype=torch.int32)),
     r"offs: expected length 3 \(W_up.shape\[0\], the number of groups\)"),
    (dict(swiglu_limit=-1.0), r"swiglu_limit: expected None or a float >= 0, got -1.0"),
    (dict(swiglu_limit="7"), r"swiglu_limit: expected None or a float, got str"),
    (dict(swiglu_alpha=None), r"swiglu_alpha: expected a float, got NoneType"),
]


@pytest.mark.parametrize("change, message", UP_ERRORS, ids=[m[:24] for _, m in UP_ERRORS])
def test_grouped_mm_swiglu_argument_errors(change, message):
    with pytest.raises(ValueError, match=r"cute_moe.grouped_mm_swiglu: " + message):
        cute_moe.grouped_mm_swiglu(**_up_args(**change))


def _down_args(**change):
    p = testing.random_expert_ffn(16, 8, 12, 3)
    h, pre = cute_moe.grouped_mm_swiglu(p.x, p.w_up, p.offs, p.b_up)
    args = dict(swiglu_out=h, W_down=p.w_down, offs=p.offs, bias=p.b_down, aux_biased_acc=pre)
    args.update(change)
    return args


DOWN_ERRORS = [
    (dict(swiglu_out=torch.randn(16, 10).to(BF16)),
     r"swiglu_out: expected 12 columns \(W_down.shape\[1\]\)"),
    (dict(W_down=torch.randn(3, 12, 8)), r"W_down: expected dtype torch.bfloat16"),
    (dict(aux_biased_acc=torch.randn(16, 12).to(BF16)),
     r"aux_biased_acc: expected shape \(16, 24\) \(M, 2I\), got shape \(16, 12\)"),
    (dict(aux_biased_acc=torch.randn(16, 24)), r"aux_biased_acc: expected dtype torch.bfloat16"),
    (dict(aux_biased_acc=torch.randn(24, 16).to(BF16).t()),
     r"aux_biased_acc: expected unit column stride"),
    (dict(aux_biased_acc=torch.zeros(16, 24, dtype=BF16, device="meta")),
     r"aux_biased_acc: expected a tensor on swiglu_out's device cpu, got meta"),
    (dict(swiglu_limit=float("nan")), r"swiglu_limit: expected None or a float >= 0, got nan"),
]


@pytest.mark.parametrize("change, message", DOWN_ERRORS, ids=[m[:24] for _, m in DOWN_ERRORS])
def test_grouped_mm_downproj_argument_errors(change, message):
    with pytest.raises(ValueError, match=r"cute_moe.grouped_mm_downproj: " + message):
        cute_moe.grouped_mm_downproj(**_down_args(**change))


def test_seed_snippet_on_cpu_at_small_size(backend):
    p, out, swiglu_out, _ = run_seed_snippet("cpu", 8, 64, 32, [12, 6, 0, 25, 19, 3, 12, 6])
    check_against_reference(p, out, swiglu_out, "sum", None)


# ---- the ops (need a library with the fused SwiGLU ops) --------------------------------

@needs_ops
def test_schemas_and_registrations():
    ops = torch.ops.cute_moe
    assert str(ops.grouped_mm_swiglu.default._schema) == (
        "cute_moe::grouped_mm_swiglu(Tensor x, Tensor w, Tensor offs, Tensor? bias=None, "
        "float alpha=1.702, float? limit=7.) -> (Tensor, Tensor)")
    assert str(ops.grouped_mm_swiglu_bwd.default._schema) == (
        "cute_moe::grouped_mm_swiglu_bwd(Tensor dy, Tensor w, Tensor offs, Tensor pre, "
        "float alpha=1.702, float? limit=7.) -> (Tensor, Tensor)")
    for name in ("cute_moe::grouped_mm_swiglu", "cute_moe::grouped_mm_swiglu_bwd"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")


@needs_ops
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_fake_kernels(layout):
    p = testing.random_expert_ffn(50, 16, 12, 4, layout=layout)
    dy = torch.randn(50, 16).to(BF16)
    _, pre = ref.grouped_mm_swiglu_ref(p.x, p.w_up, p.offs, p.b_up)
    mode = FakeTensorMode()
    x, w_up, offs, b_up, w_down_t, fdy, fpre = (
        mode.from_tensor(t) for t in (p.x, p.w_up, p.offs, p.b_up,
                                      p.w_down.transpose(-2, -1), dy, pre))
    ops = torch.ops.cute_moe
    with mode:
        h, pre_f = ops.grouped_mm_swiglu(x, w_up, offs, b_up, 1.702, None)
        dpre, h2 = ops.grouped_mm_swiglu_bwd(fdy, w_down_t, offs, fpre)
        with pytest.raises(ValueError, match=r"grouped_mm_swiglu: w: expected an even"):
            ops.grouped_mm_swiglu(x, w_up[..., 1:], offs)
        with pytest.raises(ValueError, match=r"grouped_mm_swiglu_bwd: pre: expected shape "
                           r"\(50, 24\) \(M, 2I\)"):
            ops.grouped_mm_swiglu_bwd(fdy, w_down_t, offs, fpre[:, :12])
    for t, shape in ((h, (50, 12)), (pre_f, (50, 24)), (dpre, (50, 24)), (h2, (50, 12))):
        assert (t.shape, t.dtype, t.is_contiguous()) == (shape, BF16, True)


@needs_ops
@pytest.mark.parametrize("limit", [7.0, None])
def test_cpu_ops_are_the_references(limit):
    g = torch.Generator().manual_seed(18)
    p = testing.random_expert_ffn(45, 16, 12, 4, "empty", pad=4, scale=5.0, generator=g)
    ops = torch.ops.cute_moe
    h, pre = ops.grouped_mm_swiglu(p.x, p.w_up, p.offs, p.b_up, 1.5, limit)
    h_ref, pre_ref = ref.grouped_mm_swiglu_ref(p.x, p.w_up, p.offs, p.b_up, 1.5, limit)
    assert torch.equal(h, h_ref) and torch.equal(pre, pre_ref)
    dy = torch.randn(45, 16, generator=g).to(BF16)
    dpre, h_bwd = ops.grouped_mm_swiglu_bwd(dy, p.w_down.transpose(-2, -1), p.offs, pre, 1.5,
                                            limit)
    assert torch.equal(h_bwd, h)
    expected, _ = ref.grouped_mm_swiglu_bwd_ref(dy, p.w_down.transpose(-2, -1), p.offs, pre,
                                                1.5, limit)
    assert torch.equal(dpre, expected)
    with pytest.raises(ValueError, match=r"cute_moe.grouped_mm_swiglu_bwd: dy: expected 16 "
                       r"columns \(w.shape\[1\]\)"):
        ops.grouped_mm_swiglu_bwd(dy[:, :8], p.w_down.transpose(-2, -1), p.offs, pre)


@needs_ops
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_fused_route_runs_the_fused_ops(layout):
    p = testing.random_expert_ffn(40, 16, 16, 3, "skewed", layout=layout, requires_grad=True)
    with OpLog() as log:
        out, h, pre = run_block(p)
    # the down projection: grouped_mm's kernel through grouped_mm_scaled (no autograd layer)
    assert log.calls == ["grouped_mm_act", "grouped_mm_scaled"]
    saved_down = out.grad_fn.saved_tensors
    assert all(t is None or t.data_ptr() != h.data_ptr() for t in saved_down), "h was saved"
    assert any(t is not None and t.data_ptr() == pre.data_ptr() for t in saved_down)
    # Only the down projection keeps pre, so it is freed before the up projection's backward.
    saved_up = pre.grad_fn.saved_tensors
    assert all(t is None or t.data_ptr() != pre.data_ptr() for t in saved_up), "pre saved twice"
    del h
    with OpLog() as log:
        out.sum().backward()
    up_db = ["grouped_column_sum"] if layout == "nk" else []
    assert log.calls == (["grouped_mm_act_bwd", "grouped_mm_wgrad"] + up_db
                         + ["grouped_mm_scaled", "grouped_mm_wgrad"] + up_db)


@needs_ops
@pytest.mark.parametrize("compile_backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_torch_compile_fullgraph(compile_backend, layout):
    torch._dynamo.reset()
    p = testing.random_expert_ffn(48, 16, 16, 4, "empty", pad=3, layout=layout, scale=4.0,
                                  requires_grad=True)

    def step(x, weight_up, b_up, weight_down, b_down, offs):
        w_up, w_down = weight_up, weight_down
        if layout == "nk":
            w_up, w_down = w_up.transpose(-2, -1), w_down.transpose(-2, -1)
        h, pre = cute_moe.grouped_mm_swiglu(x, w_up, offs, b_up)
        out = cute_moe.grouped_mm_downproj(h, w_down, offs, b_down, aux_biased_acc=pre)
        return out.float().square().sum() + h.float().sum()

    args = (p.x, p.weight_up, p.b_up, p.weight_down, p.b_down, p.offs)
    eager_grads = torch.autograd.grad(step(*args), p.leaves)
    loss = torch.compile(step, fullgraph=True, backend=compile_backend)(*args)
    assert torch.equal(loss, step(*args))
    for a, b in zip(torch.autograd.grad(loss, p.leaves), eager_grads):
        assert torch.equal(a, b)

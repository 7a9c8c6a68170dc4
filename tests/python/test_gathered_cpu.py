# CPU tests of the gathered up projection (cute_moe.grouped_mm_act_gathered): its reference,
# the op's fake kernel and CPU kernel (the reference), the autograd formula of the fused
# route run on CPU through the op layer (so CI checks the backward wiring the GPU runs),
# and the argument errors.
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_moe
from cute_moe import testing
from cute_moe.reference import grouped_mm_act_gathered_ref, grouped_mm_act_ref

BF16 = torch.bfloat16


def _problem(tokens=40, hidden=16, n=24, experts=4, k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    choice = torch.rand(tokens, experts, generator=g).topk(k, dim=1).indices.reshape(-1)
    choice[choice == experts - 1] = 0  # the last expert gets no rows
    order = torch.sort(choice, stable=True).indices
    rows = (order // k).to(torch.int32)
    offs = torch.cumsum(torch.bincount(choice, minlength=experts), 0).to(torch.int32)
    x = torch.randn(tokens, hidden, generator=g).to(BF16)
    w = (torch.randn(experts, hidden, n, generator=g) / hidden ** 0.5).to(BF16)
    b = (torch.randn(experts, n, generator=g) * 0.1).to(BF16)
    return x, rows, w, offs, b


def test_reference_is_grouped_mm_act_on_the_gathered_rows():
    x, rows, w, offs, b = _problem()
    h, pre = grouped_mm_act_gathered_ref(x, rows, w, offs, b, None, "geglu", 1.702, None)
    h0, pre0 = grouped_mm_act_ref(x[rows.long()], w, offs, b, None, "geglu", 1.702, None)
    assert torch.equal(h, h0) and torch.equal(pre, pre0)
    assert h.shape == (rows.shape[0], 12)


@pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded")
def test_fake_kernel_shapes():
    x, rows, w, offs, b = _problem()
    mode = FakeTensorMode()
    fx, frows, fw, foffs, fb = (mode.from_tensor(t) for t in (x, rows, w, offs, b))
    with mode:
        h, pre = torch.ops.cute_moe.grouped_mm_act_gathered(fx, frows[:30], fw, foffs, fb, None, "swiglu")
        hs, pres = torch.ops.cute_moe.grouped_mm_act_gathered(fx, frows, fw, foffs, fb, None, "srelu")
    assert h.shape == (30, 12) and pre.shape == (30, 24)
    assert hs.shape == (80, 24) and pres.shape == (80, 24)


@pytest.mark.parametrize("act,limit", [("swiglu_oai", 7.0), ("swiglu", None), ("srelu", None)])
def test_gradients_match_autograd_of_the_reference(act, limit):
    # bf16 through the op layer's CPU kernels (library loaded) or the reference fallback
    x, rows, w, offs, b = _problem(seed=1)
    scale = (torch.rand(4) + 0.5).requires_grad_()
    leaves = [t.requires_grad_() for t in (x, w, b)]
    h, pre = cute_moe.grouped_mm_act_gathered(x, rows, w, offs, b, scale, act, 1.702, limit)
    g = torch.Generator().manual_seed(2)
    gh, gp = (torch.randn(t.shape, generator=g).to(BF16) for t in (h, pre))
    grads = torch.autograd.grad((h.float() * gh).sum() + (pre.float() * gp).sum(), leaves + [scale])
    ref = [t.detach().double().requires_grad_() for t in leaves + [scale]]
    hr, pr = grouped_mm_act_gathered_ref(ref[0], rows, ref[1], offs, ref[2], ref[3], act, 1.702, limit)
    want = torch.autograd.grad((hr * gh.double()).sum() + (pr * gp.double()).sum(), ref)
    for name, got, exp in zip(("x", "w", "bias", "scale"), grads, want):
        testing.assert_rel_close(got, exp, f"d{name}", BF16)


def test_argument_errors():
    x, rows, w, offs, b = _problem()
    with pytest.raises(ValueError, match="rows: expected dtype torch.int32"):
        cute_moe.grouped_mm_act_gathered(x, rows.long(), w, offs, b)
    with pytest.raises(ValueError, match=r"w: expected w.stride\(2\) == 1"):
        cute_moe.grouped_mm_act_gathered(x, rows, w.transpose(1, 2).contiguous().transpose(1, 2), offs, b)
    with pytest.raises(ValueError, match="x: expected at least one row"):
        cute_moe.grouped_mm_act_gathered(x[:0], rows, w, offs, b)
    with pytest.raises(ValueError, match="activation"):
        cute_moe.grouped_mm_act_gathered(x, rows, w, offs, b, activation="none")

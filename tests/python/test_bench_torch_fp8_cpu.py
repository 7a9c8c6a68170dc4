# bench/torch_fp8.py (the PyTorch FP8 expert block the FP8 benchmark compares against) on the
# CPU: its quantizers and the operand / scale layouts it hands torch._scaled_grouped_mm, with
# that op emulated by dequantized fp32 GEMMs in the layouts torch documents (2d x 3d: scales per
# row of A and per (expert, column) of B; 2d x 2d: per (group, row of A) and (group, column of
# B), group-major). The real op ran on an H100 (bench_fp8_block's gradient errors, session 18).
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import torch_fp8  # noqa: E402


def _emulated_scaled_grouped_mm(a, b, sa, sb, offs, out_dtype):
    outs, start = [], 0
    if a.dim() == 2 and b.dim() == 3:  # ragged M
        assert b.stride(-2) == 1 and sa.shape == (a.shape[0],) and sb.shape == (b.shape[0], b.shape[2])
        for e, end in enumerate(offs.tolist()):
            outs.append((a[start:end].float() * sa[start:end, None]) @ (b[e].float() * sb[e][None, :]))
            start = end
        outs.append(torch.zeros(a.shape[0] - start, b.shape[-1]))
        return torch.cat(outs).to(out_dtype)
    assert a.dim() == 2 and b.dim() == 2 and b.stride(0) == 1  # ragged K, B column-major
    g, k, n = offs.numel(), a.shape[0], b.shape[1]
    assert sa.shape == (g * k,) and sb.shape == (g * n,)
    for e, end in enumerate(offs.tolist()):
        outs.append((a[:, start:end].float() * sa[e * k:(e + 1) * k, None])
                    @ (b[start:end].float() * sb[e * n:(e + 1) * n][None, :]))
        start = end
    return torch.stack(outs).to(out_dtype)


def _rel(a, b):
    return ((a.float() - b).norm() / b.norm()).item()


def test_group_colwise_scales_each_groups_columns():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 8, generator=g).bfloat16()
    offs = torch.tensor([16, 16, 48], dtype=torch.int32)  # an empty group, 2 rows past the last
    q, s = torch_fp8.group_colwise(x, offs)
    want = torch.stack([x[:16].float().abs().amax(0), torch.zeros(8),
                        x[16:48].float().abs().amax(0)]).clamp_min(1e-12) / 448
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    torch.testing.assert_close(s, want, rtol=0, atol=0)
    assert q[16:48].float().abs().amax(0).eq(448).all()  # each column's largest maps to 448
    assert _rel(q[:48].float() * torch.repeat_interleave(s, torch.tensor([16, 0, 32]), dim=0), x[:48].float()) < 0.04


def test_scaled_grouped_mm_forward_and_backward(monkeypatch):
    monkeypatch.setattr(torch, "_scaled_grouped_mm", _emulated_scaled_grouped_mm, raising=False)
    g = torch.Generator().manual_seed(1)
    m, k, n = 96, 64, 48
    x = torch.randn(m, k, generator=g).bfloat16().requires_grad_()
    w = (torch.randn(3, k, n, generator=g) / 8).bfloat16().requires_grad_()
    offs = torch.tensor([32, 32, 80], dtype=torch.int32)  # an empty expert, 16 rows past the last
    dy = torch.randn(m, n, generator=g).bfloat16()
    y = torch_fp8.ScaledGroupedMM.apply(x, w, offs, False)
    dx, dw = torch.autograd.grad(y, [x, w], dy)
    xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    yr = torch.cat([xr[:32] @ wr[0], xr[32:80] @ wr[2], torch.zeros(16, n)])
    dxr, dwr = torch.autograd.grad(yr, [xr, wr], dy.float())
    for name, got, want in (("y", y, yr), ("dx", dx, dxr), ("dw", dw, dwr)):
        assert got.dtype == torch.bfloat16
        err = _rel(got, want)
        assert 1e-3 < err < 6e-2, (name, err)  # e4m3 operands: a few percent, not exact
    assert torch.all(dw[1] == 0) and torch.all(y[80:] == 0) and torch.all(dx[80:] == 0)


@pytest.mark.parametrize("activation,bias", [("swiglu_oai", True), ("swiglu", False)])
def test_expert_block_gradients_reach_every_input(monkeypatch, activation, bias):
    monkeypatch.setattr(torch, "_scaled_grouped_mm", _emulated_scaled_grouped_mm, raising=False)
    g = torch.Generator().manual_seed(2)
    m, h, i, e = 64, 32, 32, 2

    def leaf(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).bfloat16().requires_grad_()

    x, w_up, w_down = leaf(m, h), leaf(e, h, 2 * i, s=h ** -0.5), leaf(e, i, h, s=i ** -0.5)
    b_up, b_down = (leaf(e, 2 * i, s=0.1), leaf(e, h, s=0.1)) if bias else (None, None)
    prob = torch.rand(m, generator=g).requires_grad_()
    offs = torch.tensor([16, 64], dtype=torch.int32)
    y = torch_fp8.expert_block(x, w_up, w_down, offs, b_up, b_down, prob, activation)
    leaves = [t for t in (x, w_up, w_down, b_up, b_down, prob) if t is not None]
    grads = torch.autograd.grad(y, leaves, torch.randn(m, h, generator=g).bfloat16())
    assert y.shape == (m, h) and all(gr is not None and gr.abs().sum() > 0 for gr in grads)


@pytest.mark.parametrize("activation,bias", [("swiglu_oai", True), ("swiglu", False)])
def test_moe_layer_matches_the_reference_layer(monkeypatch, activation, bias):
    """The PyTorch FP8 MoE layer (bench_fp8_layer's "torch fp8" side): each expert's rows padded
    to 16 in a buffer of a static bound, the same function as the bf16 reference layer up to
    e4m3's rounding, its gradients in x and every parameter; the experts' counts here are not
    multiples of 16 (one is: 19, 16, 17, 22 rows) and one expert gets no row."""
    from cute_moe.reference import ReferenceMoE
    from cute_moe.reference.moe import route_ref
    monkeypatch.setattr(torch, "_scaled_grouped_mm", _emulated_scaled_grouped_mm, raising=False)
    torch.manual_seed(3)
    ref = ReferenceMoE(64, 32, 5, 2, activation=activation, bias=bias, dtype=torch.bfloat16)
    with torch.no_grad():  # routing that leaves expert 4 empty
        ref.router.gate.weight[4] = 0.0
        ref.router.gate.bias[4] = -1e4
    x = torch.randn(37, 64).bfloat16().requires_grad_()
    _, experts, _ = route_ref(x, ref.router.gate.weight, ref.router.gate.bias, 2)
    counts = torch.bincount(experts.reshape(-1), minlength=5)
    assert counts[4] == 0 and (counts[:4] % 16 != 0).sum() >= 3, counts
    names, params = zip(*[(n, p) for n, p in ref.named_parameters() if p.requires_grad])
    y = torch_fp8.moe_layer(ref, x)
    want = ref(x)
    assert y.shape == want.shape and y.dtype == torch.bfloat16
    assert 1e-3 < _rel(y, want.float()) < 8e-2
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, *params], dy, allow_unused=True)
    ref_grads = torch.autograd.grad(want, [x, *params], dy, allow_unused=True)
    compared = 0
    for name, g_got, g_want in zip(("x",) + names, got, ref_grads):
        if g_want is None or g_want.abs().sum() == 0:
            continue  # the router's expert bias picks experts: no gradient in either
        assert g_got is not None, name
        if name.startswith("router"):
            # the routing weights' gradient is a difference of nearly equal terms (softmax,
            # renormalized): e4m3's few percent in y come back larger, the direction holds
            cos = torch.nn.functional.cosine_similarity(g_got.float().flatten(), g_want.float().flatten(), 0)
            assert cos > 0.9, (name, cos)
        else:
            assert _rel(g_got, g_want.float()) < 1.5e-1, name
        compared += 1
    assert compared >= (7 if bias else 4)  # x, the gate (and its bias), the expert weights (and biases)

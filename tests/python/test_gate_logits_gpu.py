# The router's float32 gate on bf16 tensor cores (cute_moe/nn/gate_logits.py) against the
# float32 F.linear it replaces (torchtitan's router math) and float64: the logits within
# 1e-5 of float64 (bf16 logits, HF's, would be ~2e-3 off); dx, dW, db no further from the
# float64 gradient than float32 math rounded to bf16 (a backward that dropped the low
# half of the float32 dlogits would be ~1.4x further).
import pytest
import torch
import torch.nn.functional as F

from cute_moe.nn import MoE
from cute_moe.nn.gate_logits import gate_logits, serves_on_tensor_cores

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("t,h,e,bias", [(4096, 2880, 32, True), (1000, 512, 128, False),
                                        (0, 256, 8, True)])
def test_gate_logits_match_float64(t, h, e, bias):
    g = torch.Generator(device="cuda").manual_seed(t + e)
    x = torch.randn(t, h, device="cuda", generator=g).to(BF16).requires_grad_()
    w = (torch.randn(e, h, device="cuda", generator=g) * h ** -0.5).to(BF16).requires_grad_()
    b = (torch.randn(e, device="cuda", generator=g) * 0.1).to(BF16).requires_grad_() if bias else None
    dl = torch.randn(t, e, device="cuda", generator=g) * 1e-3  # float32 dlogits, not bf16 values
    assert serves_on_tensor_cores(x, w)
    logits = gate_logits(x, w, b)
    assert logits.dtype == F32 and logits.shape == (t, e)
    inputs = [x, w] + ([b] if bias else [])
    grads = torch.autograd.grad(logits, inputs, dl)

    ins64 = [v.detach().double().requires_grad_() for v in inputs]
    ref = F.linear(ins64[0], ins64[1], ins64[2] if bias else None)
    ref_grads = torch.autograd.grad(ref, ins64, dl.double())
    ins32 = [v.detach().float().requires_grad_() for v in inputs]
    f32 = F.linear(ins32[0], ins32[1], ins32[2] if bias else None)
    f32_grads = [gr.to(BF16) for gr in torch.autograd.grad(f32, ins32, dl)]
    if t == 0:
        assert all(torch.all(gr == 0) for gr in grads[1:])
        return
    assert _rel(logits, ref) < 1e-5
    for name, a, b, r in zip(["dx", "dW", "db"], grads, f32_grads, ref_grads):
        assert a.dtype == BF16, name
        assert _rel(a, r) <= 1.1 * _rel(b, r) + 1e-6, (name, _rel(a, r), _rel(b, r))


def test_cpu_and_float32_keep_f_linear():
    x = torch.randn(4, 8).to(BF16)
    w = torch.randn(3, 8).to(BF16)
    assert not serves_on_tensor_cores(x, w)
    assert not serves_on_tensor_cores(x.cuda().float(), w.cuda().float())


def test_router_uses_it_and_agrees_with_float32_routing():
    """The MoE layer's router (float32 compute, bf16 gate): same experts as the float32
    SGEMM on random data, weights to float32 rounding."""
    torch.manual_seed(0)
    moe = MoE(512, 256, 16, 4, dtype=BF16, device="cuda")
    x = torch.randn(2048, 512, device="cuda").to(BF16)
    r = moe.router(x)
    gw, gb = moe.router.gate.weight, moe.router.gate.bias
    ref = F.linear(x.float(), gw.float(), gb.float())
    assert _rel(r.logits, ref.double()) < 1e-5
    same = (r.experts.sort(-1).values == torch.topk(ref, 4, -1).indices.sort(-1).values).all(-1)
    assert same.float().mean().item() >= 0.999

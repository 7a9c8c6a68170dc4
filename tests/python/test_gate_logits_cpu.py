# The router's float32 gate (cute_moe/nn/gate_logits.py) where no GPU is needed: the split of
# float32 dlogits into bf16 hi + lo keeps 16 significant bits, and on the CPU (or with
# non-bf16 tensors) the router keeps F.linear in float32, so its logits are the reference's.
import torch
import torch.nn.functional as F

from cute_moe.nn import TopKRouter
from cute_moe.nn.gate_logits import _split, serves_on_tensor_cores

BF16 = torch.bfloat16


def test_split_keeps_16_bits():
    g = torch.randn(1000, 64) * torch.logspace(-8, 2, 64)
    both = _split(g)
    hi, lo = both[:, :64].float(), both[:, 64:].float()
    assert both.dtype == BF16 and both.shape == (1000, 128)
    assert ((hi + lo - g).abs() <= g.abs() * 2.0 ** -16).all()
    assert not ((hi - g).abs() <= g.abs() * 2.0 ** -12).all()  # hi alone does not


def test_cpu_router_keeps_float32_f_linear():
    torch.manual_seed(0)
    router = TopKRouter(64, 8, 2, dtype=BF16)
    x = torch.randn(50, 64).to(BF16)
    assert not serves_on_tensor_cores(x, router.gate.weight)
    out = router(x)
    ref = F.linear(x.float(), router.gate.weight.float(), router.gate.bias.float())
    assert out.logits.dtype == torch.float32 and torch.equal(out.logits, ref)

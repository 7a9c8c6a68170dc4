# Tests of the public cute_moe.grouped_mm on CPU: values and gradients against float64
# ground truth, and argument errors. They run through the compiled ops' CPU kernels when
# the library is loaded and through the reference fallback otherwise.
import pytest
import torch

import cute_moe
from cute_moe import testing

BF16 = torch.bfloat16


def float64_grads(p, dy):
    x = p.x.detach().double().requires_grad_()
    weight = p.weight.detach().double().requires_grad_()
    bias = p.bias.detach().double().requires_grad_() if p.bias is not None else None
    w = weight if p.layout == "kn" else weight.transpose(-2, -1)
    y = cute_moe.reference.grouped_mm_ref(x, w, p.offs, bias, compute_dtype=torch.float64)
    y.backward(dy.double())
    return y, x.grad, weight.grad, bias.grad if bias is not None else None


@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("grad_out", ["random", "sum"])
def test_values_and_grads(layout, bias, grad_out):
    g = torch.Generator().manual_seed(7)
    p = testing.random_problem(70, 24, 40, 6, "empty", pad=5, layout=layout, bias=bias,
                               generator=g, requires_grad=True)
    y = cute_moe.grouped_mm(p.x, p.w, p.offs, p.bias)
    if grad_out == "sum":
        y.sum().backward()
        dy = torch.ones(70, 40)
    else:
        dy = torch.randn(70, 40, generator=g).to(BF16)
        y.backward(dy)
    y64, dx64, dw64, db64 = float64_grads(p, dy)
    assert y.dtype == BF16 and y.shape == (70, 40)
    testing.assert_rel_close(y, y64, "y")
    testing.assert_rel_close(p.x.grad, dx64, "dx")
    testing.assert_rel_close(p.weight.grad, dw64, "dw")
    assert p.weight.grad.shape == p.weight.shape
    assert torch.all(y[p.used_rows:] == 0) and torch.all(p.x.grad[p.used_rows:] == 0)
    if bias:
        testing.assert_rel_close(p.bias.grad, db64, "db")
        assert p.bias.grad.dtype == BF16


def _args(**change):
    p = testing.random_problem(16, 8, 24, 3, bias=True)
    args = {"x": p.x, "w": p.w, "offs": p.offs, "bias": p.bias}
    args.update(change)
    return args


BAD_ARGS = [
    (dict(x=torch.randn(16, 8)), r"x: expected dtype torch.bfloat16, got torch.float32"),
    (dict(x=torch.randn(2, 16, 8).to(BF16)), r"x: expected a 2-D tensor, got shape \(2, 16, 8\)"),
    (dict(x=torch.randn(16, 16).to(BF16)), r"x: expected 8 columns \(w.shape\[1\]\)"),
    (dict(x=torch.randn(8, 16).to(BF16).t()), r"x: expected unit column stride"),
    (dict(w=torch.randn(3, 8, 24)), r"w: expected dtype torch.bfloat16"),
    (dict(w=torch.randn(8, 24).to(BF16)), r"w: expected a 3-D tensor"),
    (dict(w=torch.randn(3, 24, 8, 2).to(BF16)[..., 0].transpose(1, 2)), r"w: expected w.stride"),
    (dict(offs=torch.tensor([4, 8, 16])), r"offs: expected dtype torch.int32, got torch.int64"),
    (dict(offs=torch.tensor([8, 16], dtype=torch.int32)), r"offs: expected length 3"),
    (dict(offs=torch.zeros(3, 1, dtype=torch.int32)), r"offs: expected a 1-D tensor"),
    (dict(bias=torch.randn(3, 8).to(BF16)), r"bias: expected shape \(3, 24\)"),
    (dict(bias=torch.randn(3, 24)), r"bias: expected dtype torch.bfloat16"),
    (dict(offs=torch.zeros(3, dtype=torch.int32, device="meta")),
     r"offs: expected a tensor on x's device cpu, got meta"),
    (dict(bias=torch.zeros(3, 24, dtype=BF16, device="meta")), r"bias: expected a tensor on x's"),
]


@pytest.mark.parametrize("change, message", BAD_ARGS, ids=[m[:24] for _, m in BAD_ARGS])
def test_argument_errors(change, message):
    with pytest.raises(ValueError, match=r"cute_moe.grouped_mm: " + message):
        cute_moe.grouped_mm(**_args(**change))


def test_package_exports():
    assert cute_moe.__version__ == "0.1.0"
    assert isinstance(cute_moe.library_loaded(), bool)
    assert callable(cute_moe.reference.grouped_mm_ref)

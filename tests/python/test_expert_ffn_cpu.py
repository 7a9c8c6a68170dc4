# cute_moe.expert_ffn on the CPU (the references, or the library's CPU kernels): every
# activation x bias x router probability x per-expert scale, output and all gradients
# against the fp32 reference; argument errors; torch.compile tracing.
import itertools

import pytest
import torch

import cute_moe
from cute_moe import reference as ref, testing

from expert_ffn_cases import (ACTIVATIONS, check_block, check_combine, check_halves_block, check_halves_pair,
                             make_block, run_ours)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("bias, prob, scale", list(itertools.product([False, True], repeat=3)))
def test_every_combination_matches_the_reference(activation, bias, prob, scale):
    leaves, offs = make_block(96, 32, 16, 4, activation, bias=bias, prob=prob, scale=scale)
    check_block(leaves, offs, activation)


@pytest.mark.parametrize("activation", ["swiglu_oai", "swiglu", "geglu", "srelu"])
def test_boundary_values(activation):
    leaves, offs = make_block(96, 32, 16, 4, activation, bias=True, prob=True, scale=False,
                              boundary=True)
    check_block(leaves, offs, activation)


@pytest.mark.parametrize("activation", ["swiglu", "srelu"])
def test_transposed_weights_and_empty_experts(activation):
    leaves, offs = make_block(80, 32, 16, 6, activation, bias=True, prob=True, scale=True,
                              routing="empty", layout="nk")
    check_block(leaves, offs, activation, layout="nk")


def test_reference_activations_match_their_formulas():
    pre = torch.randn(64, 32, dtype=torch.float64) * 4
    a, b = pre[:, 0::2], pre[:, 1::2]
    sig = torch.sigmoid
    torch.testing.assert_close(ref.act_ref(pre, "swiglu"), a * sig(a) * b)
    gelu = 0.5 * a * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (a + 0.044715 * a ** 3)))
    torch.testing.assert_close(ref.act_ref(pre, "geglu"), gelu * b)
    torch.testing.assert_close(ref.act_ref(pre, "srelu"), torch.where(pre > 0, pre * pre, 0.0))
    g, u = a.clamp(max=7.0), b.clamp(-7.0, 7.0)
    torch.testing.assert_close(ref.act_ref(pre, "swiglu_oai", 1.702, 7.0),
                               g * sig(1.702 * g) * (u + 1))
    torch.testing.assert_close(ref.act_ref(pre, "swiglu", limit=2.0),
                               a.clamp(max=2.0) * sig(a.clamp(max=2.0)) * b.clamp(-2.0, 2.0))

@pytest.mark.parametrize("activation, limit", [("swiglu_oai", 7.0), ("swiglu_oai", None),
                                               ("swiglu", 2.0), ("swiglu", None),
                                               ("geglu", 3.0), ("geglu", None),
                                               ("srelu", None), ("none", None)])
def test_reference_backward_is_autograd_of_the_activation(activation, limit):
    """act_bwd_ref (closed form) against autograd of act_ref, with pre values on the
    clamp bounds and at 0 (where relu's and the clamps' one-sided derivatives differ)."""
    g = torch.Generator().manual_seed(3)
    pre = torch.randn(64, 32, dtype=torch.float64, generator=g) * 4
    edges = torch.tensor([0.0] + ([limit, -limit] if limit else [1.0, -1.0]), dtype=pre.dtype)
    pre[:8] = edges[torch.randint(len(edges), (8, 32), generator=g)]
    width = 16 if activation in ref.GATED_ACTIVATIONS else 32
    dh = torch.randn(64, width, dtype=torch.float64, generator=g)
    p = pre.clone().requires_grad_()
    (expected,) = torch.autograd.grad(ref.act_ref(p, activation, 1.702, limit), p, dh)
    torch.testing.assert_close(ref.act_bwd_ref(dh, pre, activation, 1.702, limit), expected,
                               rtol=1e-12, atol=1e-12)



def test_seed_functions_are_the_swiglu_oai_block():
    leaves, offs = make_block(64, 32, 16, 4, "swiglu_oai", bias=True, prob=False, scale=False)
    h, pre = cute_moe.grouped_mm_swiglu(leaves["x"], leaves["w_up"], offs, leaves["b_up"])
    out = cute_moe.grouped_mm_downproj(h, leaves["w_down"], offs, leaves["b_down"],
                                       aux_biased_acc=pre)
    assert torch.equal(out, run_ours(leaves, offs, "swiglu_oai"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(activation="relu"), r"activation: expected one of"),
    (dict(activation="srelu", limit=7.0), r"limit: expected None for 'srelu'"),
    (dict(prob="p"), r"prob: expected a tensor or None"),
    (dict(scale_up=torch.ones(3)), r"scale_up: expected shape \(4,\)"),
])
def test_argument_errors(kwargs, message):
    leaves, offs = make_block(16, 32, 16, 4, "swiglu", bias=False, prob=False, scale=False)
    with pytest.raises(ValueError, match=message):
        cute_moe.expert_ffn(leaves["x"], leaves["w_up"], leaves["w_down"], offs, **kwargs)


def test_wrong_widths_are_rejected():
    leaves, offs = make_block(16, 32, 16, 4, "srelu", bias=False, prob=False, scale=False)
    with pytest.raises(ValueError, match=r"w_down: expected shape \(4, 8, 32\)"):
        cute_moe.expert_ffn(leaves["x"], leaves["w_up"], leaves["w_down"], offs,
                            activation="swiglu")


@pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded")
def test_schemas():
    ops = torch.ops.cute_moe
    assert str(ops.grouped_mm_act.default._schema) == (
        "cute_moe::grouped_mm_act(Tensor x, Tensor w, Tensor offs, Tensor? bias=None, "
        "Tensor? scale=None, str activation=\"swiglu_oai\", float alpha=1.702, float? limit=None, "
        "str gate_linear=\"interleaved\", Tensor? w_linear=None) -> (Tensor, Tensor)")
    assert str(ops.grouped_mm_scaled.default._schema) == (
        "cute_moe::grouped_mm_scaled(Tensor x, Tensor w, Tensor offs, Tensor? bias=None, "
        "Tensor? scale=None, Tensor? prob=None) -> Tensor")
    for name in ("grouped_mm_act", "grouped_mm_act_bwd", "grouped_mm_scaled"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"cute_moe::{name}", "CPU")


@pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded")
@pytest.mark.parametrize("activation", ["swiglu_oai", "geglu", "srelu", "none"])
def test_torch_compile_fullgraph(activation):
    torch._dynamo.reset()
    leaves, offs = make_block(48, 32, 16, 4, activation, bias=True, prob=True, scale=True)

    def forward(leaves):
        return run_ours(leaves, offs, activation)

    def step(fn):
        out = fn(leaves)  # the compiled graph carries its backward (AOT autograd)
        return out, torch.autograd.grad(out.float().sum(), list(leaves.values()))

    out, grads = step(torch.compile(forward, fullgraph=True, backend="aot_eager"))
    out_eager, grads_eager = step(forward)
    torch.testing.assert_close(out, out_eager)
    for a, b in zip(grads, grads_eager):
        torch.testing.assert_close(a, b)


@pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded")
@pytest.mark.parametrize("activation, prob, calls", [
    # The fused backward gives dprob and prob * h; "none" without prob needs neither. With
    # prob, one pass over dy first gives b_down's gradient and dprob's bias term.
    ("swiglu", True, ["grouped_bias_grads", "grouped_mm_act_bwd"]),
    ("swiglu", False, ["grouped_mm_act_bwd"]),
    ("none", True, ["grouped_bias_grads", "grouped_mm_act_bwd"]),
    ("none", False, ["grouped_mm_scaled"]),
])
def test_down_projection_backward_runs_the_fused_op(activation, prob, calls):
    leaves, offs = make_block(48, 32, 16, 4, activation, bias=True, prob=prob, scale=True)
    out = run_ours(leaves, offs, activation)
    with testing.OpLog() as log:
        torch.autograd.grad(out.float().sum(), list(leaves.values()))
    assert log.calls[:len(calls)] == calls, log.calls


@pytest.mark.parametrize("activation", ["swiglu_oai", "swiglu", "geglu"])
@pytest.mark.parametrize("up_storage, down_storage", [("kn", "kn"), ("nk", "nk"), ("nk", "kn")])
def test_halves_layout_is_the_same_function(activation, up_storage, down_storage):
    leaves, offs = make_block(80, 32, 16, 6, activation, bias=True, prob=True, scale=True,
                              routing="empty")
    check_halves_block(leaves, offs, activation, up_storage, down_storage)


def test_halves_layout_needs_a_gated_activation():
    leaves, offs = make_block(32, 16, 8, 2, "srelu", bias=False, prob=False, scale=False)
    with pytest.raises(ValueError, match="gate_linear"):
        cute_moe.expert_ffn(leaves["x"], leaves["w_up"], leaves["w_down"], offs,
                            activation="srelu", gate_linear="halves")
    with pytest.raises(ValueError, match="gate_linear"):
        cute_moe.expert_ffn(leaves["x"], leaves["w_up"], leaves["w_down"], offs,
                            activation="srelu", gate_linear="pairs")


@pytest.mark.parametrize("activation, bias", [("swiglu", False), ("swiglu_oai", True)])
@pytest.mark.parametrize("placement", ["above", "below", "separate"])
def test_halves_pair_is_the_joined_tensor(activation, bias, placement):
    # on the CPU the pair is joined (the kernels read it in place on the GPU): the gradients
    # reach both tensors of the pair
    leaves, offs = make_block(80, 32, 16, 6, activation, bias=bias, prob=True, scale=False,
                              routing="empty")
    check_halves_pair(leaves, offs, activation, placement)


def test_halves_pair_up_projection_backward():
    """UpProj with w_linear (the route the GPU takes for a pair): the input gradient from
    one GEMM over both tensors, each half's weight gradient from its half of dpre, the bias
    gradient over both halves; the same as UpProj on the joined tensor."""
    from cute_moe.ffn_autograd import Act, UpProj
    g = torch.Generator().manual_seed(4)
    e, hidden, inter, m = 3, 32, 16, 40
    x = torch.randn(m, hidden, generator=g).to(torch.bfloat16).requires_grad_()
    w1, w3 = (torch.randn(e, inter, hidden, generator=g).mul(0.2).to(torch.bfloat16).requires_grad_()
              for _ in range(2))
    b = torch.randn(e, 2 * inter, generator=g).to(torch.bfloat16).requires_grad_()
    offs = torch.tensor([10, 10, 33], dtype=torch.int32)
    act = Act("swiglu", 1.702, None, "halves")
    dpre = torch.randn(m, 2 * inter, generator=g).to(torch.bfloat16)
    _, pre = UpProj.apply(x, w1.transpose(-2, -1), offs, b, None, act, False, None, None, False,
                          w3.transpose(-2, -1))
    got = torch.autograd.grad(pre, [x, w1, w3, b], dpre)
    joined = torch.cat([w1, w3], dim=1)
    _, pre_ref = UpProj.apply(x, joined.transpose(-2, -1), offs, b, None, act, False)
    want = torch.autograd.grad(pre_ref, [x, w1, w3, b], dpre)
    assert torch.equal(pre, pre_ref)
    for name, a, w in zip(("dx", "dw1", "dw3", "db"), got, want):
        assert a.shape == w.shape and torch.equal(a, w), name


@pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded")
def test_act_op_w_linear_cpu_kernel():
    """grouped_mm_act(..., "halves", w_linear): the [gate | linear] halves as two tensors,
    the CPU kernel's result that of the joined tensor; its argument errors."""
    ops = torch.ops.cute_moe
    leaves, offs = make_block(40, 32, 16, 3, "swiglu", bias=True, prob=False, scale=False)
    x, w = leaves["x"].detach(), leaves["w_up"].detach()  # (E, H, 2I), taken as halves here
    b = leaves["b_up"].detach()
    gate, linear = w[..., :16].contiguous(), w[..., 16:].contiguous()
    got = ops.grouped_mm_act(x, gate, offs, b, None, "swiglu", 1.702, None, "halves", linear)
    want = ops.grouped_mm_act(x, w, offs, b, None, "swiglu", 1.702, None, "halves")
    assert all(torch.equal(a, c) for a, c in zip(got, want))
    with pytest.raises(ValueError, match=r"w_linear: expected None unless gate_linear='halves'"):
        ops.grouped_mm_act(x, gate, offs, b, None, "swiglu", 1.702, None, "interleaved", linear)
    with pytest.raises(ValueError, match=r"w_linear: expected the gate half's shape"):
        ops.grouped_mm_act(x, gate, offs, b, None, "swiglu", 1.702, None, "halves", linear[:2])


def test_halves_pair_errors():
    leaves, offs = make_block(32, 16, 8, 2, "swiglu", bias=False, prob=False, scale=False)
    w = leaves["w_up"]
    gate, linear = w[..., :8], w[..., 8:]
    with pytest.raises(ValueError, match=r"w_up as a pair \(w_gate, w_linear\) needs gate_linear='halves'"):
        cute_moe.expert_ffn(leaves["x"], (gate, linear), leaves["w_down"], offs, activation="swiglu")
    with pytest.raises(ValueError, match=r"the pair's tensors must have one shape \(E, H, I\)"):
        cute_moe.expert_ffn(leaves["x"], (gate, linear[..., :4]), leaves["w_down"], offs,
                            activation="swiglu", gate_linear="halves")
    with pytest.raises(ValueError, match=r"expected a tensor or a pair"):
        cute_moe.expert_ffn(leaves["x"], (gate, linear, linear), leaves["w_down"], offs,
                            activation="swiglu", gate_linear="halves")
    with pytest.raises(ValueError, match=r"w_up\[1\]: expected dtype torch.bfloat16"):
        cute_moe.expert_ffn(leaves["x"], (gate, linear.float()), leaves["w_down"], offs,
                            activation="swiglu", gate_linear="halves")


@pytest.mark.parametrize("activation", ["swiglu_oai", "swiglu", "none"])
@pytest.mark.parametrize("bias, prob", [(True, True), (True, False), (False, True)])
def test_combine_is_unpermute_after(activation, bias, prob):
    """The layer's combine joined to the down projection (its backward gathering dy with
    b_down's gradient and dprob's bias term in one pass): the composition's function."""
    leaves, offs = make_block(160, 32, 16, 5, activation, bias=bias, prob=prob, scale=False,
                              routing="empty", device="cpu")
    check_combine(leaves, offs, activation)


def test_combine_arguments_are_checked():
    leaves, offs = make_block(32, 16, 8, 2, "swiglu", bias=False, prob=False, scale=False)
    args = (leaves["x"], leaves["w_up"], leaves["w_down"], offs)
    row_token = torch.arange(32, dtype=torch.int32) // 4
    token_rows = torch.arange(32, dtype=torch.int32).view(8, 4)
    with pytest.raises(ValueError, match="combine: expected"):
        cute_moe.expert_ffn(*args, activation="swiglu", combine=row_token)
    with pytest.raises(ValueError, match="token_rows"):
        cute_moe.expert_ffn(*args, activation="swiglu", combine=(row_token, token_rows[:4]))
    with pytest.raises(ValueError, match="row_token"):
        cute_moe.expert_ffn(*args, activation="swiglu", combine=(row_token.long(), token_rows))

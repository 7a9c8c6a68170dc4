# cute_moe.expert_ffn on the GPU: the fused kernels of every activation, with and without
# biases, router probabilities and per-expert scales, output and every gradient against
# the fp32 reference; the kernels' own contracts (h recomputed bit for bit, dprob
# deterministic, padding rows zero, no host sync).
import itertools

import pytest
import torch

import cute_moe
from cute_moe import reference as ref, testing

from expert_ffn_cases import (ACTIVATIONS, BF16, check_block, check_combine, check_halves_block,
                             check_halves_pair, make_block, run_ours)

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded"),
]


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("bias, prob, scale", list(itertools.product([False, True], repeat=3)))
def test_every_combination_matches_the_reference(activation, bias, prob, scale):
    leaves, offs = make_block(1500, 256, 384, 8, activation, bias=bias, prob=prob, scale=scale,
                              device="cuda", seed=3)
    check_block(leaves, offs, activation)


@pytest.mark.parametrize("activation", ["swiglu_oai", "swiglu", "geglu", "srelu"])
@pytest.mark.parametrize("layout, routing", [("kn", "empty"), ("nk", "skewed"), ("nk", "single")])
def test_layouts_and_routings(activation, layout, routing):
    leaves, offs = make_block(700, 128, 136, 6, activation, bias=True, prob=True, scale=True,
                              routing=routing, layout=layout, device="cuda", seed=5)
    check_block(leaves, offs, activation, layout=layout)


@pytest.mark.parametrize("activation", ["swiglu_oai", "swiglu", "geglu", "srelu"])
def test_boundary_values(activation):
    leaves, offs = make_block(600, 128, 64, 4, activation, bias=True, prob=True, scale=False,
                              device="cuda", boundary=True, seed=7)
    check_block(leaves, offs, activation)


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "srelu"])
def test_kernels_against_their_references(activation):
    leaves, offs = make_block(900, 256, 264, 5, activation, bias=True, prob=True, scale=True,
                              device="cuda", padding=37, seed=11)
    x, w_up, w_down = leaves["x"].detach(), leaves["w_up"].detach(), leaves["w_down"].detach()
    b_up, b_down = leaves["b_up"].detach(), leaves["b_down"].detach()
    s_up, s_down = leaves["scale_up"].detach(), leaves["scale_down"].detach()
    prob = leaves["prob"].detach()
    ops = torch.ops.cute_moe
    used = int(offs[-1])
    h, pre = ops.grouped_mm_act(x, w_up, offs, b_up, s_up, activation)
    h_ref, pre_ref = ref.grouped_mm_act_ref(x, w_up, offs, b_up, s_up, activation)
    testing.assert_rel_close(pre, pre_ref.float(), "pre")
    testing.assert_rel_close(h, ref.act_ref(pre, activation), "h from the kernel's pre")
    assert torch.all(pre[used:] == 0) and torch.all(h[used:] == 0)
    dy = torch.randn(x.shape[0], x.shape[1], device="cuda").to(BF16)
    args = (dy, w_down.transpose(-2, -1), offs, pre, s_down, prob, b_down, True, activation)
    dpre, hp, dprob, _ = ops.grouped_mm_act_bwd(*args)
    dpre_ref, hp_ref, dprob_ref, _ = ref.grouped_mm_act_bwd_ref(*args)
    testing.assert_rel_close(dpre, dpre_ref.float(), "dpre")
    testing.assert_rel_close(hp, hp_ref.float(), "prob * h")
    testing.assert_rel_close(dprob, dprob_ref, "dprob", torch.bfloat16)
    assert torch.all(dpre[used:] == 0) and torch.all(hp[used:] == 0) and torch.all(dprob[used:] == 0)
    # Without a probability the backward's h is the forward's, bit for bit.
    _, h_again, _, _ = ops.grouped_mm_act_bwd(dy, w_down.transpose(-2, -1), offs, pre, None, None,
                                              None, False, activation)
    assert torch.equal(h_again, h)
    # dprob and db (the up projection's bias gradient, from the epilogue) have a fixed
    # summation order.
    assert torch.equal(ops.grouped_mm_act_bwd(*args)[2], dprob)
    db = ops.grouped_mm_act_bwd(*args, 1.702, None, "interleaved", True)[3]
    testing.assert_rel_close(db, ref.grouped_bias_grad_ref(dpre, offs), "db")
    assert torch.equal(ops.grouped_mm_act_bwd(*args, 1.702, None, "interleaved", True)[3], db)


def test_scaled_down_projection_kernel():
    leaves, offs = make_block(800, 128, 96, 6, "srelu", bias=True, prob=True, scale=True,
                              device="cuda", padding=20, seed=13)
    h = torch.randn(leaves["x"].shape[0], 96, device="cuda").to(BF16)
    args = (h, leaves["w_down"].detach(), offs, leaves["b_down"].detach(),
            leaves["scale_down"].detach(), leaves["prob"].detach())
    y = torch.ops.cute_moe.grouped_mm_scaled(*args)
    testing.assert_rel_close(y, ref.grouped_mm_scaled_ref(*args).float(), "y")
    assert torch.all(y[int(offs[-1]):] == 0)
    col = torch.ops.cute_moe.grouped_column_sum(h, offs, leaves["prob"].detach())
    testing.assert_rel_close(col, ref.grouped_bias_grad_ref(h, offs, row_scale=leaves["prob"]),
                             "prob-weighted column sums", torch.bfloat16)


@pytest.mark.parametrize("activation", ["geglu", "srelu", "none"])
def test_no_host_sync(activation):
    leaves, offs = make_block(512, 128, 64, 4, activation, bias=True, prob=True, scale=True,
                              device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = run_ours(leaves, offs, activation)
        torch.autograd.grad(out.float().sum(), list(leaves.values()))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("activation", ["swiglu_oai", "swiglu", "geglu"])
@pytest.mark.parametrize("up_storage, down_storage, routing",
                         [("nk", "nk", "empty"), ("nk", "nk", "skewed"), ("kn", "kn", "empty"),
                          ("nk", "kn", "single"), ("kn", "nk", "skewed")])
def test_halves_layout_is_the_same_function(activation, up_storage, down_storage, routing):
    # inter 200: the last tile column of either layout's 128- or 192-wide tiles is partial
    leaves, offs = make_block(900, 256, 200, 6, activation, bias=True, prob=True, scale=True,
                              routing=routing, device="cuda", padding=29, seed=17)
    check_halves_block(leaves, offs, activation, up_storage, down_storage)


@pytest.mark.parametrize("activation", ["swiglu_oai", "swiglu", "geglu"])
def test_halves_kernels_give_the_interleaved_bits(activation):
    """The halves kernels read the weights in place (W_up as the transposed view of an
    (E, 2I, H) tensor, W_down^T n-contiguous) and compute exactly what the interleaved
    kernels compute on the repacked weights: the same tiles reach the MMA."""
    from cute_moe.repack import interleaved_to_halves
    leaves, offs = make_block(1100, 256, 200, 7, activation, bias=True, prob=True, scale=True,
                              routing="empty", device="cuda", padding=33, seed=19)
    x, b_up = leaves["x"].detach(), leaves["b_up"].detach()
    s_up, prob = leaves["scale_up"].detach(), leaves["prob"].detach()
    w_inter = leaves["w_up"].detach().transpose(-2, -1).contiguous().transpose(-2, -1)
    w_halves = interleaved_to_halves(leaves["w_up"].detach(), -1).transpose(-2, -1).contiguous()
    ops = torch.ops.cute_moe
    h, pre = ops.grouped_mm_act(x, w_inter, offs, b_up, s_up, activation, 1.702, None)
    h2, pre2 = ops.grouped_mm_act(x, w_halves.transpose(-2, -1), offs,
                                  interleaved_to_halves(b_up, -1), s_up, activation, 1.702, None,
                                  "halves")
    assert torch.equal(pre2, pre) and torch.equal(h2, h)
    w_down_t = leaves["w_down"].detach().transpose(-2, -1).contiguous()  # (E, H, I): W_down^T
    dy = torch.randn(x.shape[0], x.shape[1], device="cuda").to(BF16)
    args = (dy, w_down_t, offs, pre, leaves["scale_down"].detach(), prob,
            leaves["b_down"].detach(), True, activation, 1.702, None)
    dpre, hp, dprob, db = ops.grouped_mm_act_bwd(*args, "interleaved", True)
    dpre2, hp2, dprob2, db2 = ops.grouped_mm_act_bwd(*args, "halves", True)
    assert torch.equal(dpre2, interleaved_to_halves(dpre, -1))
    assert torch.equal(hp2, hp) and torch.equal(dprob2, dprob)
    # the bias gradient in the weight's layout, the same sums (the same values in the same
    # order: only the columns move)
    assert torch.equal(db2, interleaved_to_halves(db, -1))


@pytest.mark.parametrize("activation, bias", [("swiglu", False), ("swiglu_oai", True), ("geglu", True)])
@pytest.mark.parametrize("placement", ["above", "apart", "below", "separate"])
def test_halves_pair_gives_the_joined_bits(activation, bias, placement):
    """w_up as the pair (w_gate, w_linear) (torchtitan's w1, w3): the kernels read the two
    tensors in place and compute exactly what they compute on the joined tensor."""
    leaves, offs = make_block(1100, 256, 256, 7, activation, bias=bias, prob=True, scale=False,
                              routing="empty", device="cuda", padding=33, seed=29)
    check_halves_pair(leaves, offs, activation, placement)


@pytest.mark.parametrize("inter", [200, 136])
def test_halves_pair_joined_where_not_in_place(inter):
    """I not a multiple of 128: the pair is joined per call, the same function."""
    leaves, offs = make_block(700, 128, inter, 5, "swiglu", bias=True, prob=True, scale=False,
                              routing="skewed", device="cuda", padding=9, seed=31)
    check_halves_pair(leaves, offs, "swiglu", "separate")


@pytest.mark.parametrize("placement, bias, copies", [("above", False, False), ("below", False, False),
                                                     ("above", True, False), ("below", True, True)])
def test_halves_pair_read_in_place(placement, bias, copies):
    """No copy of the weights where w_linear lies above w_gate, nor below it without a bias
    (the kernel loads the pairs as (linear, gate) and swaps them back), forward and
    backward; below it with a bias, the forward joins them (one aten::cat) and the backward
    still reads them apart. The results: test_halves_pair_gives_the_joined_bits."""
    from cute_moe.repack import interleaved_to_halves
    leaves, offs = make_block(512, 128, 128, 4, "swiglu", bias=bias, prob=False, scale=False,
                              device="cuda", seed=37)
    halves = interleaved_to_halves(leaves["w_up"].detach(), -1).transpose(-2, -1)  # (E, 2I, H)
    buf = torch.stack([halves[:, :128], halves[:, 128:]] if placement == "above"
                      else [halves[:, 128:], halves[:, :128]]).contiguous().requires_grad_()
    pair = (buf[0], buf[1]) if placement == "above" else (buf[1], buf[0])
    pair = tuple(t.transpose(-2, -1) for t in pair)
    x, w_down = leaves["x"], leaves["w_down"]
    b_up = interleaved_to_halves(leaves["b_up"].detach(), -1) if bias else None
    b_down = leaves["b_down"].detach() if bias else None
    with torch.autograd.profiler.profile() as prof:
        out = cute_moe.expert_ffn(x, pair, w_down, offs, b_up, b_down, activation="swiglu",
                                  gate_linear="halves")
        torch.autograd.grad(out.float().sum(), [x, buf, w_down])
    cats = [e.name for e in prof.function_events if e.name == "aten::cat"]
    assert bool(cats) == copies, cats


def test_halves_pair_compiles_fullgraph():
    leaves, offs = make_block(512, 128, 128, 4, "swiglu", bias=True, prob=True, scale=False,
                              device="cuda", seed=41)
    from cute_moe.repack import interleaved_to_halves
    halves = interleaved_to_halves(leaves["w_up"].detach(), -1).transpose(-2, -1)
    buf = torch.stack([halves[:, :128], halves[:, 128:]]).contiguous().requires_grad_()
    b_up = interleaved_to_halves(leaves["b_up"].detach(), -1).requires_grad_()

    def block(x, buf, w_down, b_up, b_down, prob):
        pair = (buf[0].transpose(-2, -1), buf[1].transpose(-2, -1))
        return cute_moe.expert_ffn(x, pair, w_down, offs, b_up, b_down, activation="swiglu",
                                   prob=prob, gate_linear="halves").float().square().sum()

    torch._dynamo.reset()
    args = (leaves["x"], buf, leaves["w_down"], b_up, leaves["b_down"], leaves["prob"])
    eager = block(*args)
    eager_grads = torch.autograd.grad(eager, args)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(*args)
    compiled_grads = torch.autograd.grad(compiled, args)
    assert torch.equal(compiled, eager)
    for a, b in zip(compiled_grads, eager_grads):
        assert torch.equal(a, b)


def test_halves_output_poisoned_first():
    """Every element of the halves dpre is written (padding rows zero), the dlinear half
    included, which the epilogue stores itself."""
    leaves, offs = make_block(700, 128, 136, 5, "swiglu", bias=False, prob=False, scale=False,
                              routing="empty", device="cuda", padding=21, seed=23)
    x = leaves["x"].detach()
    w_up = leaves["w_up"].detach()
    _, pre = torch.ops.cute_moe.grouped_mm_act(x, w_up, offs, None, None, "swiglu")
    dy = torch.randn(x.shape, device="cuda").to(BF16)
    w_down_t = leaves["w_down"].detach().transpose(-2, -1).contiguous()
    for _ in range(2):  # dpre reuses the caching allocator's block of `poison`
        poison = torch.full((x.shape[0], 2 * 136), float("nan"), device="cuda", dtype=BF16)
        del poison
        dpre = torch.ops.cute_moe.grouped_mm_act_bwd(dy, w_down_t, offs, pre, None, None, None,
                                                     False, "swiglu", 1.702, None, "halves")[0]
        assert not torch.isnan(dpre).any()
        assert torch.all(dpre[int(offs[-1]):] == 0)


@pytest.mark.parametrize("activation", ["swiglu_oai", "swiglu", "none"])
@pytest.mark.parametrize("bias, prob", [(True, True), (True, False), (False, True)])
def test_combine_is_unpermute_after(activation, bias, prob):
    """The layer's combine joined to the down projection (its backward gathering dy with
    b_down's gradient and dprob's bias term in one pass): the composition's function."""
    leaves, offs = make_block(1024, 256, 128, 6, activation, bias=bias, prob=prob, scale=False,
                              routing="empty", device="cuda")
    check_combine(leaves, offs, activation)

# cute_moe.fp8.expert_ffn on the GPU (the FP8 quantizers and ragged-M GEMMs; weight gradients in
# bf16 and in FP8, forced either way, and the default's choice between them by shape):
# a GPT-OSS-like block (swiglu_oai with biases and router probabilities) and a swiglu block
# without either, output and every gradient against the quantization-matched
# reference (fp8_ffn_cases.fp8_ffn_ref, float64) and against cute_moe.expert_ffn (bf16); no host
# sync; forward and backward captured in a CUDA graph and replayed with new routing. Needs an
# SM90 GPU and the compiled library.
import pytest
import torch

import cute_moe
from cute_moe import fp8_ffn, testing
from cute_moe.reference import offsets_from_counts

from expert_ffn_cases import run_ours
from fp8_ffn_cases import (BF16, bf16_grads, check_loose, fp8_ffn_ref, fp8_grads, make_leaves,
                           run_fp8)

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                       reason="the FP8 kernels run on SM90 (H100, H200)"),
]

# name: (counts per expert, H, I, padding rows, activation, biases and prob)
CASES = {
    "gpt_oss_like": ([300, 0, 517, 180], 256, 256, 3, "swiglu_oai", True),
    "swiglu_no_bias": ([0, 211, 64, 390], 256, 256, 0, "swiglu", False),
}
# Against the quantization-matched reference: the FP8 GEMMs accumulate each 128-long k-block
# with fewer than fp32's bits before the promotion (docs/fp8.md), and every GEMM output is
# bf16, so some roundings of pre, h, g, dh, dpre fall the other way and where a quantizer reads
# them move by an e4m3 step: inexact, bound 1e-2 relative Frobenius (seen on an H200: 1.6e-3 to
# 5.7e-3, dx the largest).
MATCHED_TOL = 1e-2
# Against the bf16 block: the e4m3 roundings of up to three chained GEMM operands (seen on an
# H200: 0.05-0.07 at w_std 2; dx 0.088 at w_std 3).
BF16_TOL = 0.1


def _leaves(case, w_std, seed=0):
    counts, hidden, inter, pad, activation, extras = CASES[case]
    leaves, offs = make_leaves(counts, hidden, inter, activation, bias=extras, prob=extras,
                               pad=pad, device="cuda", seed=seed, w_std=w_std)
    dy = torch.randn(leaves["x"].shape, generator=torch.Generator().manual_seed(seed + 1))
    return leaves, offs, activation, dy.to("cuda", BF16)


def _combine_pair(m, k, g):
    """A layer's (row_token, token_rows) on the GPU: m routed rows, k of them per token, in a
    random order from the generator g."""
    token_rows = torch.randperm(m, generator=g).view(m // k, k).to(torch.int32)
    row_token = torch.empty(m, dtype=torch.int32)
    row_token[token_rows.reshape(-1).long()] = torch.arange(m // k, dtype=torch.int32).repeat_interleave(k)
    return row_token.cuda(), token_rows.cuda()


@pytest.mark.parametrize("wgrad", ["bf16", "fp8"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_quantized_reference(case, wgrad):
    # w_std 3: pre-activations of about 3, across swiglu_oai's clamps at +-7
    leaves, offs, activation, dy = _leaves(case, 3.0, seed=1)
    fp8_w = wgrad == "fp8"
    out, grads = fp8_grads(leaves, offs, activation, dy, fp8_weight_grads=fp8_w)
    used = int(offs[-1])
    assert torch.all(out[used:] == 0) and torch.all(grads["x"][used:] == 0)
    if "prob" in grads:
        assert torch.all(grads["prob"][used:] == 0)
    want_out, want = fp8_ffn_ref(leaves, offs, activation, dy, fp8_weight_grads=fp8_w)
    check_loose(out, grads, want_out, want, MATCHED_TOL, f"{case} ({wgrad} weight gradients) vs the "
                "quantized reference")


@pytest.mark.parametrize("case", list(CASES))
def test_close_to_bf16_expert_ffn(case):
    # w_std 2: at 3, quantizing pre moves many values across swiglu_oai's clamps, where its
    # gradient jumps
    leaves, offs, activation, dy = _leaves(case, 2.0, seed=2)
    out, grads = fp8_grads(leaves, offs, activation, dy)
    want_out, want = bf16_grads(leaves, offs, activation, dy, run_ours)
    errs = check_loose(out, grads, want_out, want, BF16_TOL, f"{case} vs cute_moe.expert_ffn")
    assert errs["out"] > 1e-2  # FP8, not the bf16 block


@pytest.mark.parametrize("wgrad", ["bf16", "fp8"])
def test_no_host_sync_and_deterministic(wgrad, monkeypatch):
    monkeypatch.setattr(fp8_ffn, "FP8_WEIGHT_GRADS", wgrad == "fp8")
    leaves, offs, activation, dy = _leaves("gpt_oss_like", 3.0, seed=3)
    first = fp8_grads(leaves, offs, activation, dy)  # warm-up: lazy initialisations may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = run_fp8(leaves, offs, activation)
        grads = torch.autograd.grad(out, list(leaves.values()), dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(out, first[0])
    for name, g in zip(leaves, grads):
        assert torch.equal(g, first[1][name]), name


@pytest.mark.parametrize("wgrad", ["bf16", "fp8"])
def test_cuda_graph_replay_with_new_routing(wgrad, monkeypatch):
    """Forward and backward captured once, replayed with new routing (offs' contents), rows
    and output gradient: each replay equals an eager run on the same inputs."""
    monkeypatch.setattr(fp8_ffn, "FP8_WEIGHT_GRADS", wgrad == "fp8")
    case = "gpt_oss_like"
    counts, hidden, inter, _, activation, _ = CASES[case]
    leaves, offs, _, dy = _leaves(case, 3.0, seed=4)
    m, experts = leaves["x"].shape[0], len(counts)
    names = list(leaves)

    def step():
        out = run_fp8(leaves, offs, activation)
        return out, torch.autograd.grad(out, [leaves[k] for k in names], dy)

    graph, (static_out, static_grads) = testing.capture_graph(step, warmup=3)
    g = torch.Generator().manual_seed(5)
    for routing, pad in (("skewed", 0), ("empty", 40), ("single", 300), ("balanced", m)):
        sizes = testing.group_sizes(m - pad, experts, routing, generator=g)
        with torch.no_grad():
            offs.copy_(offsets_from_counts(sizes, device="cuda"))
            leaves["x"].copy_(torch.randn(m, hidden, generator=g).to(BF16))
            leaves["prob"].copy_(torch.rand(m, generator=g))
            dy.copy_(torch.randn(m, hidden, generator=g).to(BF16))
        graph.replay()
        eager = {k: v.detach().clone().requires_grad_() for k, v in leaves.items()}
        out, grads = fp8_grads(eager, offs.clone(), activation, dy)
        torch.cuda.synchronize()
        assert torch.equal(static_out, out), routing
        for name, a in zip(names, static_grads):
            assert torch.equal(a, grads[name]), (routing, name)
        assert torch.all(static_out[m - pad:] == 0)


def test_torch_compile_fullgraph():
    """The FP8 block (its two autograd Functions over the FP8 ops, with fake kernels) traced
    whole by torch.compile, forward and backward: the same bits as eager."""
    leaves, offs, activation, dy = _leaves("gpt_oss_like", 3.0, seed=6)
    names = list(leaves)
    want_out, want = fp8_grads(leaves, offs, activation, dy)
    torch._dynamo.reset()
    compiled = torch.compile(lambda **kw: run_fp8(kw, offs, activation), fullgraph=True,
                             backend="aot_eager")
    out = compiled(**leaves)
    grads = torch.autograd.grad(out, [leaves[k] for k in names], dy)
    assert torch.equal(out, want_out)
    for name, g in zip(names, grads):
        assert torch.equal(g, want[name]), name


@pytest.mark.parametrize("gather", [False, True])
def test_torch_compile_fullgraph_with_combine(gather):
    """The block with the layer's combine (the tokens' sums; in the backward dy's 1x128 copy
    gathered from the tokens' gradient by the quantizer), and with the dispatch's gather (x's
    1x128 copy gathered from the tokens: the first m / 4 rows of x here) traced whole: the
    same bits as eager."""
    leaves, offs, activation, _ = _leaves("gpt_oss_like", 3.0, seed=8)
    m, hidden, k = leaves["x"].shape[0], leaves["x"].shape[1], 4
    g = torch.Generator().manual_seed(9)
    combine = _combine_pair(m, k, g)
    dout = torch.randn(m // k, hidden, generator=g).to("cuda", BF16)
    names = list(leaves)

    def run(**kw):
        if gather:
            kw = dict(kw, x=kw["x"][:m // k])
            return run_fp8(kw, offs, activation, combine=combine, gather=combine)
        return run_fp8(kw, offs, activation, combine=combine)

    want_out = run(**leaves)
    want = torch.autograd.grad(want_out, [leaves[n] for n in names], dout)
    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    out = compiled(**leaves)
    grads = torch.autograd.grad(out, [leaves[n] for n in names], dout)
    assert out.shape == (m // k, hidden) and torch.equal(out, want_out)
    for name, got, ref in zip(names, grads, want):
        assert torch.equal(got, ref), name


def test_weight_gradients_in_fp8_by_shape(monkeypatch):
    """FP8_WEIGHT_GRADS None (the default): the FP8 weight gradients where the experts average
    at least FP8_WEIGHT_GRADS_MIN_ROWS_PER_EXPERT routed rows and, with a fused gather, their
    copies fit in the bf16 layer's peak (fp8_ffn.fp8_weight_grads_for), the bf16 ones otherwise:
    each default run has the bits of the setting forced that way, and the two settings' weight
    gradients differ (so the comparison tells them apart)."""
    monkeypatch.setattr(fp8_ffn, "FP8_WEIGHT_GRADS", None)
    monkeypatch.setattr(fp8_ffn, "FP8_WEIGHT_GRADS_MIN_ROWS_PER_EXPERT", 256)  # small blocks
    # (counts, H, I, gathered, FP8 expected)
    for counts, hidden, inter, gathered, want_fp8 in [
            ([300, 260], 128, 128, False, True),        # 280 rows an expert
            ([100, 200, 150], 128, 128, False, False),  # 150
            ([300, 260], 128, 256, True, True),         # gathered, the copies fit
            ([300, 260], 256, 128, True, False)]:       # gathered, they would not
        leaves, offs = make_leaves(counts, hidden, inter, "swiglu_oai", bias=True, prob=True,
                                   device="cuda", seed=len(counts) + hidden)
        m = leaves["x"].shape[0]
        dy = torch.randn(m, hidden, device="cuda").to(BF16)
        kw = {}
        if gathered:  # tokens in another order, gathered back into expert order by the block
            perm = torch.randperm(m, device="cuda")
            tokens = leaves["x"].detach()[perm.argsort()].requires_grad_()
            leaves = dict(leaves, x=tokens)
            kw = dict(gather=(perm.to(torch.int32), None))
        assert fp8_ffn.fp8_weight_grads_for(m, len(counts), hidden, inter, gathered) == want_fp8

        def grads(setting):
            monkeypatch.setattr(fp8_ffn, "FP8_WEIGHT_GRADS", setting)
            out = run_fp8(leaves, offs, "swiglu_oai", **kw)
            return dict(zip(leaves, torch.autograd.grad(out, list(leaves.values()), dy)))

        forced = {s: grads(s) for s in (False, True)}
        default = grads(None)
        assert not torch.equal(forced[True]["w_up"], forced[False]["w_up"])
        for k in leaves:
            assert torch.equal(default[k], forced[want_fp8][k]), (counts, hidden, inter, gathered, k)


@pytest.mark.parametrize("wgrad", ["bf16", "fp8"])
def test_gather_and_combine_give_the_sorted_blocks_bits(wgrad, monkeypatch):
    """The block with the layer's gather and combine (x the tokens, dy gathered from the
    tokens' gradient after the fused kernel, the FP8 weight gradient's copies made late) has
    the parameter gradients of the block on the sorted rows, bit for bit, and its output is
    the tokens' sums of that block's rows."""
    monkeypatch.setattr(fp8_ffn, "FP8_WEIGHT_GRADS", wgrad == "fp8")
    leaves, offs, activation, _ = _leaves("gpt_oss_like", 3.0, seed=12)
    m, hidden, k = leaves["x"].shape[0], leaves["x"].shape[1], 4
    g = torch.Generator().manual_seed(13)
    combine = _combine_pair(m, k, g)
    tokens = torch.randn(m // k, hidden, generator=g).to("cuda", BF16).requires_grad_()
    dout = torch.randn(m // k, hidden, generator=g).to("cuda", BF16)
    names = [n for n in leaves if n != "x"]
    out = run_fp8(dict(leaves, x=tokens), offs, activation, combine=combine, gather=combine)
    got = torch.autograd.grad(out, [leaves[n] for n in names], dout)
    rows = tokens.detach()[combine[0].long()].requires_grad_()
    sorted_out = run_fp8(dict(leaves, x=rows), offs, activation)
    want = torch.autograd.grad(sorted_out, [leaves[n] for n in names], dout[combine[0].long()])
    for name, a, b in zip(names, got, want):
        assert torch.equal(a, b), name
    sums = sorted_out.detach().float()[combine[1].long()].sum(1)
    assert testing.rel_error(out.float(), sums) < 1e-2


@pytest.mark.parametrize("case", list(CASES))
def test_h_copy_from_the_up_projection_gives_the_same_bits(case, monkeypatch):
    """fp8_ffn.FUSED_H_COPY: h's 1x128 copy from the up projection's epilogue (1 x 2 clusters
    exchanging the rows' amax) instead of a pass over pre: the output and every gradient keep
    their bits."""
    leaves, offs, activation, dy = _leaves(case, 3.0, seed=11)
    seen = {}
    for flag in (False, True):
        monkeypatch.setattr(fp8_ffn, "FUSED_H_COPY", flag)
        seen[flag] = fp8_grads(leaves, offs, activation, dy)
    (out, grads), (out2, grads2) = seen[False], seen[True]
    assert torch.equal(out, out2)
    for name in grads:
        assert torch.equal(grads[name], grads2[name]), name

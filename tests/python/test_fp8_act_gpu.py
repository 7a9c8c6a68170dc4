# GPU tests of the FP8 GEMMs with the activation fused into the epilogue
# (torch.ops.cute_moe.grouped_mm_fp8_act / _quant / _bwd, cute_moe.fp8.grouped_mm_act / _quant /
# _bwd): against the references on the same quantized inputs, at GPT-OSS-20B and
# Qwen3-30B-A3B-like shapes (k and n not multiples of 128, empty experts, padding rows poisoned),
# every activation; no host sync, determinism, CUDA-graph replay with new routing,
# torch.compile. Needs an SM90 GPU and the compiled library.
import pytest
import torch

import cute_moe
from cute_moe import fp8, testing
from cute_moe import reference as ref
from cute_moe.activation_args import is_gated
from cute_moe.reference import fp8 as ref_fp8
from cute_moe.ops.fp8 import reference_grouped_mm_fp8_act, reference_grouped_mm_fp8_act_bwd
from cute_moe.reference import offsets_from_counts

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                       reason="the FP8 kernels run on SM90 (H100, H200)"),
]

BF16, F32 = torch.bfloat16, torch.float32
ALPHA = 1.702
# name: (rows per expert, H, I, padding rows)
CASES = {
    "gpt_oss": ([300, 0, 517, 180], 2880, 2880, 3),
    "qwen3": (testing.group_sizes(3000, 32, "skewed", generator=torch.Generator().manual_seed(1)),
              2048, 768, 5),
    "small": ([0, 37, 64, 0], 80, 48, 2),
}
FWD_ACTS = ["swiglu_oai", "swiglu", "geglu", "srelu"]
BWD_ACTS = FWD_ACTS + ["none"]
# bf16 outputs against the fp32 reference of the same quantized inputs: the outputs' rounding,
# the tensor cores' k-block accumulation (docs/fp8.md) and, for h and dpre, the activation
# evaluated on a pre / u that differs by those.
TOL = 1e-2


def _limit(act):
    return ref.default_limit(act)


def _randn(g, *shape, s=1.0):
    return (torch.randn(*shape, device="cuda", generator=g) * s).to(BF16)


def _forward_problem(case, act, seed=0):
    counts, hidden, inter, pad = CASES[case]
    g = torch.Generator(device="cuda").manual_seed(seed)
    m, e = sum(counts) + pad, len(counts)
    n = ref.up_width(act, inter)
    xq, xs = fp8.quantize_1x128(_randn(g, m, hidden))
    _, _, wq_t, ws_t = fp8.quantize_128x128(_randn(g, e, hidden, n, s=3.0 * hidden ** -0.5),
                                            False, True)
    bias = _randn(g, e, n, s=0.5)
    xq.view(torch.uint8)[sum(counts):] = 0x7F  # padding rows: e4m3 NaNs, never read
    return (xq, xs, wq_t.transpose(-2, -1), ws_t.transpose(-2, -1),
            offsets_from_counts(counts, device="cuda"), bias), sum(counts)


def _backward_problem(case, act, seed=0):
    counts, hidden, inter, pad = CASES[case]
    g = torch.Generator(device="cuda").manual_seed(seed)
    m, e = sum(counts) + pad, len(counts)
    dy = _randn(g, m, hidden)
    dyq, dys = fp8.quantize_1x128(dy)
    wq, ws, _, _ = fp8.quantize_128x128(_randn(g, e, inter, hidden, s=hidden ** -0.5), True, False)
    pre = _randn(g, m, ref.up_width(act, inter) if act != "none" else inter, s=3.0)
    prob = torch.rand(m, device="cuda", generator=g)
    used = sum(counts)
    pre[used:] = float("nan")  # padding rows: never read
    prob[used:] = float("nan")
    return (dyq, dys, wq.transpose(-2, -1), ws.transpose(-2, -1),
            offsets_from_counts(counts, device="cuda"), pre, prob, _randn(g, e, hidden, s=0.5),
            dy), used


@pytest.mark.parametrize("act", FWD_ACTS)
@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_reference(case, act):
    args, used = _forward_problem(case, act, seed=len(case) + len(act))
    h, pre = torch.ops.cute_moe.grouped_mm_fp8_act(*args, act, ALPHA, _limit(act))
    want_h, want_pre = reference_grouped_mm_fp8_act(*args, act, ALPHA, _limit(act))
    assert h.dtype == pre.dtype == BF16 and h.shape == want_h.shape and pre.shape == want_pre.shape
    assert bool((pre[used:] == 0).all()) and bool((h[used:] == 0).all()), "padding rows not zero"
    testing.assert_rel_close(pre, want_pre, f"{case} {act} pre", tol=TOL)
    testing.assert_rel_close(h, want_h, f"{case} {act} h", tol=TOL)
    # h is act(pre) of the kernel's own rounded pre
    own = ref.act_ref(pre, act, ALPHA, _limit(act)).to(BF16)
    testing.assert_rel_close(h, own, f"{case} {act} h of pre", tol=4e-3)


@pytest.mark.parametrize("act", BWD_ACTS)
@pytest.mark.parametrize("case", list(CASES))
def test_backward_matches_reference(case, act):
    (dyq, dys, w, ws, offs, pre, prob, out_bias, dy), used = _backward_problem(
        case, act, seed=len(case) * len(act))
    limit = _limit(act) if act != "none" else None
    got = torch.ops.cute_moe.grouped_mm_fp8_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy,
                                                    True, act, ALPHA, limit)
    # the reference on the poisoned rows' clean stand-ins (its padding rows are zeroed anyway)
    pre0, prob0 = pre.nan_to_num(0.0), prob.nan_to_num(0.0)
    want = reference_grouped_mm_fp8_act_bwd(dyq, dys, w, ws, offs, pre0, prob0, out_bias, dy, True,
                                            act, ALPHA, limit)
    for name, a, b in zip(("dpre", "hp", "dprob"), got, want):
        assert bool((a[used:] == 0).all()), f"{case} {act} {name}: padding rows not zero"
        testing.assert_rel_close(a, b, f"{case} {act} {name}", tol=TOL)
    # without prob and dprob: the plain input gradient through act'
    dpre, hp, dprob, dpre_q, dpre_scale = torch.ops.cute_moe.grouped_mm_fp8_act_bwd(
        dyq, dys, w, ws, offs, pre, None, None, None, False, act, ALPHA, limit)
    assert dprob.numel() == 0 and dpre_q.numel() == 0 and dpre_scale.numel() == 0
    want = reference_grouped_mm_fp8_act_bwd(dyq, dys, w, ws, offs, pre0, None, None, None, False, act,
                                            ALPHA, limit)
    testing.assert_rel_close(dpre, want[0], f"{case} {act} dpre, no prob", tol=TOL)
    testing.assert_rel_close(hp, want[1], f"{case} {act} h, no prob", tol=TOL)


@pytest.mark.parametrize("act", ["swiglu_oai", "swiglu", "geglu"])
@pytest.mark.parametrize("case", list(CASES))
def test_backward_dpre_fp8_is_quantize_1x128_of_dpre(case, act):
    """dpre's 1 x 128 copy from the fused backward's epilogue: bit for bit quantize_1x128 of the
    kernel's own bf16 dpre on the groups' rows (rows past offs[-1] are not written), and the
    other outputs the bits of the call without it."""
    (dyq, dys, w, ws, offs, pre, prob, out_bias, dy), used = _backward_problem(
        case, act, seed=3 * len(case) + len(act))
    limit = _limit(act)
    call = lambda fp8_copy: torch.ops.cute_moe.grouped_mm_fp8_act_bwd(  # noqa: E731
        dyq, dys, w, ws, offs, pre, prob, out_bias, dy, True, act, ALPHA, limit, fp8_copy)
    without = call(False)
    dpre, hp, dprob, dpre_q, dpre_scale = call(True)
    for name, a, b in zip(("dpre", "hp", "dprob"), (dpre, hp, dprob), without):
        assert torch.equal(a, b), f"{case} {act} {name} changed by the copy"
    width = pre.shape[1]
    assert dpre_q.dtype == torch.float8_e4m3fn and tuple(dpre_q.shape) == (pre.shape[0], width)
    assert tuple(dpre_scale.shape) == (pre.shape[0], (width + 127) // 128)
    want_q, want_scale = fp8.quantize_1x128(dpre)
    assert torch.equal(dpre_q[:used].view(torch.uint8), want_q[:used].view(torch.uint8)), f"{case} {act} q"
    assert torch.equal(dpre_scale[:used], want_scale[:used]), f"{case} {act} scales"
    # the public function: the same five, after its checks
    got = fp8.grouped_mm_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy, True, activation=act,
                                 limit=limit, dpre_fp8=True)
    assert len(got) == 5 and torch.equal(got[3][:used].view(torch.uint8), want_q[:used].view(torch.uint8))
    if case == "small":  # the non-gated activations: a clear error
        (dyq, dys, w, ws, offs, pre, prob, out_bias, dy), _ = _backward_problem(case, "srelu", seed=1)
        with pytest.raises(RuntimeError, match="dpre_fp8 .* is for the gated activations"):
            torch.ops.cute_moe.grouped_mm_fp8_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy, True,
                                                      "srelu", ALPHA, None, True)


def _poisoned_allocator(*shapes_dtypes):
    """Blocks of the caching allocator the next allocations of these sizes take, filled with
    0xff bytes (e4m3 NaNs, fp32 NaNs), so that an output element the kernel does not write
    shows."""
    junk = [torch.full((shape[0] * shape[1] * dtype.itemsize,), 0xFF, dtype=torch.uint8, device="cuda")
            for shape, dtype in shapes_dtypes]
    del junk


@pytest.mark.parametrize("limit", ["default", 1.5])
@pytest.mark.parametrize("act", ["swiglu_oai", "swiglu", "geglu"])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_h_copy_is_act_quantize_of_pre(case, act, limit):
    """grouped_mm_fp8_act_quant: h's 1 x 128 e4m3 copy written by the up projection's epilogue
    (the two CTAs of a 1 x 2 cluster exchanging each row's amax) is bit for bit
    act_quantize_1x128 of the kernel's own pre on the groups' rows, with and without a clamp
    that bites, and pre is the plain GEMM's. GPT-OSS-20B's n = 5760 is an odd count of 128-wide
    tiles (the last cluster's second CTA past n), "small"'s a single tile."""
    limit = _limit(act) if limit == "default" else limit
    args, used = _forward_problem(case, act, seed=len(case) + len(act) + 17)
    m, n = args[0].shape[0], args[2].shape[2]
    for _ in range(2):  # the second call on memory the first left behind
        _poisoned_allocator(((m, n), BF16), ((m, n // 2), torch.uint8),
                            ((m, (n // 2 + 127) // 128), F32))
        h_q, h_scale, pre = torch.ops.cute_moe.grouped_mm_fp8_act_quant(*args, act, ALPHA, limit)
        assert h_q.dtype == torch.float8_e4m3fn and tuple(h_q.shape) == (m, n // 2)
        assert h_scale.dtype == F32 and tuple(h_scale.shape) == (m, (n // 2 + 127) // 128)
        assert torch.equal(pre, torch.ops.cute_moe.grouped_mm_fp8(*args, None)), "pre: the plain GEMM's"
        want_q, want_s = torch.ops.cute_moe.act_quantize_fp8_1x128(pre, act, ALPHA, limit)
        assert torch.equal(h_scale[:used], want_s[:used]), f"{case} {act} scales"
        assert torch.equal(h_q[:used].view(torch.uint8), want_q[:used].view(torch.uint8)), f"{case} {act} q"
    # the public function, after its checks, and the reference (CPU kernel) on the same inputs
    got = fp8.grouped_mm_act_quant(*args, activation=act, limit=limit)
    assert torch.equal(got[0][:used].view(torch.uint8), want_q[:used].view(torch.uint8))
    if case == "small":
        cpu = [a.cpu() for a in args]
        ref_q, ref_s, ref_pre = torch.ops.cute_moe.grouped_mm_fp8_act_quant(*cpu, act, ALPHA, limit)
        testing.assert_rel_close(ref_fp8.dequantize_1x128(h_q[:used].cpu(), h_scale[:used].cpu()),
                                 ref_fp8.dequantize_1x128(ref_q[:used], ref_s[:used]), f"{act} vs reference",
                                 tol=TOL)


def test_forward_h_copy_bad_input():
    args, _ = _forward_problem("small", "srelu", seed=2)
    with pytest.raises(RuntimeError, match="is not gated"):
        torch.ops.cute_moe.grouped_mm_fp8_act_quant(*args, "srelu", ALPHA, None)
    with pytest.raises(ValueError, match="a gated activation"):
        fp8.grouped_mm_act_quant(*args, activation="srelu")
    # 2I = 80: h's rows not whole 16-byte pieces
    g = torch.Generator(device="cuda").manual_seed(3)
    xq, xs = fp8.quantize_1x128(_randn(g, 64, 128))
    _, _, wq_t, ws_t = fp8.quantize_128x128(_randn(g, 2, 128, 80), False, True)
    bad = (xq, xs, wq_t.transpose(-2, -1), ws_t.transpose(-2, -1),
           offsets_from_counts([30, 34], device="cuda"), None)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.cute_moe.grouped_mm_fp8_act_quant(*bad, "swiglu", ALPHA, None)
    with pytest.raises(ValueError, match="multiple of 32"):
        fp8.grouped_mm_act_quant(*bad, activation="swiglu")


def test_public_functions_no_host_sync_and_deterministic():
    args, _ = _forward_problem("gpt_oss", "swiglu_oai", seed=3)
    bargs, _ = _backward_problem("gpt_oss", "swiglu_oai", seed=4)
    dyq, dys, w, ws, offs, pre, prob, out_bias, dy = bargs
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        h, pre_out = fp8.grouped_mm_act(*args, activation="swiglu_oai", limit=7.0)
        back = fp8.grouped_mm_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy, True,
                                      activation="swiglu_oai", limit=7.0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    again = torch.ops.cute_moe.grouped_mm_fp8_act(*args, "swiglu_oai", ALPHA, 7.0)
    assert torch.equal(h, again[0]) and torch.equal(pre_out, again[1])
    back2 = torch.ops.cute_moe.grouped_mm_fp8_act_bwd(dyq, dys, w, ws, offs, pre, prob, out_bias, dy,
                                                      True, "swiglu_oai", ALPHA, 7.0)
    for a, b in zip(back, back2):
        assert torch.equal(a, b)


def _graph_replays(op, inter, seed):
    """(routing, rows used, args, outputs) after each replay of a CUDA graph of op(*args,
    "swiglu_oai", ALPHA, 7.0) captured on balanced routing, offs rewritten in place with new
    routing (skewed, empty experts with padding rows, a single expert) before each replay."""
    m, hidden, e = 1200, 1024, 8
    g = torch.Generator(device="cuda").manual_seed(seed)
    xq, xs = fp8.quantize_1x128(_randn(g, m, hidden))
    _, _, wq_t, ws_t = fp8.quantize_128x128(_randn(g, e, hidden, 2 * inter, s=hidden ** -0.5),
                                            False, True)
    offs = offsets_from_counts(testing.group_sizes(m, e, "balanced"), device="cuda")
    args = (xq, xs, wq_t.transpose(-2, -1), ws_t.transpose(-2, -1), offs, _randn(g, e, 2 * inter))
    graph, out = testing.capture_graph(lambda: op(*args, "swiglu_oai", ALPHA, 7.0))
    gen = torch.Generator().manual_seed(seed + 1)
    for routing, pad in (("skewed", 0), ("empty", 40), ("single", 300)):
        offs.copy_(offsets_from_counts(testing.group_sizes(m - pad, e, routing, generator=gen),
                                       device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        yield routing, m - pad, args, out


def test_cuda_graph_replay_with_new_routing():
    for routing, _, args, out in _graph_replays(torch.ops.cute_moe.grouped_mm_fp8_act, 512, 5):
        want = reference_grouped_mm_fp8_act(*args, "swiglu_oai", ALPHA, 7.0)
        for name, a, b in zip(("h", "pre"), out, want):
            testing.assert_rel_close(a, b, f"replay {routing} {name}", tol=TOL)


def test_h_copy_cuda_graph_replay_with_new_routing():
    # 2I = 1152: nine 128-wide tiles, an odd count
    for routing, used, args, out in _graph_replays(torch.ops.cute_moe.grouped_mm_fp8_act_quant, 576, 8):
        h_q, h_scale, pre = out
        assert torch.equal(pre[:used], torch.ops.cute_moe.grouped_mm_fp8(*args, None)[:used]), routing
        want_q, want_s = torch.ops.cute_moe.act_quantize_fp8_1x128(pre, "swiglu_oai", ALPHA, 7.0)
        assert torch.equal(h_scale[:used], want_s[:used]), f"replay {routing} scales"
        assert torch.equal(h_q[:used].view(torch.uint8), want_q[:used].view(torch.uint8)), f"replay {routing} q"


def test_torch_compile_fullgraph():
    args, _ = _forward_problem("small", "swiglu", seed=7)
    compiled = torch.compile(lambda *a: fp8.grouped_mm_act(*a, activation="swiglu"), fullgraph=True)
    got = compiled(*args)
    want = fp8.grouped_mm_act(*args, activation="swiglu")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("limit", ["default", 1.5])
@pytest.mark.parametrize("act", FWD_ACTS + ["none"])
@pytest.mark.parametrize("case", list(CASES))
def test_act_quantize_is_quantize_1x128_of_the_fused_h(case, act, limit):
    """The FP8 block's forward path (plain GEMM, then act_quantize_1x128 over pre) gives the bits
    of the fused up projection's h quantized 1x128, for every activation, with and without a
    clamp that bites; and act(pre) within bf16 rounding of the reference's."""
    limit = _limit(act) if limit == "default" or not is_gated(act) else limit
    fused = "swiglu" if act == "none" else act  # "none": h is pre itself
    args, used = _forward_problem(case, fused, seed=len(case) + len(act) + 11)
    if act == "none":
        pre = torch.ops.cute_moe.grouped_mm_fp8(*args, None)
        h = pre
    else:
        h, pre = torch.ops.cute_moe.grouped_mm_fp8_act(*args, act, ALPHA, limit)
        assert torch.equal(pre, torch.ops.cute_moe.grouped_mm_fp8(*args, None)), "pre: the plain GEMM's"
    q, s = torch.ops.cute_moe.act_quantize_fp8_1x128(pre, act, ALPHA, limit)
    want_q, want_s = fp8.quantize_1x128(h)
    assert q.shape == h.shape and s.shape == want_s.shape
    assert torch.equal(s, want_s) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    ref_q, ref_s = ref_fp8.act_quantize_1x128(pre, act, ALPHA, limit)
    testing.assert_rel_close(ref_fp8.dequantize_1x128(q, s), ref_fp8.dequantize_1x128(ref_q, ref_s),
                             f"{case} {act} h", tol=4e-3)


def test_act_quantize_strided_rows_and_bad_input():
    g = torch.Generator(device="cuda").manual_seed(5)
    big = _randn(g, 64, 3072, s=3.0)
    pre = big[:, :2048]  # row stride 3072
    q, s = torch.ops.cute_moe.act_quantize_fp8_1x128(pre, "swiglu", ALPHA, None)
    want_q, want_s = torch.ops.cute_moe.act_quantize_fp8_1x128(pre.contiguous(), "swiglu", ALPHA, None)
    assert torch.equal(s, want_s) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    with pytest.raises(RuntimeError, match="even count of pre columns"):
        torch.ops.cute_moe.act_quantize_fp8_1x128(big[:, :17], "swiglu", ALPHA, None)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        torch.ops.cute_moe.act_quantize_fp8_1x128(big[:, :48], "swiglu", ALPHA, None)
    with pytest.raises(RuntimeError, match="takes no clamp limit"):
        torch.ops.cute_moe.act_quantize_fp8_1x128(big, "srelu", ALPHA, 7.0)
    with pytest.raises(RuntimeError, match="BFloat16"):
        torch.ops.cute_moe.act_quantize_fp8_1x128(big.float(), "swiglu", ALPHA, None)

# Every row of the compiled kernel table (torch.ops.cute_moe.kernel_table(), the core's
# list_kernels) forced once with CUTE_MOE_CONFIG on a shape that exercises it (partial
# tiles in M, N and K, an empty group, padding rows, more tiles than a 2x1 cluster
# covers) and checked against the fp32 reference. The heuristic alone never picks some
# rows at the sizes the other tests use; this is where each is known to compute the
# right thing. CUTE_MOE_LOG_CONFIG confirms that the forced kernel is the one that ran.
import zlib

import pytest
import torch

import cute_moe
from cute_moe import reference as ref
from cute_moe import testing

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded"),
]

BF16, F32 = torch.bfloat16, torch.float32
ROWS = list(torch.ops.cute_moe.kernel_table()) if cute_moe.library_loaded() else []
# m used rows + PAD padding rows, k the reduction, n the output width (up width for the
# fused forward), over E groups with one empty: every tile shape of the table leaves a
# partial tile in each dimension (tile_k 64 and 128 both: k = 5.5 * 64).
M, PAD, K, N, E = 1100, 37, 352, 528, 5
SIZES = [400, 0, 251, 300, 149]
ALPHA = 1.702

CALLS = ("ragged_m", "ragged_m_bcol", "ragged_k_bf16", "ragged_k_f32", "act_forward",
         "act_forward_bcol", "act_forward_gather", "act_backward", "act_backward_bcol",
         "act_backward_halves", "fp8_ragged_m", "fp8_act_forward", "fp8_act_backward",
         "fp8_ragged_k")


def _row_id(row: str) -> str:
    return row.replace(":", "-").replace("--", "-")


def test_every_row_is_covered():
    assert ROWS, "the library reports no kernels"
    for row in ROWS:
        call, _, config = row.split(":")
        assert call in CALLS, f"{row}: a call this sweep does not know; add it to the sweep"
        assert config


def _randn(g, *shape, s=1.0):
    return (torch.randn(*shape, device="cuda", generator=g) * s).to(BF16)


def _weight(g, k, n, bcol):
    """(E, k, n) operand: row-major, or a transposed view of a row-major (E, n, k)."""
    if bcol:
        return _randn(g, E, n, k, s=2.0 * k ** -0.5).transpose(-2, -1)
    return _randn(g, E, k, n, s=2.0 * k ** -0.5)


def _check(name, got, want):
    err = testing.rel_error(got, want)
    assert err <= testing.tolerance(BF16), f"{name}: relative error {err:.3e}"


def _run(call, act, g, offs, limit):
    ops = torch.ops.cute_moe
    if call.startswith("ragged_m"):
        x, w = _randn(g, M + PAD, K), _weight(g, K, N, call.endswith("bcol"))
        bias = _randn(g, E, N, s=0.5)
        _check("y", ops.grouped_mm(x, w, offs, bias), ref.grouped_mm_ref(x, w, offs, bias, out_dtype=F32))
    elif call.startswith("ragged_k"):
        dtype = BF16 if call.endswith("bf16") else F32
        x, dy = _randn(g, M + PAD, K), _randn(g, M + PAD, N)
        dw, _ = ops.grouped_mm_wgrad(x, dy, offs, dtype)
        assert dw.dtype == dtype
        _check("dw", dw, ref.grouped_mm_wgrad_ref(x, dy, offs, F32))
    elif call.startswith("act_forward"):
        w, bias = _weight(g, K, N, call.endswith("bcol")), _randn(g, E, N, s=0.5)
        scale = torch.rand(E, device="cuda", generator=g) + 0.5
        if call.endswith("gather"):
            tokens = _randn(g, 700, K)
            rows = torch.randint(0, 700, (M + PAD,), device="cuda", generator=g, dtype=torch.int32)
            h, pre = ops.grouped_mm_act_gathered(tokens, rows, w, offs, bias, scale, act, ALPHA, limit)
            want_h, want_pre = ref.grouped_mm_act_gathered_ref(tokens, rows, w, offs, bias, scale, act,
                                                               ALPHA, limit)
        else:
            x = _randn(g, M + PAD, K)
            h, pre = ops.grouped_mm_act(x, w, offs, bias, scale, act, ALPHA, limit)
            want_h, want_pre = ref.grouped_mm_act_ref(x, w, offs, bias, scale, act, ALPHA, limit)
            if call.endswith("bcol") and act in ref.GATED_ACTIVATIONS:
                # the same kernel reads [gate | linear] halves of W and the bias in place
                _check("pre", pre, want_pre)
                _check("h", h, want_h)
                w, bias = _weight(g, K, N, True), _randn(g, E, N, s=0.5)
                h, pre = ops.grouped_mm_act(x, w, offs, bias, scale, act, ALPHA, limit, "halves")
                want_h, want_pre = ref.grouped_mm_act_ref(x, w, offs, bias, scale, act, ALPHA,
                                                          limit, "halves")
        _check("pre", pre, want_pre)
        _check("h", h, want_h)
    elif call == "fp8_ragged_m":  # e4m3 operands by blocks, against the same quantized inputs
        from cute_moe import fp8
        from cute_moe.ops.fp8 import reference_grouped_mm_fp8
        xq, xs = fp8.quantize_1x128(_randn(g, M + PAD, K))
        _, _, wq_t, ws_t = fp8.quantize_128x128(_randn(g, E, K, N, s=2.0 * K ** -0.5), False, True)
        wq, ws = wq_t.transpose(-2, -1), ws_t.transpose(-2, -1)  # (E, K, N), k-contiguous
        bias = _randn(g, E, N, s=0.5)
        prob = torch.rand(M + PAD, device="cuda", generator=g)
        _check("y", ops.grouped_mm_fp8(xq, xs, wq, ws, offs, bias, prob),
               reference_grouped_mm_fp8(xq, xs, wq, ws, offs, bias, prob, out_dtype=F32))
    elif call == "fp8_act_forward":  # (h, pre) from e4m3 operands by blocks
        from cute_moe import fp8
        from cute_moe.ops.fp8 import reference_grouped_mm_fp8_act
        xq, xs = fp8.quantize_1x128(_randn(g, M + PAD, K))
        _, _, wq_t, ws_t = fp8.quantize_128x128(_randn(g, E, K, N, s=2.0 * K ** -0.5), False, True)
        wq, ws = wq_t.transpose(-2, -1), ws_t.transpose(-2, -1)  # (E, K, N), k-contiguous
        bias = _randn(g, E, N, s=0.5)
        got = ops.grouped_mm_fp8_act(xq, xs, wq, ws, offs, bias, act, ALPHA, limit)
        want = reference_grouped_mm_fp8_act(xq, xs, wq, ws, offs, bias, act, ALPHA, limit)
        for name, a, b in zip(("h", "pre"), got, want):
            _check(name, a, b)
    elif call == "fp8_act_backward":  # dy e4m3 (m, H) @ W_down[e]^T, w the (E, H, I) view
        from cute_moe import fp8
        from cute_moe.ops.fp8 import reference_grouped_mm_fp8_act_bwd
        gated = act in ref.GATED_ACTIVATIONS
        inter = N // 2 + 8 if gated else N  # 272: the weight cast's k, a multiple of 16
        dy = _randn(g, M + PAD, K)
        dyq, dys = fp8.quantize_1x128(dy)
        wq, ws, _, _ = fp8.quantize_128x128(_randn(g, E, inter, K, s=2.0 * K ** -0.5), True, False)
        wq, ws = wq.transpose(-2, -1), ws.transpose(-2, -1)  # (E, K, I), k-contiguous
        pre = _randn(g, M + PAD, 2 * inter if gated else inter, s=3.0)
        prob = torch.rand(M + PAD, device="cuda", generator=g)
        out_bias = _randn(g, E, K, s=0.5)
        got = ops.grouped_mm_fp8_act_bwd(dyq, dys, wq, ws, offs, pre, prob, out_bias, dy, True, act,
                                         ALPHA, limit, gated)  # dpre's e4m3 copy: gated only
        want = reference_grouped_mm_fp8_act_bwd(dyq, dys, wq, ws, offs, pre, prob, out_bias, dy, True,
                                                act, ALPHA, limit)
        for name, a, b in zip(("dpre", "hp", "dprob"), got, want):
            _check(name, a, b)
        if gated:  # dpre's 1 x 128 copy from the same epilogue: quantize_1x128 of the kernel's dpre
            want_q, want_s = fp8.quantize_1x128(got[0])
            assert torch.equal(got[3][:M].view(torch.uint8), want_q[:M].view(torch.uint8)), "dpre_q"
            assert torch.equal(got[4][:M], want_s[:M]), "dpre_scale"
    elif call == "fp8_ragged_k":  # the weight gradient: a by 128 x 1 blocks, b by 128 x 128
        from cute_moe import fp8
        from cute_moe.ops.fp8 import reference_grouped_mm_fp8_wgrad
        a_t, a_s = fp8.quantize_128x1(_randn(g, M + PAD, K), offs)
        b_t, b_s = fp8.quantize_128x1(_randn(g, M + PAD, N), offs, tile_scales=True)
        _check("dw", ops.grouped_mm_fp8_wgrad(a_t, a_s, b_t, b_s, offs),
               reference_grouped_mm_fp8_wgrad(a_t, a_s, b_t, b_s, offs).float())
    else:  # act_backward: dy (m, H) @ W_down[e]^T, w the (E, H, I) operand
        gated = act in ref.GATED_ACTIVATIONS
        inter = N // 2 if gated else N
        w = _weight(g, K, inter, call.endswith("bcol"))  # halves: n-contiguous
        layout = "halves" if call.endswith("halves") else "interleaved"
        dy = _randn(g, M + PAD, K)
        pre = _randn(g, M + PAD, 2 * inter if gated else inter, s=3.0)
        scale = torch.rand(E, device="cuda", generator=g) + 0.5
        prob = torch.rand(M + PAD, device="cuda", generator=g)
        out_bias = _randn(g, E, K, s=0.5)
        got = ops.grouped_mm_act_bwd(dy, w, offs, pre, scale, prob, out_bias, True, act, ALPHA, limit, layout,
                                     True)
        want = ref.grouped_mm_act_bwd_ref(dy, w, offs, pre, scale, prob, out_bias, True, act, ALPHA, limit,
                                          layout, True)
        for name, a, b in zip(("dpre", "hp", "dprob", "db"), got, want):
            _check(name, a, b)
        # db from the epilogue's registers: the column sums of the dpre it stored (the order
        # of the fp32 additions aside), an empty expert's exactly 0
        dpre, db = got[0], got[3]
        torch.testing.assert_close(db, ref.grouped_bias_grad_ref(dpre, offs), rtol=1e-5, atol=1e-5 * float(
            dpre.float().abs().sum(0).max()))
        assert torch.all(db[SIZES.index(0)] == 0)


# Limit-free twins ("<act>_nolimit": the clamps compiled out) run for calls of <act> without a
# limit on their tiles; a call with a limit runs the clamping kernel of the same tile.
NOLIMIT = "_nolimit"
TWINNED = {r.replace(NOLIMIT + ":", ":") for r in ROWS if r.split(":")[1].endswith(NOLIMIT)}


@pytest.mark.parametrize("row", ROWS, ids=[_row_id(r) for r in ROWS])
def test_forced_row_matches_the_reference(row, monkeypatch, capfd):
    call, act, config = row.split(":")
    twin = act.endswith(NOLIMIT)
    base = act[:-len(NOLIMIT)] if twin else act
    limit = ref.default_limit(base) if base else None
    if twin:
        limit = None
    elif row in TWINNED:
        limit = 7.0  # so that the clamping kernel runs, not its twin
    monkeypatch.setenv("CUTE_MOE_CONFIG", config)
    monkeypatch.setenv("CUTE_MOE_LOG_CONFIG", "1")
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(row.encode()))
    offs = torch.tensor(SIZES, device="cuda").cumsum(0).to(torch.int32)
    assert int(offs[-1]) == M
    _run(call, base, g, offs, limit)
    torch.cuda.synchronize()
    log = capfd.readouterr().err
    assert f"-> {config} (forced)" in log, f"the forced kernel did not run: {log!r}"
    assert (f"(forced) {act} " in log) == twin, f"the limit-free twin {'did not run' if twin else 'ran'}: {log!r}"


@pytest.mark.parametrize("limit", [None, 7.0], ids=["no-limit", "limit"])
def test_the_heuristic_runs_the_limit_free_twin_only_without_a_limit(limit, monkeypatch, capfd):
    """Unforced calls of "swiglu" (the heuristic's tiles, which have twins): forward and fused
    backward on the twins without a limit, on the clamping kernels with one; both against the
    reference. The fused backward without a bias gradient runs on the pingpong twin (no column
    sums in its epilogue), with one on the cooperative kernel."""
    if not any(r.split(":")[1] == "swiglu" + NOLIMIT for r in ROWS):
        pytest.skip("this build has no limit-free swiglu kernels")
    monkeypatch.setenv("CUTE_MOE_LOG_CONFIG", "1")
    ops, g = torch.ops.cute_moe, torch.Generator(device="cuda").manual_seed(11)
    sizes = [512, 0, 700, 300]
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    m, k, inter = sum(sizes), 256, 384
    x, w = _randn(g, m, k), _randn(g, len(sizes), k, 2 * inter, s=2.0 * k ** -0.5)
    h, pre = ops.grouped_mm_act(x, w, offs, None, None, "swiglu", ALPHA, limit)
    want_h, want_pre = ref.grouped_mm_act_ref(x, w, offs, None, None, "swiglu", ALPHA, limit)
    _check("pre", pre, want_pre)
    _check("h", h, want_h)
    dy, wd = _randn(g, m, k), _randn(g, len(sizes), inter, k, s=2.0 * inter ** -0.5)
    pre = _randn(g, m, 2 * inter, s=3.0)
    prob = torch.rand(m, device="cuda", generator=g)
    got = ops.grouped_mm_act_bwd(dy, wd.transpose(-2, -1), offs, pre, None, prob, None, True, "swiglu",
                                 ALPHA, limit, "interleaved")
    want = ref.grouped_mm_act_bwd_ref(dy, wd.transpose(-2, -1), offs, pre, None, prob, None, True, "swiglu",
                                      ALPHA, limit, "interleaved")
    for name, a, b in zip(("dpre", "hp", "dprob"), got, want):
        _check(name, a, b)
    got = ops.grouped_mm_act_bwd(dy, wd.transpose(-2, -1), offs, pre, None, prob, None, True, "swiglu",
                                 ALPHA, limit, "interleaved", True)
    want = ref.grouped_mm_act_bwd_ref(dy, wd.transpose(-2, -1), offs, pre, None, prob, None, True, "swiglu",
                                      ALPHA, limit, "interleaved", True)
    for name, a, b in zip(("dpre", "hp", "dprob", "db"), got, want):
        _check(name, a, b)
    torch.cuda.synchronize()
    log = capfd.readouterr().err
    lines = [line for line in log.splitlines() if "act_forward" in line or "act_backward" in line]
    assert len(lines) == 3, log
    for line in lines:
        assert ("swiglu_nolimit" in line) == (limit is None), line
    backward, backward_db = lines[1], lines[2]
    pong_twin = any(r.startswith("act_backward:swiglu" + NOLIMIT + ":") and r.endswith("_pong") for r in ROWS)
    assert ("_pong " in backward) == (limit is None and pong_twin), backward
    assert "_coop " in backward_db, backward_db

# cute_moe.fp8.expert_ffn on the CPU (the quantizers' and the FP8 GEMM's references, the bf16
# ops' CPU kernels): every activation, with and without biases and router probabilities, on
# small ragged blocks with an empty expert and padding rows. The output and every gradient
# against (a) the float64 reference of the FP8 path (fp8_ffn_cases.fp8_ffn_ref: the same
# quantizations and bf16 roundings), tightly, and (b) the unquantized block of
# cute_moe.reference, loosely; (c) the layouts it leaves to cute_moe.expert_ffn; (d) padding
# rows; the gradients of any subset of the inputs; limit="default".
import pytest
import torch

import cute_moe

from expert_ffn_cases import run_ref
from fp8_ffn_cases import (ACTIVATIONS, BF16, bf16_grads, check_loose, check_matched, errors,
                           fp8_ffn_ref, fp8_grads, make_leaves, run_fp8)

# (counts per expert, H, I, padding rows): H and I multiples of 16, not all of 128, so that
# 1x128 and 128x128 blocks are short at the edges; an empty expert first, in the middle, none
SHAPES = [([37, 0, 50], 144, 80, 5), ([0, 61, 19], 128, 176, 3), ([23, 41, 9], 160, 144, 0)]

# (a): at least 95% of the elements of every output agree with the float64 reference to fp32
# level (bit for bit after the output's bf16 rounding; 90% of dprob's rows), and the relative
# Frobenius error is at most 5e-3. Why not 1e-5 over the whole: the FP8 path rounds pre, h, z,
# g, dh and dpre to bf16 from fp32 arithmetic, the reference from float64; about 1e-4 of those
# roundings fall on the other side, and where a quantizer reads such an element it can move by
# an e4m3 step (2^-4 of itself), which shows in the rows and columns computed from it. Seen over
# this grid: at least 98.9% of the elements of each output exact (95.9% of dprob's rows: each
# sums H roundings of z), relative Frobenius errors up to 2.1e-3 (out of [0, 61, 19] geglu).
# A missing or different quantization gives 2e-2 and more (test_every_quantization_shows); a
# missing or extra bf16 rounding breaks the exact share.
MIN_EXACT, MATCHED_TOL = 0.95, 5e-3
# (b): against the unquantized block, the e4m3 roundings of up to three chained GEMM operands:
# 5-7% on this data (0.072 at most over the grid); bound 0.1.
BF16_TOL = 0.1


def _dy(leaves, seed=2):
    return torch.randn(leaves["x"].shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


@pytest.mark.parametrize("wgrad", ["bf16", "fp8"], ids=["", "fp8_wgrad"])
@pytest.mark.parametrize("prob", [False, True], ids=["", "prob"])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_matches_quantized_reference(shape, activation, bias, prob, wgrad):
    counts, hidden, inter, pad = SHAPES[shape]
    # w_std 3: pre-activations of about 3, across swiglu_oai's clamps at +-7 and every kink
    leaves, offs = make_leaves(counts, hidden, inter, activation, bias=bias, prob=prob, pad=pad,
                               seed=hidden + inter, w_std=3.0)
    dy = _dy(leaves)
    fp8_w = wgrad == "fp8"
    out, grads = fp8_grads(leaves, offs, activation, dy, fp8_weight_grads=fp8_w)
    assert out.dtype == BF16 and out.shape == leaves["x"].shape
    assert all(grads[k].dtype == leaves[k].dtype and grads[k].shape == leaves[k].shape
               for k in grads)
    want_out, want = fp8_ffn_ref(leaves, offs, activation, dy, fp8_weight_grads=fp8_w)
    check_matched(out, grads, want_out, want, MATCHED_TOL, MIN_EXACT,
                  f"{activation} {counts} H={hidden} I={inter}")


@pytest.mark.parametrize("unquantized", ["x", "w_up", "w_down", "h", "dy", "dpre", "hp"])
def test_every_quantization_shows(unquantized):
    """The tight check tells each quantization apart (the weight gradients' too: FP8 weight
    gradients): against a reference without it, some output is off by well over MATCHED_TOL."""
    counts, hidden, inter, pad = SHAPES[0]
    leaves, offs = make_leaves(counts, hidden, inter, "swiglu_oai", bias=True, prob=True, pad=pad,
                               seed=1)
    dy = _dy(leaves)
    out, grads = fp8_grads(leaves, offs, "swiglu_oai", dy, fp8_weight_grads=True)
    check_matched(out, grads, *fp8_ffn_ref(leaves, offs, "swiglu_oai", dy, fp8_weight_grads=True),
                  MATCHED_TOL, MIN_EXACT, "control")
    want_out, want = fp8_ffn_ref(leaves, offs, "swiglu_oai", dy, unquantized=(unquantized,),
                                 fp8_weight_grads=True)
    assert max(errors(out, grads, want_out, want).values()) > 3 * MATCHED_TOL
    with pytest.raises(AssertionError):
        check_matched(out, grads, want_out, want, MATCHED_TOL, MIN_EXACT, unquantized)


@pytest.mark.parametrize("prob", [False, True], ids=["", "prob"])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_close_to_unquantized_block(activation, bias, prob):
    counts, hidden, inter, pad = SHAPES[2]
    # w_std 2: at 3, quantizing pre moves many values across swiglu_oai's clamps, whose
    # gradient jumps there (dx 0.11 from the unquantized block)
    leaves, offs = make_leaves(counts, hidden, inter, activation, bias=bias, prob=prob, pad=pad,
                               seed=7, w_std=2.0)
    dy = _dy(leaves)
    out, grads = fp8_grads(leaves, offs, activation, dy)
    want_out, want = bf16_grads(leaves, offs, activation, dy, run_ref)
    errs = check_loose(out, grads, want_out, want, BF16_TOL, activation)
    assert errs["out"] > 1e-2  # it is FP8: not the bf16 block


def _block(**kw):
    return make_leaves([6, 0, 9], 32, 16, "swiglu_oai", bias=True, prob=True, pad=2, seed=3, **kw)


def test_gather_argument_errors():
    """The FP8 block's gather is checked as the bf16 block's: a pair, int32 rows on x's device,
    token_rows (T, k) with T = x's rows."""
    leaves, offs = _block()
    x, w_up, w_down = (leaves[k].detach() for k in ("x", "w_up", "w_down"))
    m = x.shape[0]
    fp8 = cute_moe.fp8.expert_ffn
    rows = torch.arange(m, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"gather: expected \(rows, token_rows\)"):
        fp8(x, w_up, w_down, offs, gather=(rows,))
    with pytest.raises(ValueError, match=r"gather: expected rows as a 1-D int32 tensor"):
        fp8(x, w_up, w_down, offs, gather=(rows.long(), None))
    with pytest.raises(ValueError, match=r"fp8\.expert_ffn"):
        fp8(x[:5], w_up, w_down, offs, gather=(rows, rows.view(m, 1)))
    # rows past offs[-1] are padding: the gathered block equals the block on x[rows]
    y = fp8(x, w_up, w_down, offs, gather=(rows.flip(0), None))
    assert torch.equal(y, fp8(x.flip(0), w_up, w_down, offs))


def test_rejects_what_cute_moe_expert_ffn_serves():
    leaves, offs = _block()
    x, w_up, w_down = (leaves[k].detach() for k in ("x", "w_up", "w_down"))
    b_up, b_down = leaves["b_up"].detach(), leaves["b_down"].detach()
    scale = torch.ones(3)
    up_t = w_up.transpose(-2, -1).contiguous().transpose(-2, -1)   # (E, 2I, H) storage
    down_t = w_down.transpose(-2, -1).contiguous().transpose(-2, -1)  # (E, H, I) storage
    fp8 = cute_moe.fp8.expert_ffn
    cases = {
        "transposed w_up": lambda: fp8(x, up_t, w_down, offs, b_up, b_down),
        "transposed w_down": lambda: fp8(x, w_up, down_t, offs, b_up, b_down),
        "halves": lambda: fp8(x, w_up, w_down, offs, b_up, b_down, gate_linear="halves"),
        "scale_up": lambda: fp8(x, w_up, w_down, offs, scale_up=scale),
        "scale_down": lambda: fp8(x, w_up, w_down, offs, scale_down=scale),
    }
    for name, call in cases.items():
        with pytest.raises(NotImplementedError, match=r"cute_moe\.expert_ffn serves it"):
            call()
    # the bf16 block takes each of them
    assert cute_moe.expert_ffn(x, up_t, down_t, offs, b_up, b_down).shape == x.shape
    # and the argument errors are those of cute_moe.expert_ffn
    with pytest.raises(ValueError, match=r"cute_moe\.fp8\.expert_ffn: activation"):
        fp8(x, w_up, w_down, offs, activation="relu")
    with pytest.raises(ValueError, match=r"w_down: expected shape"):
        fp8(x, w_up, w_down[:, :8], offs)
    with pytest.raises(ValueError, match=r"multiples of 16"):
        fp8(x[:, :24].contiguous(), w_up[:, :24], w_down[..., :24], offs)
    with pytest.raises(ValueError, match=r"b_up"):
        fp8(x, w_up, w_down, offs, b_up[:, :8])
    with pytest.raises(ValueError, match=r"limit"):
        fp8(x, w_up[..., :16], w_down, offs, activation="srelu", limit=7.0)


def test_padding_rows():
    leaves, offs = make_leaves([9, 0, 14], 144, 80, "swiglu_oai", bias=True, prob=True, pad=6,
                               seed=4)
    used = int(offs[-1])
    with torch.no_grad():  # poisoned padding rows: never read
        leaves["x"][used:] = float("nan")
        leaves["prob"][used:] = float("nan")
    dy = _dy(leaves)
    out, grads = fp8_grads(leaves, offs, "swiglu_oai", dy)
    assert torch.all(out[used:] == 0) and torch.all(grads["prob"][used:] == 0)
    assert torch.all(grads["x"][used:] == 0)
    assert all(bool(torch.isfinite(g).all()) for g in grads.values())
    check_matched(out, grads, *fp8_ffn_ref(leaves, offs, "swiglu_oai", dy), MATCHED_TOL,
                  MIN_EXACT, "poisoned padding")
    # all rows padding, and no rows
    for pad in (5, 0):
        leaves, offs = make_leaves([0, 0, 0], 32, 16, "swiglu_oai", bias=True, prob=True,
                                   pad=pad, seed=5)
        out, grads = fp8_grads(leaves, offs, "swiglu_oai", _dy(leaves))
        assert out.shape == (pad, 32) and torch.all(out == 0)
        assert all(torch.count_nonzero(g) == 0 for g in grads.values())


@pytest.mark.parametrize("activation", ["swiglu_oai", "srelu", "none"])
def test_any_subset_of_gradients(activation):
    """Each input alone needing its gradient gets the gradient of the full run; without
    gradients, the same output."""
    leaves, offs = make_leaves([11, 0, 7], 144, 80, activation, bias=True, prob=True, pad=2,
                               seed=6)
    dy = _dy(leaves)
    out, full = fp8_grads(leaves, offs, activation, dy)
    with torch.no_grad():
        assert torch.equal(run_fp8(leaves, offs, activation), out)
    for name in full:
        alone = {k: v.detach().requires_grad_(k == name) for k, v in leaves.items()}
        y = run_fp8(alone, offs, activation)
        assert torch.equal(y, out)
        (g,) = torch.autograd.grad(y, [alone[name]], dy)
        assert torch.equal(g, full[name]), name


@pytest.mark.parametrize("wgrad", [False, True], ids=["", "fp8_wgrad"])
def test_up_projection_takes_dpre_copy_from_fused_backward(monkeypatch, wgrad):
    """In eager mode the up projection's input gradient reads dpre's 1x128 copy that the down
    projection's fused backward wrote (one quantization pass fewer than with FUSED_DPRE_COPY
    off), with the same bits; without dx to compute, no copy is asked for."""
    from cute_moe import fp8_ffn
    leaves, offs = make_leaves([11, 0, 7], 144, 80, "swiglu_oai", bias=True, prob=True, pad=2, seed=8)
    dy = _dy(leaves)
    calls = {"quantize": 0, "copies": 0}
    quantize, act_bwd = fp8_ffn.quantize_1x128, fp8_ffn.grouped_mm_act_bwd_unchecked
    quantize_sums = fp8_ffn.quantize_1x128_column_sums

    def counting_quantize(a, index=None):
        calls["quantize"] += 1
        return quantize(a, index)

    def counting_quantize_sums(a, offs):  # dpre's pass where b_up needs its gradient
        calls["quantize"] += 1
        return quantize_sums(a, offs)

    def counting_act_bwd(*args):
        calls["copies"] += bool(args[-1])
        return act_bwd(*args)

    monkeypatch.setattr(fp8_ffn, "quantize_1x128", counting_quantize)
    monkeypatch.setattr(fp8_ffn, "quantize_1x128_column_sums", counting_quantize_sums)
    monkeypatch.setattr(fp8_ffn, "grouped_mm_act_bwd_unchecked", counting_act_bwd)
    monkeypatch.setattr(fp8_ffn, "FP8_WEIGHT_GRADS", wgrad)
    seen = {}
    for fused in (True, False):
        monkeypatch.setattr(fp8_ffn, "FUSED_DPRE_COPY", fused)
        calls.update(quantize=0, copies=0)
        seen[fused] = (fp8_grads(leaves, offs, "swiglu_oai", dy), dict(calls))
    (out, grads), fused_calls = seen[True]
    (out2, grads2), pass_calls = seen[False]
    assert torch.equal(out, out2) and all(torch.equal(grads[k], grads2[k]) for k in grads)
    assert fused_calls["copies"] == 1 and pass_calls["copies"] == 0
    if not wgrad:  # with FP8 weight gradients dpre's pass is both-ways (another function)
        assert fused_calls["quantize"] == pass_calls["quantize"] - 1, (fused_calls, pass_calls)
    # x without a gradient: no dx, no copy asked for
    calls.update(quantize=0, copies=0)
    monkeypatch.setattr(fp8_ffn, "FUSED_DPRE_COPY", True)
    no_x = {k: v.detach().requires_grad_(k != "x") for k, v in leaves.items()}
    torch.autograd.grad(run_fp8(no_x, offs, "swiglu_oai"), [no_x["w_up"]], dy)
    assert calls["copies"] == 0


@pytest.mark.parametrize("activation", ["swiglu_oai", "srelu"])
def test_h_copy_from_up_projection_epilogue(monkeypatch, activation):
    """FUSED_H_COPY: the up projection writes h's 1x128 copy itself (grouped_mm_act_quant, gated
    activations) instead of a pass over pre (act_quantize_1x128), with the same bits for the
    output and every gradient; a non-gated activation keeps the pass."""
    from cute_moe import fp8_ffn
    leaves, offs = make_leaves([11, 0, 7], 144, 80, activation, bias=True, prob=True, pad=2, seed=9)
    dy = _dy(leaves)
    calls = {"pass": 0, "fused": 0}
    act_pass, fused = fp8_ffn.act_quantize_1x128, fp8_ffn.grouped_mm_act_quant_unchecked

    def counting_pass(*args):
        calls["pass"] += 1
        return act_pass(*args)

    def counting_fused(*args):
        calls["fused"] += 1
        return fused(*args)

    monkeypatch.setattr(fp8_ffn, "act_quantize_1x128", counting_pass)
    monkeypatch.setattr(fp8_ffn, "grouped_mm_act_quant_unchecked", counting_fused)
    seen = {}
    for flag in (True, False):
        monkeypatch.setattr(fp8_ffn, "FUSED_H_COPY", flag)
        calls.update({"pass": 0, "fused": 0})
        seen[flag] = (fp8_grads(leaves, offs, activation, dy), dict(calls))
    (out, grads), with_flag = seen[True]
    (out2, grads2), without = seen[False]
    assert torch.equal(out, out2) and all(torch.equal(grads[k], grads2[k]) for k in grads)
    assert without == {"pass": 1, "fused": 0}
    assert with_flag == ({"pass": 0, "fused": 1} if activation == "swiglu_oai" else without)


def test_prob_dtype_and_default_limit():
    leaves, offs = _block()
    x, w_up, w_down = (leaves[k].detach() for k in ("x", "w_up", "w_down"))
    prob = leaves["prob"].detach().to(BF16).requires_grad_()
    y = cute_moe.fp8.expert_ffn(x, w_up, w_down, offs, prob=prob)
    (dprob,) = torch.autograd.grad(y, [prob], _dy(leaves))
    assert dprob.dtype == BF16
    # limit="default" is swiglu_oai's 7.0, as in cute_moe.expert_ffn; None: no clamp
    x = x * 8  # pre-activations past 7
    y7 = cute_moe.fp8.expert_ffn(x, w_up, w_down, offs, limit=7.0)
    assert torch.equal(cute_moe.fp8.expert_ffn(x, w_up, w_down, offs), y7)
    assert not torch.equal(cute_moe.fp8.expert_ffn(x, w_up, w_down, offs, limit=None), y7)
    # another alpha and limit reach the activation and its backward
    leaves, offs = make_leaves([7, 0, 9], 144, 80, "swiglu_oai", bias=True, prob=True, seed=8)
    dy = _dy(leaves)
    out = run_fp8(leaves, offs, "swiglu_oai", swiglu_alpha=1.0, limit=5.0)
    names = list(leaves)
    grads = dict(zip(names, torch.autograd.grad(out, [leaves[k] for k in names], dy)))
    check_matched(out, grads, *fp8_ffn_ref(leaves, offs, "swiglu_oai", dy, alpha=1.0, limit=5.0),
                  MATCHED_TOL, MIN_EXACT, "alpha 1, limit 5")


def test_fp8_weight_grads_rule(monkeypatch):
    """fp8_ffn.fp8_weight_grads_for: FP8_WEIGHT_GRADS where set; unset, FP8 from
    FP8_WEIGHT_GRADS_MIN_ROWS_PER_EXPERT routed rows an expert on average, and with a fused
    gather only where the copies fit in the bf16 layer's peak (the GPU test checks the block
    follows it; test_fp8_memory_cpu.py the peaks)."""
    from cute_moe import fp8_ffn
    rule = fp8_ffn.fp8_weight_grads_for
    least = fp8_ffn.FP8_WEIGHT_GRADS_MIN_ROWS_PER_EXPERT
    monkeypatch.setattr(fp8_ffn, "FP8_WEIGHT_GRADS", None)
    assert rule(32 * least, 32, 2880, 2880, gathered=False)
    assert not rule(32 * least - 1, 32, 2880, 2880, gathered=False)
    assert rule(3072 * 32, 32, 2880, 2880, gathered=True)            # GPT-OSS-20B
    assert not rule(1024 * 128, 128, 2048, 768, gathered=False)      # Qwen3-30B-A3B
    assert rule(6144 * 8, 8, 2048, 1024, gathered=False)             # the seed example
    assert not rule(6144 * 8, 8, 2048, 1024, gathered=True)          # gathered: would not fit
    for setting in (True, False):
        monkeypatch.setattr(fp8_ffn, "FP8_WEIGHT_GRADS", setting)
        for rows, gathered in [(1, False), (10 ** 6, False), (10 ** 6, True)]:
            assert rule(rows, 4, 128, 128, gathered=gathered) is setting

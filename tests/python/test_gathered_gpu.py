# GPU tests of the gathered up projection (cute_moe::grouped_mm_act_gathered, the token
# gather fused into the GEMM's A load): bit-for-bit equality with grouped_mm_act on the
# gathered rows for every activation and both tile schedules, over ragged, skewed and
# empty groups, K tails and padding rows; the reference; gradients against autograd of the
# reference; argument errors; a bad row index stopping the kernel (child process).

import pytest
import torch

import cute_moe
from cute_moe import testing
from cute_moe.reference import grouped_mm_act_gathered_ref

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded"),
]

ops = torch.ops.cute_moe
BF16 = torch.bfloat16
ACTS = [("swiglu_oai", 7.0), ("swiglu", None), ("geglu", 5.0), ("srelu", None)]


def _problem(tokens, hidden, n, experts, k, routing="balanced", pad=0, bias=True, seed=0):
    """Routed rows of `tokens` tokens to top-k of `experts`, sorted by expert: rows (the token
    of each routed row, plus `pad` padding rows), offs, x (T, H), w (E, H, n), bias."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=g)
    if routing == "skewed":  # expert 0 takes most rows, the last two none
        scores[:, 0] += 2.0
        scores[:, -2:] -= 2.0
    choice = scores.topk(k, dim=1).indices.reshape(-1)
    order = torch.sort(choice, stable=True).indices
    rows = (order // k).to(torch.int32)
    offs = torch.cumsum(torch.bincount(choice, minlength=experts), 0).to(torch.int32)
    if pad:
        rows = torch.cat([rows, torch.randint(0, tokens, (pad,), generator=g, dtype=torch.int32)])
    x = torch.randn(tokens, hidden, generator=g).to(BF16)
    w = (torch.randn(experts, hidden, n, generator=g) / hidden ** 0.5).to(BF16)
    b = (torch.randn(experts, n, generator=g) * 0.1).to(BF16) if bias else None
    return [t.cuda() if t is not None else None for t in (x, rows, w, offs, b)]


CASES = [  # tokens, hidden, n, experts, k, routing, pad
    (300, 136, 48, 5, 2, "balanced", 0),     # K tail: 136 = 2 * 64 + 8
    (300, 136, 48, 5, 2, "skewed", 37),      # empty groups, padding rows
    (777, 2880, 720, 32, 4, "balanced", 5),  # GPT-OSS hidden size
    (1000, 256, 512, 8, 2, "skewed", 0),
    (64, 64, 32, 3, 1, "balanced", 0),       # a single partial tile per group
]


@pytest.mark.parametrize("config", [None, "128x256x64_2x1_coop", "128x128x64_2x1_pong"])
@pytest.mark.parametrize("act,limit", ACTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c[0]}_H{c[1]}_N{c[2]}_E{c[3]}_k{c[4]}_{c[5]}_pad{c[6]}")
def test_equals_grouped_mm_act_on_the_gathered_rows(case, act, limit, config, monkeypatch):
    if config is not None:
        monkeypatch.setenv("CUTE_MOE_CONFIG", config)
    tokens, hidden, n, experts, k, routing, pad = case
    x, rows, w, offs, b = _problem(tokens, hidden, n, experts, k, routing, pad)
    scale = torch.rand(experts, device="cuda") + 0.5
    h, pre = ops.grouped_mm_act_gathered(x, rows, w, offs, b, scale, act, 1.702, limit)
    h0, pre0 = ops.grouped_mm_act(x[rows.long()], w, offs, b, scale, act, 1.702, limit)
    # the same tile, the same WGMMA order: the same bits, padding rows zero in both
    assert torch.equal(pre, pre0) and torch.equal(h, h0)
    used = int(offs[-1])
    assert not pre[used:].any() and not h[used:].any()
    href, preref = grouped_mm_act_gathered_ref(x.double(), rows, w.double(), offs, b.double(),
                                               scale.double(), act, 1.702, limit)
    testing.assert_rel_close(pre[:used], preref[:used], "pre", BF16)
    testing.assert_rel_close(h[:used], href[:used], "h", BF16)


def test_no_rows_and_no_tokens_used():
    x, rows, w, offs, b = _problem(16, 64, 32, 4, 1)
    h, pre = ops.grouped_mm_act_gathered(x, rows[:0], w, torch.zeros_like(offs), b, None, "swiglu")
    assert h.shape == (0, 16) and pre.shape == (0, 32)
    # all rows padding: zeros
    h, pre = ops.grouped_mm_act_gathered(x, rows, w, torch.zeros_like(offs), b, None, "swiglu")
    assert not h.any() and not pre.any()


@pytest.mark.parametrize("act,limit", [("swiglu_oai", 7.0), ("srelu", None)])
def test_gradients_match_autograd_of_the_reference(act, limit):
    x, rows, w, offs, b = _problem(500, 128, 96, 6, 3, "skewed", pad=4)
    scale = (torch.rand(6, device="cuda") + 0.5).requires_grad_()
    leaves = [t.requires_grad_() for t in (x, w, b)]
    h, pre = cute_moe.grouped_mm_act_gathered(x, rows, w, offs, b, scale, act, 1.702, limit)
    g = torch.Generator().manual_seed(5)
    gh, gp = (torch.randn(t.shape, generator=g).to(BF16).cuda() for t in (h, pre))
    grads = torch.autograd.grad((h.float() * gh).sum() + (pre.float() * gp).sum(), leaves + [scale])
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves + [scale]]
    hr, pr = grouped_mm_act_gathered_ref(ref_leaves[0], rows, ref_leaves[1], offs, ref_leaves[2],
                                         ref_leaves[3], act, 1.702, limit)
    ref_grads = torch.autograd.grad((hr * gh.double()).sum() + (pr * gp.double()).sum(), ref_leaves)
    for name, got, want in zip(("x", "w", "bias", "scale"), grads, ref_grads):
        testing.assert_rel_close(got, want, f"d{name}", BF16)


def test_argument_errors_name_what_was_expected():
    x, rows, w, offs, b = _problem(32, 64, 32, 4, 2)
    with pytest.raises(RuntimeError, match="rows must be Int"):
        ops.grouped_mm_act_gathered(x, rows.long(), w, offs, b, None, "swiglu")
    with pytest.raises(RuntimeError, match="contiguous along N"):
        wt = w.transpose(1, 2).contiguous().transpose(1, 2)
        ops.grouped_mm_act_gathered(x, rows, wt, offs, b, None, "swiglu")
    with pytest.raises(RuntimeError, match="no fused forward"):
        ops.grouped_mm_act_gathered(x, rows, w, offs, b, None, "none")
    with pytest.raises(ValueError, match="rows"):
        cute_moe.grouped_mm_act_gathered(x, rows.cpu(), w, offs, b)


@pytest.mark.parametrize("bad", ["[0, 1, 2, 8]", "[0, -1, 2, 3]"], ids=["past-end", "negative"])
def test_invalid_row_index_stops_the_kernel_with_a_message(bad):
    out = testing.device_trap_output(f"""
        x = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2, 64, 32, device="cuda", dtype=torch.bfloat16)
        rows = torch.tensor({bad}, device="cuda", dtype=torch.int32)
        offs = torch.tensor([2, 4], device="cuda", dtype=torch.int32)
    """, 'torch.ops.cute_moe.grouped_mm_act_gathered(x, rows, w, offs, None, None, "swiglu")')
    assert "cute_moe act_forward: invalid gather_rows[" in out, out
    assert "row indices must be in [0, x_rows=8)" in out, out

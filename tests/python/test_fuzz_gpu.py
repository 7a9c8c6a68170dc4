# A seeded randomized fuzz of the fused expert block (cute_moe.expert_ffn) on the GPU:
# random expert counts (1-256), row counts (0 included, rarely a tile multiple), H and I
# (multiples of 8 up to 4096), routings with skew and empty experts, padding rows, every
# activation, with and without biases, router probabilities and per-expert scales, both
# weight layouts. Each case checks the output and every gradient against the fp32
# reference, that the gradients of empty experts are exactly zero, and that padding rows
# are exactly zero (output and input gradient). The cases are drawn once from a fixed
# seed, so a failure names a reproducible case.
import random

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
NUM_CASES = 300
# Elements of one expert weight stack (E x H x up) and of one activation (M x width):
# caps that keep the whole fuzz, reference included, under a minute on an H100.
MAX_WEIGHT = 1 << 23
MAX_ROWS_X_WIDTH = 1 << 22


def _mult8(v: float) -> int:
    return max(8, int(v) // 8 * 8)


def _draw(rng: random.Random) -> dict:
    activation = rng.choice(tuple(ref.ACTIVATIONS))
    gated = activation in ref.GATED_ACTIVATIONS
    e = int(round(2 ** rng.uniform(0, 8)))  # 1 .. 256, log-uniform
    hidden = _mult8(2 ** rng.uniform(3, 12))  # 8 .. 4096
    inter = _mult8(2 ** rng.uniform(3, 12))
    while e * hidden * (2 * inter if gated else inter) > MAX_WEIGHT:
        if hidden >= inter:
            hidden = _mult8(hidden // 2)
        else:
            inter = _mult8(inter // 2)
    width = max(hidden, 2 * inter if gated else inter)
    kind = rng.random()
    if kind < 0.08:
        m = 0
    elif kind < 0.3:
        m = rng.randint(1, 40)
    else:
        m = rng.randint(1, max(1, min(8192, MAX_ROWS_X_WIDTH // width)))
    pad = 0 if rng.random() < 0.6 else rng.randint(1, 70)
    return dict(activation=activation, e=e, m=m, pad=pad, hidden=hidden, inter=inter,
                routing=rng.choice(testing.ROUTINGS), layout=rng.choice(("kn", "nk")),
                bias=rng.random() < 0.5, prob=rng.random() < 0.5, scale=rng.random() < 0.2,
                seed=rng.randrange(1 << 30))


_RNG = random.Random(20261124)
CASES = [_draw(_RNG) for _ in range(NUM_CASES)]


def _case_id(c: dict) -> str:
    return (f"{c['activation']}-E{c['e']}-M{c['m']}+{c['pad']}-H{c['hidden']}-I{c['inter']}-"
            f"{c['routing']}-{c['layout']}{'-bias' if c['bias'] else ''}"
            f"{'-prob' if c['prob'] else ''}{'-scale' if c['scale'] else ''}")


def _leaves(c: dict):
    g = torch.Generator(device="cuda").manual_seed(c["seed"])
    cpu_g = torch.Generator().manual_seed(c["seed"])
    gated = c["activation"] in ref.GATED_ACTIVATIONS
    e, h, i = c["e"], c["hidden"], c["inter"]
    up = 2 * i if gated else i
    rows = c["m"] + c["pad"]

    def randn(*shape, s=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * s).to(BF16)

    def weight(k, n):  # the leaf in its storage layout
        return randn(e, k, n, s=2.0 * k ** -0.5) if c["layout"] == "kn" else randn(e, n, k, s=2.0 * k ** -0.5)

    leaves = dict(x=randn(rows, h), w_up=weight(h, up), w_down=weight(i, h))
    if c["bias"]:
        leaves["b_up"] = randn(e, up, s=0.5)
        leaves["b_down"] = randn(e, h, s=0.5)
    if c["prob"]:
        leaves["prob"] = torch.rand(rows, device="cuda", generator=g)
    if c["scale"]:
        leaves["scale_up"] = torch.rand(e, device="cuda", generator=g) + 0.5
        leaves["scale_down"] = torch.rand(e, device="cuda", generator=g) + 0.5
    sizes = testing.group_sizes(c["m"], e, c["routing"], generator=cpu_g)
    offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    return {k: v.requires_grad_() for k, v in leaves.items()}, offs, sizes


def _operand(leaf: torch.Tensor, layout: str) -> torch.Tensor:
    return leaf if layout == "kn" else leaf.transpose(-2, -1)


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_expert_block_fuzz(case):
    c = case
    leaves, offs, sizes = _leaves(c)
    act, layout = c["activation"], c["layout"]
    w_up, w_down = _operand(leaves["w_up"], layout), _operand(leaves["w_down"], layout)
    out = cute_moe.expert_ffn(leaves["x"], w_up, w_down, offs, leaves.get("b_up"), leaves.get("b_down"),
                              activation=act, prob=leaves.get("prob"), scale_up=leaves.get("scale_up"),
                              scale_down=leaves.get("scale_down"))
    expect = ref.expert_ffn_ref(leaves["x"], w_up, leaves.get("b_up"), w_down, leaves.get("b_down"), offs,
                                1.702, ref.default_limit(act), F32, activation=act,
                                prob=leaves.get("prob"), scale_up=leaves.get("scale_up"),
                                scale_down=leaves.get("scale_down"))
    used = c["m"]
    assert out.shape == expect.shape and out.dtype == BF16
    assert torch.count_nonzero(out[used:]) == 0, "padding rows of the output are not zero"

    dy = torch.randn(out.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).to(BF16)
    names = list(leaves)
    grads = torch.autograd.grad(out, [leaves[k] for k in names], dy, allow_unused=True)
    want = torch.autograd.grad(expect, [leaves[k] for k in names], dy.float(), allow_unused=True)
    errors = {"out": testing.rel_error(out, expect)}
    for k, a, b in zip(names, grads, want):
        assert a is not None, f"d{k} is missing"
        b = torch.zeros_like(a) if b is None else b
        errors[f"d{k}"] = testing.rel_error(a, b)
    bad = {k: f"{v:.2e}" for k, v in errors.items() if not v <= testing.tolerance(BF16)}
    assert not bad, f"relative errors above {testing.tolerance(BF16)}: {bad}"

    d = dict(zip(names, grads))
    assert torch.count_nonzero(d["x"][used:]) == 0, "padding rows of dx are not zero"
    if c["prob"]:
        assert torch.count_nonzero(d["prob"][used:]) == 0, "padding rows of dprob are not zero"
    empty = [e for e, s in enumerate(sizes) if s == 0]
    for k in ("w_up", "w_down", "b_up", "b_down"):
        if k in d and empty:
            assert torch.count_nonzero(d[k][empty]) == 0, f"d{k} of empty experts {empty[:8]} is not zero"

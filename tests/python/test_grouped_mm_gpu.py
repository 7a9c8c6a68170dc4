# GPU tests of the cute_moe grouped GEMMs against the fp32 references: a sweep of random
# ragged problems (empty groups, padding rows, E from 1 to 1024, sizes off the tile
# grid, both weight layouts, with and without bias) through forward and backward, the
# wgrad op's output dtypes, determinism, host-sync freedom and CUDA-graph replay with
# new routing. Needs a CUDA device and the compiled library.
import random

import pytest
import torch

import cute_moe
from cute_moe import testing
from cute_moe.reference import (grouped_bias_grad_ref, grouped_mm_ref, grouped_mm_wgrad_ref,
                                offsets_from_counts)

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded "
                       "(pip install --no-build-isolation .)"),
]

BF16, F32 = torch.bfloat16, torch.float32
TOL = testing.tolerance(BF16)


def _make_cases(count=56, seed=2024):
    rng = random.Random(seed)
    experts = [1, 2, 3, 7, 16, 32, 64, 128, 257, 1024]
    dims = [8, 40, 72, 136, 200, 264, 520, 776, 128, 256]  # multiples of 8, mostly not of 64
    cases = []
    for i in range(count):
        e = experts[i % len(experts)]
        m = rng.randrange(1, 3001) | 1  # odd: never a tile multiple
        pad = rng.choice([0, 0, 1, rng.randrange(1, 200)])
        cases.append(dict(m=m + pad, k=rng.choice(dims), n=rng.choice(dims), e=e,
                          routing=rng.choice(testing.ROUTINGS), pad=pad,
                          layout=("kn", "nk")[(i // len(experts)) % 2],
                          bias=(i // (2 * len(experts))) % 2 == 1, seed=i))
    return cases


CASES = _make_cases()


def _case_id(c):
    return (f"m{c['m']}-k{c['k']}-n{c['n']}-E{c['e']}-{c['routing']}-pad{c['pad']}-"
            f"{c['layout']}{'-bias' if c['bias'] else ''}")


def _problem(c, requires_grad=True):
    g = torch.Generator().manual_seed(c["seed"])
    p = testing.random_problem(c["m"], c["k"], c["n"], c["e"], c["routing"], pad=c["pad"],
                               layout=c["layout"], bias=c["bias"], device="cuda", generator=g,
                               requires_grad=requires_grad)
    dy = torch.randn(c["m"], c["n"], generator=g).to(device="cuda", dtype=BF16)
    return p, dy


def _poison(*shapes):
    """Fill freed allocator blocks of these shapes with NaN, so that an output that
    reuses one and leaves elements unwritten shows them."""
    blocks = [torch.full(s, float("nan"), dtype=BF16, device="cuda") for s in shapes]
    del blocks


def _forward_backward(p, dy):
    _poison(dy.shape, p.x.shape)
    y = cute_moe.grouped_mm(p.x, p.w, p.offs, p.bias)
    leaves = [p.x, p.weight] + ([p.bias] if p.bias is not None else [])
    grads = torch.autograd.grad(y, leaves, dy)
    return (y, *grads) if p.bias is not None else (y, *grads, None)


def _references(p, dy):
    y = grouped_mm_ref(p.x, p.w, p.offs, p.bias, out_dtype=F32)
    dx = grouped_mm_ref(dy, p.w.transpose(-2, -1), p.offs, out_dtype=F32)
    dw = grouped_mm_wgrad_ref(p.x, dy, p.offs, out_dtype=F32)
    if p.layout == "nk":
        dw = dw.transpose(-2, -1)
    db = grouped_bias_grad_ref(dy, p.offs) if p.bias is not None else None
    return y, dx, dw, db


def _check(p, outs, refs):
    used = p.used_rows
    empty = torch.tensor(p.sizes, device="cuda") == 0
    for name, out, ref in zip(("y", "dx", "dw", "db"), outs, refs):
        if ref is None:
            continue
        assert not out.isnan().any(), f"{name} has NaNs"
        err = testing.rel_error(out, ref)
        assert err <= TOL, f"{name}: relative error {err:.3e} > {TOL:.0e}"
    y, dx, dw, db = outs
    assert torch.all(y[used:] == 0), "y: padding rows not zero"
    assert torch.all(dx[used:] == 0), "dx: padding rows not zero"
    assert torch.all(dw[empty] == 0), "dw: empty groups not exactly zero"
    if db is not None:
        assert torch.all(db[empty] == 0), "db: empty groups not exactly zero"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_forward_backward_matches_reference(case):
    p, dy = _problem(case)
    outs = _forward_backward(p, dy)
    assert outs[0].shape == (case["m"], case["n"]) and outs[0].dtype == BF16
    assert outs[2].stride() == p.weight.stride(), "dw does not have the weight's layout"
    with torch.no_grad():
        _check(p, outs, _references(p, dy))


@pytest.mark.parametrize("out_dtype", [BF16, F32])
@pytest.mark.parametrize("bias_grad", [False, True])
@pytest.mark.parametrize("case", CASES[:12], ids=_case_id)
def test_wgrad_op(case, out_dtype, bias_grad):
    p, dy = _problem(case, requires_grad=False)
    _poison((case["e"], case["k"], case["n"]))
    dw, db = torch.ops.cute_moe.grouped_mm_wgrad(p.x, dy, p.offs, out_dtype, bias_grad)
    assert dw.dtype == out_dtype and dw.shape == (case["e"], case["k"], case["n"])
    assert dw.is_contiguous() and not dw.isnan().any()
    err = testing.rel_error(dw, grouped_mm_wgrad_ref(p.x, dy, p.offs, out_dtype=F32))
    # An fp32 dw must not have been rounded to bf16 on the way (that alone gives ~2e-3).
    limit = 1e-4 if out_dtype == F32 else TOL
    assert err <= limit, f"dw: relative error {err:.3e} > {limit:.0e}"
    empty = torch.tensor(p.sizes, device="cuda") == 0
    assert torch.all(dw[empty] == 0)
    if bias_grad:
        assert db.shape == (case["e"], case["n"]) and db.dtype == F32
        testing.assert_rel_close(db, grouped_bias_grad_ref(dy, p.offs), "db", BF16)
        assert torch.all(db[empty] == 0)
    else:
        assert db.shape == (0,) and db.dtype == F32


# Every group empty: with rows (all padding) the GEMM runs every tile with no k-blocks and
# stores zeros; with none a memset writes them (no GEMM).
@pytest.mark.parametrize("out_dtype", [BF16, F32])
@pytest.mark.parametrize("m", [0, 37])
@pytest.mark.parametrize("e", [3, 1024, 1500])
def test_wgrad_op_with_every_group_empty(e, m, out_dtype):
    k, n = 136, 200
    x = torch.randn(m, k, device="cuda").to(BF16)
    dy = torch.randn(m, n, device="cuda").to(BF16)
    offs = torch.zeros(e, dtype=torch.int32, device="cuda")
    _poison((e, k, n * (2 if out_dtype == F32 else 1)))
    dw, db = torch.ops.cute_moe.grouped_mm_wgrad(x, dy, offs, out_dtype, True)
    assert dw.shape == (e, k, n) and dw.dtype == out_dtype
    assert torch.all(dw == 0), "dw: empty groups not exactly zero"
    assert torch.all(db == 0), "db: empty groups not exactly zero"


@pytest.mark.parametrize("case", [c for c in CASES if c["e"] in (7, 1024)][:4], ids=_case_id)
def test_deterministic(case):
    p, dy = _problem(case)
    first = _forward_backward(p, dy)
    second = _forward_backward(p, dy)
    for name, a, b in zip(("y", "dx", "dw", "db"), first, second):
        assert a is None or torch.equal(a, b), f"{name} differs between two runs"
    w32 = [torch.ops.cute_moe.grouped_mm_wgrad(p.x, dy, p.offs, F32, True) for _ in range(2)]
    assert torch.equal(w32[0][0], w32[1][0]) and torch.equal(w32[0][1], w32[1][1])


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_no_host_sync(layout):
    c = dict(CASES[3], layout=layout, bias=True)
    p, dy = _problem(c)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = _forward_backward(p, dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    with torch.no_grad():
        _check(p, outs, _references(p, dy))


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_cuda_graph_replay_with_new_routing(layout):
    m, k, n, e = 1531, 136, 200, 16
    c = dict(m=m, k=k, n=n, e=e, routing="balanced", pad=11, layout=layout, bias=True, seed=9)
    p, dy = _problem(c)
    graph, outs = testing.capture_graph(lambda: _forward_backward(p, dy))

    g = torch.Generator().manual_seed(10)
    for routing, pad in (("skewed", 0), ("empty", 40), ("single", 300), ("balanced", m)):
        p.sizes = testing.group_sizes(m - pad, e, routing, generator=g)
        with torch.no_grad():
            p.offs.copy_(offsets_from_counts(p.sizes, device="cuda"))
            p.x.copy_(torch.randn(m, k, generator=g).to(BF16))
            dy.copy_(torch.randn(m, n, generator=g).to(BF16))
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            _check(p, outs, _references(p, dy))


@pytest.mark.parametrize("offs", ["[10, 5, 64]", "[10, 20, 65]", "[-4, 20, 30]"],
                         ids=["decreasing", "past-m", "negative"])
def test_invalid_offs_stop_the_kernel_with_a_message(offs):
    # A device-side check cannot raise like a host check: it prints and traps, which
    # poisons the CUDA context, so it runs in a child process.
    out = testing.device_trap_output(f"""
        x = torch.randn(64, 16, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(3, 16, 8, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor({offs}, device="cuda", dtype=torch.int32)
    """, "cute_moe.grouped_mm(x, w, offs)")
    assert "invalid offs at group" in out, out


# The weight gradients hand out their tiles from an atomic counter (the dynamic schedule,
# the default) or by the static stride (CUTE_MOE_SCHEDULE=s). Either way each tile is the
# same computation, so the two must agree bit for bit, on every compiled ragged-K kernel
# (clusters of 2 pass tickets between their CTAs) and with far more tiles than CTAs (so
# tickets are drawn, not just the first wave); each against the fp32 reference as well.
RAGGED_K_ROWS = [tuple(row.split(":")[::2]) for row in torch.ops.cute_moe.kernel_table()
                 if row.startswith("ragged_k")] if cute_moe.library_loaded() else []


@pytest.mark.parametrize("routing", ["balanced", "skewed", "empty"])
@pytest.mark.parametrize("call,config", RAGGED_K_ROWS, ids=["-".join(r) for r in RAGGED_K_ROWS])
def test_wgrad_dynamic_and_static_schedules_agree(monkeypatch, call, config, routing):
    out_dtype = {"ragged_k_bf16": BF16, "ragged_k_f32": F32}[call]
    case = dict(m=6001, k=520, n=776, e=64, routing=routing, pad=3, layout="kn", bias=False,
                seed=77)
    p, dy = _problem(case, requires_grad=False)
    monkeypatch.setenv("CUTE_MOE_CONFIG", config)
    out = {}
    for schedule, lookahead in (("s", "0"), ("d", "0"), ("d", "0"), ("d", "1"), ("d", "8")):
        monkeypatch.setenv("CUTE_MOE_SCHEDULE", schedule)
        monkeypatch.setenv("CUTE_MOE_SCHEDULE_LOOKAHEAD", lookahead)
        _poison((case["e"], case["k"], case["n"]))
        dw, _ = torch.ops.cute_moe.grouped_mm_wgrad(p.x, dy, p.offs, out_dtype, False)
        if schedule in out:
            assert torch.equal(dw, out[schedule]), \
                f"the dynamic schedule (lookahead {lookahead}) differs from the first dynamic run"
        out[schedule] = dw
    assert torch.equal(out["s"], out["d"]), "dynamic and static schedules differ"
    err = testing.rel_error(out["d"], grouped_mm_wgrad_ref(p.x, dy, p.offs, out_dtype=F32))
    limit = 1e-4 if out_dtype == F32 else TOL
    assert err <= limit, f"dw: relative error {err:.3e}"
    empty = torch.tensor(p.sizes, device="cuda") == 0
    assert torch.all(out["d"][empty] == 0)


# Under skew the last tiles of a ragged-K launch are the shortest, and a cluster's two CTAs
# end close together: a store into the leader's shared memory after it exited once failed
# the launch now and then ("unspecified launch failure"). Repeated, synchronized launches
# of the dynamic schedule on every ragged-K kernel, each bit-equal to the first.
@pytest.mark.parametrize("call,config", RAGGED_K_ROWS, ids=["-".join(r) for r in RAGGED_K_ROWS])
def test_wgrad_dynamic_schedule_repeated_under_skew(monkeypatch, call, config):
    out_dtype = {"ragged_k_bf16": BF16, "ragged_k_f32": F32}[call]
    case = dict(m=6001, k=520, n=776, e=64, routing="skewed", pad=3, layout="kn", bias=False,
                seed=78)
    p, dy = _problem(case, requires_grad=False)
    monkeypatch.setenv("CUTE_MOE_CONFIG", config)
    monkeypatch.setenv("CUTE_MOE_SCHEDULE", "d")
    first = None
    for rep in range(20):
        monkeypatch.setenv("CUTE_MOE_SCHEDULE_LOOKAHEAD", ("0", "1", "8")[rep % 3])
        dw, _ = torch.ops.cute_moe.grouped_mm_wgrad(p.x, dy, p.offs, out_dtype, False)
        torch.cuda.synchronize()
        if first is None:
            first = dw
        assert torch.equal(dw, first), f"repeat {rep} differs from the first"


# The weight gradients walk the groups deepest first (ragged_k_order.h: the setup kernel
# ranks them); above 1024 groups they walk them in their own order, empty ones included
# (whose tiles store nothing). Both schedules must still give the reference, and exact
# zeros for the empty groups, with the outputs poisoned first.
@pytest.mark.parametrize("schedule", ["s", "d"])
@pytest.mark.parametrize("groups", [1024, 1100])
def test_wgrad_at_and_beyond_the_ranked_group_count(monkeypatch, schedule, groups):
    case = dict(m=9000, k=136, n=200, e=groups, routing="skewed", pad=5, layout="kn", bias=False,
                seed=groups)
    p, dy = _problem(case, requires_grad=False)
    sizes = torch.tensor(p.sizes, device="cuda")
    assert (sizes == 0).any() and (sizes > 64).any(), "the case should hold empty and multi-block groups"
    monkeypatch.setenv("CUTE_MOE_SCHEDULE", schedule)
    _poison((groups, case["k"], case["n"]))
    dw, _ = torch.ops.cute_moe.grouped_mm_wgrad(p.x, dy, p.offs, BF16, False)
    err = testing.rel_error(dw, grouped_mm_wgrad_ref(p.x, dy, p.offs, out_dtype=F32))
    assert err <= TOL, f"dw: relative error {err:.3e}"
    assert torch.all(dw[sizes == 0] == 0)


@pytest.mark.parametrize("name,value,message", [("CUTE_MOE_SCHEDULE", "x", "schedule must be 'd' or 's'"),
                                                ("CUTE_MOE_SCHEDULE_LOOKAHEAD", "9", "lookahead must be 1 to 8")])
def test_schedule_options_are_checked(monkeypatch, name, value, message):
    p, dy = _problem(CASES[0], requires_grad=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.cute_moe.grouped_mm_wgrad(p.x, dy, p.offs, F32, False)


@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("k1, k2, e, routing", [
    (128, 128, 8, "skewed"),    # the halves of an up projection: I = 128
    (768, 768, 16, "empty"),    # Qwen3-30B-A3B's I
    (128, 264, 3, "single"),    # more rows in the second tensor, a partial last k-tile
    (256, 72, 1, "balanced"),   # fewer, partial
    (200, 200, 5, "skewed"),    # not a multiple of 128: joined first (a copy)
])
def test_split_weight_gives_the_joined_bits(layout, k1, k2, e, routing):
    """grouped_mm(x, w, offs, bias, w_hi): W's rows from two tensors (the second descriptor
    past k1), bit for bit the GEMM over the joined tensor: the same tiles reach the MMA.
    The second tensor lies below the first too (any order serves)."""
    g = torch.Generator().manual_seed(k1 + k2 + e)
    m, n = 1500, 136
    sizes = testing.group_sizes(m - 17, e, routing, generator=g)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32).cuda()
    x = torch.randn(m, k1 + k2, generator=g).to(BF16).cuda()
    bias = torch.randn(e, n, generator=g).to(BF16).cuda()

    def weight(k):
        w = torch.randn(e, k, n, generator=g).mul(0.1).to(BF16).cuda()
        return w if layout == "kn" else w.transpose(-2, -1).contiguous().transpose(-2, -1)

    w_hi, w_lo = weight(k2), weight(k1)  # w_hi allocated first: below w_lo, likely
    joined = torch.cat([w_lo, w_hi], dim=1)
    joined = joined if layout == "kn" else joined.transpose(-2, -1).contiguous().transpose(-2, -1)
    want = torch.ops.cute_moe.grouped_mm(x, joined, offs, bias)
    for _ in range(2):  # y reuses poison's block: every element is written
        poison = torch.full((m, n), float("nan"), dtype=BF16, device="cuda")
        del poison
        got = torch.ops.cute_moe.grouped_mm(x, w_lo, offs, bias, w_hi)
        assert torch.equal(got, want)
    testing.assert_rel_close(got, grouped_mm_ref(x, joined, offs, bias, out_dtype=F32), "y")

# cute_moe.fp8.reuse_weight_casts: the FP8 block's weight casts made once and reused across the
# micro-batches of one optimizer step. On the CPU (the references) and on an SM90 GPU (the
# kernels): the same bits as casting every time over micro-batches with fresh data, gradients
# accumulated in .grad; the number of cast passes; a weight changed in place inside the context
# cast again (a stale copy would give other numbers); what it holds, and nothing after it closes;
# weights made afresh by every forward (an fp32 master cast to bf16) leave no entries behind;
# forward-only calls cast one copy; optimizer steps (SGD, AdamW foreach and fused) inside the
# context; torch.compile'd code and CUDA graph captures cast as without the context.
import gc

import pytest
import torch

import cute_moe
from cute_moe import fp8

from fp8_ffn_cases import BF16, make_leaves, run_fp8

_SM90 = (torch.cuda.is_available() and cute_moe.library_loaded()
         and torch.cuda.get_device_capability() == (9, 0))
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _SM90, reason="the FP8 kernels need an SM90 GPU and the op library"))]

COUNTS, HIDDEN, INTER = [37, 0, 150, 61], 144, 160
ACT = "swiglu_oai"


def _block(device, seed=0):
    leaves, offs = make_leaves(COUNTS, HIDDEN, INTER, ACT, bias=True, prob=True, pad=3,
                               device=device, seed=seed)
    return leaves, offs


def _micro_batches(leaves, n, seed):
    """n fresh (x, prob, dy) triples shaped as the block's."""
    g = torch.Generator().manual_seed(seed)
    x, dev = leaves["x"], leaves["x"].device
    return [(torch.randn(x.shape, generator=g).to(dev, BF16).requires_grad_(),
             torch.rand(x.shape[0], generator=g).to(dev).requires_grad_(),
             torch.randn(x.shape, generator=g).to(dev, BF16)) for _ in range(n)]


def _step(leaves, offs, batches, between=None):
    """Forward + backward of each micro-batch, the parameters' gradients accumulated in .grad;
    between(i) runs after micro-batch i. Returns the outputs, the inputs' gradients and the
    parameters' accumulated gradients."""
    params = {k: v for k, v in leaves.items() if k not in ("x", "prob")}
    for p in params.values():
        p.grad = None
    outs, input_grads = [], []
    for i, (x, prob, dy) in enumerate(batches):
        out = run_fp8(dict(params, x=x, prob=prob), offs, ACT)
        out.backward(dy)
        outs.append(out.detach())
        input_grads += [x.grad, prob.grad]
        x.grad = prob.grad = None
        if between is not None:
            between(i)
    return outs, input_grads, {k: p.grad.clone() for k, p in params.items()}


def _same(a, b):
    outs_a, in_a, par_a = a
    outs_b, in_b, par_b = b
    assert all(torch.equal(u, v) for u, v in zip(outs_a, outs_b))
    assert all(torch.equal(u, v) for u, v in zip(in_a, in_b))
    assert par_a.keys() == par_b.keys()
    for k in par_a:
        assert torch.equal(par_a[k], par_b[k]), k


@pytest.mark.parametrize("device", DEVICES)
def test_same_bits_one_cast_per_weight(device):
    leaves, offs = _block(device, seed=1)
    batches = _micro_batches(leaves, 3, seed=2)
    want = _step(leaves, offs, batches)
    with fp8.reuse_weight_casts() as casts:
        got = _step(leaves, offs, batches)
        # each weight: one pass (both copies) in the first forward; its backward and the two
        # later micro-batches' forwards and backwards reuse them
        assert (casts.casts, casts.reuses) == (2, 2 * (1 + 2 * 2))
        e, up = len(COUNTS), 2 * INTER
        fp8_bytes = 2 * e * HIDDEN * up + 2 * e * INTER * HIDDEN  # two e4m3 copies of each
        assert casts.held_bytes() >= fp8_bytes
    _same(got, want)
    assert casts.held_bytes() == 0 and not casts._entries


@pytest.mark.parametrize("device", DEVICES)
def test_weight_changed_in_place_is_cast_again(device):
    """An optimizer-like in-place update after the first micro-batch: the later micro-batches
    must see the new weights (the same bits as without the context)."""
    leaves, offs = _block(device, seed=3)
    batches = _micro_batches(leaves, 2, seed=4)
    start = {k: v.detach().clone() for k, v in leaves.items()}
    g = torch.Generator().manual_seed(5)
    deltas = {k: (torch.randn(leaves[k].shape, generator=g) * 0.05).to(leaves[k].device, BF16)
              for k in ("w_up", "w_down")}

    def update(i):
        if i == 0:
            with torch.no_grad():
                for k, d in deltas.items():
                    leaves[k].add_(d)

    want = _step(leaves, offs, batches, update)
    with torch.no_grad():
        for k, v in start.items():
            leaves[k].copy_(v)
    with fp8.reuse_weight_casts() as casts:
        got = _step(leaves, offs, batches, update)
        assert casts.casts == 4  # both weights again after the update
    _same(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_weights_made_per_forward_leave_nothing(device):
    """Weights that are new tensors at every forward (fp32 masters cast to bf16, as
    nn.GroupedExperts does for another dtype): one pass per weight and micro-batch, and the
    entries go with the tensors."""
    leaves, offs = _block(device, seed=6)
    masters = {k: leaves[k].detach().float().requires_grad_() for k in ("w_up", "w_down")}
    batches = _micro_batches(leaves, 2, seed=7)
    with fp8.reuse_weight_casts() as casts:
        for x, prob, dy in batches:
            kw = dict(leaves, x=x, prob=prob, **{k: m.to(BF16) for k, m in masters.items()})
            run_fp8(kw, offs, ACT).backward(dy)
            del kw
        gc.collect()
        assert casts.casts == 4 and casts.reuses == 4  # each backward reuses its forward's pass
        assert not casts._entries and casts.held_bytes() == 0
    assert all(m.grad is not None for m in masters.values())


@pytest.mark.parametrize("device", DEVICES)
def test_forward_only_casts_one_copy(device):
    leaves, offs = _block(device, seed=8)
    with fp8.reuse_weight_casts() as casts:
        with torch.no_grad():
            want = run_fp8(leaves, offs, ACT)
            again = run_fp8(leaves, offs, ACT)
        assert (casts.casts, casts.reuses) == (2, 2)
        e, up = len(COUNTS), 2 * INTER
        assert casts.held_bytes() >= e * HIDDEN * up + e * INTER * HIDDEN
        forward_only = casts.held_bytes()
    assert torch.equal(want, again)
    with torch.no_grad():
        assert torch.equal(run_fp8(leaves, offs, ACT), want)
    with fp8.reuse_weight_casts() as training:  # both copies: the as-is ones on top
        run_fp8(leaves, offs, ACT)
        as_is = e * HIDDEN * up + e * INTER * HIDDEN
        assert training.held_bytes() >= forward_only + as_is


@pytest.mark.parametrize("device", DEVICES[1:])  # the CPU references do not trace
def test_torch_compile_casts_as_without(device):
    """Traced code keeps no Python state between calls: inside the context a compiled block
    casts as without it, the same bits as eager, and the context records nothing."""
    leaves, offs = _block(device, seed=9)
    (x, prob, dy), = _micro_batches(leaves, 1, seed=10)
    names = [k for k in leaves if k not in ("x", "prob")]

    def run(**kw):
        return run_fp8(kw, offs, ACT)

    want_out = run(**dict(leaves, x=x, prob=prob))
    want = torch.autograd.grad(want_out, [leaves[n] for n in names], dy)
    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    with fp8.reuse_weight_casts() as casts:
        out = compiled(**dict(leaves, x=x, prob=prob))
        grads = torch.autograd.grad(out, [leaves[n] for n in names], dy)
        assert (casts.casts, casts.reuses) == (0, 0)
    assert torch.equal(out, want_out)
    for name, got, ref in zip(names, grads, want):
        assert torch.equal(got, ref), name


def test_nested_contexts_and_exit():
    leaves, offs = _block("cpu", seed=11)
    with fp8.reuse_weight_casts() as outer:
        with fp8.reuse_weight_casts() as inner:
            with torch.no_grad():
                run_fp8(leaves, offs, ACT)
        assert inner.casts == 2 and outer.casts == 0 and inner.held_bytes() == 0
        with torch.no_grad():
            run_fp8(leaves, offs, ACT)
        assert outer.casts == 2
    from cute_moe import fp8_weight_casts
    assert fp8_weight_casts._ACTIVE == []


@pytest.mark.parametrize("optimizer", ["sgd", "adamw_foreach", "adamw_fused"])
def test_optimizer_steps_inside_the_context_are_seen(optimizer):
    """A context left open across optimizer steps casts again after each (a global step hook:
    fused AdamW does not move the weights' version counters): the same training as
    without it."""
    if optimizer == "adamw_fused" and not hasattr(torch, "_fused_adamw_"):
        pytest.skip("no fused AdamW in this torch")
    leaves, offs = _block("cpu", seed=12)
    params = [leaves[k] for k in leaves if k not in ("x", "prob")]
    start = [p.detach().clone() for p in params]
    batches = _micro_batches(leaves, 3, seed=13)

    def train(context):
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        make = {"sgd": lambda: torch.optim.SGD(params, lr=0.1),
                "adamw_foreach": lambda: torch.optim.AdamW(params, lr=1e-2, foreach=True),
                "adamw_fused": lambda: torch.optim.AdamW(params, lr=1e-2, fused=True)}[optimizer]
        opt = make()
        outs = []
        with context:
            for x, prob, dy in batches:
                opt.zero_grad(set_to_none=True)
                out = run_fp8(dict(leaves, x=x, prob=prob), offs, ACT)
                out.backward(dy)
                opt.step()
                outs.append(out.detach())
        return outs, [p.detach().clone() for p in params]

    import contextlib
    want = train(contextlib.nullcontext())
    casts = fp8.reuse_weight_casts()
    got = train(casts)
    assert casts.casts == 2 * len(batches)  # every step changed both weights
    assert all(torch.equal(a, b) for a, b in zip(got[0], want[0]))
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


@pytest.mark.parametrize("device", DEVICES[1:])  # CUDA graphs
def test_cuda_graph_capture_casts_as_without(device):
    """A forward + backward captured inside the context records its own casts (a graph that
    read cached copies would replay them after the weights changed): replayed after an
    in-place weight update it gives the eager result of the new weights."""
    leaves, offs = _block(device, seed=14)
    (x, prob, dy), = _micro_batches(leaves, 1, seed=15)
    names = [k for k in leaves if k not in ("x", "prob")]
    static = dict(leaves, x=x.detach().clone().requires_grad_(), prob=prob.detach().clone())

    def run():
        out = run_fp8(static, offs, ACT)
        return (out, *torch.autograd.grad(out, [static[n] for n in names], dy))

    with fp8.reuse_weight_casts() as casts:
        run()  # fills the cache outside the capture
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            run()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = run()
        reused_before = casts.reuses
        with torch.no_grad():
            for n in ("w_up", "w_down"):
                leaves[n].mul_(1.5)
        graph.replay()
        torch.cuda.synchronize()
        assert casts.reuses == reused_before  # replays do not go through the cache
    want = run()
    for a, b in zip(captured, want):
        assert torch.equal(a, b)

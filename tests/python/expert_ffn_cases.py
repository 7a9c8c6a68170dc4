# Random expert blocks for every activation / bias / probability / scale combination,
# shared by the CPU and GPU tests of cute_moe.expert_ffn.
from __future__ import annotations

import torch

from cute_moe import reference as ref, testing

BF16 = torch.bfloat16
ACTIVATIONS = tuple(ref.ACTIVATIONS)  # the names, in the table's order


def make_block(m, hidden, inter, experts, activation, *, bias, prob, scale, routing="skewed",
               layout="kn", device="cpu", seed=0, padding=0, boundary=False):
    """Leaves (dict, requires_grad) and offs of a random block. `boundary` pushes the
    up-projection's outputs onto the activation's kinks (the clamp limits, 0)."""
    g = torch.Generator().manual_seed(seed)
    gated = activation in ref.GATED_ACTIVATIONS
    up = 2 * inter if gated else inter
    sizes = testing.group_sizes(m, experts, routing, generator=g)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)

    def randn(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(BF16)

    def weight(k, n):
        w = randn(experts, k, n, s=3.0 * k ** -0.5)
        return w if layout == "kn" else w.transpose(-2, -1).contiguous()

    leaves = dict(x=randn(m + padding, hidden), w_up=weight(hidden, up),
                  w_down=weight(inter, hidden))
    if boundary:  # a bias that lands many pre-activations exactly on the kinks
        kinks = torch.tensor([7.0, -7.0, 0.0, 6.9921875, 7.0078125])
        leaves["b_up"] = kinks[torch.randint(len(kinks), (experts, up), generator=g)].to(BF16)
        leaves["x"] = (leaves["x"].float() * 1e-3).to(BF16)  # keep x @ W tiny next to them
    elif bias:
        leaves["b_up"] = randn(experts, up, s=0.5)
    if bias:
        leaves["b_down"] = randn(experts, hidden, s=0.5)
    if prob:
        leaves["prob"] = torch.rand(m + padding, generator=g)
    if scale:
        leaves["scale_up"] = torch.rand(experts, generator=g) + 0.5
        leaves["scale_down"] = torch.rand(experts, generator=g) + 0.5
    leaves = {k: v.to(device).requires_grad_() for k, v in leaves.items()}
    return leaves, offs.to(device)


def operands(leaves, layout):
    """The (E, K, N) operands: the leaves, or transposed views of them (layout "nk")."""
    w = {k: (v if layout == "kn" else v.transpose(-2, -1)) for k, v in leaves.items()
         if k.startswith("w_")}
    return w["w_up"], w["w_down"]


def run_ours(leaves, offs, activation, layout="kn"):
    import cute_moe
    w_up, w_down = operands(leaves, layout)
    return cute_moe.expert_ffn(leaves["x"], w_up, w_down, offs, leaves.get("b_up"),
                               leaves.get("b_down"), activation=activation,
                               prob=leaves.get("prob"), scale_up=leaves.get("scale_up"),
                               scale_down=leaves.get("scale_down"))


def run_ref(leaves, offs, activation, layout="kn", compute_dtype=torch.float32):
    w_up, w_down = operands(leaves, layout)
    return ref.expert_ffn_ref(leaves["x"], w_up, leaves.get("b_up"), w_down, leaves.get("b_down"),
                              offs, 1.702, ref.default_limit(activation), compute_dtype,
                              activation=activation, prob=leaves.get("prob"),
                              scale_up=leaves.get("scale_up"), scale_down=leaves.get("scale_down"))


def check_block(leaves, offs, activation, layout="kn", tol=1e-2):
    """Output and every gradient of expert_ffn against the fp32 reference."""
    out = run_ours(leaves, offs, activation, layout)
    expect = run_ref(leaves, offs, activation, layout)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, BF16)
    names = list(leaves)
    grads = torch.autograd.grad(out, [leaves[k] for k in names], dy)
    want = torch.autograd.grad(expect, [leaves[k] for k in names], dy.float())
    errors = {"out": testing.rel_error(out, expect)}
    errors.update({f"d{k}": testing.rel_error(a, b) for k, a, b in zip(names, grads, want)})
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"{activation}: relative errors above {tol}: {bad}"
    return errors


def check_halves_block(leaves, offs, activation, up_storage, down_storage, tol=1e-2):
    """expert_ffn with gate_linear="halves" on the [gate | linear] copies of the block's
    (interleaved, "kn") w_up and b_up, against the fp32 reference of the interleaved block:
    the same function, so the output must match and every gradient must be the reference's,
    the up projection's mapped into halves. up_storage / down_storage: "kn" passes the
    (E, H, 2I) / (E, I, H) tensors, "nk" transposed views of (E, 2I, H) / (E, H, I) ones
    (HF transformers' Qwen3-MoE / Mixtral storage)."""
    import cute_moe
    from cute_moe.repack import interleaved_to_halves

    def stored(w, storage):
        w = w.detach()
        w = w if storage == "kn" else w.transpose(-2, -1).contiguous()
        return w.requires_grad_()

    def view(w, storage):
        return w if storage == "kn" else w.transpose(-2, -1)

    halves = dict(leaves)
    halves["w_up"] = stored(interleaved_to_halves(leaves["w_up"].detach(), -1), up_storage)
    halves["w_down"] = stored(leaves["w_down"], down_storage)
    if "b_up" in leaves:
        halves["b_up"] = interleaved_to_halves(leaves["b_up"].detach(), -1).requires_grad_()
    out = cute_moe.expert_ffn(leaves["x"], view(halves["w_up"], up_storage),
                              view(halves["w_down"], down_storage), offs, halves.get("b_up"),
                              leaves.get("b_down"), activation=activation,
                              prob=leaves.get("prob"), scale_up=leaves.get("scale_up"),
                              scale_down=leaves.get("scale_down"), gate_linear="halves")
    expect = run_ref(leaves, offs, activation)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out.device, BF16)
    names = list(leaves)
    grads = dict(zip(names, torch.autograd.grad(out, [halves[k] for k in names], dy)))
    want = dict(zip(names, torch.autograd.grad(expect, [leaves[k] for k in names], dy.float())))
    want["w_up"] = interleaved_to_halves(want["w_up"], -1)
    grads["w_up"] = view(grads["w_up"], up_storage)
    if "b_up" in want:
        want["b_up"] = interleaved_to_halves(want["b_up"], -1)
    grads["w_down"] = view(grads["w_down"], down_storage)
    errors = {"out": testing.rel_error(out, expect)}
    errors.update({f"d{k}": testing.rel_error(grads[k], want[k]) for k in names})
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"{activation} halves ({up_storage}, {down_storage}): relative errors " \
                    f"above {tol}: {bad}"
    return errors


def check_combine(leaves, offs, activation, top_k=4, tol=1e-5, precision="bf16"):
    """expert_ffn(..., combine=(row_token, token_rows)) against unpermute(expert_ffn(...)):
    the same output bits, and the same gradients of every leaf (prob's to float32
    rounding: its bias term is summed in another order); in `precision`."""
    import cute_moe
    from cute_moe.permute import unpermute
    m = leaves["x"].shape[0]
    g = torch.Generator().manual_seed(3)
    token_rows = torch.randperm(m, generator=g).view(m // top_k, top_k).to(torch.int32)
    row_token = torch.empty(m, dtype=torch.int32)
    tokens = torch.arange(m // top_k, dtype=torch.int32).repeat_interleave(top_k)
    row_token[token_rows.reshape(-1).long()] = tokens
    dev = leaves["x"].device
    token_rows, row_token = token_rows.to(dev), row_token.to(dev)
    kw = dict(activation=activation, prob=leaves.get("prob"), scale_up=leaves.get("scale_up"),
              scale_down=leaves.get("scale_down"), precision=precision)
    args = (leaves["x"], leaves["w_up"], leaves["w_down"], offs, leaves.get("b_up"),
            leaves.get("b_down"))
    fused = cute_moe.expert_ffn(*args, combine=(row_token, token_rows), **kw)
    apart = unpermute(cute_moe.expert_ffn(*args, **kw), token_rows, row_token)
    assert fused.shape == (m // top_k, leaves["x"].shape[1]) and torch.equal(fused, apart)
    dout = torch.randn(fused.shape, generator=g).to(dev, BF16)
    names = list(leaves)
    ga = torch.autograd.grad(fused, [leaves[k] for k in names], dout)
    gb = torch.autograd.grad(apart, [leaves[k] for k in names], dout)
    errors = {f"d{k}": testing.rel_error(a, b) for k, a, b in zip(names, ga, gb)}
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"{activation}: combine vs unpermute after: {bad}"


def check_gather(leaves, offs, activation, top_k=4, precision="bf16", combine=False):
    """expert_ffn(tokens, ..., gather=(row_token, token_rows)) against expert_ffn on
    permute(tokens) (the rows gathered first), with the layer's combine too when `combine`:
    the same output bits and the same gradient bits of the tokens, the weights, the biases
    and prob; in `precision`."""
    import cute_moe
    from cute_moe.permute import permute
    m, hidden = leaves["x"].shape
    g = torch.Generator().manual_seed(5)
    token_rows = torch.randperm(m, generator=g).view(m // top_k, top_k).to(torch.int32)
    row_token = torch.empty(m, dtype=torch.int32)
    row_token[token_rows.reshape(-1).long()] = torch.arange(
        m // top_k, dtype=torch.int32).repeat_interleave(top_k)
    dev = leaves["x"].device
    token_rows, row_token = token_rows.to(dev), row_token.to(dev)
    tokens = torch.randn(m // top_k, hidden, generator=g).to(dev, BF16).requires_grad_()
    kw = dict(activation=activation, prob=leaves.get("prob"), precision=precision)
    if combine:
        kw["combine"] = (row_token, token_rows)
    rest = (leaves["w_up"], leaves["w_down"], offs, leaves.get("b_up"), leaves.get("b_down"))
    fused = cute_moe.expert_ffn(tokens, *rest, gather=(row_token, token_rows), **kw)
    apart = cute_moe.expert_ffn(permute(tokens, row_token, token_rows), *rest, **kw)
    assert torch.equal(fused, apart)
    dout = torch.randn(fused.shape, generator=g).to(dev, BF16)
    names = [k for k in ("w_up", "w_down", "b_up", "b_down", "prob") if leaves.get(k) is not None]
    inputs = [tokens] + [leaves[k] for k in names]
    ga = torch.autograd.grad(fused, inputs, dout)
    gb = torch.autograd.grad(apart, inputs, dout)
    for name, a, b in zip(["tokens"] + names, ga, gb):
        assert torch.equal(a, b), f"{activation}: gather vs permute first: d{name}"


def check_halves_pair(leaves, offs, activation, placement):
    """expert_ffn with w_up as the pair (w_gate, w_linear) of (E, H, I) tensors (the halves
    apart, torchtitan's w1^T and w3^T) against expert_ffn on the one [gate | linear] tensor
    they make (the transposed view of an (E, 2I, H) tensor): the output and every gradient,
    bit for bit (the same tiles reach the same kernels: the pair is read in place by the
    forward, the input gradient and the weight gradients).
    placement: where w_linear's storage lies: "above" w_gate's (the forward's B load spans
    both), "apart" (above, one tensor between), "below" (the forward's B load spans both
    from w_linear and swaps each pair back in its epilogue; with a bias it joins them
    instead; the backward reads them in place), "separate" (two allocations in any order).
    The block takes no scale_up (a pair with one is joined)."""
    import cute_moe
    from cute_moe.repack import interleaved_to_halves
    halves = interleaved_to_halves(leaves["w_up"].detach(), -1)  # (E, H, 2I) [gate | linear]
    inter = halves.shape[2] // 2
    w1 = halves[..., :inter].transpose(-2, -1).contiguous()  # (E, I, H), torchtitan's w1
    w3 = halves[..., inter:].transpose(-2, -1).contiguous()
    if placement == "separate":
        params = [w1.clone().requires_grad_(), w3.clone().requires_grad_()]
        pair = [params[0].transpose(-2, -1), params[1].transpose(-2, -1)]
    else:
        order = {"above": (w1, w3), "apart": (w1, torch.zeros_like(w1), w3), "below": (w3, w1)}
        buf = torch.stack(order[placement]).requires_grad_()
        gate, linear = {"above": (0, 1), "apart": (0, 2), "below": (1, 0)}[placement]
        params = [buf]
        pair = [buf[gate].transpose(-2, -1), buf[linear].transpose(-2, -1)]
    joined = torch.cat([w1, w3], dim=1).requires_grad_()  # (E, 2I, H)
    b_up = leaves.get("b_up")
    b_up = interleaved_to_halves(b_up.detach(), -1).requires_grad_() if b_up is not None else None
    kw = dict(activation=activation, prob=leaves.get("prob"), scale_down=leaves.get("scale_down"),
              gate_linear="halves")
    out = cute_moe.expert_ffn(leaves["x"], tuple(pair), leaves["w_down"], offs, b_up,
                              leaves.get("b_down"), **kw)
    others = [t for t in (leaves["x"], leaves["w_down"], b_up, leaves.get("b_down"),
                          leaves.get("prob"), leaves.get("scale_down")) if t is not None]
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out.device, BF16)
    got = torch.autograd.grad(out, params + others, dy)
    if placement == "separate":
        got_w1, got_w3 = got[0], got[1]
    else:
        got_w1, got_w3 = got[0][gate], got[0][linear]
        if placement == "apart":  # the tensor between the two is not read
            assert torch.all(got[0][1] == 0)
    got = got[len(params):]
    want_out = cute_moe.expert_ffn(leaves["x"], joined.transpose(-2, -1), leaves["w_down"], offs,
                                   b_up, leaves.get("b_down"), **kw)
    want = torch.autograd.grad(want_out, [joined] + others, dy)
    want_w1, want_w3 = want[0][:, :inter], want[0][:, inter:]
    pairs = {"out": (out, want_out), "dw1": (got_w1, want_w1), "dw3": (got_w3, want_w3)}
    pairs.update({f"d{i}": (a, b) for i, (a, b) in enumerate(zip(got, want[1:]))})
    for name, (a, b) in pairs.items():
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape)
        assert torch.equal(a, b), f"{placement}: {name} differs from the joined tensor's"

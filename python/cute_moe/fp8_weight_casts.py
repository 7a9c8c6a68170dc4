"""The FP8 expert block's weight casts, made once per optimizer step instead of once per
micro-batch (cute_moe.fp8.reuse_weight_casts).

Without it each forward casts each weight to e4m3 for its GEMM (the transposed copy) and each
backward casts it again (the as-is copy for the input gradient): four casts per layer per
micro-batch, at the copy rate (1.6 ms a GPT-OSS-20B layer, 1.2 ms a Qwen3-30B-A3B layer on an
H100, where the FP8 GEMMs save 0.9 ms). Within one optimizer step the weights do not change, so
with gradient accumulation every micro-batch after the first can reuse the first one's casts,
as TransformerEngine's first-micro-batch cache does. The price is memory: both e4m3 copies of
every FP8 layer's weights stay allocated while the context is open (about the bf16 weights'
bytes), where without it no FP8 copy outlives its GEMM.

Entries are keyed by the weight's storage (the base tensor of a view, its data pointer, shape,
strides and dtype) and hold a weak reference to that base tensor and its version counter. What
makes the context cast again: any torch.optim optimizer's step (a global step hook drops every
entry: fused AdamW updates the weights without moving their version counters), a weight changed
in place otherwise (its version counter moves) or replaced by another tensor at the same
address. An entry goes away with its tensor (a weight made afresh by every forward, such as an
fp32 master cast to bf16, is cast once per micro-batch, both copies in one pass).
torch.compile'd code and CUDA graph captures cast as without the context (what they record is
replayed later: it must not read copies that go stale).
"""
from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from .fp8 import quantize_128x128

__all__ = ["reuse_weight_casts", "forward_operand", "backward_operand"]

_ACTIVE: list["reuse_weight_casts"] = []  # the open contexts, innermost last


def _operand(q: torch.Tensor, scale: torch.Tensor):
    """An FP8 GEMM's weight operand from one copy of a cast: q (E, n, k) as the k-contiguous
    (E, k, n) view, its scales as (E, ceil(k / 128), ceil(n / 128)). From the transposed copy:
    W (x @ W); from the as-is copy: W^T (dy @ W^T)."""
    return q.transpose(-2, -1), scale.transpose(-2, -1)


class _Entry:
    __slots__ = ("base", "version", "forward", "backward")

    def __init__(self, base: weakref.ref, version: int):
        self.base, self.version = base, version
        self.forward = self.backward = None  # the transposed / as-is copy's operand


class reuse_weight_casts:
    """Context manager: inside it, cute_moe.fp8.expert_ffn (and nn.MoE / the HF integration in
    precision "fp8") casts each expert weight to e4m3 once and reuses the copies while the
    weight is unchanged. Open it once per optimizer step, around the micro-batches' forwards
    and backwards, with the optimizer step outside:

        for batch in loader:
            with cute_moe.fp8.reuse_weight_casts():
                for micro in batch.split(micro_batch_size):
                    model(micro).loss.backward()
            optimizer.step(); optimizer.zero_grad()

    The first micro-batch's forward casts both copies of each weight in one pass (the backward's
    as-is copy too), later micro-batches cast nothing. The same bits as without the context.
    Holds both e4m3 copies of every FP8 weight (plus their fp32 scales) until it closes:
    `held_bytes()` says how much. A torch.optim optimizer step inside the context drops them
    all (the next forward casts again), as does an in-place change of one weight for that
    weight (its version counter). What it cannot see is a weight's storage rewritten behind
    both (a custom kernel writing into it, a non-torch.optim optimizer): hence once per step.
    `casts` counts the cast passes made, `reuses` the operands served from earlier passes."""

    def __init__(self):
        self._entries: dict[tuple, _Entry] = {}
        self._hook = None
        self.casts = 0
        self.reuses = 0

    def __enter__(self):
        _ACTIVE.append(self)
        self._hook = register_optimizer_step_post_hook(self._stepped)
        return self

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        self._hook.remove()
        self._entries.clear()
        return False

    def _stepped(self, optimizer, args, kwargs):
        self._entries.clear()  # the weights may have changed (fused steps leave no version bump)

    def held_bytes(self) -> int:
        """Bytes of the e4m3 copies and scales this context holds now."""
        total = 0
        for entry in self._entries.values():
            for operand in (entry.forward, entry.backward):
                if operand is not None:
                    total += sum(t.untyped_storage().nbytes() for t in operand)
        return total

    def _entry(self, w: torch.Tensor) -> _Entry:
        base = w._base if w._base is not None else w
        key = (id(base), w.device, w.data_ptr(), tuple(w.shape), w.stride(), w.dtype)
        entry = self._entries.get(key)
        if entry is None or entry.base() is not base or entry.version != w._version:
            entries = self._entries
            entry = _Entry(weakref.ref(base, lambda _, k=key: entries.pop(k, None)), w._version)
            entries[key] = entry
        return entry

    def forward_operand(self, w: torch.Tensor, backward_too: bool):
        entry = self._entry(w)
        if entry.forward is not None:
            self.reuses += 1
            return entry.forward
        both = backward_too and entry.backward is None
        q, scale, q_t, scale_t = quantize_128x128(w, as_is=both, transposed=True)
        self.casts += 1
        entry.forward = _operand(q_t, scale_t)
        if both:
            entry.backward = _operand(q, scale)
        return entry.forward

    def backward_operand(self, w: torch.Tensor):
        entry = self._entry(w)
        if entry.backward is not None:
            self.reuses += 1
            return entry.backward
        q, scale, _, _ = quantize_128x128(w, as_is=True, transposed=False)
        self.casts += 1
        entry.backward = _operand(q, scale)
        return entry.backward


def _capturing() -> bool:
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _active():
    # traced or captured code keeps no Python state between calls (a CUDA graph replays the
    # casts it captured; one that read cached copies would replay them after they went stale)
    if torch.compiler.is_compiling() or not _ACTIVE or _capturing():
        return None
    return _ACTIVE[-1]


def forward_operand(w: torch.Tensor, backward_too: bool = False):
    """The forward GEMM's operand of w (E, k, n): its transposed copy (E, n, k) in e4m3, from
    the open reuse_weight_casts context when there is one (which with backward_too also keeps
    the as-is copy from the same pass for the backward), else cast now."""
    casts = _active()
    if casts is not None:
        return casts.forward_operand(w, backward_too)
    _, _, q_t, scale_t = quantize_128x128(w, as_is=False, transposed=True)
    return _operand(q_t, scale_t)


def backward_operand(w: torch.Tensor):
    """The input gradient's operand of w: its as-is copy, from the open context or cast now."""
    casts = _active()
    if casts is not None:
        return casts.backward_operand(w)
    q, scale, _, _ = quantize_128x128(w, as_is=True, transposed=False)
    return _operand(q, scale)

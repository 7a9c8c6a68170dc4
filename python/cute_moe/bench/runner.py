# Measurement of one MoE layer config for `python -m cute_moe.bench`: cute_moe.nn.MoE
# against the torchtitan-style ReferenceMoE (torch._grouped_mm, unfused elementwise and
# index_add combine) holding the very same parameter tensors, on the same inputs in the
# same process. Forward and backward are timed separately with CUDA events.
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ..nn import MoE
from ..reference.moe import ReferenceMoE
from ..testing import rel_error
from .configs import BenchConfig

__all__ = ["AGREE_TOL", "CHECKED_GRADS", "time_ms", "run_config"]

# The baseline rounds to bf16 more often (after each GEMM, the bias, inside the
# activation, the prob scaling and the index_add), so the two differ by more than either
# does from an fp32 ground truth (the GPU tests check that, at 1e-2).
AGREE_TOL = 2e-2
# Gradients held to AGREE_TOL under --check; the others (router, biases) are reported:
# the baseline sums bias gradients through a bf16 row-gather backward (errors of several %
# at thousands of rows per expert) and the router gradient through those.
CHECKED_GRADS = ("x", "experts.gate_up_proj", "experts.down_proj")

Progress = Callable[[str], None]


class _Clock:
    """Start/stop marks: CUDA events on the current stream (the GPU time between them),
    or wall-clock time on the CPU (--cpu-smoke only)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks = []

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append([ev, None])
        else:
            self.marks.append([time.perf_counter(), None])

    def stop(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks[-1][1] = ev
        else:
            self.marks[-1][1] = time.perf_counter()

    def times_ms(self, skip: int) -> list:
        if self.cuda:
            torch.cuda.synchronize()
            return [s.elapsed_time(e) for s, e in self.marks[skip:]]
        return [(e - s) * 1e3 for s, e in self.marks[skip:]]

    def quartiles_ms(self, skip: int) -> tuple:
        """(median, 25th, 75th percentile); a single time is all three."""
        times = self.times_ms(skip)
        if len(times) < 2:
            return times[0], times[0], times[0]
        q1, q2, q3 = statistics.quantiles(times, n=4, method="inclusive")
        return q2, q1, q3


def time_ms(fn, reps: int, warmup: int, cuda: bool = True) -> float:
    """Median time of fn() over `reps` calls after `warmup` untimed ones."""
    return alternating_ms({"fn": call_step(fn)}, reps, warmup, cuda)["fn"][0]


def backward_ms(forward, backward, reps: int, warmup: int, cuda: bool = True) -> float:
    """Median time of backward(out) alone, each after an untimed out = forward(): the
    events bracket only the backward's kernels."""
    return alternating_ms({"bwd": backward_step(forward, backward)}, reps, warmup, cuda)["bwd"][0]


def alternating_ms(steps: dict, reps: int, warmup: int, cuda: bool = True) -> dict:
    """{side: (median, 25th, 75th percentile) ms} of each side's timed call, the sides
    taking turns call by call (the order flipped every call), `warmup` untimed turns first.
    A side is a step(clock) that brackets its call with clock.start() / clock.stop() (see
    call_step, backward_step). Taking turns per call gives every side the same clocks: an
    H100 at its power limit slows down within tens of milliseconds of GEMMs, by how much
    depending on what ran, so sides timed in separate runs of calls (even alternating
    runs) see different clocks."""
    clocks = {name: _Clock(cuda) for name in steps}
    names = list(steps)
    for i in range(warmup + reps):
        for name in (names if i % 2 == 0 else names[::-1]):
            steps[name](clocks[name])
    return {name: clock.quartiles_ms(warmup) for name, clock in clocks.items()}


def call_step(fn):
    """A step of alternating_ms timing fn()."""
    def step(clock):
        clock.start()
        fn()
        clock.stop()
    return step


def backward_step(forward, backward):
    """A step of alternating_ms timing backward(out) alone after an untimed out = forward()."""
    def step(clock):
        out = forward()
        clock.start()
        backward(out)
        clock.stop()
        del out
    return step


def peak_bytes(fn, cuda: bool) -> int | None:
    """Peak allocated memory above what was allocated before, during one fn()."""
    if not cuda:
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def build(cfg: BenchConfig, device, seed: int, cpu_smoke: bool = False,
          fuse_gather: bool | None = None):
    """(ours, baseline, x, dy): the two layers share every parameter tensor."""
    torch.manual_seed(seed)
    bf16 = torch.bfloat16
    ours = MoE(**cfg.moe_kwargs(), fuse_gather=fuse_gather, dtype=bf16, device=device).train()
    # on the CPU torch._grouped_mm has no backward for empty groups: the loop instead
    base = ReferenceMoE.like(ours, impl="loop" if cpu_smoke else "grouped_mm").train()
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    x = torch.randn(cfg.tokens, cfg.hidden, device=device, generator=gen).to(bf16)
    dy = torch.randn(cfg.tokens, cfg.hidden, device=device, generator=gen).to(bf16)
    return ours, base, x.requires_grad_(), dy


def _measure(block, x, inputs, dy, reps, warmup, cuda, say: Progress, label: str) -> dict:
    def forward():
        return block(x)

    def backward(out):
        return torch.autograd.grad(out, inputs, dy)

    say(f"{label}: forward")
    fwd = time_ms(forward, reps, warmup, cuda)
    say(f"{label}: backward")
    bwd = backward_ms(forward, backward, reps, warmup, cuda)
    say(f"{label}: peak memory")
    peak = peak_bytes(lambda: backward(forward()), cuda)
    return dict(fwd_ms=fwd, bwd_ms=bwd, fwd_bwd_ms=fwd + bwd, peak_bytes=peak)


def run_config(cfg: BenchConfig, *, reps: int, warmup: int, seed: int, check: bool,
               say: Progress, device="cuda", cpu_smoke: bool = False,
               fuse_gather: bool | None = None) -> dict:
    """One table row: times, TFLOP/s and peak memory of both layers, and how far apart
    their outputs (and with check, gradients) are."""
    cuda = not cpu_smoke
    ours, base, x, dy = build(cfg, device, seed, cpu_smoke, fuse_gather)
    names = ["x"] + [n for n, _ in ours.named_parameters()]
    inputs = [x] + [p for _, p in ours.named_parameters()]
    assert {id(p) for p in base.parameters()} <= {id(p) for p in inputs}, "weights not shared"

    say("checking that both layers agree")
    diff = {}
    out_ours, out_base = ours(x), base(x)
    diff["out"] = rel_error(out_ours, out_base)
    if check:
        g_ours = torch.autograd.grad(out_ours, inputs, dy)
        g_base = torch.autograd.grad(out_base, inputs, dy)
        for n, a, b in zip(names, g_ours, g_base):
            diff[f"d{n}"] = rel_error(a, b)
        del g_ours, g_base
    del out_ours, out_base

    res = {"ours": _measure(ours, x, inputs, dy, reps, warmup, cuda, say, "cute-moe"),
           "torch": _measure(base, x, inputs, dy, reps, warmup, cuda, say, "torchtitan-style")}
    fwd_flops, bwd_flops = cfg.flops()
    row = dict(config=cfg.to_dict(), rows=cfg.rows, fwd_flops=fwd_flops, bwd_flops=bwd_flops,
               rel_diff=diff)
    for impl, r in res.items():
        for k, v in r.items():
            row[f"{impl}_{k}"] = v
        row[f"{impl}_fwd_tflops"] = fwd_flops / r["fwd_ms"] / 1e9
        row[f"{impl}_bwd_tflops"] = bwd_flops / r["bwd_ms"] / 1e9
    for k in ("fwd_ms", "bwd_ms", "fwd_bwd_ms"):
        row[f"speedup_{k[:-3]}"] = row[f"torch_{k}"] / row[f"ours_{k}"]
    row["mismatch"] = {k: v for k, v in diff.items()
                       if (k == "out" or k[1:] in CHECKED_GRADS) and not v <= AGREE_TOL}
    del ours, base, x, dy
    if cuda:
        torch.cuda.empty_cache()
    return row

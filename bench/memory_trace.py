#!/usr/bin/env python3
# The MoE layer's peak memory in one forward + backward, and what is live at the peak, without a
# GPU: the layer runs on meta tensors (shapes, no data), its ops through their fake kernels (the
# allocations the CUDA ops make), and a dispatch mode counts the bytes of every storage an op
# creates until the storage is freed. What it measures is the sum of live tensors, as
# torch.cuda.max_memory_allocated does less the allocator's rounding (GPT-OSS-20B: 4.321 GiB
# here, 4.32 on an H100). Used to find where a precision's peak is (docs/perf-notes.md,
# session 27); the GPU measures it in bench_fp8_layer.py and python -m cute_moe.bench. Also
# the bytes live after the forward (the output and what autograd saved for the backward):
# what each layer of a deep model holds until its backward, which a one-layer peak hides.
#
# The package picks the op path over its PyTorch references where a tensor is on CUDA; here
# torch.Tensor.is_cuda reads meta tensors as CUDA ones (inside meta_as_cuda() only), so the fake
# kernels run where the GPU would run the ops. Needs the op library (the fake kernels).
#
#   python bench/memory_trace.py [--config gpt-oss-20b] [--precisions bf16,fp8] [--tokens T]
#                                [--top 12] [--fuse-gather default|on|off]
#                                [--fp8-weight-grads default|on|off]
from __future__ import annotations

import argparse
import contextlib
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common import import_cute_moe


class LiveBytes(TorchDispatchMode):
    """The bytes of the storages that ops create inside the mode and that are still alive; the
    peak, and the live set (bytes, op, shape, dtype) at the peak. Views and in-place results
    (storages an op's inputs already had) are not new; tensors made outside the mode (the
    parameters, the inputs) are not counted."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[int, str]] = {}
        self.now = self.peak = 0
        self.held = 0  # set by the caller: the live bytes between the forward and the backward
        self.at_peak: list[tuple[int, str]] = []

    def _freed(self, key: int) -> None:
        nbytes, _ = self.live.pop(key)
        self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage()._cdata for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}
        for t in torch.utils._pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in inputs or key in self.live:
                continue
            self.live[key] = (storage.nbytes(), f"{func}  {tuple(t.shape)} {t.dtype}")
            self.now += storage.nbytes()
            weakref.finalize(storage, self._freed, key)
            if self.now > self.peak:
                self.peak = self.now
                self.at_peak = sorted(self.live.values(), key=lambda v: -v[0])
        return out


@contextlib.contextmanager
def meta_as_cuda():
    """torch.Tensor.is_cuda true for meta tensors too, inside the block only."""
    saved = torch.Tensor.__dict__.get("is_cuda")
    torch.Tensor.is_cuda = property(lambda self: self.device.type in ("cuda", "meta"))
    try:
        yield
    finally:
        if saved is None:
            del torch.Tensor.is_cuda
        else:
            torch.Tensor.is_cuda = saved


def layer_peaks(cfg, precisions, fuse_gather: bool | None = None) -> dict[str, LiveBytes]:
    """{precision: the LiveBytes of one forward + backward} of cute_moe.nn.MoE at cfg (a
    cute_moe.bench BenchConfig; MoE's fuse_gather, None: its default per precision), bf16
    weights, on meta tensors; the op library must be loaded."""
    from cute_moe.nn import MoE
    bf16 = torch.bfloat16
    layer = MoE(**cfg.moe_kwargs(), fuse_gather=fuse_gather, dtype=bf16, device="meta").train()
    x = torch.empty(cfg.tokens, cfg.hidden, device="meta", dtype=bf16, requires_grad=True)
    dy = torch.empty(cfg.tokens, cfg.hidden, device="meta", dtype=bf16)
    inputs = [x] + list(layer.parameters())
    peaks = {}
    with meta_as_cuda():
        for precision in precisions:
            layer.experts.precision = precision
            peaks[precision] = LiveBytes()
            with peaks[precision]:
                out = layer(x)
                # what a model of many layers holds per layer until its backward: the
                # output and the tensors saved for the backward
                peaks[precision].held = peaks[precision].now
                torch.autograd.grad(out, inputs, dy)
                del out
    return peaks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the MoE layer's peak memory on meta tensors")
    ap.add_argument("--config", default="gpt-oss-20b")
    ap.add_argument("--precisions", default="bf16,fp8")
    ap.add_argument("--tokens", type=int, default=None, help="override the config's T")
    ap.add_argument("--top", type=int, default=12, help="live tensors listed at the peak")
    ap.add_argument("--fuse-gather", choices=("default", "on", "off"), default="default",
                    help="MoE's fuse_gather: None (on for fp8, off for bf16), True or False")
    ap.add_argument("--fp8-weight-grads", choices=("default", "on", "off"), default="default",
                    help="fp8's weight gradients on the FP8 ragged-K GEMM (fp8_ffn.FP8_WEIGHT_GRADS): "
                         "by shape (fp8_ffn.fp8_weight_grads_for), always or never")
    args = ap.parse_args(argv)
    import_cute_moe()
    from cute_moe import fp8_ffn
    fp8_ffn.FP8_WEIGHT_GRADS = {"default": None, "on": True, "off": False}[args.fp8_weight_grads]
    from cute_moe.bench.configs import CONFIGS
    cfg = CONFIGS[args.config]
    if args.tokens is not None:
        cfg = cfg.with_(tokens=args.tokens)
    fuse_gather = {"default": None, "on": True, "off": False}[args.fuse_gather]
    for precision, mode in layer_peaks(cfg, args.precisions.split(","), fuse_gather).items():
        print(f"{cfg.name} T={cfg.tokens} {precision} fuse_gather {args.fuse_gather}: peak "
              f"{mode.peak / 2 ** 30:.3f} GiB ({mode.peak} bytes), held from the forward to the "
              f"backward {mode.held / 2 ** 30:.3f} GiB; live at the peak:")
        for nbytes, what in mode.at_peak[:args.top]:
            print(f"  {nbytes / 2 ** 30:7.3f} GiB  {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

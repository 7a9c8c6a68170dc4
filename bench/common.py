# Helpers shared by the benchmark scripts. The timing, error, memory, commit and JSON
# helpers are the package's own (cute_moe.bench, cute_moe.testing), so these scripts and
# `python -m cute_moe.bench` measure and record the same way; cute_moe comes from the
# installed package or, failing that, this checkout's python/.
from __future__ import annotations

import datetime
import os
import sys

import torch

try:
    import cute_moe  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from cute_moe.bench.report import align_columns, git_commit, write_json  # noqa: E402,F401
from cute_moe.bench.runner import peak_bytes, time_ms  # noqa: E402,F401
from cute_moe.testing import rel_error  # noqa: E402,F401


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def import_cute_moe():
    """cute_moe with its op library loaded (a clear error otherwise)."""
    import cute_moe
    from cute_moe._library import require_library
    require_library("the benchmark")
    return cute_moe


def print_columns(lines, left: int) -> None:
    """Prints rows of cells as aligned columns, the first `left` of them left-aligned."""
    for line in align_columns(lines, left):
        print(line)


def run_meta(**extra) -> dict:
    """The record of a run for the JSON file: device, versions, date, commit and command,
    plus the script's own settings."""
    import cute_moe
    return dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                cute_moe=cute_moe.__version__, cuda=torch.version.cuda,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                git_commit=git_commit(), command=" ".join([sys.executable] + sys.argv), **extra)


class ZeroCost(torch.autograd.Function):
    """Experts that cost nothing, for a benchmark's bound: apply(x, *tensors) -> zeros like
    x; zero gradients for x and every tensor (a memset each: what any implementation at
    least writes). A step with these is the floor under every experts implementation."""

    @staticmethod
    def forward(ctx, x, *tensors):
        ctx.like = [(t.shape, t.dtype, t.device) for t in (x,) + tensors]  # not the tensors: no memory held
        return torch.zeros_like(x)

    @staticmethod
    def backward(ctx, grad):
        return tuple(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.like)

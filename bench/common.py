# Helpers shared by the benchmark scripts: CUDA-event timing, relative error, the commit
# a result was measured at, number formatting.
from __future__ import annotations

import os
import subprocess
import sys

import torch


def time_ms(fn, reps: int, warmup: int) -> float:
    """Median of `reps` CUDA-event timings of fn() after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in events)
    return times[len(times) // 2]


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (||out|| when ref is zero)."""
    ref64 = ref.double()
    den = ref64.norm().item()
    return (out.double() - ref64).norm().item() / den if den > 0 else out.double().norm().item()


def git_commit() -> str | None:
    """CUTE_MOE_GIT_COMMIT (set where the checkout has no .git, e.g. the GPU machine), else
    the checkout's HEAD, else None."""
    if os.environ.get("CUTE_MOE_GIT_COMMIT"):
        return os.environ["CUTE_MOE_GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=os.path.dirname(os.path.abspath(__file__))
                              ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def import_cute_moe():
    """cute_moe, installed or from this checkout's python/, with its op library loaded
    (a clear error otherwise)."""
    try:
        import cute_moe
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import cute_moe
    from cute_moe._library import require_library
    require_library("the benchmark")
    return cute_moe

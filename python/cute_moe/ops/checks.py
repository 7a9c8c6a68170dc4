"""The argument checks every op shares, and the checked-offsets debugging mode."""
# Shared by the public functions, the fake (shape) kernels and the CPU kernels so that
# every path rejects the same inputs with the same message. Shapes, dtypes, strides and
# devices only: tensor values are read by the checked-offsets mode alone.
from __future__ import annotations

import os

import torch

__all__ = ["fail", "check_tensor", "check_contiguous", "unit_columns", "check_same_device",
           "check_offs_length", "check_scales", "CHECK_OFFS_ENV", "set_offs_check", "offs_check_enabled",
           "check_offs_values"]


def fail(op: str, name: str, expected: str, got) -> None:
    """Raises the package's argument error: `cute_moe.<op>: <name>: expected ..., got ...`."""
    raise ValueError(f"cute_moe.{op}: {name}: expected {expected}, got {got}")


def check_tensor(op: str, name: str, t, ndim: int, dtype: torch.dtype) -> None:
    if not isinstance(t, torch.Tensor):
        fail(op, name, "a tensor", type(t).__name__)
    if t.dim() != ndim:
        fail(op, name, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")
    if t.dtype != dtype:
        fail(op, name, f"dtype {dtype}", t.dtype)


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        fail(op, name, "a contiguous tensor", f"strides {t.stride()} for shape {tuple(t.shape)}")


def unit_columns(t: torch.Tensor) -> bool:
    """Whether t's columns are adjacent in memory; an empty tensor has no layout (autograd
    hands e.g. expanded (0, N) gradients with strides (0, 0))."""
    return t.numel() == 0 or t.shape[1] <= 1 or t.stride(1) == 1


def check_same_device(op: str, ref_name: str, ref: torch.Tensor, **others) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            fail(op, name, f"a tensor on {ref_name}'s device {ref.device}", t.device)


def check_offs_length(op: str, offs, num_groups: int, what: str) -> None:
    """offs (num_groups,) int32; `what` says where num_groups comes from."""
    check_tensor(op, "offs", offs, 1, torch.int32)
    if offs.shape[0] != num_groups:
        fail(op, "offs", f"length {num_groups} ({what})", f"length {offs.shape[0]}")


def check_scales(op: str, name: str, t, length: int, what: str, ref_name: str,
                 ref: torch.Tensor, dtypes=(torch.float32,)) -> None:
    """An optional 1-D vector of `length` floats (a per-expert or per-row scale)."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        fail(op, name, "a tensor or None", type(t).__name__)
    if t.dim() != 1 or t.shape[0] != length:
        fail(op, name, f"shape ({length},) ({what})", f"shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        fail(op, name, " or ".join(str(d) for d in dtypes), t.dtype)
    check_same_device(op, ref_name, ref, **{name: t})


# --- checked offsets (a debugging mode) ----------------------------------------------
# offs is read on the device only: a non-monotone or out-of-range entry stops the kernel
# with a printed message and a trap, which leaves the CUDA context unusable for the rest
# of the process. For debugging, the checked mode reads offs on the host first (one
# synchronisation per call) and raises a ValueError naming the first bad entry instead.

CHECK_OFFS_ENV = "CUTE_MOE_CHECK_OFFS"
_check_offs: bool | None = None  # None: follow the environment variable


def set_offs_check(enabled: bool | None) -> None:
    """Turns the checked-offsets mode on (True) or off (False) for this process; None
    leaves it to the environment variable CUTE_MOE_CHECK_OFFS (on when set to anything
    but "" or "0"). In checked mode every public function that takes offs copies it to
    the host (a synchronisation: for debugging, not for training runs, and skipped while
    torch.compile traces) and raises ValueError at the first entry that is negative,
    below its predecessor or past the rows it indexes."""
    global _check_offs
    _check_offs = None if enabled is None else bool(enabled)


def offs_check_enabled() -> bool:
    if _check_offs is not None:
        return _check_offs
    return os.environ.get(CHECK_OFFS_ENV, "") not in ("", "0")


def check_offs_values(op: str, offs: torch.Tensor, m: int, m_name: str) -> None:
    """In checked mode: offs must be non-decreasing cumulative end offsets in [0, m]."""
    if torch.compiler.is_compiling() or not offs_check_enabled():
        return
    if isinstance(offs, torch._subclasses.fake_tensor.FakeTensor) or offs.device.type == "meta":
        return
    values = offs.detach().to("cpu", torch.int64).tolist()
    prev = 0
    for e, end in enumerate(values):
        if end < 0:
            why = "is negative"
        elif end < prev:
            why = f"is below offs[{e - 1}] = {prev} (offs must be non-decreasing)"
        elif end > m:
            why = f"is past the {m} rows of {m_name}"
        else:
            prev = end
            continue
        raise ValueError(f"cute_moe.{op}: offs[{e}] = {end} {why}; offs holds cumulative end "
                         f"offsets in [0, {m}] (checked mode, {CHECK_OFFS_ENV})")

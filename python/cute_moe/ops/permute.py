"""The row-gather ops of the dispatch and combine: gather_rows, gather_sum_rows, gather_rows_dot."""
# Their argument checks (mirroring the CUDA ops' so that every path rejects the same
# inputs), the checks of the public permute / unpermute built on them, and the ops' fake
# and CPU kernels (the references), registered on import when the op library is loaded.
# The ops have no autograd of their own: cute_moe/permute.py puts them together in
# autograd.Functions. Shapes, dtypes, strides and devices only: index values are never
# read here.
from __future__ import annotations

import torch

from .. import _library
from ..reference.permute import gather_rows_dot_ref, gather_rows_ref, gather_sum_rows_ref
from .checks import check_contiguous, check_same_device, check_tensor, fail
from .registry import register_kernels

__all__ = ["OPS", "check_gather_rows_args", "check_gather_sum_rows_args",
           "check_gather_rows_dot_args", "vector_rows_ok", "check_permute_args",
           "check_unpermute_args", "checked_combine", "check_row_length"]

OPS = ("gather_rows", "gather_sum_rows", "gather_rows_dot")


def _is_tensor(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"cute_moe.{op}: {name}: expected a tensor, got {type(t).__name__}")


def _index(op: str, name: str, t, ndim: int) -> None:
    _is_tensor(op, name, t)
    check_tensor(op, name, t, ndim, torch.int32)


def vector_rows_ok(t: torch.Tensor) -> bool:
    """Whether the kernels can read t's rows with 16-byte vectors as it is: unit column
    stride, row stride a multiple of 8 elements, start at a multiple of 8 elements."""
    if t.numel() == 0:
        return True
    return ((t.stride(1) == 1 or t.shape[1] == 1) and (t.shape[0] == 1 or t.stride(0) % 8 == 0)
            and t.storage_offset() % 8 == 0)


def _bf16_rows(op: str, name: str, t) -> None:
    """A bf16 (rows, H) operand of the kernels: H a multiple of 8, 16-byte vector rows."""
    _is_tensor(op, name, t)
    check_tensor(op, name, t, 2, torch.bfloat16)
    if t.shape[1] % 8:
        fail(op, name, "a multiple of 8 columns (rows of 16-byte vectors)",
             f"shape {tuple(t.shape)}")
    if not vector_rows_ok(t):
        fail(op, name, "unit column stride, a row stride and storage offset that are multiples "
             "of 8 (call .contiguous())",
             f"strides {t.stride()}, storage offset {t.storage_offset()}")


def _choices(op: str, index, weight, ref_name: str, ref: torch.Tensor) -> None:
    """index (T, k) int32 contiguous; weight None or fp32 of index's shape, contiguous."""
    _index(op, "index", index, 2)
    check_contiguous(op, "index", index)
    if weight is not None:
        _is_tensor(op, "weight", weight)
        check_tensor(op, "weight", weight, 2, torch.float32)
        if weight.shape != index.shape:
            fail(op, "weight", f"index's shape {tuple(index.shape)}",
                 f"shape {tuple(weight.shape)}")
        check_contiguous(op, "weight", weight)
    check_same_device(op, ref_name, ref, index=index, weight=weight)


def check_gather_rows_args(src, index, scale=None, op: str = "gather_rows") -> None:
    """src (N, H) bf16, H % 8 == 0; index (M,) int32; scale None or (M,) fp32; the small
    ones contiguous; one device."""
    _bf16_rows(op, "src", src)
    _index(op, "index", index, 1)
    check_contiguous(op, "index", index)
    if scale is not None:
        _is_tensor(op, "scale", scale)
        check_tensor(op, "scale", scale, 1, torch.float32)
        if scale.shape[0] != index.shape[0]:
            fail(op, "scale", f"length {index.shape[0]} (one entry per index)",
                 f"length {scale.shape[0]}")
        check_contiguous(op, "scale", scale)
    check_same_device(op, "src", src, index=index, scale=scale)


def check_gather_sum_rows_args(src, index, weight=None, op: str = "gather_sum_rows") -> None:
    """src (M, H) bf16, H % 8 == 0; index (T, k) int32; weight None or (T, k) fp32."""
    _bf16_rows(op, "src", src)
    _choices(op, index, weight, "src", src)


def check_gather_rows_dot_args(a, src, index, op: str = "gather_rows_dot") -> None:
    """a (T, H) and src (M, H) bf16, H % 8 == 0; index (T, k) int32."""
    _bf16_rows(op, "a", a)
    _bf16_rows(op, "src", src)
    if src.shape[1] != a.shape[1]:
        fail(op, "src", f"{a.shape[1]} columns (a.shape[1])", f"shape {tuple(src.shape)}")
    _choices(op, index, None, "a", a)
    if index.shape[0] != a.shape[0]:
        fail(op, "index", f"{a.shape[0]} rows (a.shape[0])", f"shape {tuple(index.shape)}")
    check_same_device(op, "a", a, src=src)


# --- public permute / unpermute --------------------------------------------------------

def _floating(op: str, name: str, t, ndim: int) -> None:
    _is_tensor(op, name, t)
    if t.dim() != ndim:
        fail(op, name, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")
    if not t.is_floating_point():
        fail(op, name, "a floating-point dtype", t.dtype)


def _routing(op: str, row_token, token_rows, tokens: int | None, rows: int | None) -> None:
    """row_token (M,) and token_rows (T, k) int32 with M = T*k; T and M as given."""
    _index(op, "row_token", row_token, 1)
    _index(op, "token_rows", token_rows, 2)
    t, k = token_rows.shape
    if tokens is not None and t != tokens:
        fail(op, "token_rows", f"{tokens} rows (one per token)",
             f"shape {tuple(token_rows.shape)}")
    if rows is not None and row_token.shape[0] != rows:
        fail(op, "row_token", f"length {rows} (one per routed row)",
             f"shape {tuple(row_token.shape)}")
    if row_token.shape[0] != t * k:
        fail(op, "row_token", f"length T*k = {t}*{k} = {t * k} (token_rows is (T, k) and the two "
             "are inverse permutations)", f"shape {tuple(row_token.shape)}")


def check_permute_args(x, row_token, token_rows, op: str = "permute") -> None:
    """x (T, H) floating; row_token (M,) and token_rows (T, k) int32, M = T*k; one device."""
    _floating(op, "x", x, 2)
    _routing(op, row_token, token_rows, x.shape[0], None)
    check_same_device(op, "x", x, row_token=row_token, token_rows=token_rows)


def check_unpermute_args(y, token_rows, row_token, weight=None, op: str = "unpermute") -> None:
    """y (M, H) floating; token_rows (T, k) and row_token (M,) int32, M = T*k; weight None
    or (T, k) floating; one device."""
    _floating(op, "y", y, 2)
    _routing(op, row_token, token_rows, None, y.shape[0])
    if weight is not None:
        _floating(op, "weight", weight, 2)
        if weight.shape != token_rows.shape:
            fail(op, "weight", f"token_rows' shape {tuple(token_rows.shape)} (T, k)",
                 f"shape {tuple(weight.shape)}")
    check_same_device(op, "y", y, token_rows=token_rows, row_token=row_token, weight=weight)


def checked_combine(op: str, combine, rows: int, hidden: int, x: torch.Tensor):
    """An expert block's combine (row_token (rows,), token_rows (T, k)) int32 on x's device,
    checked as unpermute checks its pair for a (rows, hidden) output, made contiguous; None
    stays None."""
    if combine is None:
        return None
    if not (isinstance(combine, (tuple, list)) and len(combine) == 2):
        raise ValueError(f"cute_moe.{op}: combine: expected (row_token, token_rows), got "
                         f"{combine!r:.80}")
    y_like = x.new_empty_strided((rows, hidden), (0, 1))  # a stand-in: one row of memory
    check_unpermute_args(y_like, combine[1], combine[0], op=op)
    return combine[0].contiguous(), combine[1].contiguous()


def checked_gather(op: str, gather, x: torch.Tensor):
    """An expert block's gather (rows (M,), token_rows (T, k) or None) over the tokens x (T, H):
    with token_rows, checked as permute checks its pair; without, rows a 1-D int32 tensor on x's
    device. Returns (rows, token_rows), made contiguous."""
    if not (isinstance(gather, (tuple, list)) and len(gather) == 2):
        raise ValueError(f"cute_moe.{op}: gather: expected (rows, token_rows), got {gather!r:.80}")
    rows, token_rows = gather
    if token_rows is not None:
        check_permute_args(x, rows, token_rows, op=op)
        token_rows = token_rows.contiguous()
    elif not (isinstance(rows, torch.Tensor) and rows.dim() == 1 and rows.dtype == torch.int32
              and rows.device == x.device):
        raise ValueError(f"cute_moe.{op}: gather: expected rows as a 1-D int32 tensor on x's "
                         f"device, got {rows!r:.80}")
    return rows.contiguous(), token_rows


def check_row_length(op: str, name: str, t: torch.Tensor) -> None:
    """H % 8 == 0, which the op library's kernels need (the references take any H)."""
    if t.shape[1] % 8:
        fail(op, name, "a multiple of 8 columns for the op library's bf16 kernels (float32 and "
             "float64 inputs run the PyTorch reference, which takes any width)",
             f"shape {tuple(t.shape)}")


# --- fake and CPU kernels (every argument given: see registry.py) ---------------------

def _fake_gather_rows(src, index, scale):
    check_gather_rows_args(src, index, scale)
    return src.new_empty(index.shape[0], src.shape[1])


def _cpu_gather_rows(src, index, scale):
    check_gather_rows_args(src, index, scale)
    return gather_rows_ref(src, index, scale)


def _fake_gather_sum_rows(src, index, weight):
    check_gather_sum_rows_args(src, index, weight)
    return src.new_empty(index.shape[0], src.shape[1])


def _cpu_gather_sum_rows(src, index, weight):
    check_gather_sum_rows_args(src, index, weight)
    return gather_sum_rows_ref(src, index, weight)


def _fake_gather_rows_dot(a, src, index):
    check_gather_rows_dot_args(a, src, index)
    return a.new_empty(index.shape[0], index.shape[1], dtype=torch.float32)


def _cpu_gather_rows_dot(a, src, index):
    check_gather_rows_dot_args(a, src, index)
    return gather_rows_dot_ref(a, src, index, torch.float32)


def _register() -> None:
    for name, fake, cpu in (("gather_rows", _fake_gather_rows, _cpu_gather_rows),
                            ("gather_sum_rows", _fake_gather_sum_rows, _cpu_gather_sum_rows),
                            ("gather_rows_dot", _fake_gather_rows_dot, _cpu_gather_rows_dot)):
        register_kernels(name, fake, cpu)


if _library.library_loaded():
    _register()

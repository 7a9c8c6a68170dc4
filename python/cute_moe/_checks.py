# Argument checks of the grouped GEMM ops, shared by the public functions, the fake
# (shape) kernels and the CPU kernels so that every path rejects the same inputs with
# the same message. Shapes, dtypes, strides and devices only: offs is never read here.
from __future__ import annotations

import os

import torch


def _fail(op: str, name: str, expected: str, got) -> None:
    raise ValueError(f"cute_moe.{op}: {name}: expected {expected}, got {got}")


def _tensor(op: str, name: str, t, ndim: int, dtype: torch.dtype) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(op, name, "a tensor", type(t).__name__)
    if t.dim() != ndim:
        _fail(op, name, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")
    if t.dtype != dtype:
        _fail(op, name, f"dtype {dtype}", t.dtype)


def _unit_columns(t: torch.Tensor) -> bool:
    """Whether t's columns are adjacent in memory; an empty tensor has no layout (autograd
    hands e.g. expanded (0, N) gradients with strides (0, 0))."""
    return t.numel() == 0 or t.shape[1] <= 1 or t.stride(1) == 1


def _same_device(op: str, ref_name: str, ref: torch.Tensor, **others) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            _fail(op, name, f"a tensor on {ref_name}'s device {ref.device}", t.device)


def _offs(op: str, offs, num_groups: int, what: str) -> None:
    _tensor(op, "offs", offs, 1, torch.int32)
    if offs.shape[0] != num_groups:
        _fail(op, "offs", f"length {num_groups} ({what})", f"length {offs.shape[0]}")


def check_grouped_mm_args(x, w, offs, bias=None, op: str = "grouped_mm",
                          names: dict[str, str] | None = None) -> None:
    """x (M, K) with unit column stride, w (E, K, N) with w.stride(2) == 1 or
    w.stride(1) == 1, offs (E,) int32, bias (E, N); all bf16 but offs, one device.
    `names` renames arguments in the messages (e.g. {"w": "W_up"})."""
    name = (names or {}).get
    nx, nw, nb = name("x", "x"), name("w", "w"), name("bias", "bias")
    _tensor(op, nx, x, 2, torch.bfloat16)
    _tensor(op, nw, w, 3, torch.bfloat16)
    num_groups, k, n = w.shape
    _offs(op, offs, num_groups, f"{nw}.shape[0], the number of groups")
    if x.shape[1] != k:
        _fail(op, nx, f"{k} columns ({nw}.shape[1])", f"shape {tuple(x.shape)}")
    if not _unit_columns(x):
        _fail(op, nx, "unit column stride (call .contiguous())", f"strides {x.stride()}")
    if w.stride(2) != 1 and w.stride(1) != 1:
        _fail(op, nw, f"{nw}.stride(2) == 1 (E, K, N) or {nw}.stride(1) == 1 (a transposed "
              "(E, N, K) tensor)", f"strides {w.stride()}")
    if bias is not None:
        _tensor(op, nb, bias, 2, torch.bfloat16)
        if tuple(bias.shape) != (num_groups, n):
            _fail(op, nb, f"shape {(num_groups, n)} (E, N)", f"shape {tuple(bias.shape)}")
    _same_device(op, nx, x, **{nw: w, "offs": offs, nb: bias})


def check_grouped_mm_wgrad_args(x, dy, offs, out_dtype=None,
                                op: str = "grouped_mm_wgrad") -> None:
    """x (M, K), dy (M, N) bf16, offs 1-D int32, out_dtype bf16, float32 or None."""
    _tensor(op, "x", x, 2, torch.bfloat16)
    _tensor(op, "dy", dy, 2, torch.bfloat16)
    if dy.shape[0] != x.shape[0]:
        _fail(op, "dy", f"{x.shape[0]} rows (x.shape[0])", f"shape {tuple(dy.shape)}")
    _tensor(op, "offs", offs, 1, torch.int32)
    if out_dtype not in (None, torch.bfloat16, torch.float32):
        _fail(op, "out_dtype", "torch.bfloat16 or torch.float32", out_dtype)
    _same_device(op, "x", x, dy=dy, offs=offs)


def check_grouped_column_sum_args(src, offs, row_scale=None,
                                  op: str = "grouped_column_sum") -> None:
    """src (M, N) bf16, offs 1-D int32 and row_scale (M,) float32 on src's device."""
    _tensor(op, "src", src, 2, torch.bfloat16)
    _tensor(op, "offs", offs, 1, torch.int32)
    _same_device(op, "src", src, offs=offs)
    check_scales(op, "row_scale", row_scale, src.shape[0], "one per row of src", "src", src)


def check_swiglu_params(alpha, limit, op: str, names: dict[str, str] | None = None) -> None:
    """alpha a real number, limit None or a real number >= 0."""
    name = (names or {}).get
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        _fail(op, name("alpha", "alpha"), "a float", type(alpha).__name__)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, float)):
            _fail(op, name("limit", "limit"), "None or a float", type(limit).__name__)
        if not limit >= 0:
            _fail(op, name("limit", "limit"), "None or a float >= 0", limit)


def check_grouped_mm_swiglu_args(x, w, offs, bias=None, alpha=1.702, limit=7.0,
                                 op: str = "grouped_mm_swiglu",
                                 names: dict[str, str] | None = None) -> None:
    """check_grouped_mm_args with an even output width 2I (interleaved gate/linear
    columns) and valid SwiGLU parameters."""
    check_grouped_mm_args(x, w, offs, bias, op, names)
    if w.shape[2] % 2:
        nw = (names or {}).get("w", "w")
        _fail(op, nw, f"an even {nw}.shape[2] (2I interleaved gate/linear columns)",
              f"shape {tuple(w.shape)}")
    check_swiglu_params(alpha, limit, op, names)


def check_pre_args(pre, m: int, inter: int, ref_name: str, ref: torch.Tensor, op: str,
                   name: str = "pre") -> None:
    """pre (m, 2 * inter) bf16 with unit column stride, on ref's device."""
    _tensor(op, name, pre, 2, torch.bfloat16)
    if tuple(pre.shape) != (m, 2 * inter):
        _fail(op, name, f"shape {(m, 2 * inter)} (M, 2I)", f"shape {tuple(pre.shape)}")
    if not _unit_columns(pre):
        _fail(op, name, "unit column stride (call .contiguous())", f"strides {pre.stride()}")
    _same_device(op, ref_name, ref, **{name: pre})


def check_grouped_mm_swiglu_bwd_args(dy, w, offs, pre, alpha=1.702, limit=7.0,
                                     op: str = "grouped_mm_swiglu_bwd") -> None:
    """dy (M, N) and w (E, N, I) as check_grouped_mm_args has them, pre (M, 2I)."""
    check_grouped_mm_args(dy, w, offs, None, op, {"x": "dy"})
    check_pre_args(pre, dy.shape[0], w.shape[2], "dy", dy, op)
    check_swiglu_params(alpha, limit, op)


def check_activation(activation, limit, op: str) -> None:
    """activation one of reference.ACTIVATIONS; srelu and none take no clamp limit."""
    from .reference import ACTIVATIONS, GATED_ACTIVATIONS
    if activation not in ACTIVATIONS:
        _fail(op, "activation", f"one of {ACTIVATIONS}", repr(activation))
    if limit is not None and activation not in GATED_ACTIVATIONS:
        _fail(op, "limit", f"None for {activation!r} (clamp limits apply to gated activations)",
              limit)


def check_scales(op: str, name: str, t, length: int, what: str, ref_name: str,
                 ref: torch.Tensor, dtypes=(torch.float32,)) -> None:
    """An optional 1-D vector of `length` floats (a per-expert or per-row scale)."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        _fail(op, name, "a tensor or None", type(t).__name__)
    if t.dim() != 1 or t.shape[0] != length:
        _fail(op, name, f"shape ({length},) ({what})", f"shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        _fail(op, name, " or ".join(str(d) for d in dtypes), t.dtype)
    _same_device(op, ref_name, ref, **{name: t})


def check_grouped_mm_scaled_args(x, w, offs, bias=None, scale=None, prob=None,
                                 op: str = "grouped_mm_scaled") -> None:
    check_grouped_mm_args(x, w, offs, bias, op)
    check_scales(op, "scale", scale, w.shape[0], "one per group", "x", x)
    check_scales(op, "prob", prob, x.shape[0], "one per row of x", "x", x)


def check_grouped_mm_act_args(x, w, offs, bias=None, scale=None, activation="swiglu_oai",
                              alpha=1.702, limit=None, op: str = "grouped_mm_act") -> None:
    from .reference import GATED_ACTIVATIONS
    check_activation(activation, limit, op)
    if activation == "none":
        _fail(op, "activation", "a fused activation (not 'none': use grouped_mm_scaled)",
              repr(activation))
    check_grouped_mm_args(x, w, offs, bias, op)
    if activation in GATED_ACTIVATIONS and w.shape[2] % 2:
        _fail(op, "w", "an even w.shape[2] (2I interleaved gate/linear columns)",
              f"shape {tuple(w.shape)}")
    check_scales(op, "scale", scale, w.shape[0], "one per group", "x", x)
    check_swiglu_params(alpha, limit, op)


def check_grouped_mm_act_gathered_args(x, rows, w, offs, bias=None, scale=None,
                                       activation="swiglu_oai", alpha=1.702, limit=None,
                                       op: str = "grouped_mm_act_gathered") -> None:
    """grouped_mm_act's rules for x (T, K) plus rows (M,) int32 on x's device and a weight
    contiguous along N (the gathered kernel loads B as (E, K, N) row-major)."""
    check_grouped_mm_act_args(x, w, offs, bias, scale, activation, alpha, limit, op)
    _tensor(op, "rows", rows, 1, torch.int32)
    _same_device(op, "x", x, rows=rows)
    if w.stride(2) != 1 and w.shape[2] > 1:
        _fail(op, "w", "w.stride(2) == 1 (an (E, K, N) row-major weight)", f"strides {w.stride()}")
    if rows.shape[0] > 0 and x.shape[0] == 0:
        _fail(op, "x", "at least one row to gather from", f"shape {tuple(x.shape)}")


def check_grouped_mm_act_bwd_args(dy, w, offs, pre, scale=None, prob=None, out_bias=None,
                                  prob_grad=False, activation="swiglu_oai", alpha=1.702,
                                  limit=None, op: str = "grouped_mm_act_bwd") -> None:
    from .reference import GATED_ACTIVATIONS
    check_activation(activation, limit, op)
    check_grouped_mm_args(dy, w, offs, None, op, {"x": "dy"})
    gated = activation in GATED_ACTIVATIONS
    width = 2 * w.shape[2] if gated else w.shape[2]
    _tensor(op, "pre", pre, 2, torch.bfloat16)
    if tuple(pre.shape) != (dy.shape[0], width):
        _fail(op, "pre", f"shape {(dy.shape[0], width)}", f"shape {tuple(pre.shape)}")
    if not _unit_columns(pre):
        _fail(op, "pre", "unit column stride (call .contiguous())", f"strides {pre.stride()}")
    _same_device(op, "dy", dy, pre=pre)
    check_scales(op, "scale", scale, w.shape[0], "one per group", "dy", dy)
    check_scales(op, "prob", prob, dy.shape[0], "one per row of dy", "dy", dy)
    if prob_grad and prob is None:
        _fail(op, "prob", "a tensor when prob_grad is set", None)
    if out_bias is not None:
        if not prob_grad:
            _fail(op, "out_bias", "None unless prob_grad (it is only read for dprob)", "a tensor")
        _tensor(op, "out_bias", out_bias, 2, torch.bfloat16)
        if tuple(out_bias.shape) != (w.shape[0], dy.shape[1]):
            _fail(op, "out_bias", f"shape {(w.shape[0], dy.shape[1])} (E, H)",
                  f"shape {tuple(out_bias.shape)}")
        _same_device(op, "dy", dy, out_bias=out_bias)
    check_swiglu_params(alpha, limit, op)


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

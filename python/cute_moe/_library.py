# Finds and loads the compiled op library (libcute_moe_torch.so), which registers the
# torch.ops.cute_moe namespace. Kept apart so the rest of the package can import, and
# fall back to the references, when the library has not been built. The library ships
# inside the package, so it is loaded with all its ops or not at all: one that lacks an
# op this package calls (a stale build) counts as not loaded.
from __future__ import annotations

import os
import warnings

import torch

__all__ = ["ENV_VAR", "OPS", "library_path", "library_loaded", "load_error", "require_library"]

ENV_VAR = "CUTE_MOE_LIBRARY"
_BUILD_HINT = "build it from the repository root with `pip install --no-build-isolation .`"
# Every op of the library that this package calls or registers kernels for.
OPS = ("grouped_mm", "grouped_mm_wgrad", "grouped_column_sum", "grouped_bias_grads",
       "grouped_mm_scaled",
       "grouped_mm_act", "grouped_mm_act_gathered", "grouped_mm_act_bwd", "grouped_mm_swiglu",
       "grouped_mm_swiglu_bwd", "gather_rows", "gather_sum_rows", "gather_rows_dot",
       "quantize_fp8_1x128", "quantize_fp8_128x128", "quantize_fp8_128x1",
       "quantize_fp8_1x128_128x1", "quantize_fp8_1x128_column_sums", "act_quantize_fp8_1x128",
       "grouped_mm_fp8", "grouped_mm_fp8_act", "grouped_mm_fp8_act_quant",
       "grouped_mm_fp8_act_bwd", "grouped_mm_fp8_wgrad", "top_k", "sort_by_expert")

_load_error: str | None = None


def library_path() -> str:
    """CUTE_MOE_LIBRARY if set, else lib/libcute_moe_torch.so inside this package."""
    env = os.environ.get(ENV_VAR)
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libcute_moe_torch.so")


def _missing_ops() -> list[str]:
    missing = []
    for name in OPS:
        try:
            getattr(torch.ops.cute_moe, name).default
        except (AttributeError, RuntimeError):
            missing.append(name)
    return missing


def _load() -> bool:
    """Loads the library unless it already is; whether all of OPS are registered."""
    global _load_error
    if not _missing_ops():
        return True
    path = library_path()
    if not os.path.isfile(path):
        source = f"{ENV_VAR}={path}" if os.environ.get(ENV_VAR) else path
        _load_error = f"the op library was not found at {source}"
        return False
    try:
        torch.ops.load_library(path)
    except (OSError, RuntimeError) as exc:
        _load_error = f"loading the op library {path} failed: {exc}"
        warnings.warn(f"cute_moe: {_load_error}; falling back to the PyTorch references",
                      stacklevel=3)
        return False
    missing = _missing_ops()
    if missing:
        _load_error = (f"{path} loaded but did not register the torch.ops.cute_moe ops "
                       f"{', '.join(missing)} (a stale build?)")
        warnings.warn(f"cute_moe: {_load_error}; falling back to the PyTorch references",
                      stacklevel=3)
        return False
    return True


_loaded = _load()


def library_loaded() -> bool:
    """Whether the torch.ops.cute_moe ops are available (decided once, on import: the
    package registers its fake and CPU kernels then)."""
    return _loaded


def load_error() -> str | None:
    """Why the library is not loaded (None when it is, or when nothing was tried)."""
    return _load_error


def require_library(what: str = "this operation") -> None:
    if not _loaded:
        reason = _load_error or "it is not loaded"
        raise RuntimeError(f"cute_moe: {what} needs the compiled op library, but {reason}; "
                           f"{_BUILD_HINT} (or point {ENV_VAR} at a built libcute_moe_torch.so)")

# Finds and loads the compiled op library (libcute_moe_torch.so), which registers the
# torch.ops.cute_moe namespace. Kept apart so the rest of the package can import, and
# fall back to the references, when the library has not been built.
from __future__ import annotations

import os
import warnings

import torch

__all__ = ["ENV_VAR", "library_path", "library_loaded", "require_library"]

ENV_VAR = "CUTE_MOE_LIBRARY"
_BUILD_HINT = "build it from the repository root with `pip install --no-build-isolation .`"

_load_error: str | None = None


def library_path() -> str:
    """CUTE_MOE_LIBRARY if set, else lib/libcute_moe_torch.so inside this package."""
    env = os.environ.get(ENV_VAR)
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libcute_moe_torch.so")


def _ops_registered() -> bool:
    try:
        torch.ops.cute_moe.grouped_mm.default
        torch.ops.cute_moe.grouped_mm_wgrad.default
        torch.ops.cute_moe.grouped_column_sum.default
    except (AttributeError, RuntimeError):
        return False
    return True


def _load() -> None:
    global _load_error
    if _ops_registered():
        return
    path = library_path()
    if not os.path.isfile(path):
        source = f"{ENV_VAR}={path}" if os.environ.get(ENV_VAR) else path
        _load_error = f"the op library was not found at {source}"
        return
    try:
        torch.ops.load_library(path)
    except (OSError, RuntimeError) as exc:
        _load_error = f"loading the op library {path} failed: {exc}"
        warnings.warn(f"cute_moe: {_load_error}; falling back to the PyTorch references",
                      stacklevel=3)
        return
    if not _ops_registered():
        _load_error = f"{path} loaded but did not register the torch.ops.cute_moe ops"
        warnings.warn(f"cute_moe: {_load_error}", stacklevel=3)


def library_loaded() -> bool:
    """Whether the torch.ops.cute_moe ops are available."""
    return _ops_registered()


def require_library(what: str = "this operation") -> None:
    if not _ops_registered():
        reason = _load_error or "it is not loaded"
        raise RuntimeError(f"cute_moe: {what} needs the compiled op library, but {reason}; "
                           f"{_BUILD_HINT} (or point {ENV_VAR} at a built libcute_moe_torch.so)")


_load()

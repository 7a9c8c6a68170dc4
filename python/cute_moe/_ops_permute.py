# Python registrations for the permute / unpermute ops of the compiled library (which
# defines their schemas and CUDA kernels): fake kernels for tracing (torch.compile,
# FakeTensorMode) and CPU kernels that run the references. Registered only when the loaded
# library has the ops (an older build may not); permute.py then runs the references. The
# ops have no autograd of their own: permute / unpermute put them together in
# autograd.Functions.
from __future__ import annotations

import torch

from . import _library
from ._checks_permute import (check_gather_rows_args, check_gather_rows_dot_args,
                              check_gather_sum_rows_args)
from ._ops import _has_op
from .reference_permute import gather_rows_dot_ref, gather_rows_ref, gather_sum_rows_ref

__all__ = ["PERMUTE_OPS", "REGISTERED"]

PERMUTE_OPS = ("gather_rows", "gather_sum_rows", "gather_rows_dot")


def _fake_gather_rows(src, index, scale=None):
    check_gather_rows_args(src, index, scale)
    return src.new_empty(index.shape[0], src.shape[1])


def _cpu_gather_rows(src, index, scale=None):
    check_gather_rows_args(src, index, scale)
    return gather_rows_ref(src, index, scale)


def _fake_gather_sum_rows(src, index, weight=None):
    check_gather_sum_rows_args(src, index, weight)
    return src.new_empty(index.shape[0], src.shape[1])


def _cpu_gather_sum_rows(src, index, weight=None):
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
        torch.library.register_fake(f"cute_moe::{name}", fake)
        torch.library.register_kernel(f"cute_moe::{name}", "cpu", cpu)


REGISTERED = _library.library_loaded() and all(_has_op(name) for name in PERMUTE_OPS)
if REGISTERED:
    _register()

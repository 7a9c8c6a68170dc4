"""Expert parallelism for cute_moe's torchtitan experts: torchtitan's ExpertParallel
dispatch and combine with cute_moe's row gathers in place of torchtitan's permutation."""
# torchtitan's ExpertParallel (torchtitan/distributed/expert_parallel.py) wraps the experts
# call in two hooks. The dispatch all-to-alls the routed rows to the ranks that own their
# experts; they arrive ordered by (source rank, expert), and torchtitan reorders them by
# (expert, source rank), padding every expert's group to a multiple of 8 rows (what
# torch._grouped_mm needs): x = [x; 0][permuted_indices], a gather whose backward is an
# index_put with accumulate (a sort, then atomics). The combine scatters the rows back
# (out[permuted_indices] = y) before the reverse all-to-all. At Qwen3-30B-A3B dims on 2 GPUs
# that permutation took ~9.6 ms of a ~53 ms step (docs/perf-notes.md, session 12).
#
# cute_moe's experts need no padding. For them the hooks here do the same all-to-alls and
# reorder with cute_moe.nn.dispatch's gathers (sort_received): one gather each way, forward
# and backward, deterministic. Other experts modules keep torchtitan's hooks, unchanged.
#
# install() puts these in ExpertParallel's place (its subclass ExpertTensorParallel calls
# them through super()). distribute_module binds the hooks when torchtitan's parallelize
# function applies the style, so install() must come first: convert() calls it, and
# torchtitan's model converters run before parallelization. A model parallelized before
# its conversion keeps torchtitan's permutation (the same results, slower).
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.distributed._functional_collectives import (all_to_all_single,
                                                        all_to_all_single_autograd)

from ..nn.dispatch import permute, sort_received, tokens_per_expert, unpermute

__all__ = ["install", "installed"]

_MARK = "_cute_moe_dispatch_installed"  # class attribute of the patched ExpertParallel
_STATE = "_cute_moe_dispatch"          # the style's Dispatch between its two hooks


def _expert_parallel_class():
    from torchtitan.distributed.expert_parallel import ExpertParallel
    return ExpertParallel


def installed() -> bool:
    return bool(getattr(_expert_parallel_class(), _MARK, False))


def install(is_ours: Callable[[nn.Module], bool]) -> None:
    """Routes ExpertParallel's dispatch and combine of the modules for which is_ours(module)
    holds through cute_moe's gathers; every other module through torchtitan's own.
    Idempotent."""
    cls = _expert_parallel_class()
    if getattr(cls, _MARK, False):
        return
    their_dispatch, their_combine = cls._token_dispatch, cls._token_combine

    def _token_dispatch(self, mod, inputs, device_mesh):
        if is_ours(mod):
            return _dispatch(self, inputs, device_mesh)
        return their_dispatch(self, mod, inputs, device_mesh)

    def _token_combine(self, mod, routed_output, device_mesh):
        if is_ours(mod):
            return _combine(self, routed_output, device_mesh)
        return their_combine(self, mod, routed_output, device_mesh)

    cls._token_dispatch, cls._token_combine = _token_dispatch, _token_combine
    setattr(cls, _MARK, True)


def _dispatch(style, inputs, device_mesh):
    """(rows sorted by global expert, rows per global expert) -> this rank's received rows
    sorted by local expert, unpadded, and rows per local expert. The splits live on the
    style, as torchtitan's do (its combine, or ours, reads them)."""
    routed_input, num_tokens_per_expert = inputs
    ranks = device_mesh.shape[0]
    local = num_tokens_per_expert.shape[0] // ranks
    group = device_mesh.get_group()
    with torch.no_grad():
        received = all_to_all_single(num_tokens_per_expert, None, None, group=group)
        received = torch.ops._c10d_functional.wait_tensor(received).view(ranks, local)
        sent = num_tokens_per_expert.view(ranks, local).sum(1).to("cpu", non_blocking=True)
        # the host reads the received splits: the all-to-all's output size (a sync, as in
        # torchtitan's dispatch)
        style.output_splits = received.sum(1).to("cpu").tolist()
        style.input_splits = sent.tolist()
    x = all_to_all_single_autograd(routed_input, style.output_splits, style.input_splits, group)
    x = torch.ops._c10d_functional.wait_tensor(x)
    d = sort_received(received, sum(style.output_splits))
    setattr(style, _STATE, d)
    return permute(x, d), tokens_per_expert(d.offs)


def _combine(style, routed_output, device_mesh):
    """The experts' rows back in the received order, then home with the reverse
    all-to-all."""
    y = unpermute(routed_output, getattr(style, _STATE))
    setattr(style, _STATE, None)
    return all_to_all_single_autograd(y, style.input_splits, style.output_splits,
                                      device_mesh.get_group())

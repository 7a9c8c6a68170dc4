"""cute_moe experts for torchtitan's MoE models (torchtitan 0.2.x)."""
# torchtitan's MoE layer (torchtitan/models/moe/moe.py) routes, sorts the routed rows by
# expert and calls its experts module as
#     experts(x (R, D) sorted by expert, num_tokens_per_expert (E_local,)) -> (R, D)
# with the router scores applied outside it (before or after, score_before_experts).
# Under expert parallelism, ExpertParallel's forward hooks wrap that call: the all-to-all
# and a reorder by local expert. For converted modules that reorder is cute_moe's (one
# deterministic gather each way, no padding rows: torchtitan_expert_parallel.py, installed
# by convert()); torchtitan's own pads every expert's group to a multiple of 8 rows with
# zeros, which the kernels serve too (a model parallelized before its conversion keeps it).
# The parameters are DTensors that the forward reads through .to_local(), as torchtitan's
# own does. FSDP2 all-gathers them before the forward and reduce-scatters their gradients
# after the backward.
#
# convert(model) switches every experts module to a subclass of its own class whose forward
# runs cute_moe.expert_ffn (the two fused grouped GEMMs). Nothing else changes: the same
# Parameter objects under the same names (so state-dict keys, DCP checkpoints, optimizers
# and DTensor placements are torchtitan's), the same hooks; it can run before or after
# torchtitan's parallelize function. Registered as the torchtitan model converter
# "cute_moe" too: `--experimental.custom_import cute_moe.integrations.torchtitan
# --model.converters cute_moe`.
#
# Which experts, and how:
#   GroupedExperts (Llama 4, DeepSeek-V3, Qwen3-MoE): w1, w3 (E, I, D), w2 (E, D, I), used
#     as x @ W[e].T; silu(x w1^T) * (x w3^T) is cute_moe's "swiglu" over [gate | linear]
#     halves. w1 and w3 are two parameters (two allocations; under FSDP2, two all-gather
#     outputs), handed to expert_ffn as the pair (w1^T, w3^T): the kernels read them in place
#     (the forward's B load spans both where w3 lies above w1, the input gradient reads its
#     k-tiles from either, each weight gradient comes from its half of dpre), so bf16
#     parameters (FSDP2's param_dtype) cost no copy and fp32 ones (one GPU, no FSDP) only
#     torchtitan's own per-call cast, made into one buffer so that w3's copy lies above w1's
#     (_CastPair). Where FSDP2's w3 lies below its w1 the forward's B load starts at w3 and
#     its epilogue swaps each (linear, gate) pair back: no copy either; docs/halves-layout.md.
#   GptOssGroupedExperts: mlp1_weight (E, 2I, D) with interleaved (gate, linear) rows and
#     mlp1_bias, mlp2_weight (E, D, I), mlp2_bias; torchtitan's clamped SwiGLU (alpha
#     1.702, swiglu_limit) is "swiglu_oai", the kernels' native layout: read in place.
# Both also follow torchtitan's experts under expert tensor parallelism (local shards;
# GPT-OSS's down bias divided by the TP degree in the forward only; not run yet).
# The kernels compute in bf16 on SM90 GPUs (x and the weights cast to bf16 as torchtitan's
# grouped_mm experts do; no host sync, no data-dependent Python: CUDA-graph and
# torch.compile friendly). On the CPU the same forward runs cute_moe's PyTorch references
# in the parameters' dtype. Anything else raises UnsupportedExpertsError, naming what works.
from __future__ import annotations

import inspect
import sys

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torchtitan.models.moe.moe import GroupedExperts

from .. import _library
from . import torchtitan_expert_parallel as _expert_parallel
from ..activations import DEFAULT_ALPHA
from ..expert_ffn import expert_ffn
from ..reference.groups import offsets_from_counts
from ..reference.moe import experts_ref

__all__ = ["NAME", "UnsupportedExpertsError", "convert", "is_converted", "experts_modules",
           "CuteMoEConverter", "register"]

NAME = "cute_moe"
# Where torchtitan keeps GPT-OSS's experts: looked up when a model has them (importing the
# gpt_oss package here would import its training-spec dependencies: datasets, ...).
_GPT_OSS_MODULE = "torchtitan.models.gpt_oss.model.moe"
_GPT_OSS_CLASS = "GptOssGroupedExperts"
_CONVERTED = "_cute_moe_family"  # class attribute of the converted classes


class UnsupportedExpertsError(NotImplementedError):
    """An experts module, parameter type or device that cute_moe cannot serve; the message
    says why and what works."""


# --- conversion ---------------------------------------------------------------------------

def convert(model: nn.Module) -> nn.Module:
    """Switches every torchtitan experts module of `model` (GroupedExperts, GPT-OSS's
    GptOssGroupedExperts; `model` itself may be one) to cute_moe's fused kernels, in place,
    keeping its parameters, their names and placements, and its hooks. Idempotent. Works
    on a model on the meta device (as torchtitan's model converters see it), before or
    after parallelization (before: expert parallelism then reorders the experts' rows
    with cute_moe's gathers, torchtitan_expert_parallel.py). Raises
    UnsupportedExpertsError for an experts class whose forward is not one of those (e.g. a
    quantized variant), ValueError when the model has no experts module. Returns the
    model."""
    _expert_parallel.install(is_converted)
    found = 0
    for name, module in model.named_modules():
        family = _family(module)
        if family is None:
            continue
        found += 1
        if not is_converted(module):
            module.__class__ = _converted_class(type(module), family)
    if not found:
        raise ValueError(f"cute_moe.integrations.torchtitan.convert: {type(model).__name__} has no "
                         "torchtitan experts module (GroupedExperts or GptOssGroupedExperts)")
    return model


def is_converted(module: nn.Module) -> bool:
    return getattr(type(module), _CONVERTED, None) is not None


def experts_modules(model: nn.Module) -> list[nn.Module]:
    """The torchtitan experts modules of `model`, converted or not, in module order."""
    return [m for m in model.modules() if is_converted(m) or _family(m) is not None]


def _gpt_oss_class():
    return getattr(sys.modules.get(_GPT_OSS_MODULE), _GPT_OSS_CLASS, None)


def _family(module: nn.Module) -> str | None:
    """"llama" (GroupedExperts), "gpt_oss" or None (not an experts module). Raises for a
    subclass of either that brings a forward of its own."""
    gpt_oss = _gpt_oss_class()
    if is_converted(module):
        return getattr(type(module), _CONVERTED)
    if gpt_oss is not None and isinstance(module, gpt_oss):
        family, base = "gpt_oss", gpt_oss
    elif isinstance(module, GroupedExperts):
        family, base = "llama", GroupedExperts
    else:
        return None
    if type(module).forward is not base.forward:
        raise UnsupportedExpertsError(
            f"{NAME}: {type(module).__qualname__} is a {base.__name__} with a forward of its own "
            f"({type(module).forward.__qualname__}), which cute_moe cannot stand in for; leave "
            "this model's experts as they are (torchtitan's grouped_mm experts)")
    return family


_CLASSES: dict[tuple[type, str], type] = {}


def _converted_class(cls: type, family: str) -> type:
    """The subclass of `cls` with cute_moe's forward (one per class: FSDP2's and
    distribute_module's own subclasses keep working, whichever was applied first)."""
    key = (cls, family)
    if key not in _CLASSES:
        mixin = _GptOssForward if family == "gpt_oss" else _LlamaForward
        attrs = {"__module__": __name__, _CONVERTED: family}
        if family == "gpt_oss":  # a constant of the class: nothing to look up in the forward
            attrs["_cute_moe_alpha"] = _gpt_oss_alpha()
        _CLASSES[key] = type(f"CuteMoE{cls.__name__}", (mixin, cls), attrs)
    return _CLASSES[key]


# --- the forwards --------------------------------------------------------------------------

def _local(p: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor parameter (as torchtitan's experts read it)."""
    return p.to_local() if isinstance(p, DTensor) else p


def _tp_degree(p: torch.Tensor) -> int:
    """The "tp" mesh size of a DTensor parameter (expert tensor parallelism), as
    torchtitan's GPT-OSS experts find it; 1 otherwise."""
    if isinstance(p, DTensor):
        names = p.device_mesh.mesh_dim_names or ()
        if "tp" in names:
            return p.device_mesh.size(names.index("tp"))
    return 1


def _use_kernels(module: nn.Module, w: torch.Tensor) -> bool:
    """Whether the block runs cute_moe's bf16 functions (on CUDA: the SM90 kernels; on the
    CPU for bf16 weights: the op library's CPU kernels or the references under the same
    autograd) or the plain references in the weights' dtype (CPU). Raises where neither
    serves."""
    if type(w) is not torch.Tensor and type(w) is not nn.Parameter:
        _unsupported(module, f"its weights are {type(w).__name__} tensors (a quantized training "
                     "recipe?); cute_moe computes bf16 from plain (or DTensor) parameters")
    dev = w.device
    if dev.type == "cuda":
        if not torch.compiler.is_compiling():  # checked in eager calls; traced code trusts it
            _check_cuda(module, dev)
        return True
    if dev.type == "cpu":
        return w.dtype == torch.bfloat16
    _unsupported(module, f"its weights are on {dev}; cute_moe runs on SM90 GPUs (H100, H200), "
                 "and on the CPU through its PyTorch references")


_CHECKED: set[int] = set()


def _check_cuda(module: nn.Module, dev: torch.device) -> None:
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index in _CHECKED:
        return
    if not _library.library_loaded():
        _unsupported(module, f"the cute_moe op library is not loaded ({_library.load_error()})")
    props = torch.cuda.get_device_properties(index)
    if (props.major, props.minor) != (9, 0):
        _unsupported(module, f"its weights are on {props.name} (sm_{props.major}{props.minor}); "
                     "the cute_moe kernels run on SM90 GPUs (H100, H200)")
    _CHECKED.add(index)


def _unsupported(module: nn.Module, why: str):
    raise UnsupportedExpertsError(
        f"{NAME}: {type(module).__name__}: {why}. torchtitan's own experts serve this case: "
        "build the model without the cute_moe conversion (drop 'cute_moe' from "
        "--model.converters)")


class _CastPair(torch.autograd.Function):
    """(w1, w3) -> their copies in `dtype`, the two halves of one (2, E, I, D) buffer (w3's
    above w1's, where the fused forward reads both in place): the per-call cast torchtitan's
    own experts make, in one allocation. Backward: each gradient in its parameter's dtype."""

    @staticmethod
    def forward(ctx, w1, w3, dtype):
        ctx.dtypes = (w1.dtype, w3.dtype)
        buf = w1.new_empty((2,) + tuple(w1.shape), dtype=dtype)
        buf[0].copy_(w1)
        buf[1].copy_(w3)
        return buf[0], buf[1]

    @staticmethod
    def backward(ctx, g1, g3):
        return (None if g1 is None else g1.to(ctx.dtypes[0]),
                None if g3 is None else g3.to(ctx.dtypes[1]), None)


def _gate_up_pair(w1: torch.Tensor, w3: torch.Tensor, dtype: torch.dtype):
    """(w1^T, w3^T) in `dtype` for expert_ffn's pair: as they are where they have it (FSDP2's
    bf16 parameters), else cast into one buffer (_CastPair)."""
    if w1.dtype != dtype or w3.dtype != dtype:
        w1, w3 = _CastPair.apply(w1, w3, dtype)
    return w1.transpose(-2, -1), w3.transpose(-2, -1)


class _LlamaForward:
    """GroupedExperts.forward on cute_moe: silu(x w1[e]^T) * (x w3[e]^T) @ w2[e]^T."""

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = _local(self.w1), _local(self.w2), _local(self.w3)
        offs = offsets_from_counts(num_tokens_per_expert)  # int32 cumulative ends, on its device
        if _use_kernels(self, w2):
            bf16 = torch.bfloat16
            y = expert_ffn(x.to(bf16), _gate_up_pair(w1, w3, bf16), w2.to(bf16).transpose(-2, -1), offs,
                           activation="swiglu", limit=None, gate_linear="halves")
            return y.type_as(x)
        w_up = torch.cat([w1, w3], dim=1).transpose(-2, -1)
        return experts_ref(x.to(w2.dtype), offs, w_up, w2.transpose(-2, -1), activation="swiglu",
                           limit=None, impl="loop", gate_linear="halves").type_as(x)


class _GptOssForward:
    """GptOssGroupedExperts.forward on cute_moe: torchtitan's clamped SwiGLU over
    interleaved (gate, linear) rows of mlp1, with both biases."""

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        w_up, b_up = _local(self.mlp1_weight), _local(self.mlp1_bias)
        w_down, b_down = _local(self.mlp2_weight), _local(self.mlp2_bias)
        offs = offsets_from_counts(num_tokens_per_expert)  # int32 cumulative ends, on its device
        tp = _tp_degree(self.mlp1_weight)
        if tp > 1:  # torchtitan's: the bias divided by the TP degree forward, not backward
            b_down = sys.modules[_GPT_OSS_MODULE].ScaleBiasForward.apply(b_down, tp)
        alpha, limit = self._cute_moe_alpha, float(self.swiglu_limit)
        if _use_kernels(self, w_down):
            bf16 = torch.bfloat16
            # torchtitan returns these experts' output in bf16 (grouped_mm + a bf16 bias)
            return expert_ffn(x.to(bf16), w_up.to(bf16).transpose(-2, -1),
                              w_down.to(bf16).transpose(-2, -1), offs, b_up.to(bf16),
                              b_down.to(bf16), activation="swiglu_oai", swiglu_alpha=alpha,
                              limit=limit)
        dt = w_down.dtype
        return experts_ref(x.to(dt), offs, w_up.transpose(-2, -1), w_down.transpose(-2, -1),
                           b_up.to(dt), b_down.to(dt), activation="swiglu_oai", alpha=alpha,
                           limit=limit, impl="loop").type_as(x)


def _gpt_oss_alpha() -> float:
    """The alpha torchtitan's GPT-OSS experts call their swiglu with: its default."""
    fn = getattr(sys.modules.get(_GPT_OSS_MODULE), "swiglu", None)
    default = inspect.signature(fn).parameters["alpha"].default if fn is not None else None
    return float(default) if isinstance(default, (int, float)) else DEFAULT_ALPHA


# --- torchtitan's model converter ------------------------------------------------------

class CuteMoEConverter:
    """torchtitan ModelConverter "cute_moe": convert(model) on the model torchtitan's
    trainer builds (on the meta device, before parallelization)."""

    def __init__(self, job_config=None, parallel_dims=None):
        self.job_config, self.parallel_dims = job_config, parallel_dims

    def convert(self, model: nn.Module) -> None:
        convert(model)

    def post_optimizer_hook(self, model) -> None:
        pass


def register() -> None:
    """Registers CuteMoEConverter as torchtitan's model converter "cute_moe". Idempotent;
    importing this module already did it."""
    from torchtitan.protocols import model_converter

    registry = getattr(model_converter, "_registry_model_converter_cls", None)
    if registry is not None and registry.get(NAME) is CuteMoEConverter:
        return
    model_converter.register_model_converter(CuteMoEConverter, NAME)


register()

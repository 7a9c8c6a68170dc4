"""experts_implementation="cute_moe" for the MoE experts modules of HF transformers."""
# transformers (5.x) runs every experts class decorated with @use_experts_implementation
# (GPT-OSS, Qwen3-MoE, Mixtral, DeepSeek-V3, ...) through its ExpertsInterface: the config's
# experts implementation names a registered function
#     forward(module, hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k)) -> (T, H)
# that reads the module's parameters and flags (has_gate, has_bias, is_transposed,
# is_concatenated). Importing this module registers "cute_moe" there (register() does it
# again, harmlessly); the name is then chosen with from_pretrained(...,
# experts_implementation="cute_moe") or model.set_experts_implementation("cute_moe").
# "cute_moe_fp8", registered beside it, runs the expert GEMMs in FP8 (cute_moe.expert_ffn's
# precision="fp8", docs/fp8.md) for the experts stored in its layout: GPT-OSS's.
#
# The forward reads the HF parameters in place, through views only: they stay the source
# of truth, so checkpoints, state-dict keys and optimizers see nothing new. What the module
# needs (route, activation, which weights are transposed) is worked out once from its
# flags and classes and kept on it; a call then sorts the routed rows by expert on the
# device (no host sync, no data-dependent Python), runs the experts and combines each
# token's rows in a fixed order.
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from transformers import activations as hf_activations
from transformers.integrations import moe as hf_moe
from transformers.integrations.moe import ExpertsInterface
from transformers.trainer_callback import TrainerCallback

from .. import _library
from ..activations import DEFAULT_ALPHA
from ..expert_ffn import expert_ffn
from ..fp8_weight_casts import reuse_weight_casts
from ..nn.dispatch import permute, sort_by_expert, unpermute
from ..reference.moe import experts_ref

__all__ = ["NAME", "NAME_FP8", "UnsupportedExpertsError", "register", "prepare",
           "experts_forward", "experts_forward_fp8", "Fp8WeightCastsCallback"]

NAME = "cute_moe"
NAME_FP8 = "cute_moe_fp8"
# What the error messages point to: transformers' own implementations serve every module
# ("grouped_mm" on any GPU since SM80 in bf16, and on the CPU; "eager" in any dtype).
FALLBACK = "grouped_mm"


class UnsupportedExpertsError(NotImplementedError):
    """An experts module or device that experts_implementation="cute_moe" cannot serve;
    the message says why and names an implementation that can."""


def register() -> None:
    """Registers "cute_moe" and "cute_moe_fp8" in transformers' ExpertsInterface (for every
    experts class decorated with @use_experts_implementation). Idempotent; importing this
    module already did it."""
    ExpertsInterface.register(NAME, experts_forward)
    ExpertsInterface.register(NAME_FP8, experts_forward_fp8)


class Fp8WeightCastsCallback(TrainerCallback):
    """For HF's Trainer with gradient accumulation and experts_implementation="cute_moe_fp8":
    the experts' FP8 weight casts made once per optimizer step and reused by its other
    micro-batches (cute_moe.fp8.reuse_weight_casts, opened at each step's first micro-batch
    and closed before the optimizer step). Same results; both e4m3 copies of every FP8
    experts module's weights stay allocated through the micro-batches (about the bf16
    weights' bytes). `casts` and `reuses` add up the cast passes made and the copies
    reused.

        Trainer(model, args, ..., callbacks=[Fp8WeightCastsCallback()])"""

    def __init__(self):
        self._open = None
        self.casts = self.reuses = 0

    def _close(self):
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self.casts += self._open.casts
            self.reuses += self._open.reuses
            self._open = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._close()
        self._open = reuse_weight_casts().__enter__()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._close()

    def on_step_end(self, args, state, control, **kwargs):
        self._close()

    def on_train_end(self, args, state, control, **kwargs):
        self._close()


class _Plan(NamedTuple):
    """How one experts module runs, worked out once (see _plan)."""
    route: str              # "fused" (interleaved gate/linear columns, or not gated) or
                            # "halves" ([gate | linear]); both run cute_moe.expert_ffn
    activation: str         # a name of cute_moe/activations.py
    alpha: float
    limit: float | None
    up: str                 # "gate_up_proj" (gated) or "up_proj"
    bias: bool              # <up>_bias and down_proj_bias exist
    out_in: bool            # weights stored (E, out, in) (is_transposed False): read as .mT views
    kernels: bool           # the package's bf16 functions (the op library); else the references
    device: torch.device    # the weights' device and dtype the plan was made for
    dtype: torch.dtype
    precision: str          # "bf16" ("cute_moe") or "fp8" ("cute_moe_fp8")


_PLAN = "_cute_moe_plan"  # the module attribute holding its _Plan (not a parameter or buffer)


def experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """out[t] = sum_j top_k_weights[t, j] * expert_{top_k_index[t, j]}(hidden_states[t]),
    (T, H) in hidden_states' dtype. Expert ids >= num_experts (expert-parallel sentinels)
    contribute zero and give their weight a zero gradient. Differentiable with respect
    to hidden_states, top_k_weights and the module's parameters."""
    return _forward(self, hidden_states, top_k_index, top_k_weights, "bf16")


def experts_forward_fp8(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
    """experts_forward with the expert GEMMs in FP8 (e4m3, DeepSeek-V3's block scales;
    cute_moe.fp8.expert_ffn): bf16 weights in GPT-OSS's layout ((E, H, 2I) gate_up_proj with
    interleaved columns, or a non-gated (E, H, I) up_proj; is_transposed=True), hidden and
    intermediate sizes multiples of 16. Other modules raise, naming "cute_moe"."""
    return _forward(self, hidden_states, top_k_index, top_k_weights, "fp8")


def _forward(self, hidden_states, top_k_index, top_k_weights, precision: str) -> torch.Tensor:
    w = self.down_proj
    plan = getattr(self, _PLAN, None)
    if (plan is None or plan.device != w.device or plan.dtype != w.dtype
            or plan.precision != precision):
        # once per module, and again after a move to another device/dtype or precision
        plan = _make_plan(self, precision)
    w_up, w_down = getattr(self, plan.up), w
    if plan.out_in:  # x @ W[e].T: the transposed views, which the kernels read as they are
        w_up, w_down = w_up.transpose(-2, -1), w_down.transpose(-2, -1)
    b_up = getattr(self, plan.up + "_bias") if plan.bias else None
    b_down = self.down_proj_bias if plan.bias else None
    # Sentinel ids sort past every real expert, so they land past offs[-1]: padding rows,
    # which the grouped GEMMs leave zero (and whose router weight gets zero gradient).
    d = sort_by_expert(top_k_index, self.num_experts, top_k_weights)
    x = hidden_states.to(plan.dtype)
    # FP8: the routed rows gathered by x's quantizer (nn.MoE's default there: no sorted copy
    # held, no time lost); bf16: gathered first (the gathering GEMM is slower on Hopper)
    gather = plan.kernels and plan.precision == "fp8"
    if not gather:
        x = permute(x, d)
    # the router weight goes into the down projection's epilogue, the combine joins its
    # backward (the output gradient gathered with the bias gradients in one pass)
    return _expert_ffn(x, w_up, w_down, b_up, b_down, d, plan, gather).to(hidden_states.dtype)


def _expert_ffn(x, w_up, w_down, b_up, b_down, d, plan: _Plan, gather: bool = False):
    """The whole expert block in two fused grouped GEMMs and the combine back to tokens:
    w_up (E, H, 2I) with the gate and linear columns interleaved (GPT-OSS) or as
    [gate | linear] halves (plan.route), or (E, H, I) non-gated, as stored or as a
    transposed view. x: the routed rows, or with `gather` the tokens."""
    gate_linear = "halves" if plan.route == "halves" else "interleaved"
    if plan.kernels:
        return expert_ffn(x, w_up, w_down, d.offs, b_up, b_down, activation=plan.activation,
                          prob=d.prob, swiglu_alpha=plan.alpha, limit=plan.limit,
                          gate_linear=gate_linear, precision=plan.precision,
                          gather=(d.row_token, d.token_rows) if gather else None,
                          combine=(d.row_token, d.token_rows))
    y = experts_ref(x, d.offs, w_up, w_down, b_up, b_down, d.prob, activation=plan.activation,
                    alpha=plan.alpha, limit=plan.limit, impl="loop", gate_linear=gate_linear)
    return unpermute(y, d)


# --- the plan: route, activation and backend of one module, worked out once ------------

def prepare(model: nn.Module) -> nn.Module:
    """Works out the plan of every experts module of `model` that runs "cute_moe" now
    rather than at its first call (which torch.compile(fullgraph=True) could not trace:
    the plan is made outside the graph), raising here for those it cannot serve.
    Call it after moving the model to its device and dtype. Returns the model."""
    precisions = {NAME: "bf16", NAME_FP8: "fp8"}
    for module in model.modules():
        config = getattr(module, "config", None)
        name = getattr(config, "_experts_implementation", None)
        if (hasattr(module, "is_concatenated") and hasattr(module, "down_proj")
                and name in precisions):
            _make_plan(module, precisions[name])
    return model


@torch.compiler.disable
def _make_plan(module: nn.Module, precision: str = "bf16") -> _Plan:
    """_plan(module, precision), kept on the module. Outside torch.compile's graph: a graph
    break where the plan is missing (a module's first call), none once it is there."""
    plan = _plan(module, precision)
    setattr(module, _PLAN, plan)
    return plan


def _unsupported(module: nn.Module, why: str, fallback: str = FALLBACK, name: str = NAME):
    raise UnsupportedExpertsError(
        f"experts_implementation={name!r}: {type(module).__name__}: {why}. Use "
        f"experts_implementation={fallback!r} for this model "
        f"(model.set_experts_implementation({fallback!r}), or from_pretrained(..., "
        f"experts_implementation={fallback!r}))")


def _plan(module: nn.Module, precision: str = "bf16") -> _Plan:
    w = module.down_proj
    kernels = _uses_kernels(module, w, NAME if precision == "bf16" else NAME_FP8)
    if getattr(module, "has_post_expert_norm", False):
        _unsupported(module, "its experts apply a norm after the down projection, which "
                     "cute_moe's expert block does not have")
    alpha, limit = DEFAULT_ALPHA, None
    if module.has_gate:
        up = "gate_up_proj"
        gate = getattr(type(module), "_apply_gate", None)
        if _is_gpt_oss_gate(gate):
            # GPT-OSS: interleaved (gate, linear) columns, the clamped SwiGLU with the
            # module's alpha and limit: the fused kernels' native layout and activation
            route, activation = "fused", "swiglu_oai"
            alpha = float(module.alpha)
            limit = None if module.limit is None else float(module.limit)
        elif gate is not None and gate is _DEFAULT_GATE:
            if not module.is_concatenated:
                _unsupported(module, "transformers' default gate splits [gate | up] halves, but "
                             "the module says is_concatenated=False")
            route, activation = "halves", _activation(module, _GATED_ACTS, "gated")
        else:
            _unsupported(module, f"its gate {getattr(gate, '__qualname__', gate)} is its own; "
                         "cute_moe computes GPT-OSS's clamped SwiGLU and transformers' default "
                         "act_fn(gate) * up")
    else:
        up = "up_proj"
        route, activation = "fused", _activation(module, _PLAIN_ACTS, "non-gated")
    hidden, inter = (w.shape[1], w.shape[2]) if not module.is_transposed else (w.shape[2],
                                                                               w.shape[1])
    if kernels and (hidden % 8 or inter % 8):
        _unsupported(module, f"the kernels need hidden and intermediate sizes that are multiples "
                     f"of 8, got {hidden} and {inter}")
    if precision == "fp8":
        _check_fp8(module, route, kernels, hidden, inter)
    return _Plan(route, activation, alpha, limit, up, bool(module.has_bias),
                 not module.is_transposed, kernels, w.device, w.dtype, precision)


def _check_fp8(module: nn.Module, route: str, kernels: bool, hidden: int, inter: int) -> None:
    """What cute_moe.fp8.expert_ffn serves: bf16, GPT-OSS's storage, 16-byte e4m3 rows."""
    def unsupported(why):
        _unsupported(module, why, fallback=NAME, name=NAME_FP8)
    if not kernels:
        unsupported(f"its weights are {module.down_proj.dtype}; the FP8 expert block takes "
                    "bfloat16 weights (load the model with dtype=torch.bfloat16)")
    if route == "halves" or not module.is_transposed:
        layout = "[gate | up] halves" if route == "halves" else "(E, out, in) weights"
        unsupported(f"its {layout} are not the FP8 block's layout yet (GPT-OSS's: (E, H, 2I) "
                    "with interleaved gate/linear columns, is_transposed=True)")
    if hidden % 16 or inter % 16:
        unsupported(f"the FP8 block needs hidden and intermediate sizes that are multiples of "
                    f"16, got {hidden} and {inter}")


def _uses_kernels(module: nn.Module, w: torch.Tensor, name: str = NAME) -> bool:
    """Whether the module's weights run the package's bf16 functions (on CUDA, the fused
    SM90 kernels; on the CPU, the op library's CPU kernels or the references under the
    same autograd) rather than the plain references (CPU, other dtypes). Raises where
    neither serves."""
    dev = w.device
    if dev.type == "cuda":
        if not _library.library_loaded():
            _unsupported(module, f"the cute_moe op library is not loaded ({_library.load_error()})",
                         name=name)
        props = torch.cuda.get_device_properties(dev)
        if (props.major, props.minor) != (9, 0):
            _unsupported(module, f"its weights are on {props.name} "
                         f"(sm_{props.major}{props.minor}); the cute_moe kernels run on SM90 GPUs "
                         "(H100, H200)", name=name)
        if w.dtype != torch.bfloat16:  # (torch's grouped_mm takes bf16 only on CUDA, too)
            _unsupported(module, f"its weights are {w.dtype}; the cute_moe kernels take bfloat16 "
                         "(load the model with dtype=torch.bfloat16)", fallback="eager",
                         name=name)
        return True
    if dev.type == "cpu":
        return w.dtype == torch.bfloat16
    _unsupported(module, f"its weights are on {dev}; cute_moe runs on SM90 GPUs, and on the CPU "
                 "through its PyTorch references", name=name)


# The gates cute_moe knows. transformers gives every decorated class without a gate of
# its own _default_apply_gate; GPT-OSS's is known by name, so that this module needs not
# import the GPT-OSS model.
_DEFAULT_GATE = getattr(hf_moe, "_default_apply_gate", None)
_GPT_OSS_GATE = ("transformers.models.gpt_oss.modeling_gpt_oss", "GptOssExperts._apply_gate")


def _is_gpt_oss_gate(gate) -> bool:
    return (getattr(gate, "__module__", None), getattr(gate, "__qualname__", None)) == _GPT_OSS_GATE


def _act_classes(*names: str) -> tuple[type, ...]:
    return tuple(c for c in (getattr(hf_activations, n, None) for n in names) if c is not None)


# transformers' activation modules (ACT2FN) -> cute_moe's activations. "gelu" (exact, erf)
# is not here: cute_moe's geglu is the tanh approximation ("gelu_pytorch_tanh",
# "gelu_new", "gelu_fast"), up to 4.7e-4 away from it (at -2.7), so a model trained with
# the exact one would not get its own function.
_GATED_ACTS = ((_act_classes("SiLUActivation") + (nn.SiLU,), "swiglu"),
               (_act_classes("GELUTanh", "NewGELUActivation", "FastGELUActivation"), "geglu"))
_PLAIN_ACTS = ((_act_classes("ReLUSquaredActivation"), "srelu"),)


def _activation(module: nn.Module, table, kind: str) -> str:
    act = getattr(module, "act_fn", None)
    for classes, name in table:
        if classes and isinstance(act, classes):
            return name
    config = getattr(module, "config", None)
    named = [f"{key}={getattr(config, key)!r}" for key in ("hidden_act", "mlp_hidden_act")
             if isinstance(getattr(config, key, None), str)]
    served = "silu/swish (swiglu), gelu_pytorch_tanh/gelu_new/gelu_fast (geglu)" \
        if kind == "gated" else "relu2 (srelu)"
    _unsupported(module, f"its {kind} activation {type(act).__name__}"
                 f"{' (' + ', '.join(named) + ')' if named else ''} is not one cute_moe computes "
                 f"for {kind} experts: {served}")


register()

"""References of the activations of the table: forward and closed-form backward."""
# Gated activations take `pre` with gate and linear columns interleaved (column 2j gate
# j, 2j+1 linear j) and give h half as wide; the others keep the width. The activations
# are those of cute_moe/activations.py.
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..activation_args import default_limit, is_gated
from ..activations import ACTIVATIONS, DEFAULT_ACTIVATION, DEFAULT_ALPHA

__all__ = ["act_ref", "act_bwd_ref", "activation_ref", "glu_halves_ref", "swiglu_oai_ref",
           "swiglu_oai_bwd_ref"]


def math_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float32, or float64 when an input is float64."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _known(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {tuple(ACTIVATIONS)}, got {activation!r}")


def _clamped(a: torch.Tensor, b: torch.Tensor, limit: float | None):
    """(g, u): the gate clamped from above, the linear input clamped both ways."""
    if limit is None:
        return a, b
    return a.clamp(max=limit), b.clamp(-limit, limit)


def _gate_linear(pre: torch.Tensor, limit: float | None):
    return _clamped(pre[..., 0::2], pre[..., 1::2], limit)


def _glu(g: torch.Tensor, u: torch.Tensor, activation: str, alpha: float) -> torch.Tensor:
    """A gated activation of its (clamped) gate and linear inputs."""
    if activation == "swiglu_oai":
        return g * torch.sigmoid(alpha * g) * (u + 1)
    if activation == "swiglu":
        return F.silu(g) * u
    if activation == "geglu":
        return F.gelu(g, approximate="tanh") * u
    raise NotImplementedError(f"no reference of the gated activation {activation!r}")


def _act(p: torch.Tensor, activation: str, alpha: float, limit: float | None) -> torch.Tensor:
    """act(p) computed in p's dtype."""
    _known(activation)
    if is_gated(activation):
        return _glu(*_gate_linear(p, limit), activation, alpha)
    elif activation == "srelu":
        return torch.relu(p) ** 2
    elif activation == "none":
        return p
    raise NotImplementedError(f"act_ref: no reference of the activation {activation!r}")


def act_ref(pre: torch.Tensor, activation: str = DEFAULT_ACTIVATION, alpha: float = DEFAULT_ALPHA,
            limit: float | None = None) -> torch.Tensor:
    """h = act(pre) in float32 (float64 for a float64 input). Gated activations take
    interleaved (gate a, linear b) columns (..., 2I) -> (..., I) with g = min(a, limit),
    u = clamp(b, -limit, limit) when limit is set (None: no clamps):
    swiglu_oai g*sigmoid(alpha*g)*(u+1); swiglu silu(g)*u; geglu gelu_tanh(g)*u.
    srelu relu(pre)^2 and none (identity) keep the width. Differentiable."""
    return _act(pre.to(math_dtype(pre)), activation, alpha, limit)


def activation_ref(pre: torch.Tensor, activation: str = DEFAULT_ACTIVATION,
                   alpha: float = DEFAULT_ALPHA, limit: float | None = None) -> torch.Tensor:
    """act_ref computed and returned in pre's own dtype, rounding after every step as an
    eager PyTorch layer does (the torchtitan-style reference/moe.py's activation)."""
    return _act(pre, activation, alpha, limit)


def glu_halves_ref(gate: torch.Tensor, linear: torch.Tensor,
                   activation: str = DEFAULT_ACTIVATION, alpha: float = DEFAULT_ALPHA,
                   limit: float | None = None) -> torch.Tensor:
    """A gated activation given its gate and linear inputs as two tensors of one shape
    (e.g. the [gate | linear] halves of a Llama/Qwen-layout pre-activation, as views):
    act_ref of the interleaved pairs, in float32 (float64 if an input is).
    Differentiable."""
    _known(activation)
    if not is_gated(activation):
        raise ValueError(f"glu_halves_ref: activation: expected a gated activation, one of "
                         f"{tuple(n for n in ACTIVATIONS if is_gated(n))}, got {activation!r}")
    dtype = math_dtype(gate, linear)
    return _glu(*_clamped(gate.to(dtype), linear.to(dtype), limit), activation, alpha)


def act_bwd_ref(dh: torch.Tensor, pre: torch.Tensor, activation: str = DEFAULT_ACTIVATION,
                alpha: float = DEFAULT_ALPHA, limit: float | None = None) -> torch.Tensor:
    """The gradient of act_ref with respect to pre for an upstream gradient dh, in closed
    form: float32 (float64 if an input is), interleaved like pre for the gated
    activations. The clamps pass gradient inside their closed intervals, as autograd
    does. Closed form rather than autograd of act_ref: the op library's CPU kernels call
    this below the autograd dispatch key, where autograd records nothing."""
    _known(activation)
    dtype = math_dtype(dh, pre)
    p = pre.to(dtype)
    dh = dh.to(dtype)
    if not is_gated(activation):
        if activation == "srelu":
            return dh * 2 * torch.relu(p)
        if activation == "none":
            return dh.clone()
        raise NotImplementedError(f"act_bwd_ref: no reference of the activation {activation!r}")
    a, b = p[..., 0::2], p[..., 1::2]
    g, u = _gate_linear(p, limit)
    if activation == "swiglu_oai":
        s = torch.sigmoid(alpha * g)
        da = dh * (u + 1) * (s + alpha * g * s * (1 - s))
        db = dh * g * s
    elif activation == "swiglu":
        s = torch.sigmoid(g)
        da = dh * u * (s + g * s * (1 - s))
        db = dh * g * s
    elif activation == "geglu":
        # gelu_tanh(g) = g/2 (1 + tanh(k)), k = sqrt(2/pi) (g + 0.044715 g^3)
        c = math.sqrt(2.0 / math.pi)
        t = torch.tanh(c * (g + 0.044715 * g ** 3))
        dgelu = 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * c * (1 + 3 * 0.044715 * g * g)
        da = dh * u * dgelu
        db = dh * 0.5 * g * (1 + t)
    else:
        raise NotImplementedError(f"act_bwd_ref: no reference of the activation {activation!r}")
    if limit is not None:
        da = torch.where(a <= limit, da, 0.0)
        db = torch.where((b >= -limit) & (b <= limit), db, 0.0)
    return torch.stack((da, db), dim=-1).flatten(-2)


def swiglu_oai_ref(pre: torch.Tensor, alpha: float = DEFAULT_ALPHA,
                   limit: float | None = default_limit("swiglu_oai")) -> torch.Tensor:
    """GPT-OSS SwiGLU of interleaved pre-activations (..., 2I) -> (..., I):
    g = min(a, limit), u = clamp(b, -limit, limit) (no clamps when limit is None),
    h = g * sigmoid(alpha * g) * (u + 1): act_ref of "swiglu_oai". Computes and returns
    float32 (float64 for a float64 input). Differentiable."""
    return act_ref(pre, "swiglu_oai", alpha, limit)


def swiglu_oai_bwd_ref(dh: torch.Tensor, pre: torch.Tensor, alpha: float = DEFAULT_ALPHA,
                       limit: float | None = default_limit("swiglu_oai")) -> torch.Tensor:
    """Gradient of swiglu_oai_ref with respect to pre (act_bwd_ref of "swiglu_oai")."""
    return act_bwd_ref(dh, pre, "swiglu_oai", alpha, limit)

"""The activation arguments over the table in activations.py: limit sentinel, defaults, checks."""
# activations.py is generated from codegen/kernel_space.py; everything derived from it by
# hand lives here, so that every API agrees on which activations exist, which are gated,
# and what limit a caller gets by not giving one.
from __future__ import annotations

from .activations import ACTIVATIONS
from .ops.checks import fail

__all__ = ["LIMIT_DEFAULT", "GATED_ACTIVATIONS", "is_gated", "default_limit", "resolve_limit",
           "up_width", "check_activation", "check_act_params"]

# The `limit` of an API that means "the activation's default limit" (7.0 for swiglu_oai,
# no clamp for the others). A string, so that it serialises in configs and torch.compile
# traces it as a constant; None always means "no clamp".
LIMIT_DEFAULT = "default"

GATED_ACTIVATIONS = tuple(name for name, act in ACTIVATIONS.items() if act.gated)


def is_gated(activation: str) -> bool:
    """Whether the activation reads interleaved (gate, linear) column pairs of a 2I-wide
    up projection and so halves the width."""
    return ACTIVATIONS[activation].gated


def default_limit(activation: str) -> float | None:
    """The clamp limit an activation has when the caller gives none (the table's)."""
    return ACTIVATIONS[activation].default_limit


def resolve_limit(activation: str, limit):
    """limit, with LIMIT_DEFAULT replaced by the activation's default limit (an unknown
    activation is left to check_activation)."""
    if isinstance(limit, str) and limit == LIMIT_DEFAULT and activation in ACTIVATIONS:
        return default_limit(activation)
    return limit


def up_width(activation: str, inter: int) -> int:
    """Columns of W_up: 2I (interleaved gate/linear) for gated activations, else I."""
    return 2 * inter if is_gated(activation) else inter


def _check_limit(op: str, name: str, limit) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        fail(op, name, "None or a float", type(limit).__name__)
    if not limit >= 0:
        fail(op, name, "None or a float >= 0", limit)


def check_activation(activation, limit, op: str) -> None:
    """activation one of the table's; limit (resolved: not LIMIT_DEFAULT) None or a float
    >= 0, and None for the activations that are not gated (they have no clamp)."""
    if activation not in ACTIVATIONS:
        fail(op, "activation", f"one of {tuple(ACTIVATIONS)}", repr(activation))
    if limit is not None and not is_gated(activation):
        fail(op, "limit", f"None for {activation!r} (clamp limits apply to gated activations)",
             limit)
    _check_limit(op, "limit", limit)


def check_act_params(alpha, limit, op: str, names: dict[str, str] | None = None) -> None:
    """alpha a real number, limit None or a real number >= 0. `names` renames them in the
    messages (e.g. {"alpha": "swiglu_alpha"})."""
    name = (names or {}).get
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        fail(op, name("alpha", "alpha"), "a float", type(alpha).__name__)
    _check_limit(op, name("limit", "limit"), limit)

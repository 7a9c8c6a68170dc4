"""Registration of the Python fake and CPU kernels of the library's ops."""
# The dispatcher hands a Python kernel its arguments with the trailing ones that equal the
# schema's defaults left out, so a kernel must fill those in with the schema's own
# defaults, not with defaults of its own that could drift from the C++ declaration (the
# default activation, for one). The kernels registered here take every argument
# positionally and get the missing ones from the schema.
from __future__ import annotations

import functools

import torch

__all__ = ["register_kernels"]


def _with_schema_defaults(name: str, kernel):
    """kernel called with every argument of cute_moe::name, defaults from its schema."""
    schema = getattr(torch.ops.cute_moe, name).default._schema
    params = [(a.name, a.default_value if a.has_default_value() else None)
              for a in schema.arguments]

    @functools.wraps(kernel)
    def with_defaults(*args, **kwargs):
        rest = [kwargs.get(arg, default) for arg, default in params[len(args):]]
        return kernel(*args, *rest)

    return with_defaults


def register_kernels(name: str, fake, cpu) -> None:
    """Registers fake (shapes, for tracing: torch.compile, FakeTensorMode) and cpu (the
    reference) as the kernels of cute_moe::name."""
    torch.library.register_fake(f"cute_moe::{name}", _with_schema_defaults(name, fake))
    torch.library.register_kernel(f"cute_moe::{name}", "cpu", _with_schema_defaults(name, cpu))

# Import path of the seed's public API (`from cutlass_op.bf16_grouped_mm import ...`);
# the implementation is the cute_moe package.
from . import bf16_grouped_mm

__all__ = ["bf16_grouped_mm"]

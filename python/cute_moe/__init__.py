# cute-moe: grouped GEMMs for mixture-of-experts layers (CUDA kernels behind torch ops,
# with pure-PyTorch references that double as the CPU implementation).
from . import reference, repack
from ._library import library_loaded
# The op modules register their fake and CPU kernels with the loaded library on import.
from .ops import fp8 as _fp8_ops, gemm as _gemm_ops, glu as _glu_ops, permute as _permute_ops  # noqa: F401
from .ops import routing as _routing_ops  # noqa: F401
from .ops.checks import offs_check_enabled, set_offs_check
from .expert_ffn import expert_ffn
from .swiglu import grouped_mm_downproj, grouped_mm_swiglu
from .functional import grouped_mm
from .gathered import grouped_mm_act_gathered
from . import permute  # the module: permute.permute / permute.unpermute
from . import fp8  # the module: fp8.quantize_1x128 / fp8.quantize_128x128 / fp8.grouped_mm / fp8.expert_ffn
from . import nn  # noqa: E402  (cute_moe.nn.MoE, GroupedExperts: built on the above)
from .reference import permute as reference_permute  # listed in __all__: reference/permute.py

__version__ = "0.1.0"

__all__ = ["grouped_mm", "grouped_mm_act_gathered", "expert_ffn", "grouped_mm_swiglu", "grouped_mm_downproj", "permute",
           "library_loaded", "set_offs_check", "offs_check_enabled", "nn", "fp8", "reference", "reference_permute", "repack", "__version__"]

# cute-moe: grouped GEMMs for mixture-of-experts layers (CUDA kernels behind torch ops,
# with pure-PyTorch references that double as the CPU implementation).
from . import reference
from ._library import library_loaded
from .functional import grouped_mm

__version__ = "0.1.0"

__all__ = ["grouped_mm", "library_loaded", "reference", "__version__"]

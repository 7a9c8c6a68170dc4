# BF16 grouped GEMMs with fused bias and SwiGLU epilogues for MoE expert FFNs, re-exported
# from cute_moe under the seed's import path.
from cute_moe import grouped_mm, grouped_mm_downproj, grouped_mm_swiglu
from cute_moe.repack import halves_to_interleaved, interleaved_to_halves

__all__ = ["grouped_mm_swiglu", "grouped_mm_downproj", "grouped_mm",
           "halves_to_interleaved", "interleaved_to_halves"]

"""Pure-PyTorch references of every op and layer: the tests' ground truth, the CPU fallback."""
# By feature: groups.py (group offsets), gemm.py (grouped GEMMs), activation.py (the
# activations, forward and backward), glu.py (GEMM plus activation), expert_ffn.py (one
# expert block), moe.py (a torchtitan-style MoE layer), permute.py (dispatch and combine
# gathers), routing.py (the router's top-k and the sort by expert), fp8.py (the FP8 recipe's
# block quantizers and GEMMs, docs/fp8.md; imported as cute_moe.reference.fp8). The references
# loop over groups and read offs and index values on the host, which the kernels never do;
# that is acceptable here and only here.
from ..activation_args import GATED_ACTIVATIONS, default_limit, up_width
from ..activations import ACTIVATIONS
from .activation import (act_bwd_ref, act_ref, activation_ref, glu_halves_ref, swiglu_oai_bwd_ref,
                         swiglu_oai_ref)
from .expert_ffn import expert_ffn_ref
from .gemm import grouped_bias_grad_ref, grouped_mm_ref, grouped_mm_scaled_ref, grouped_mm_wgrad_ref
from .glu import (grouped_mm_act_bwd_ref, grouped_mm_act_gathered_ref, grouped_mm_act_ref,
                  grouped_mm_swiglu_bwd_ref, grouped_mm_swiglu_ref)
from .groups import group_bounds, offsets_from_counts, rows_to_groups
from .moe import ReferenceMoE, experts_ref, route_ref
from .permute import (gather_rows_dot_ref, gather_rows_ref, gather_sum_rows_ref, permute_ref,
                      routing_indices, unpermute_ref)
from .routing import sort_by_expert_ref, top_k_ref

GATED = GATED_ACTIVATIONS  # the same tuple under its shorter name

__all__ = [
    # group offsets
    "offsets_from_counts", "group_bounds", "rows_to_groups",
    # grouped GEMMs
    "grouped_mm_ref", "grouped_mm_wgrad_ref", "grouped_bias_grad_ref", "grouped_mm_scaled_ref",
    # activations (the table is cute_moe/activations.py)
    "ACTIVATIONS", "GATED_ACTIVATIONS", "GATED", "default_limit", "up_width", "act_ref",
    "act_bwd_ref", "activation_ref", "glu_halves_ref", "swiglu_oai_ref", "swiglu_oai_bwd_ref",
    # GEMM plus activation, and the expert block
    "grouped_mm_swiglu_ref", "grouped_mm_swiglu_bwd_ref", "grouped_mm_act_ref",
    "grouped_mm_act_gathered_ref", "grouped_mm_act_bwd_ref", "expert_ffn_ref",
    # the MoE layer
    "experts_ref", "route_ref", "ReferenceMoE",
    # dispatch and combine
    "gather_rows_ref", "gather_sum_rows_ref", "gather_rows_dot_ref", "permute_ref",
    "unpermute_ref", "routing_indices", "top_k_ref", "sort_by_expert_ref",
]

# cute_moe.nn: the MoE layer as PyTorch modules (router, dispatch, experts, combine) on
# top of the fused expert kernels.
from .dispatch import (Dispatch, permute, sort_by_expert, sort_received, tokens_per_expert,
                       unpermute)
from .experts import GroupedExperts
from .moe import MoE
from .router import RouterOutput, TopKRouter

__all__ = ["MoE", "GroupedExperts", "TopKRouter", "RouterOutput", "Dispatch",
           "sort_by_expert", "sort_received", "tokens_per_expert", "permute", "unpermute"]

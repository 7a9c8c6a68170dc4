"""The kernel space of cute-moe, declared once: arches, operand variants, tiles per (arch,
variant), dtypes, activations. codegen/generate.py derives from it the per-kernel
translation units, the dispatch table, the enum <-> name tables of the core and the torch
layer, and the Python activation table (python/cute_moe/activations.py).

To add an activation: a functor in src/core/activations.h and a row in ACTIVATIONS.
To add a tile: a row in TILES (the heuristic, src/core/heuristics.cpp, picks rows by role);
an experiment's tile, for forced A/B runs: probe=True (built with -DCUTE_MOE_PROBES=ON only).
To compile a gated activation's clamps out for calls without a limit: LIMIT_FREE (and its tiles;
a tile with twins_only has no other kernels).
To add an arch: an Arch, its kernel headers in HEADERS and its TILES.
"""
from __future__ import annotations

from typing import NamedTuple


class Arch(NamedTuple):
    name: str       # file-name prefix of its kernels, e.g. "sm90"
    enum: str       # detail::Arch value
    major: int      # the compute capability its kernels run on
    minor: int
    gencode: str    # nvcc's -gencode value for its translation units
    devices: str    # for error messages


class Activation(NamedTuple):
    name: str       # the API's string ("swiglu_oai"), Python's and the torch ops'
    enum: str       # cute_moe::Activation::k<enum> and detail::Act::<enum>
    functor: str    # its functor in src/core/activations.h
    gated: bool     # reads interleaved (gate, linear) column pairs; h is half as wide
    default_limit: float | None  # the clamp limit when the caller does not give one
    fused_forward: bool          # has a fused forward kernel ("none"'s forward is a plain GEMM)
    formula: str    # for the generated header's comment


class Variant(NamedTuple):
    enum: str       # detail::KernelVariant value
    call: str       # the public call it serves, as list_kernels() reports it
    what: str       # for error messages and logs
    ragged: str     # "m" (forward, input gradient) or "k" (weight gradient)
    acts: str       # which activations get a kernel: "unfused", "forward", "backward" or
                    # "backward_gated" (the gated ones)
    family: str     # which arch header holds its traits (HEADERS)
    out: str        # element type of D, one of DTYPES (the fused backward stores bf16 pairs)
    ab: str = "bf16"  # element type of A and B, one of DTYPES


class Tile(NamedTuple):
    tile_m: int
    tile_n: int
    tile_k: int
    cluster_m: int
    cluster_n: int
    schedule: str   # one of SCHEDULES
    # compiled only as the LIMIT_FREE twins of its role's activations (the role must be in
    # LIMIT_FREE_TILES): a tile the heuristic picks only for calls without a limit
    twins_only: bool = False
    # an experiment's tile: compiled only in a build configured with -DCUTE_MOE_PROBES=ON
    # (never in CI's), run only when forced (CUTE_MOE_CONFIG): a ragged-M role's first tile
    # on another cluster, after it (generate.py checks), so the heuristic never picks it
    probe: bool = False


ARCHES = (
    Arch("sm90", "Sm90", 9, 0, "arch=compute_90a,code=sm_90a", "Hopper (H100, H200)"),
)

# The epilogue activations. "none" exists for the fused backward of a plain up-projection.
ACTIVATIONS = (
    Activation("swiglu_oai", "SwigluOai", "SwigluOai", True, 7.0, True,
               "g = min(a, L), u = clamp(b, -L, L), h = g * sigmoid(alpha * g) * (u + 1)"),
    Activation("swiglu", "Swiglu", "Swiglu", True, None, True, "h = silu(g) * u (optional clamps)"),
    Activation("geglu", "Geglu", "Geglu", True, None, True, "h = gelu_tanh(g) * u (optional clamps)"),
    Activation("srelu", "Srelu", "SquaredRelu", False, None, True, "h = relu(a)^2"),
    Activation("none", "Identity", "Identity", False, None, False, "h = a"),
)
DEFAULT_ACTIVATION = "swiglu_oai"


class LimitFree(NamedTuple):
    of: str         # the ACTIVATIONS name it serves when called without a limit
    name: str       # its kernels' activation name (list_kernels, file names); not an API name
    enum: str       # its detail::Act value
    functor: str    # its functor in src/core/activations.h (no clamps, no masks compiled in)


# Limit-free twins of gated activations: the same kernels with the clamps and in-range masks
# compiled out, which the host runs instead of the clamping kernel of the same tile when a
# call gives no limit (Qwen3-MoE, Mixtral, DeepSeek-V3: "swiglu" never clamps). Compiled only
# for the tiles in LIMIT_FREE_TILES (the heuristic's picks at the models' shapes); any other
# tile serves such a call with its clamping kernel at limit +inf, as before.
LIMIT_FREE = (
    LimitFree("swiglu", "swiglu_nolimit", "SwigluNoLimit", "SwigluNoLimit"),
)
DEFAULT_ALPHA = 1.702  # swiglu_oai's sigmoid scale

# Element types (C++ spelling) of the operands (Variant.ab) and outputs (Variant.out).
DTYPES = {"bf16": "cutlass::bfloat16_t", "f32": "float", "e4m3": "cutlass::float_e4m3_t"}

VARIANTS = (
    Variant("RaggedM_BRow", "ragged_m", "ragged_m (weight n-contiguous)", "m", "unfused",
            "ragged_m", "bf16"),
    Variant("RaggedM_BCol", "ragged_m_bcol", "ragged_m (weight k-contiguous)", "m", "unfused",
            "ragged_m", "bf16"),
    Variant("RaggedK_OutBF16", "ragged_k_bf16", "ragged_k (bf16 output)", "k", "unfused",
            "ragged_k", "bf16"),
    Variant("RaggedK_OutF32", "ragged_k_f32", "ragged_k (fp32 output)", "k", "unfused",
            "ragged_k", "f32"),
    Variant("ActFwd_BRow", "act_forward", "act_forward (weight n-contiguous)", "m", "forward",
            "act_forward", "bf16"),
    Variant("ActFwd_BCol", "act_forward_bcol", "act_forward (weight k-contiguous)", "m", "forward",
            "act_forward", "bf16"),
    Variant("ActFwdGather_BRow", "act_forward_gather",
            "act_forward (gathered rows, weight n-contiguous)", "m", "forward", "gather", "bf16"),
    Variant("ActBwd_BRow", "act_backward", "act_backward (weight n-contiguous)", "m", "backward",
            "act_backward", "bf16"),
    Variant("ActBwd_BCol", "act_backward_bcol", "act_backward (weight k-contiguous)", "m",
            "backward", "act_backward", "bf16"),
    Variant("ActBwdHalves_BRow", "act_backward_halves",
            "act_backward (dpre as [dgate | dlinear] halves, weight n-contiguous)", "m",
            "backward_gated", "act_backward", "bf16"),
    # FP8 (docs/fp8.md): e4m3 operands with fp32 block scales applied per 128-long k-block,
    # A by 1 x 128 blocks, B by 128 x 128; both k-major (FP8 tensor cores read no other).
    Variant("Fp8RaggedM", "fp8_ragged_m",
            "fp8_ragged_m (e4m3 x e4m3, 1x128 / 128x128 block scales, weight k-contiguous)", "m",
            "unfused", "fp8", "bf16", ab="e4m3"),
    # The fused activation epilogues on the FP8 mainloop: the up projection (pre and h in
    # bf16) and the down projection's input gradient with the activation's backward.
    Variant("Fp8ActFwd", "fp8_act_forward",
            "fp8_act_forward (e4m3 x e4m3, 1x128 / 128x128 block scales, weight k-contiguous)",
            "m", "forward", "fp8", "bf16", ab="e4m3"),
    Variant("Fp8ActBwd", "fp8_act_backward",
            "fp8_act_backward (e4m3 x e4m3, 1x128 / 128x128 block scales, weight k-contiguous)",
            "m", "backward", "fp8", "bf16", ab="e4m3"),
    # The weight gradients: A (the activation) by 128 x 1 blocks of the routed rows, B (the
    # gradient) by 128 x 128, both transposed (quantize_fp8_128x1's q_t: k-major, each expert's
    # rows whole 128-column blocks). (Its `what` still says "128x1 on both": changing it
    # regenerates kernel_enums.h, a full rebuild; to be mended with the next one.)
    Variant("Fp8RaggedK", "fp8_ragged_k",
            "fp8_ragged_k (e4m3 x e4m3, 128x1 block scales on both, k-major)", "k", "unfused",
            "fp8", "bf16", ab="e4m3"),
)

# Per arch, the header (under src/core) that defines each variant family's traits.
HEADERS = {
    "sm90": {"ragged_m": "sm90/ragged_m_variants.cuh", "ragged_k": "sm90/ragged_k_variants.cuh",
             "act_forward": "sm90/act_forward_variants.cuh",
             "act_backward": "sm90/act_backward_variants.cuh",
             "gather": "sm90/gather_variants.cuh", "fp8": "sm90/fp8_variants.cuh"},
}

# How a tile's warps share the work, and each one's short name in configuration names:
# Cooperative: 2 consumer warpgroups share a tile; Pingpong: they alternate tiles;
# StoreWarp: cooperative consumers that write the whole output tile to shared memory once and
# leave its TMA stores to a producer warp (src/core/sm90/store_warp_kernel.cuh), only for
# variants whose epilogue has that kernel (the plain FP8 GEMM's).
SCHEDULES = {"Cooperative": "coop", "Pingpong": "pong", "StoreWarp": "store"}

# The roles the heuristic chooses between (src/core/heuristics.cpp); every variant has a
# "wide" tile, its default.
TILE_ROLES = {
    "wide": "long reductions and the fused backward: the largest tile",
    "narrow": "short reductions: pingpong (or FP8's store warp) overlaps one tile's epilogue with the next mainloop",
    "small": "tiny groups (a few rows per expert): less padding per tile",
    "mid": "the fused-activation kernels' default: 128x192 (the heavy epilogue with fewer registers)",
}

_WIDE = Tile(128, 256, 64, 2, 1, "Cooperative")
_NARROW = Tile(128, 128, 64, 2, 1, "Pingpong")
_SMALL = Tile(64, 128, 128, 1, 1, "Pingpong")
_MID_PONG = Tile(128, 192, 64, 2, 1, "Pingpong")
_MID_COOP = Tile(128, 192, 64, 2, 1, "Cooperative")
# The fused backward of calls without a limit and without a bias gradient (Qwen3-MoE,
# Mixtral, DeepSeek): pingpong overlaps one tile's heavy epilogue with the next mainloop,
# which needs the cooperative tile's column sums out of the epilogue (they do not fit next
# to a warpgroup's whole 128x192 accumulator). Even so it spills 152-192 bytes, per-tile
# scalars outside the k-loop, and is 1.18-1.22x the cooperative kernel at Qwen3-30B-A3B
# (docs/perf-notes.md, session 23).
_MID_PONG_TWINS = Tile(128, 192, 64, 2, 1, "Pingpong", twins_only=True)
# The weight gradients' mid tile on other clusters, for outputs whose row tiles leave a 2x1
# cluster a spare CTA (an odd count: 2880 = 22.5 x 128): along N where its column tiles pair
# up, else alone (src/core/heuristics.cpp; docs/perf-notes.md, session 22).
_MID_PONG_1X2 = Tile(128, 192, 64, 1, 2, "Pingpong")
_MID_PONG_1X1 = Tile(128, 192, 64, 1, 1, "Pingpong")
# Probes (Tile.probe: -DCUTE_MOE_PROBES=ON builds, forced A/B runs) go here, each a ragged-M
# role's tile after the one it is measured against. None now: the last, 2x2 clusters under
# the 128x192 and FP8 128x128 tiles, ran 12-23% slower than their 2x1 tiles on an H100
# (docs/perf-notes.md, session 26).
# FP8: a k-tile of 128 is one scale block (the mainloop promotes once per k-tile)
_FP8_WIDE = Tile(128, 128, 128, 2, 1, "Cooperative")
_FP8_WIDE_1X1 = Tile(128, 128, 128, 1, 1, "Cooperative")  # the weight gradient's, as _MID_PONG_1X1
# The fused up projection: its two CTAs hold the two halves (128 columns of pre each) of a 1 x 128
# block of h, so its e4m3 copy needs their row amaxes exchanged (sm90/fp8_h_epilogue.cuh).
_FP8_WIDE_1X2 = Tile(128, 128, 128, 1, 2, "Cooperative")
# The plain FP8 GEMM over short reductions: the cooperative tile with its epilogue handed to
# a store warp, so the next tile's mainloop starts sooner: 1.12-1.14x at K = 768, 1.00-1.01x
# at K = 2048-2880, but 0.96x at K = 5760 (H200, docs/perf-notes.md, session 36).
_FP8_STORE = Tile(128, 128, 128, 2, 1, "StoreWarp")
# The fused backward on pingpong: its heavy epilogue under the other warpgroup's mainloop. A
# warpgroup holds 64 x 128 of an FP8 tile (its accumulator and the two promotion temporaries:
# 192 registers), so the tile halves in M: 1.17x / 1.02x the cooperative kernel at GPT-OSS-20B
# / Qwen3-30B-A3B (H100), the same bits; the plain GEMM and the fused forward lose on it
# (0.83-0.97x: docs/perf-notes.md, session 26).
_FP8_PONG = Tile(64, 128, 128, 2, 1, "Pingpong")

# Per (arch, variant), the compiled tiles by role (a tile, or a tuple of tiles the heuristic
# picks between within the role), in dispatch-table order (the cost model keeps the earlier
# of two equally cheap rows). The 128x192 "mid" tiles: 5-40% faster
# than 128x256 / 128x128 for the fused activation kernels at GPT-OSS-20B and Qwen3-30B-A3B
# (docs/perf-notes.md, "128x192 tiles"); the plain ragged-M GEMMs have them for the sweep tools.
TILES = {
    ("sm90", "RaggedM_BRow"): {"wide": _WIDE, "narrow": _NARROW, "small": _SMALL,
                               "mid": _MID_PONG},
    ("sm90", "RaggedM_BCol"): {"wide": _WIDE, "narrow": _NARROW, "small": _SMALL, "mid": _MID_PONG},
    ("sm90", "RaggedK_OutBF16"): {"wide": _WIDE, "narrow": _NARROW, "mid": (_MID_PONG, _MID_PONG_1X2, _MID_PONG_1X1)},
    ("sm90", "RaggedK_OutF32"): {"wide": _WIDE, "narrow": _NARROW},
    ("sm90", "ActFwd_BRow"): {"wide": _WIDE, "narrow": _NARROW, "mid": _MID_PONG},
    ("sm90", "ActFwd_BCol"): {"wide": _WIDE, "narrow": _NARROW, "mid": _MID_PONG},
    ("sm90", "ActFwdGather_BRow"): {"wide": _WIDE, "narrow": _NARROW},
    ("sm90", "ActBwd_BRow"): {"wide": _WIDE, "mid": (_MID_COOP, _MID_PONG_TWINS)},
    ("sm90", "ActBwd_BCol"): {"wide": _WIDE, "mid": (_MID_COOP, _MID_PONG_TWINS)},
    ("sm90", "ActBwdHalves_BRow"): {"wide": _WIDE, "mid": (_MID_COOP, _MID_PONG_TWINS)},
    ("sm90", "Fp8RaggedM"): {"wide": _FP8_WIDE, "narrow": _FP8_STORE},
    ("sm90", "Fp8ActFwd"): {"wide": _FP8_WIDE_1X2},
    ("sm90", "Fp8ActBwd"): {"wide": (_FP8_PONG, _FP8_WIDE)},
    ("sm90", "Fp8RaggedK"): {"wide": (_FP8_WIDE, _FP8_WIDE_1X1)},
}

# Per (arch, variant), the tile roles that also get LIMIT_FREE twins: the fused kernels' mid
# tiles, and the gathered forward's two tiles (it has no mid one).
LIMIT_FREE_TILES = {
    ("sm90", "ActFwd_BRow"): ("mid",),
    ("sm90", "ActFwd_BCol"): ("mid",),
    ("sm90", "ActFwdGather_BRow"): ("wide", "narrow"),
    ("sm90", "ActBwd_BRow"): ("mid",),
    ("sm90", "ActBwd_BCol"): ("mid",),
    ("sm90", "ActBwdHalves_BRow"): ("mid",),
}


def role_tiles(tiles: dict) -> list[tuple[str, Tile]]:
    """A TILES entry as (role, tile) pairs, in order (a role's tuple of tiles flattened; a Tile
    is itself a tuple, of ints)."""
    return [(role, t) for role, ts in tiles.items() for t in (ts if isinstance(ts[0], tuple) else (ts,))]

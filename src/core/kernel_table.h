// The table of grouped-GEMM kernels compiled into the library.
//
// One row = one kernel instantiation = one generated translation unit (CMake reads the
// rows of CUTE_MOE_KERNEL_TABLE below with a regex, so keep one row per line). The
// runtime dispatch table is built from the same rows, so adding a configuration is
// adding a line here; the heuristic (heuristics.cpp) decides when it is used.
//
// Columns: X(variant, tile_m, tile_n, tile_k, cluster_m, cluster_n, schedule, act)
//   variant   which operands/layouts (see KernelVariant)
//   tile_*    CTA tile (BLK_M, BLK_N, BLK_K)
//   cluster_* thread-block cluster (multicast of the shared operand)
//   schedule  Cooperative (2 consumer warpgroups share one tile) or Pingpong (they
//             alternate tiles, overlapping one's epilogue with the other's mainloop)
//   act       the activation of a GLU variant's epilogue (Act), None elsewhere
#pragma once

#include "kernel_types.h"  // KernelVariant, Schedule, TileConfig

// clang-format off
#define CUTE_MOE_KERNEL_TABLE(X) \
  X(RaggedM_BRow,   128, 256,  64, 2, 1, Cooperative, None) \
  X(RaggedM_BRow,   128, 128,  64, 2, 1, Pingpong,   None) \
  X(RaggedM_BRow,    64, 128, 128, 1, 1, Pingpong,   None) \
  X(RaggedM_BCol,   128, 256,  64, 2, 1, Cooperative, None) \
  X(RaggedM_BCol,   128, 128,  64, 2, 1, Pingpong,   None) \
  X(RaggedM_BCol,    64, 128, 128, 1, 1, Pingpong,   None) \
  X(RaggedK_OutBF16, 128, 256,  64, 2, 1, Cooperative, None) \
  X(RaggedK_OutBF16, 128, 128,  64, 2, 1, Pingpong,   None) \
  X(RaggedK_OutF32, 128, 256,  64, 2, 1, Cooperative, None) \
  X(RaggedK_OutF32, 128, 128,  64, 2, 1, Pingpong,   None) \
  X(GluFwd_BRow,    128, 256,  64, 2, 1, Cooperative, SwigluOai) \
  X(GluFwd_BRow,    128, 256,  64, 2, 1, Cooperative, Swiglu) \
  X(GluFwd_BRow,    128, 256,  64, 2, 1, Cooperative, Geglu) \
  X(GluFwd_BRow,    128, 256,  64, 2, 1, Cooperative, Srelu) \
  X(GluFwd_BRow,    128, 128,  64, 2, 1, Pingpong,   SwigluOai) \
  X(GluFwd_BRow,    128, 128,  64, 2, 1, Pingpong,   Swiglu) \
  X(GluFwd_BRow,    128, 128,  64, 2, 1, Pingpong,   Geglu) \
  X(GluFwd_BRow,    128, 128,  64, 2, 1, Pingpong,   Srelu) \
  X(GluFwd_BCol,    128, 256,  64, 2, 1, Cooperative, SwigluOai) \
  X(GluFwd_BCol,    128, 256,  64, 2, 1, Cooperative, Swiglu) \
  X(GluFwd_BCol,    128, 256,  64, 2, 1, Cooperative, Geglu) \
  X(GluFwd_BCol,    128, 256,  64, 2, 1, Cooperative, Srelu) \
  X(GluFwd_BCol,    128, 128,  64, 2, 1, Pingpong,   SwigluOai) \
  X(GluFwd_BCol,    128, 128,  64, 2, 1, Pingpong,   Swiglu) \
  X(GluFwd_BCol,    128, 128,  64, 2, 1, Pingpong,   Geglu) \
  X(GluFwd_BCol,    128, 128,  64, 2, 1, Pingpong,   Srelu) \
  X(GluFwdGather_BRow, 128, 256,  64, 2, 1, Cooperative, SwigluOai) \
  X(GluFwdGather_BRow, 128, 256,  64, 2, 1, Cooperative, Swiglu) \
  X(GluFwdGather_BRow, 128, 256,  64, 2, 1, Cooperative, Geglu) \
  X(GluFwdGather_BRow, 128, 256,  64, 2, 1, Cooperative, Srelu) \
  X(GluFwdGather_BRow, 128, 128,  64, 2, 1, Pingpong,   SwigluOai) \
  X(GluFwdGather_BRow, 128, 128,  64, 2, 1, Pingpong,   Swiglu) \
  X(GluFwdGather_BRow, 128, 128,  64, 2, 1, Pingpong,   Geglu) \
  X(GluFwdGather_BRow, 128, 128,  64, 2, 1, Pingpong,   Srelu) \
  X(GluBwd_BRow,    128, 256,  64, 2, 1, Cooperative, SwigluOai) \
  X(GluBwd_BRow,    128, 256,  64, 2, 1, Cooperative, Swiglu) \
  X(GluBwd_BRow,    128, 256,  64, 2, 1, Cooperative, Geglu) \
  X(GluBwd_BRow,    128, 256,  64, 2, 1, Cooperative, Srelu) \
  X(GluBwd_BRow,    128, 256,  64, 2, 1, Cooperative, Identity) \
  X(GluBwd_BCol,    128, 256,  64, 2, 1, Cooperative, SwigluOai) \
  X(GluBwd_BCol,    128, 256,  64, 2, 1, Cooperative, Swiglu) \
  X(GluBwd_BCol,    128, 256,  64, 2, 1, Cooperative, Geglu) \
  X(GluBwd_BCol,    128, 256,  64, 2, 1, Cooperative, Srelu) \
  X(GluBwd_BCol,    128, 256,  64, 2, 1, Cooperative, Identity)
// clang-format on

// The vocabulary of kernel_table.h rows: operand variants, schedules, a tile
// configuration. Kept apart from the table itself so that the kernel translation units,
// which need only these types, do not recompile when a row is added.
#pragma once

namespace cute_moe::detail {

// Operand layouts and output type of a kernel; the variant is fixed by the arguments
// (weight layout, gradient dtype), the tile configuration by the heuristic.
enum class KernelVariant {
  RaggedM_BRow,     // y = x @ W_e,   W_e (k x n) with unit stride along n
  RaggedM_BCol,     // y = x @ W_e,   W_e (k x n) with unit stride along k
  RaggedK_OutBF16,  // dw_e = x_e^T @ dy_e, bf16 output
  RaggedK_OutF32,   // dw_e = x_e^T @ dy_e, fp32 output
  GluFwd_BRow,      // ragged M, epilogue: pre = scale * acc + bias stored as D, h = act(pre) as aux
  GluFwd_BCol,
  GluFwdGather_BRow,  // GluFwd_BRow whose A rows are gathered from x by a row index (the
                      //   MoE dispatch's permutation fused into the A load, gather_mainloop.cuh)
  GluBwd_BRow,      // ragged M, epilogue: reads pre (as C), dpre = dact(row_scale * scale * acc) as D,
  GluBwd_BCol,      //   row_scale * act(pre) as aux, row_scale-gradient partials
};

// The activation compiled into a GLU variant's epilogue (None for the other variants;
// Identity is the "none" activation's fused backward).
// A compile-time choice: one kernel per activation keeps each epilogue's code small (a
// runtime switch made the fused backward instruction-cache bound, docs/perf-notes.md).
enum class Act { None, SwigluOai, Swiglu, Geglu, Srelu, Identity };

enum class Schedule { Cooperative, Pingpong };

struct TileConfig {
  KernelVariant variant;
  int tile_m, tile_n, tile_k;
  int cluster_m, cluster_n;
  Schedule schedule;
  Act act = Act::None;
};

}  // namespace cute_moe::detail

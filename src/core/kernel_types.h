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
  GluFwd_BRow,      // ragged M, epilogue: pre = acc + bias stored as D, h = act(pre) as aux
  GluFwd_BCol,
  GluBwd_BRow,      // ragged M, epilogue: reads pre (as C), dpre = dact as aux, h = act(pre) as D
  GluBwd_BCol,
};

enum class Schedule { Cooperative, Pingpong };

struct TileConfig {
  KernelVariant variant;
  int tile_m, tile_n, tile_k;
  int cluster_m, cluster_n;
  Schedule schedule;
};

}  // namespace cute_moe::detail

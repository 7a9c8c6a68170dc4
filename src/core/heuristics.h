// Choosing a tile configuration for a grouped GEMM.
//
// The choice sees only what the host knows: the total row count m (an upper bound of
// the routed rows), n, k and the group count, never the routing itself. It is a pure
// function of those and the candidate list, so the C++ tests can check it without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernel_types.h"

namespace cute_moe::detail {

// "128x256x64_2x1_coop": the name users pass in GemmOptions::config / CUTE_MOE_CONFIG.
std::string tile_config_name(const TileConfig& c);

// The GEMM of one group, as the host sees it. For ragged M the rows per group are only
// known on average (m / groups); for ragged K every group has the same (k x n) output.
struct GroupedProblem {
  KernelVariant variant;
  int64_t m, n, k;
  int32_t num_groups;
  Act act = Act::Unfused;  // the activation variants' activation
  Arch arch = Arch::Sm90;  // the device's
  bool limit_free = false;   // an activation call without a clamp limit: act's LIMIT_FREE twins serve it too
  bool column_sums = false;  // the fused backward asked for dpre's column sums (a bias gradient)
};

// Whether a compiled kernel computes this problem's variant (and activation) on its arch.
inline bool serves(const TileConfig& c, const GroupedProblem& p) {
  const Act twin = limit_free_twin(p.act);
  const bool act = c.act == p.act || (p.limit_free && twin != Act::Unfused && c.act == twin);
  return c.variant == p.variant && act && c.arch == p.arch;
}

// Whether a fused-backward kernel sums dpre's columns (the bias gradient) in its epilogue:
// the cooperative 128-row tiles, whose epilogue subtiles span the tile's rows (as
// Sm90ActBackward::kColumnSums says on the device). Others leave it to a pass over dpre.
inline bool fuses_column_sums(const TileConfig& c) { return c.schedule == Schedule::Cooperative && c.tile_m == 128; }

// Output tiles of one launch with this tile shape, the rows spread evenly over groups.
int64_t output_tiles(const GroupedProblem& p, const TileConfig& c);

// CTA tiles of one launch once every cluster is whole (a cluster past the output's last row
// or column tile still runs its spare CTAs, which share the cluster's multicast loads).
int64_t cluster_padded_tiles(const GroupedProblem& p, const TileConfig& c);

// Estimated cost in arbitrary units: full waves of tiles over `sm_count` persistent
// CTAs, each tile weighted by its area over the configuration's relative throughput.
double estimated_cost(const GroupedProblem& p, const TileConfig& c, int sm_count);

// Index into `candidates` of the cheapest configuration serving p by the cost model,
// or -1 if none.
int choose_tile_config(const GroupedProblem& p, const std::vector<TileConfig>& candidates, int sm_count);

// The full choice for a launch: which kernel, and the persistent scheduler's tile order.
struct LaunchChoice {
  int index = -1;           // into the candidates
  bool raster_along_n = false;
  // Handed to CUTLASS's group scheduler, which does not apply it: without host copies of
  // the problem shapes it sizes its logical grid as (SMs, 1) and so picks log swizzle 0
  // (docs/perf-notes.md, session 11). The rules below keep the values they were measured
  // with; the differences those sweeps saw between swizzles were noise.
  int swizzle = 1;
  bool dynamic_schedule = false;  // weight gradients: tiles from the atomic counter
};

// Measured rules first (docs/perf-notes.md), by tile role (codegen/kernel_space.py): every
// kernel takes its "mid" tile (128x192) where compiled, except the weight gradient of a
// wide output over deep groups (n >= 4096, >= 2048 rows per group on average), which takes
// the "wide" one (128x256 cooperative) along m, swizzle 4. The mid tile's order: along n
// (the expert's weight strip stays in L2 while row tiles stream past), swizzle 4 for the
// fused kernels and the weight gradients (2 for the fused forward over shallow groups),
// 2 for plain ragged-M GEMMs over deep groups, and along m unswizzled for plain GEMMs over
// shallow ones. Without a mid tile: a short reduction (ragged M: k <= 3072; ragged K:
// <= 1536 rows per group on average, since skew deepens some groups; n <= 3072 for both)
// runs the "narrow" tile (128x128 pingpong), longer ones and the fused backward the "wide"
// one; tall groups (rows per group >= n) and pingpong launches walk along n. The cost model
// decides when the variant has no tile of the wanted role, and for tiny ragged-M groups
// (<= 64 rows on average), where the "small" tile can win. Weight gradients over deep
// groups (>= 2048 rows per group on average) take the dynamic tile schedule.
LaunchChoice choose_launch(const GroupedProblem& p, const std::vector<TileConfig>& candidates, int sm_count);

}  // namespace cute_moe::detail

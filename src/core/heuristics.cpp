// Tile-configuration heuristic: a wave-quantisation cost model (see heuristics.h).
#include "heuristics.h"

#include <cmath>
#include <limits>

namespace cute_moe::detail {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Throughput of a full tile relative to the 128x256 cooperative kernel, from the
// measurements in docs/perf-notes.md: smaller tiles re-read more operand bytes per FLOP
// and pingpong hides the epilogue, which matters most when tiles are small.
double relative_rate(const TileConfig& c) {
  const int area = c.tile_m * c.tile_n;
  if (area >= 128 * 256) return 1.0;
  if (area >= 128 * 128) return c.schedule == Schedule::Pingpong ? 0.95 : 0.9;
  return 0.7;
}

}  // namespace

std::string tile_config_name(const TileConfig& c) {
  return std::to_string(c.tile_m) + "x" + std::to_string(c.tile_n) + "x" + std::to_string(c.tile_k) + "_" +
         std::to_string(c.cluster_m) + "x" + std::to_string(c.cluster_n) + "_" +
         schedule_short_name(c.schedule);
}

int64_t output_tiles(const GroupedProblem& p, const TileConfig& c) {
  if (is_ragged_m(p.variant)) {
    // Each group's rows are padded to whole tiles; assume an even spread (the host does
    // not know the routing) but never fewer than one row per non-empty group.
    const int64_t rows_per_group = std::max<int64_t>(1, ceil_div(p.m, p.num_groups));
    return p.num_groups * ceil_div(rows_per_group, c.tile_m) * ceil_div(p.n, c.tile_n);
  }
  return p.num_groups * ceil_div(p.k, c.tile_m) * ceil_div(p.n, c.tile_n);
}

int64_t cluster_padded_tiles(const GroupedProblem& p, const TileConfig& c) {
  const int64_t rows = is_ragged_m(p.variant) ? std::max<int64_t>(1, ceil_div(p.m, p.num_groups)) : p.k;
  const int64_t tiles_m = ceil_div(ceil_div(rows, c.tile_m), c.cluster_m) * c.cluster_m;
  const int64_t tiles_n = ceil_div(ceil_div(p.n, c.tile_n), c.cluster_n) * c.cluster_n;
  return p.num_groups * tiles_m * tiles_n;
}

double estimated_cost(const GroupedProblem& p, const TileConfig& c, int sm_count) {
  const int64_t ctas = std::max(1, sm_count);
  const int64_t waves = ceil_div(output_tiles(p, c), ctas);
  return static_cast<double>(waves) * c.tile_m * c.tile_n / relative_rate(c);
}

int choose_tile_config(const GroupedProblem& p, const std::vector<TileConfig>& candidates, int sm_count) {
  int best = -1;
  double best_cost = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!serves(candidates[i], p)) continue;
    const double cost = estimated_cost(p, candidates[i], sm_count);
    if (cost < best_cost) {  // strict: ties keep the earlier (table-order) row
      best_cost = cost;
      best = static_cast<int>(i);
    }
  }
  return best;
}

LaunchChoice choose_launch(const GroupedProblem& p, const std::vector<TileConfig>& candidates, int sm_count) {
  const bool ragged_m = is_ragged_m(p.variant);
  const int64_t rows_per_group = std::max<int64_t>(1, ceil_div(p.m, p.num_groups));
  // Length of the reduction. For ragged K it is the group's rows, which routing skew can
  // make many times the average: only clearly shallow groups count as short there.
  const bool short_reduction = ragged_m ? p.k <= 3072 && p.n <= 3072 : rows_per_group <= 1536 && p.n <= 3072;
  // The fused activation backward's epilogue (dact, two outputs, the row-scale-gradient
  // sums) is the heaviest: fewer, larger tiles won 3-4% at both the GPT-OSS and the
  // Qwen3 shapes (docs/perf-notes.md, "activation family").
  // The plain FP8 GEMM's narrow row is its store-warp kernel: 1.12-1.14x at K = 768,
  // 1.00-1.01x at K = 2048-2880 (both models' other short calls), 0.96x at GPT-OSS-20B's up
  // dgrad (K = 5760, a wide call) on an H200 (docs/perf-notes.md, session 36).
  const TileRole rule = short_reduction && !is_act_backward(p.variant) ? TileRole::Narrow : TileRole::Wide;
  // the first row serving p in this role (and on this schedule, where one is named)
  auto first_with_role = [&](TileRole role, const Schedule* schedule = nullptr) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      const TileConfig& c = candidates[i];
      if (serves(c, p) && c.role == role && (schedule == nullptr || c.schedule == *schedule)) {
        return static_cast<int>(i);
      }
    }
    return -1;
  };

  LaunchChoice choice;
  // The "mid" tile (128x192) where compiled: at GPT-OSS-20B and Qwen3-30B-A3B the fused
  // kernels 5-40% faster than the rule's tile (docs/perf-notes.md, "128x192 tiles"), the
  // weight gradients 9-23% (session 6), and the plain ragged-M GEMMs 12-28%, long reductions
  // included once they walk along n (the GPT-OSS up dgrad at k = 5760: 4.65-4.75 ms against
  // 4.76-5.44 on 128x256; session 9).
  // The weight gradients too, wide outputs included: GPT-OSS-20B's up projection (n = 5760,
  // 3072 rows per expert) ran 6-25% faster on 128x256 cooperative in session 9, but under
  // the deepest-first dynamic schedule (session 11) 128x192 pingpong along n is 5.6-5.9%
  // faster than it (5.23 / 5.42 ms against 5.55 / 5.74, balanced / skewed; session 14).
  const bool deep_groups = rows_per_group >= 2048;
  choice.index = first_with_role(TileRole::Mid);
  // The fused backward without column sums to keep: the mid tile's pingpong kernel where
  // one serves p (the limit-free twins'), its heavy epilogue overlapping the other
  // warpgroup's mainloop: at Qwen3-30B-A3B 1.18-1.22x the cooperative one (H100,
  // balanced / skewed; docs/perf-notes.md, session 23).
  if (is_act_backward(p.variant) && !p.column_sums) {
    const Schedule pingpong = Schedule::Pingpong;
    const int twin = first_with_role(TileRole::Mid, &pingpong);
    if (twin >= 0) choice.index = twin;
  }
  if (choice.index < 0) choice.index = first_with_role(rule);
  // Tiny groups (<= 64 rows on average): mostly padding in a 128-row tile; let the cost
  // model weigh the 64-row tiles.
  if (choice.index < 0 || (ragged_m && rows_per_group <= 64)) choice.index = choose_tile_config(p, candidates, sm_count);
  if (choice.index < 0) return choice;  // nothing compiled serves p
  // A weight gradient whose row tiles leave the chosen tile's 2x1 clusters a spare CTA in
  // every group (an odd count: GPT-OSS-20B's H = I = 2880 are 22.5 tiles of 128, so 24 CTA
  // tiles run for 22.5; the spare one still loads and multicasts its half of B) takes the same
  // tile on the cluster that runs the fewest CTA tiles where one is compiled (the mid tile's,
  // the FP8 tile's), if clearly fewer (3%), walked along m; on a tie the earlier in the table,
  // 1x2 (multicast kept) before 1x1. H100, session 22, against the mid tile's 2x1 along n:
  // GPT-OSS-20B's up projection (2I = 5760: 30 column tiles pair up) 1x2 1.05-1.08x faster,
  // balanced and skewed; its down projection (2880 x 2880: 15 column tiles) 1x1 1.015x /
  // 1.04x (1x2 0.95x); along n either loses 13-43%. The FP8 tile (n tiles odd at both) on
  // 1x1 1.03-1.04x faster than on 2x1, both along m.
  bool cluster_not_2x1 = false;
  if (!ragged_m && candidates[choice.index].cluster_m == 2) {
    const TileConfig& two = candidates[choice.index];
    const int64_t padded = cluster_padded_tiles(p, two);
    int64_t fewest = padded;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const TileConfig& c = candidates[i];
      if (!serves(c, p) || c.role != two.role || c.cluster_m != 1 || c.tile_m != two.tile_m ||
          c.tile_n != two.tile_n || c.tile_k != two.tile_k || c.schedule != two.schedule) {
        continue;
      }
      const int64_t tiles = cluster_padded_tiles(p, c);
      if (tiles < fewest && tiles < 0.97 * static_cast<double>(padded)) {
        fewest = tiles;
        choice.index = static_cast<int>(i);
        cluster_not_2x1 = true;
      }
    }
  }
  // A weight gradient whose output the mid tile covers in clearly more waves' worth of work
  // than the 128x128 pingpong tile (ragged K: every group's whole output, its size known on
  // the host) takes the narrow tile: the seed example's down projection (8 experts of 1024 x
  // 2048: 704 mid tiles are 5.3 waves of 132 CTAs, 1024 narrow ones 7.8) ran 6-8% faster on
  // it (H100, session 15), while at GPT-OSS-20B and Qwen3-30B-A3B (margins of -2..+3%) the
  // mid tile stays 3-17% ahead: the narrow tile reads 1.25x the operand bytes per output, so
  // it must win on waves by 5% or more.
  bool narrow_fit = false;
  if (!ragged_m && candidates[choice.index].role == TileRole::Mid) {
    const int narrow = first_with_role(TileRole::Narrow);
    narrow_fit = narrow >= 0 && estimated_cost(p, candidates[narrow], sm_count) <
                                    0.95 * estimated_cost(p, candidates[choice.index], sm_count);
    if (narrow_fit) choice.index = narrow;
  }
  const TileConfig& chosen = candidates[choice.index];
  const bool pingpong = chosen.schedule == Schedule::Pingpong;
  if (chosen.role == TileRole::Mid) {
    // The tile order on the mid tile, from the sweeps of every role over raster x swizzle
    // (docs/perf-notes.md, session 9, H100; the best order or within 2% of it at both
    // models, both routings): along n, where the expert's weight strip stays in L2 while row
    // tiles stream past (along m loses 8-13% under skew); swizzle 4 for the fused kernels'
    // and the weight gradients' tiles (the fused backward 1-15% over swizzle 1 in the first
    // sweep, within 1% of swizzle 2 in the second), 2 for plain deep groups.
    // Session 14 (H100, the dynamic weight-gradient schedule in, swizzles known inert): the
    // plain GEMMs of shallow groups along n too, 0-6% faster than along m (Qwen3-30B-A3B
    // skewed up dgrad 1.357 against 1.446 ms; balanced within 0.5%).
    const bool fused_forward = ragged_m && p.act != Act::Unfused && !is_act_backward(p.variant);
    const bool plain_ragged_m = ragged_m && p.act == Act::Unfused;
    if (plain_ragged_m) {
      choice.raster_along_n = true;
      choice.swizzle = deep_groups ? 2 : 1;
    } else if (fused_forward && !deep_groups) {
      choice.raster_along_n = true;
      choice.swizzle = 2;
    } else {
      choice.raster_along_n = !cluster_not_2x1;
      choice.swizzle = 4;
    }
  } else if (narrow_fit) {
    choice.raster_along_n = true;  // as the mid tile (session 15's sweep: along m 1-4% slower)
    choice.swizzle = 1;
  } else if (ragged_m && (pingpong || rows_per_group >= p.n)) {
    choice.raster_along_n = true;
    choice.swizzle = pingpong ? 2 : 1;
  } else if (!ragged_m && !short_reduction) {
    choice.swizzle = 2;
  }
  // Weight gradients take their tiles from the dynamic scheduler (dynamic_group_scheduler.cuh,
  // lookahead 2) over groups of 1024 rows or more: at GPT-OSS-20B (3072 rows per expert) 4-16%
  // faster than the static stride, balanced and skewed. Session 10 kept the static stride over
  // Qwen3-30B-A3B's shallow groups (1024 rows: 16 k-blocks a tile), 0-12% ahead then; since the
  // deepest-first walk (session 11) the dynamic schedule is 2.8% ahead on its skewed up
  // projection, within 1.2% elsewhere (session 15, H100). Shallower groups keep the static
  // stride (a tile of a few k-blocks may not hide the ticket).
  choice.dynamic_schedule = !ragged_m && rows_per_group >= 1024;
  return choice;
}

}  // namespace cute_moe::detail

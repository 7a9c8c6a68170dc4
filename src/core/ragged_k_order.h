// The order in which a weight-gradient (ragged-K) launch walks its groups: deepest first.
//
// Every group of a ragged-K launch has the same output tiles; a tile costs its group's
// rows. Walking the groups from the deepest to the shallowest lets both tile schedules
// (dynamic_group_scheduler.cuh) balance the SMs under skewed routing: the dynamic one
// becomes longest-first list scheduling, and the static stride, snaking back and forth
// across the grid wave by wave over tiles of decreasing cost, gives each CTA about the same
// work (a simulation of Qwen3-30B-A3B's skewed weight gradients: the busiest CTA 1% above
// the average, against 2-12% in the groups' own order, which at 33 cluster tiles per group
// and 66 clusters hands half the CTAs every even group and half every odd one).
//
// An empty group's tiles run with no k-blocks and store its zero gradient (a store each,
// no math), last: the same bytes as a zero fill ahead of the GEMM, and the same time
// (Qwen3-30B-A3B under skew: -38 us of setup kernel, +37 us of GEMM; spread evenly among
// the other groups instead, no better: docs/perf-notes.md, session 16).
//
// The setup kernel writes it right after the groups' problem shapes, in the same array:
//   order[0, E)   group ids by rows, deepest first (ties: lower id first), empty groups last
//   order[E]      the number of groups the scheduler walks: all E
//   order[E + 1]  M, order[E + 2] N: the output shape every group shares
//   order[E + 3]  0: the dynamic schedule's ticket counter, which the GEMM's scheduler warps
//                 then count up (zeroed here, by the launch's own setup kernel, rather than by
//                 a memset of its own before every launch)
// Above kMaxOrderedGroups groups the ranking would cost the setup kernel too much; the
// order is then the ids' own.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace cute_moe::detail {

constexpr int32_t kMaxOrderedGroups = 1024;

// int32 words of the order block for num_groups groups.
CUTE_MOE_HOST_DEVICE int64_t ragged_k_order_words(int32_t num_groups) { return int64_t(num_groups) + 4; }

// The rank of group e among rows[0, n): how many groups come before it.
CUTE_MOE_HOST_DEVICE int32_t ragged_k_rank(const int32_t* rows, int32_t n, int32_t e) {
  int32_t rank = 0;
  const int32_t mine = rows[e];
  for (int32_t j = 0; j < n; ++j) rank += (rows[j] > mine || (rows[j] == mine && j < e)) ? 1 : 0;
  return rank;
}

}  // namespace cute_moe::detail

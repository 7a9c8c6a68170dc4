// What our persistent kernels share where they replace CUTLASS's operator() with their own
// (epilogue_warpgroup_kernel.cuh, store_warp_kernel.cuh): a shared-memory buffer handed
// between warps, the tile it holds, the cluster's start, the scheduler warp's loop.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

namespace cute_moe::detail::own_kernel {

// A buffer's handoff: mbarriers (their arrive releases, their wait acquires: the stores
// before `full`'s arrive are seen after its wait, the loads before `empty`'s arrive have read
// before the buffer is written again). A side's phase bit flips at each use; the writer's
// starts at 1, so its first wait on `empty` passes. Each thread that touched the buffer (or
// the TileInfo beside it) arrives itself: racecheck orders no one else's accesses.
struct Handoff {
  cutlass::arch::ClusterBarrier full, empty;
  // by one thread, before start_cluster
  CUTLASS_DEVICE void init(uint32_t writers, uint32_t readers) {
    full.init(writers);
    empty.init(readers);
  }
};
// The tile in the buffer (scheduler coordinates); valid 0: no more tiles.
struct TileInfo {
  int32_t m, n, l, valid;
};

// After the barriers' init: every CTA of the cluster sees them before any thread uses them.
template <class ClusterShape>
CUTLASS_DEVICE void start_cluster() {
  cutlass::arch::fence_barrier_init();
  if constexpr (cute::size(ClusterShape{}) > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }
}

// The scheduler warp: the CTA's tiles into the scheduler pipeline until none is left.
template <class Scheduler, class Pipeline>
CUTLASS_DEVICE void run_scheduler(Scheduler& scheduler, Pipeline& pipeline) {
  auto write = cutlass::make_producer_start_state<Pipeline>();
  bool valid = true;
  do {
    auto [next, increment] = scheduler.advance_to_next_work(pipeline, write);
    valid = next.is_valid();
    if (increment) ++write;
  } while (valid);
  pipeline.producer_tail(write);
}

}  // namespace cute_moe::detail::own_kernel

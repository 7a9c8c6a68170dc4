// A dynamic persistent tile scheduler for the grouped GEMMs: each CTA takes its next tile
// from a device-wide atomic counter when it is ready for one, instead of striding over
// the tiles by the grid size.
//
// Why: in a weight-gradient launch (ragged K) every expert has the same output tiles but
// its own reduction length, so under skewed routing one tile of a deep expert costs many
// tiles of a shallow one. With the static stride the CTAs fall out of step: a CTA that
// drew deep tiles finishes last (the launch's tail), and the CTAs working on one expert
// at a time no longer walk its rows together, so they stop sharing them in L2 (ncu, the
// GPT-OSS-20B weight gradients under skew: 52% L2 hits against QuACK's 72-78%, 17%
// between the busiest and idlest SM). Handing tiles out in order as CTAs free up keeps
// the running tiles adjacent in the tile order and the SMs evenly busy.
//
// How: CUTLASS's SM90 ptr-array kernels already run the group scheduler in a warp of its
// own, which pushes each next tile through an 8-stage shared-memory pipeline to the other
// roles. This scheduler keeps that structure and maps a linear cluster-tile index q to
// (group, m, n) itself: every group of a ragged-K launch has the same output tiles, so
// q / (cluster tiles per group) is the group's place in the walking order the setup kernel
// wrote (ragged_k_order.h: deepest first, empty groups last), and the rest its cluster
// tile, along the raster order. Where q comes from:
//   first tile   the CTA's cluster index (no atomics for the first wave)
//   next tiles   dynamic: clusters in the grid + ticket, ticket = atomicAdd(counter);
//                static: the k-th tile of cluster c is k * clusters + c, or
//                k * clusters + (clusters - 1 - c) for odd k (a snake: over tiles of
//                decreasing cost, each cluster's sum stays near the average)
// A cluster (2 CTAs sharing multicast loads) must work on one cluster tile, so only its
// rank-0 CTA draws the ticket and stores it into each peer's shared memory (a mailbox
// slot per pipeline stage, tagged with the draw's sequence number); a peer acknowledges
// each ticket it read, and the leader does not overwrite a slot that is not yet read.
// The counter is a word of the order block (ragged_k_order.h) that the launch's setup kernel
// zeroes on the same stream just before (CUDA-graph safe; no memset launch of its own, no
// workspace). With no counter (Arguments::dynamic false) the schedule is the static snake.
//
// Lookahead: the scheduler warp would otherwise take a ticket as soon as one of its 8
// pipeline slots is free, i.e. up to 8 tiles before its CTA computes them. Right after
// the first tile every CTA would then grab 8 tickets in a burst, in whatever order the
// CTAs happen to run, and the tiles running at one time would spread over 8 x 132
// tickets (8 experts at Qwen3-30B-A3B: measured 6-18% slower than the static stride
// there, while GPT-OSS-20B gained). So a ticket for draw s is taken only once every role
// has started tile s - lookahead (a wait on that slot's release; lookahead 2 leaves a
// whole tile to hide the atomic and the mailbox behind).
//
// The kernel picks it up through its problem shape type: DynamicGroupProblemShape is
// CUTLASS's GroupProblemShape under another name, and the selector below maps it to this
// scheduler (the ptr-array kernels accept only the group scheduler tag).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

#include "ragged_k_order.h"

namespace cute_moe::detail {

template <class UnderlyingProblemShape>
struct DynamicGroupProblemShape : cutlass::gemm::GroupProblemShape<UnderlyingProblemShape> {};

namespace dynamic_schedule {
CUTLASS_DEVICE uint32_t smem_address(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
// The address of the same shared-memory location in CTA `rank` of the cluster.
CUTLASS_DEVICE uint32_t in_cta(uint32_t local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
CUTLASS_DEVICE void store_release(uint32_t cluster_address, uint64_t v) {
  asm volatile("st.release.cluster.shared::cluster.b64 [%0], %1;" ::"r"(cluster_address), "l"(v) : "memory");
}
CUTLASS_DEVICE void store_release(uint32_t cluster_address, uint32_t v) {
  asm volatile("st.release.cluster.shared::cluster.b32 [%0], %1;" ::"r"(cluster_address), "r"(v) : "memory");
}
CUTLASS_DEVICE uint64_t load_acquire64(uint32_t local) {
  uint64_t v;
  asm volatile("ld.acquire.cluster.shared::cta.b64 %0, [%1];" : "=l"(v) : "r"(local) : "memory");
  return v;
}
CUTLASS_DEVICE uint32_t load_acquire32(uint32_t local) {
  uint32_t v;
  asm volatile("ld.acquire.cluster.shared::cta.b32 %0, [%1];" : "=r"(v) : "r"(local) : "memory");
  return v;
}
}  // namespace dynamic_schedule

template <class GroupProblemShape, int Stages>
class DynamicGroupScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupProblemShape, Stages> {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupProblemShape, Stages>;

 public:
  using typename Base::RasterOrder;
  using typename Base::RasterOrderOptions;
  using typename Base::WorkTileInfo;
  static constexpr bool IsDynamicPersistent = true;

  // One slot per pipeline stage: the tile pushed to the other roles, and (cluster peers)
  // the leader's ticket for this CTA's draw number `seq`, as (seq + 1) << 32 | ticket;
  // ack (in the leader, slot `rank`): how many tickets peer `rank` has read.
  struct Response {
    WorkTileInfo work;
    uint64_t mail;
    uint32_t ack;
    uint32_t unused;
  };
  using SchedulerResponse = Response;

  struct Arguments : Base::Arguments {
    bool dynamic = true;
    int lookahead = 2;  // 1 .. Stages
  };
  struct Params : Base::Params {
    uint32_t* counter = nullptr;  // null: the static schedule
    uint32_t lookahead = Stages;
    const int32_t* order = nullptr;  // the groups' walking order (ragged_k_order.h), device
  };

  template <class TileShape, class ClusterShape>
  static Params to_underlying_arguments(GroupProblemShape problem_shapes, TileShape tile_shape, ClusterShape cluster_shape,
                                        cutlass::KernelHardwareInfo const& hw_info, Arguments const& arguments,
                                        void* workspace = nullptr, const uint32_t = 1, uint32_t = 1) {
    static_assert(cute::size(ClusterShape{}) <= Stages, "one acknowledgement slot per cluster peer");
    Params p;
    static_cast<typename Base::Params&>(p) =
        Base::to_underlying_arguments(problem_shapes, tile_shape, cluster_shape, hw_info, arguments, workspace);
    p.order = reinterpret_cast<const int32_t*>(problem_shapes.problem_shapes) + 3 * problem_shapes.groups();
    // order[E + 3], zeroed by the setup kernel (the array is the launch's own, device memory)
    p.counter = arguments.dynamic ? reinterpret_cast<uint32_t*>(const_cast<int32_t*>(p.order) + problem_shapes.groups() + 3)
                                  : nullptr;
    p.lookahead = uint32_t(arguments.lookahead < 1 ? 1 : (arguments.lookahead > Stages ? Stages : arguments.lookahead));
    return p;
  }

  // No workspace: the counter lives in the order block (above).
  template <class ProblemShape, class ElementAccumulator>
  static size_t get_workspace_size(Arguments const&, ProblemShape, cutlass::KernelHardwareInfo const&, uint32_t,
                                   const uint32_t = 1, uint32_t = 1) {
    return 0;
  }

  template <class ProblemShape, class ElementAccumulator>
  static cutlass::Status initialize_workspace(Arguments const&, void*, cudaStream_t, ProblemShape,
                                              cutlass::KernelHardwareInfo const&, uint32_t, const uint32_t = 1,
                                              uint32_t = 1, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  DynamicGroupScheduler() = default;

  // Run by every thread of the CTA before the kernel's first cluster barrier, so the
  // zeroed mailboxes are in place before any peer writes to them.
  CUTLASS_DEVICE DynamicGroupScheduler(Params const& params, Response* responses)
      : Base(params, nullptr), responses_(responses), counter_(params.counter), lookahead_(params.lookahead) {
#if defined(__CUDA_ARCH__)
    order_ = params.order;
    const int32_t groups = params.problem_shapes_.groups();
    const uint32_t active = uint32_t(order_[groups]);
    const uint32_t m = uint32_t(order_[groups + 1]), n = uint32_t(order_[groups + 2]);
    cluster_m_ = uint32_t(params.cluster_shape_.m());
    cluster_n_ = uint32_t(params.cluster_shape_.n());
    const uint32_t tile_m = uint32_t(params.cta_shape_.m()), tile_n = uint32_t(params.cta_shape_.n());
    const uint32_t clusters_m = ((m + tile_m - 1) / tile_m + cluster_m_ - 1) / cluster_m_;
    const uint32_t clusters_n = ((n + tile_n - 1) / tile_n + cluster_n_ - 1) / cluster_n_;
    along_n_ = params.raster_order_ == RasterOrder::AlongN;
    fast_ = along_n_ ? clusters_n : clusters_m;
    per_group_ = clusters_m * clusters_n;
    total_ = uint64_t(active) * per_group_;
    const dim3 cluster = cute::cluster_id_in_grid(), clusters = cute::cluster_grid_dims();
    cluster_ = cluster.x + clusters.x * (cluster.y + clusters.y * cluster.z);
    clusters_ = clusters.x * clusters.y * clusters.z;
    const dim3 in_cluster = cute::block_id_in_cluster();
    m_in_cluster_ = in_cluster.x;
    n_in_cluster_ = in_cluster.y;
    cluster_size_ = cluster_m_ * cluster_n_;
    rank_ = cute::block_rank_in_cluster();
    if (counter_ != nullptr && cluster_size_ > 1 && threadIdx.x < Stages) {
      responses_[threadIdx.x].mail = 0;
      responses_[threadIdx.x].ack = 0;
      asm volatile("fence.acq_rel.cluster;" ::: "memory");
    }
#endif
  }

  // Every role: its first tile.
  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) const {
    return work_at(cluster_);
  }

  // The scheduler warp (all 32 lanes): the next tile, pushed to the other roles.
  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto advance_to_next_work(TileSchedulerPipeline& pipeline, TileSchedulerPipelineState state,
                                           uint32_t advance_count = 1) {
    draws_ += advance_count;
    uint64_t q;
    if (counter_ == nullptr) {
      q = uint64_t(draws_) * clusters_ + ((draws_ & 1u) ? clusters_ - 1 - cluster_ : cluster_);
    } else {
      if (lookahead_ < Stages) {
        // Acquiring the slot of draw s + Stages - lookahead waits until draw s - lookahead
        // has been released by every role, i.e. until they all started that tile.
        TileSchedulerPipelineState earlier = state;
        earlier.advance(Stages - lookahead_);
        pipeline.producer_acquire(earlier);
      }
      q = uint64_t(clusters_) + next_ticket();
    }
    WorkTileInfo work = work_at(q);
    pipeline.producer_acquire(state);
    if (cute::elect_one_sync()) {
      responses_[state.index()].work = work;
      cutlass::arch::fence_view_async_shared();
      pipeline.producer_commit(state);
    }
    return cute::make_tuple(work, true);
  }

  // Every other role: the next tile the scheduler warp pushed.
  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo, TileSchedulerPipeline& pipeline, TileSchedulerPipelineState state) {
    pipeline.consumer_wait(state);
    WorkTileInfo work = responses_[state.index()].work;
    cutlass::arch::fence_view_async_shared();
    pipeline.consumer_release(state);
    return cute::make_tuple(work, true);
  }

 private:
  // The tile of linear cluster-tile index q, for this CTA's place in its cluster.
  CUTLASS_DEVICE WorkTileInfo work_at(uint64_t q) const {
    if (q >= total_) return WorkTileInfo::invalid_work_tile();
    const uint32_t slot = uint32_t(q / per_group_);
    const uint32_t tile = uint32_t(q - uint64_t(slot) * per_group_);
    const uint32_t slow = tile / fast_, fast = tile - slow * fast_;
    const uint32_t cm = along_n_ ? slow : fast, cn = along_n_ ? fast : slow;
    WorkTileInfo work;
    work.M_idx = int32_t(cm * cluster_m_ + m_in_cluster_);
    work.N_idx = int32_t(cn * cluster_n_ + n_in_cluster_);
    work.L_idx = order_[slot];
    work.is_valid_tile = 1;
    return work;
  }

  // This CTA's next ticket; in a cluster, the leader's draw for the whole cluster.
  CUTLASS_DEVICE uint32_t next_ticket() {
    using namespace dynamic_schedule;
    const uint32_t lane = cutlass::canonical_lane_idx();
    uint32_t ticket = 0;
    if (lane == 0) {
      const uint32_t slot = seq_ % Stages;
      if (cluster_size_ == 1) {
        ticket = atomicAdd(counter_, 1u);
      } else if (rank_ == 0) {
        ticket = atomicAdd(counter_, 1u);
        for (uint32_t peer = 1; peer < cluster_size_; ++peer) {
          // the slot's previous ticket (draw seq - Stages) must have been read
          const uint32_t ack = smem_address(&responses_[peer].ack);
          while (int32_t(load_acquire32(ack) - (seq_ + 1 - Stages)) < 0) {
          }
          store_release(in_cta(smem_address(&responses_[slot].mail), peer),
                        (uint64_t(seq_ + 1) << 32) | uint64_t(ticket));
        }
      } else {
        const uint32_t mail = smem_address(&responses_[slot].mail);
        uint64_t v;
        while (uint32_t((v = load_acquire64(mail)) >> 32) != seq_ + 1) {
        }
        ticket = uint32_t(v);
        // No acknowledgement of the ticket past the last tile: the leader draws none after
        // it and may have exited already, and a CTA's shared memory must not be written
        // after it exits (this store raced the leader's exit when the last tiles were short).
        if (uint64_t(clusters_) + ticket < total_) {
          store_release(in_cta(smem_address(&responses_[rank_].ack), 0), seq_ + 1);
        }
      }
    }
    ++seq_;
    return __shfl_sync(0xffffffffu, ticket, 0);
  }

  Response* responses_ = nullptr;
  uint32_t* counter_ = nullptr;
  uint32_t lookahead_ = Stages;
  const int32_t* order_ = nullptr;  // groups in walking order, then their count, M and N
  uint64_t total_ = 0;         // cluster tiles of the launch
  uint32_t per_group_ = 1;     // cluster tiles of one group
  uint32_t fast_ = 1;          // cluster tiles along the raster order
  bool along_n_ = true;
  uint32_t cluster_m_ = 1, cluster_n_ = 1;
  uint32_t m_in_cluster_ = 0, n_in_cluster_ = 0;
  uint32_t clusters_ = 1;      // clusters in the grid
  uint32_t cluster_ = 0;       // this CTA's cluster
  uint32_t draws_ = 0;         // tiles after the first taken so far
  uint32_t cluster_size_ = 1;
  uint32_t rank_ = 0;          // block rank in the cluster
  uint32_t seq_ = 0;           // tickets drawn so far
};

}  // namespace cute_moe::detail

namespace cutlass::gemm::kernel::detail {
// The kernel's group scheduler for a DynamicGroupProblemShape.
template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount, class UnderlyingProblemShape>
struct TileSchedulerSelector<GroupScheduler, arch::Sm90, TileShape, ClusterShape, SchedulerPipelineStageCount,
                             cute_moe::detail::DynamicGroupProblemShape<UnderlyingProblemShape>> {
  using Scheduler = cute_moe::detail::DynamicGroupScheduler<
      cute_moe::detail::DynamicGroupProblemShape<UnderlyingProblemShape>, int(SchedulerPipelineStageCount)>;
};
}  // namespace cutlass::gemm::kernel::detail

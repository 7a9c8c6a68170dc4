// EXPERIMENT (session 31; off: CUTE_MOE_FP8_LOOK_AHEAD=0): the plain FP8 GEMM's kernel with
// the next tile's first k-tile under the epilogue. Correct (the same bits as the shipped
// kernel, its GPU tests pass) and pipelined by ptxas, but 0.97-1.015x of the shipped kernel
// on an H100 (docs/perf-notes.md, session 31): kept in history, not in the tree.
//
// Why: in CUTLASS's cooperative kernel both consumer warpgroups run a tile's epilogue while
// the tensor cores idle, ~15% of the consumer warps' time at GPT-OSS-20B's up projection
// (docs/perf-notes.md, sessions 29-30). The FP8 mainloop accumulates each k-tile into a
// temporary and promotes it into the accumulator with its scales, so at a tile's end a
// temporary is free: the next tile's first k-tile can run in it while the accumulator is
// stored. ptxas keeps a WGMMA in flight across a loop's back edge only in a narrow shape
// (found with small kernels, session 31): no loop nested inside (a tile loop around the
// k-loop serializes every WGMMA, C7514), and after the loop a tail shaped as CUTLASS's
// k-loop tail (a branch one side of which issues one more k-tile). Hence:
//   - one loop over the k-tiles of all the CTA's tiles, two per iteration (the two
//     temporaries alternate), each step issuing the next k-tile before promoting the
//     current one; a tile's epilogue runs in a branch of the step after its last k-tile,
//     with the next tile's first k-tile in flight;
//   - after the last tile the steps run on two stages the producer completes without data
//     (Fp8WholeOperandsMainloop::load_tail), never promoted into an output nor released;
//   - the epilogue written here: no branch on the thread (the TMA store's issue predicated
//     in its instruction), STSM into the collective's D buffer (the whole tile, two 128 x 64
//     stages), one named barrier before and one after.
// The producer warps, the scheduler warp, the pipelines and shared storage are CUTLASS's
// (the kernel derives from CUTLASS's cooperative kernel and replaces its operator()).
//
// Epilogue: D = row_scale[row] * (group_scale[group] * acc + bias[group][col]), rounded once
// to bf16, as RaggedMEpilogue's tree computes it (same bits).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/bfloat16.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "fixed_tma_store.cuh"
#include "kernel_registry.h"

namespace cute_moe::detail {

// D's store: the whole 128 x 128 tile in two 128 x 64 stages of the collective's buffer.
using LookAheadStore = FixedTmaStore<cutlass::bfloat16_t, cute::Shape<cute::_128, cute::_64>, 2>;

struct LookAheadEpilogueParams {
  LookAheadStore::Params d;
  const float* const* row_scale = nullptr;        // per group, its first row's (null: 1)
  const float* group_scale = nullptr;             // per group (null: 1)
  const cutlass::bfloat16_t* const* bias = nullptr;  // per group, its n values (null: 0)
};

inline LookAheadEpilogueParams look_ahead_epilogue_params(const GroupArrays& g, const LaunchContext& ctx) {
  LookAheadEpilogueParams p;
  p.d = LookAheadStore::to_params(ctx.d, ctx.whole.offs);
  p.row_scale = g.row_scale;
  p.group_scale = g.group_scale;
  p.bias = reinterpret_cast<const cutlass::bfloat16_t* const*>(g.bias);
  return p;
}

namespace look_ahead {

// A load of p[i] where p may be null (then `otherwise`), without a branch on the thread.
CUTLASS_DEVICE float load_or(const float* p, int64_t i, float otherwise) {
  float v = otherwise;
  asm(
      "{\n .reg .pred has;\n setp.ne.u64 has, %1, 0;\n @has ld.global.nc.f32 %0, [%2];\n}\n"
      : "+f"(v)
      : "l"(p), "l"(p + i));
  return v;
}
CUTLASS_DEVICE int32_t load_or(const int32_t* p, int64_t i, int32_t otherwise) {
  int32_t v = otherwise;
  asm(
      "{\n .reg .pred has;\n setp.ne.u64 has, %1, 0;\n @has ld.global.nc.b32 %0, [%2];\n}\n"
      : "+r"(v)
      : "l"(p), "l"(p + i));
  return v;
}
CUTLASS_DEVICE uint32_t load_or(const uint32_t* p, int64_t i, uint32_t otherwise) {
  uint32_t v = otherwise;
  asm(
      "{\n .reg .pred has;\n setp.ne.u64 has, %1, 0;\n @has ld.global.nc.b32 %0, [%2];\n}\n"
      : "+r"(v)
      : "l"(p), "l"(p + i));
  return v;
}
CUTLASS_DEVICE uint64_t load_or(const uint64_t* p, int64_t i, uint64_t otherwise) {
  uint64_t v = otherwise;
  asm(
      "{\n .reg .pred has;\n setp.ne.u64 has, %1, 0;\n @has ld.global.nc.b64 %0, [%2];\n}\n"
      : "+l"(v)
      : "l"(p), "l"(p + i));
  return v;
}

// The tile's epilogue (see the header). `accum` is the cooperative tile's accumulator as the
// TiledMma partitions it for mma_thread; D's buffer is the collective's (`smem`).
template <class TileShape, class TiledMma, class Accum>
CUTLASS_DEVICE void store_tile(LookAheadEpilogueParams const& p, Accum const& accum, int mma_thread, int m_idx,
                               int n_idx, int group, int rows, int cols, cutlass::bfloat16_t* smem) {
  using namespace cute;
  using bf16 = cutlass::bfloat16_t;
  constexpr int kTileM = decltype(size<0>(TileShape{}))::value;
  constexpr int kTileN = decltype(size<1>(TileShape{}))::value;
  static_assert(kTileM == 128 && kTileN == 128, "the look-ahead store holds a 128 x 128 tile");
  constexpr uint32_t kThreads = decltype(size(TiledMma{}))::value;

  // the buffer is free once the last tile's TMA stores have read it (only their issuing
  // thread has bulk groups; the others return at once)
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  cutlass::arch::NamedBarrier::sync(kThreads, cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);

  // the group's operands (a null array: the neutral value)
  const int32_t begin = load_or(group == 0 ? nullptr : p.d.offs, group - 1, 0);
  const float scale = load_or(p.group_scale, group, 1.0f);
  const float* row_scale = reinterpret_cast<const float*>(
      load_or(reinterpret_cast<const uint64_t*>(p.row_scale), group, uint64_t(0)));
  const uint32_t* bias = reinterpret_cast<const uint32_t*>(
      load_or(reinterpret_cast<const uint64_t*>(p.bias), group, uint64_t(0)));

  Tensor coords = TiledMma{}.get_slice(mma_thread).partition_C(make_identity_tensor(take<0, 2>(TileShape{})));
  static_assert(decltype(size(coords))::value == decltype(size(accum))::value, "one coordinate per accumulator");
  const int row0 = m_idx * kTileM, col0 = n_idx * kTileN;
  // The thread's rows and column pairs: in the WGMMA layout its elements are rows m0 + 8 h
  // (64 rows per warpgroup) and columns n0 + 8 j + {0, 1} (elements 2i, 2i + 1: one pair).
  const int m0 = get<0>(coords(0)), n0 = get<1>(coords(0));
  constexpr int kRowsPerThread = 2 * kTileM / 128;  // h (the other warpgroup's rows are its own)
  constexpr int kPairs = kTileN / 8;                // j
  static_assert(decltype(size(accum))::value == 2 * kRowsPerThread * kPairs, "the WGMMA accumulator layout");
  // the optional operands behind uniform branches (a null array: the neutral value)
  float rs[kRowsPerThread];
  CUTLASS_PRAGMA_UNROLL
  for (int h = 0; h < kRowsPerThread; ++h) rs[h] = 1.0f;
  if (row_scale != nullptr) {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < kRowsPerThread; ++h) rs[h] = __ldg(row_scale + min(row0 + m0 + 8 * h, rows - 1));
  }
  float b[2 * kPairs];  // clamped: columns past n are padding
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < 2 * kPairs; ++j) b[j] = 0.0f;
  if (bias != nullptr) {
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kPairs; ++j) {
      const uint32_t pair = __ldg(bias + min(col0 + n0 + 8 * j, cols - 2) / 2);
      b[2 * j] = float(reinterpret_cast<const bf16*>(&pair)[0]);
      b[2 * j + 1] = float(reinterpret_cast<const bf16*>(&pair)[1]);
    }
  }
  // Into smem with STSM, as CUTLASS's epilogue partitions the accumulator: one 128 x 64
  // stage per half of the tile's columns.
  using CopyAtomC = Copy_Atom<SM90_U32x4_STSM_N, cutlass::half_t>;
  auto tiled_r2s = make_tiled_copy_S(Copy_Atom<SM90_U32x4_STSM_N, bf16>{}, make_tiled_copy_C_atom(CopyAtomC{}, TiledMma{}));
  auto thread_r2s = tiled_r2s.get_slice(mma_thread);
  Tensor tRS_rAcc = thread_r2s.retile_S(accum);   // ((R2S,R2S_V),MMA_M,MMA_N)
  Tensor tRS_cAcc = thread_r2s.retile_S(coords);  // their coordinates in the tile
  Tensor s_epi = as_position_independent_swizzle_tensor(
      make_tensor(make_smem_ptr(smem), typename LookAheadStore::SmemLayout{}));  // (128, 64, 2)
  Tensor tRS_sD = thread_r2s.partition_D(s_epi);  // (R2S,R2S_M,R2S_N,PIPE)
  Tensor tRS_rD = make_tensor<bf16>(make_layout(take<0, 3>(shape(thread_r2s.partition_S(s_epi)))));
  constexpr int kPerStage = decltype(size(tRS_rD))::value;
  static_assert(2 * kPerStage == decltype(size(accum))::value, "two stages hold the tile");
  CUTLASS_PRAGMA_UNROLL
  for (int stage = 0; stage < 2; ++stage) {
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < kPerStage; ++v) {
      const auto c = tRS_cAcc(stage * kPerStage + v);
      const int h = (get<0>(c) - m0) / 8, j = (get<1>(c) - n0) / 8, odd = (get<1>(c) - n0) % 2;  // compile-time
      tRS_rD(v) = bf16(rs[h] * (scale * tRS_rAcc(stage * kPerStage + v) + b[2 * j + odd]));
    }
    copy(tiled_r2s, tRS_rD, tRS_sD(_, _, _, stage));
  }
  cutlass::arch::fence_view_async_shared();
  cutlass::arch::NamedBarrier::sync(kThreads, cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);
  const bool issue = mma_thread == 0;
  const int32_t big = fixed_tma::kBig;  // (a local: not odr-used)
  const int32_t ragged_row0 = row0 + big - rows;
  LookAheadStore::template tma_store_if<Shape<Int<kTileM>, Int<kTileN>>>(&p.d, smem, ragged_row0, col0,
                                                                        begin + rows, 0, 0, 0, issue);
  LookAheadStore::template tma_store_if<Shape<Int<kTileM>, Int<kTileN>>>(&p.d, smem, ragged_row0, col0,
                                                                        begin + rows, 0, 1, 1, issue);
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

}  // namespace look_ahead

template <class Base>
struct LookAheadCooperativeKernel : Base {
  using typename Base::Params;
  using typename Base::SharedStorage;
  using typename Base::CollectiveMainloop;
  using typename Base::CollectiveEpilogue;
  using typename Base::TileScheduler;
  using typename Base::TiledMma;
  using typename Base::TileShape;
  using typename Base::ClusterShape;
  using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
  using PipelineState = typename CollectiveMainloop::PipelineState;
  using SchedulerPipeline = typename TileScheduler::Pipeline;

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(size(TiledMma{}) == 256, "a cooperative tile: two consumer warpgroups");
    enum class Role { Mainloop = 0, Scales = 1, Unused = 2, Scheduler = 3 };
    SharedStorage& storage = *reinterpret_cast<SharedStorage*>(smem_buf);
    TileScheduler scheduler{params.scheduler, storage.scheduler_response};
    CollectiveMainloop mainloop;

    const int thread_idx = int(threadIdx.x);
    const int warp_group = cutlass::canonical_warp_group_idx();
    const Role role = Role(cutlass::canonical_warp_idx_sync() % cutlass::NumWarpsPerWarpGroup);
    const bool producer = warp_group == 0;
    const int mma_thread = thread_idx % int(size(TiledMma{}));
    const uint32_t block_rank = block_rank_in_cluster();

    // The scheduler warp hands each next tile to the load warp, the scale warp and the consumers.
    typename SchedulerPipeline::Params sp;
    sp.role = producer && role == Role::Scheduler ? SchedulerPipeline::ThreadCategory::Producer
                                                  : SchedulerPipeline::ThreadCategory::Consumer;
    sp.consumer_arv_count = size(TiledMma{}) + 2 * cutlass::NumThreadsPerWarp;
    sp.producer_arv_count = 1;
    SchedulerPipeline scheduler_pipeline(storage.pipelines.scheduler, sp);
    typename MainloopPipeline::Params mp;
    if (producer && (role == Role::Mainloop || role == Role::Scales)) mp.role = MainloopPipeline::ThreadCategory::Producer;
    if (!producer) mp.role = MainloopPipeline::ThreadCategory::Consumer;
    mp.is_leader = thread_idx % cutlass::NumThreadsPerWarpGroup == 0;
    mp.num_consumers = size(TiledMma{});
    mp.num_producers = Base::NumProducerThreads;
    mp.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline pipeline(storage.pipelines.mainloop, mp, ClusterShape{});

    // every CTA of the cluster sees the barriers initialized
    if constexpr (size(ClusterShape{}) > 1) {
      cluster_arrive_relaxed();
      cluster_wait();
    } else {
      __syncthreads();
    }

    auto work = scheduler.initial_work_tile_info(ClusterShape{});
    if (!work.is_valid()) return;
    auto problem = append<4>(params.problem_shape.get_problem_shape(work.L_idx), 1);
    const auto blk_shape = TileShape{};
    typename SchedulerPipeline::PipelineState scheduler_read;
    auto next_work = [&] {
      auto [next, increment] = scheduler.fetch_next_work(work, scheduler_pipeline, scheduler_read);
      if (increment) ++scheduler_read;
      return next;
    };

    if (producer) {
      cutlass::arch::warpgroup_reg_dealloc<Base::LoadRegisterRequirement>();
      if (role == Role::Scheduler) {
        auto write = cutlass::make_producer_start_state<SchedulerPipeline>();
        do {
          auto [next, increment] = scheduler.advance_to_next_work(scheduler_pipeline, write);
          work = next;
          if (increment) ++write;
        } while (work.is_valid());
        scheduler_pipeline.producer_tail(write);
      } else if (role == Role::Mainloop || role == Role::Scales) {
        // the A and B tiles (TMA), or their scales (cp.async): each warp walks the same tiles
        auto produce = [&](auto load_tile) {
          auto inputs = mainloop.load_init(problem, params.mainloop);
          auto write = cutlass::make_producer_start_state<MainloopPipeline>();
          int32_t loaded_group = -1;
          do {
            if (work.L_idx != loaded_group) {
              loaded_group = work.L_idx;
              problem = append<4>(params.problem_shape.get_problem_shape(loaded_group), 1);
              inputs = mainloop.tensors_perform_update(inputs, params.mainloop, problem, loaded_group);
            }
            const int k_tiles = TileScheduler::get_work_k_tile_count(work, problem, blk_shape);
            load_tile(inputs, write, make_coord(work.M_idx, work.N_idx, _, 0),
                      make_coord_iterator(0, shape<3>(get<0>(inputs))), k_tiles);
            write.advance(k_tiles);
            work = next_work();
          } while (work.is_valid());
          return write;
        };
        const int lane = thread_idx % cutlass::NumThreadsPerWarp;
        if (role == Role::Mainloop) {
          auto write = produce([&](auto const& inputs, auto write, auto blk_coord, auto k_tile_iter, int k_tiles) {
            mainloop.load(params.mainloop, pipeline, write, inputs, make_tuple(nullptr, nullptr), blk_coord, k_tile_iter,
                          k_tiles, lane, block_rank, storage.tensors.mainloop);
          });
          mainloop.load_tail(pipeline, write);
        } else {
          produce([&](auto const& inputs, auto write, auto blk_coord, auto k_tile_iter, int k_tiles) {
            mainloop.load_auxiliary(params.mainloop, pipeline, write, inputs, blk_coord, k_tile_iter, k_tiles, lane,
                                    block_rank, storage.tensors.mainloop);
          });
        }
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<Base::MmaRegisterRequirement>();
      auto* d_buffer = reinterpret_cast<cutlass::bfloat16_t*>(&storage.tensors.epilogue.collective);
      static_assert(sizeof(storage.tensors.epilogue.collective) >= 128 * 128 * sizeof(cutlass::bfloat16_t),
                    "the collective's D buffer holds a whole tile");
      TiledMma tiled_mma;
      auto accum = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));
      auto tmp0 = make_fragment_like(accum);
      auto tmp1 = make_fragment_like(accum);
      auto sfa0 = CollectiveMainloop::make_row_scales(accum);
      auto sfa1 = CollectiveMainloop::make_row_scales(accum);
      PipelineState read, release;
      auto view = mainloop.template consumer_view<decltype(accum)>(mma_thread, storage.tensors.mainloop);
      auto issue = [&](auto& tmp, auto& sfa) { view.issue(pipeline, read, tmp, sfa); };
      // One loop over the k-tiles of all the CTA's tiles, two per iteration (ptxas keeps the
      // WGMMAs in flight across its back edge only in this shape: no inner loop, one exit, and
      // a tail as CUTLASS's k-loop has; session 31). Each step: the k-tile in `cur` is in
      // flight; the next one (this tile's, the next tile's first, or after the last tile one
      // of load_tail's two empty stages) is issued into `nxt`; `cur` is promoted; after a tile's
      // last k-tile its epilogue runs with the next k-tile in flight.
      int left = TileScheduler::get_work_k_tile_count(work, problem, blk_shape) - 1;  // not yet issued
      bool done = false;  // past the last tile: the empty stages, neither promoted nor released
      clear(accum);
      warpgroup_fence_operand(accum);
      issue(tmp0, sfa0);
      auto step = [&](auto& cur, auto& sfa_cur, auto& nxt, auto& sfa_nxt) {
        issue(nxt, sfa_nxt);
        mainloop.template retire_k_tile<1>(pipeline, release, accum, cur, sfa_cur, !done);
        if (left != 0) {  // within a tile, or past the last one (-1)
          left -= left > 0;
          return;
        }
        auto next = next_work();
        look_ahead::store_tile<TileShape, TiledMma>(params.mainloop.epilogue, accum, mma_thread, work.M_idx,
                                                    work.N_idx, work.L_idx, int(get<0>(problem)),
                                                    int(get<1>(problem)), d_buffer);
        clear(accum);
        warpgroup_fence_operand(accum);
        work = next;
        if (work.is_valid()) {
          problem = append<4>(params.problem_shape.get_problem_shape(work.L_idx), 1);
          left = TileScheduler::get_work_k_tile_count(work, problem, blk_shape) - 1;
        } else {
          done = true;
          left = -1;
        }
      };
      CUTLASS_PRAGMA_NO_UNROLL
      do {
        step(tmp0, sfa0, tmp1, sfa1);
        step(tmp1, sfa1, tmp0, sfa0);
      } while (!done);
      // The second empty stage's k-tile in flight in tmp0. The branch that never runs gives the
      // loop the tail of CUTLASS's k-loop, without which ptxas serializes every WGMMA (C7514).
      if (left < -1) {
        issue(tmp1, sfa1);
        mainloop.template retire_k_tile<1>(pipeline, release, accum, tmp0, sfa0, false);
        mainloop.template retire_k_tile<0>(pipeline, release, accum, tmp1, sfa1, false);
        const_cast<float*>(params.mainloop.epilogue.group_scale)[mma_thread] = accum(0);
      } else {
        warpgroup_wait<0>();
      }
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    }
#endif
  }
};

}  // namespace cute_moe::detail

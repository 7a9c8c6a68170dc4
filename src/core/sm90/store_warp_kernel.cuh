// The plain ragged-M FP8 GEMM (D = row_scale[row] * (scale[group] * acc + bias[group][col]),
// bf16) on CUTLASS's cooperative kernel with its epilogue cut to what the accumulator's
// owners must do: the math, one conversion and one shared-memory store of the whole tile.
// A warp of the producer warpgroup then issues the tile's TMA stores while the consumers
// start the next tile's mainloop. The kernel of the plain FP8 GEMM's StoreWarp rows
// (codegen/kernel_space.py), which the heuristic picks for short reductions
// (docs/perf-notes.md, sessions 36-37).
//
// Why: in the cooperative tile both consumer warpgroups run the epilogue while the tensor
// cores idle. CUTLASS's collective epilogue walks the tile in subtiles, each with its visitor
// tree's math, a shared-memory store, a proxy fence, a 256-thread barrier and a TMA store
// issued by one thread (~750 SASS instructions a warp and tile; sessions 29-30). Here a
// consumer thread runs ~64 FFMAs, 32 conversions, 8 STSMs (the whole 128 x 128 bf16 tile,
// 32 KB, in the collective's own D buffer), one fence and one mbarrier arrive; no barrier
// among the consumers.
// Measured (H200, ncu at locked clocks, against CUTLASS's kernel): 1.12x at Qwen3-30B-A3B's
// down projection (K = 768), 1.00-1.01x at K = 2048-2880, 0.96x at GPT-OSS-20B's up dgrad
// (K = 5760); the same bits. Long reductions are not bound by the epilogue (the producer
// refills the stages under it); why they lose is open. So the cooperative row stays the
// "wide" tile and this one is the "narrow" one (heuristics.cpp: K and N <= 3072).
//
// Shape (the 2x1 cluster's 128 x 128 x 128 FP8 tile; four warpgroups of CUTLASS's kernel):
//   warpgroup 0     producer: warp 0 the A/B loads, warp 1 the scales (cp.async), warp 2
//                   the store warp (this file), warp 3 the tile scheduler
//   warpgroups 1-2  the mainloop on 64 rows each, then the epilogue above
// The handoff: one tile buffer and two mbarriers (full: the 256 consumer threads -> the store
// warp; empty: the store warp's 32 lanes, once its TMA stores have read the buffer -> the
// consumers), the tile's coordinates through shared memory. The consumers wait for `empty`
// only before writing the next tile, a whole mainloop later. The epilogue's bias row and row
// scales are prefetched into L1 under the mainloop (held in registers there, they cost 2-7%:
// the mainloop runs at 232).
//
// The same function as RaggedMEpilogue's tree (ragged_m_variants.cuh), bit for bit: the same
// operations in the same order, one rounding to bf16; D through the same descriptor
// (FixedTmaStore: rows past the group's end fall outside it).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/bfloat16.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "fixed_tma_store.cuh"  // FixedTmaStore, kernel_smem_base
#include "own_kernel_parts.cuh"

namespace cute_moe::detail {

namespace store_warp {

// the buffer's handoff (own_kernel::Handoff)
constexpr uint32_t kWriters = 256;  // both consumer warpgroups
constexpr uint32_t kReaders = 32;   // the store warp

}  // namespace store_warp

// Base: CUTLASS's cooperative ptr-array kernel of the row (its collectives, scheduler and
// parameters are used; its operator() is replaced). Store: the tree's FixedTmaStore (D's
// descriptor, the buffer's layout: the tile's 128 x 128 as kStages subtiles of 128 x 64).
template <class Base, class Store>
struct StoreWarpKernel : Base {
  using typename Base::CollectiveMainloop;
  using typename Base::TileScheduler;
  using typename Base::TiledMma;
  using typename Base::TileShape;
  using typename Base::ClusterShape;
  using typename Base::Params;
  using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
  using PipelineState = typename CollectiveMainloop::PipelineState;
  using SchedulerPipeline = typename TileScheduler::Pipeline;
  using Element = cutlass::bfloat16_t;

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static_assert(Store::kEpiM == kTileM && Store::kEpiN * decltype(cute::size<2>(typename Store::SmemLayout{}))::value == kTileN,
                "the store's subtiles cover the tile");
  using CtaTile = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>>;

  // CUTLASS's storage (the collective epilogue's D buffer, unused by it, is the tile buffer;
  // its offset reaches the kernel through the tree's parameters) and the handoff
  using BaseStorage = typename Base::SharedStorage;
  struct SharedStorage {
    using TensorStorage = typename BaseStorage::TensorStorage;
    TensorStorage tensors;
    typename BaseStorage::PipelineStorage pipelines;
    alignas(16) typename Base::TileSchedulerResponse scheduler_response[Base::TileSchedulerStages];
    typename BaseStorage::TensorMapStorage tensormaps;
    alignas(16) own_kernel::Handoff handoff;
    alignas(16) own_kernel::TileInfo info;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static_assert(SharedStorageSize <= 227 * 1024, "shared memory: 227 KB a CTA");
  static_assert(sizeof(typename BaseStorage::TensorStorage::EpilogueTensorStorage) >=
                    sizeof(Element) * cute::cosize_v<typename Store::SmemLayout>,
                "the collective's D buffer holds a whole tile");
  static_assert(Base::IsMainloopAuxiliaryLoadNeeded, "the FP8 mainloop: scales by a second producer warp");

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(size(TiledMma{}) == 256, "the cooperative tile: two consumer warpgroups");
    enum class Role { Mainloop = 0, MainloopAux = 1, StoreWarp = 2, Scheduler = 3 };
    SharedStorage& storage = *reinterpret_cast<SharedStorage*>(smem_buf);
    TileScheduler scheduler{params.scheduler, storage.scheduler_response};
    CollectiveMainloop mainloop;

    const int thread_idx = int(threadIdx.x);
    const bool producer = cutlass::canonical_warp_group_idx() == 0;
    const Role role = Role(cutlass::canonical_warp_idx_sync() % cutlass::NumWarpsPerWarpGroup);
    const int mma_thread = thread_idx - int(cutlass::NumThreadsPerWarpGroup);
    const int lane = thread_idx % cutlass::NumThreadsPerWarp;
    const uint32_t block_rank = block_rank_in_cluster();

    typename SchedulerPipeline::Params sp;
    sp.role = producer && role == Role::Scheduler ? SchedulerPipeline::ThreadCategory::Producer
                                                  : SchedulerPipeline::ThreadCategory::Consumer;
    sp.consumer_arv_count = size(TiledMma{}) + 2 * cutlass::NumThreadsPerWarp;  // consumers, both load warps
    sp.producer_arv_count = 1;
    SchedulerPipeline scheduler_pipeline(storage.pipelines.scheduler, sp);
    typename MainloopPipeline::Params mp;
    if (producer && (role == Role::Mainloop || role == Role::MainloopAux)) {
      mp.role = MainloopPipeline::ThreadCategory::Producer;
    }
    if (!producer) mp.role = MainloopPipeline::ThreadCategory::Consumer;
    mp.is_leader = thread_idx % cutlass::NumThreadsPerWarpGroup == 0;
    mp.num_consumers = size(TiledMma{});
    mp.num_producers = Base::NumProducerThreads;
    mp.transaction_bytes = params.mainloop.tma_transaction_bytes;
    // the barriers now; a consumer's release masks in its own branch (made here, they stay
    // live through the producers' code and ptxas spills them, reloading them every k-tile)
    MainloopPipeline pipeline(storage.pipelines.mainloop, mp, ClusterShape{}, cute::true_type{}, cute::false_type{});
    own_kernel::Handoff& handoff = storage.handoff;
    if (thread_idx == 0) handoff.init(store_warp::kWriters, store_warp::kReaders);
    own_kernel::start_cluster<ClusterShape>();

    auto const& tree = params.epilogue.thread;
    auto const& d_store = tree.op_1;  // Sm90StoreD's: D's descriptor, the buffer's offset
    Element* buffer = reinterpret_cast<Element*>(kernel_smem_base() + d_store.smem_offset);
    own_kernel::TileInfo* info = &storage.info;

    auto work = scheduler.initial_work_tile_info(ClusterShape{});
    if (!work.is_valid()) return;  // (every warp alike: the scheduler's answer is the CTA's)
    auto problem = append<4>(params.problem_shape.get_problem_shape(work.L_idx), 1);
    const auto blk_shape = TileShape{};
    typename SchedulerPipeline::PipelineState scheduler_read;
    auto next_work = [&] {
      auto [next, increment] = scheduler.fetch_next_work(work, scheduler_pipeline, scheduler_read);
      if (increment) ++scheduler_read;
      return next;
    };

    if (producer) {
      cutlass::arch::warpgroup_reg_dealloc<Base::LoadRegisterRequirement>();  // (the store warp's too)
      if (role == Role::Scheduler) {
        own_kernel::run_scheduler(scheduler, scheduler_pipeline);
      } else if (role == Role::Mainloop || role == Role::MainloopAux) {
        // each producer warp's own loop (one loop for both costs spills under 40 registers)
        auto load_tiles = [&](auto aux) {
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
            auto k_iter = make_coord_iterator(0, shape<3>(get<0>(inputs)));
            auto coord = make_coord(work.M_idx, work.N_idx, _, 0);
            if constexpr (decltype(aux)::value) {
              mainloop.load_auxiliary(params.mainloop, pipeline, write, inputs, coord, k_iter, k_tiles, lane,
                                      block_rank, storage.tensors.mainloop);
            } else {
              mainloop.load(params.mainloop, pipeline, write, inputs, make_tuple(nullptr, nullptr), coord, k_iter,
                            k_tiles, lane, block_rank, storage.tensors.mainloop);
            }
            write.advance(k_tiles);
            work = next_work();
          } while (work.is_valid());
          if constexpr (!decltype(aux)::value) mainloop.load_tail(pipeline, write);
        };
        if (role == Role::Mainloop) {
          load_tiles(cute::false_type{});
        } else {
          load_tiles(cute::true_type{});
        }
      } else {
        store_tiles(d_store.store, handoff, buffer, info);
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<Base::MmaRegisterRequirement>();
      pipeline = MainloopPipeline(storage.pipelines.mainloop, mp, ClusterShape{}, cute::false_type{}, cute::true_type{});
      TiledMma tiled_mma;
      PipelineState read;
      uint32_t empty_phase = 1;  // the buffer starts free
      auto const& row_scale = tree.op_0.op_0;  // RowScaleCol (router probabilities)
      auto const& group_scale = tree.op_0.op_1.op_1;
      auto const& bias = tree.op_0.op_1.op_2;
      do {
        problem = append<4>(params.problem_shape.get_problem_shape(work.L_idx), 1);
        const int k_tiles = TileScheduler::get_work_k_tile_count(work, problem, blk_shape);
        // The epilogue's inputs into L1 now, under the mainloop (registers would spill
        // there): the tile's bias row and row scales, a line a thread.
        {
          const int32_t l = work.L_idx, m0 = int32_t(work.M_idx) * kTileM, n0 = int32_t(work.N_idx) * kTileN;
          if (bias.ptr_row != nullptr && mma_thread < kTileN * 2 / 128 && n0 + mma_thread * 64 < get<1>(problem)) {
            prefetch_l1(bias.ptr_row[l] + n0 + mma_thread * 64);
          } else if (row_scale.ptr_col != nullptr && mma_thread >= 32 && mma_thread < 32 + kTileM * 4 / 128 &&
                     m0 + (mma_thread - 32) * 32 < get<0>(problem)) {
            prefetch_l1(row_scale.ptr_col[l] + m0 + (mma_thread - 32) * 32);
          }
        }
        auto accum = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));
        mainloop.mma(pipeline, read, accum, k_tiles, mma_thread, storage.tensors.mainloop, params.mainloop);
        mainloop.mma_tail(pipeline, read, k_tiles);
        read.advance(k_tiles);
        auto out = tile_values(tiled_mma, accum, work, problem, row_scale, group_scale, bias, mma_thread);
        handoff.empty.wait(empty_phase);  // the last tile's TMA stores have read the buffer
        empty_phase ^= 1;
        to_smem(tiled_mma, out, buffer, mma_thread);
        if (mma_thread == 0) *info = {int32_t(work.M_idx), int32_t(work.N_idx), int32_t(work.L_idx), 1};
        handoff.full.arrive();
        work = next_work();
      } while (work.is_valid());
      handoff.empty.wait(empty_phase);
      if (mma_thread == 0) info->valid = 0;
      handoff.full.arrive();
    }
#endif
  }

  CUTLASS_DEVICE static void prefetch_l1(void const* p) {
    asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
  }

  // The tile's D values of the thread's accumulator, as the tree computes them: scale * acc +
  // bias (one FFMA), times the row scale, one rounding to bf16. The thread's elements: rows
  // first_row + {0, 8}, columns first_col + 8 j + {0, 1} (j < kTileN / 8), at compile-time
  // offsets from its first.
  template <class Accum, class Work, class Problem, class RowScale, class GroupScale, class Bias>
  CUTLASS_DEVICE static auto tile_values(TiledMma const& tiled_mma, Accum const& accum, Work const& work,
                                         Problem const& problem, RowScale const& row_scale,
                                         GroupScale const& group_scale, Bias const& bias, int mma_thread) {
    using namespace cute;
    Tensor coords = tiled_mma.get_slice(mma_thread).partition_C(make_identity_tensor(CtaTile{}));
    const int32_t l = work.L_idx, rows = get<0>(problem), cols = get<1>(problem);
    const int32_t row0 = int32_t(work.M_idx) * kTileM + get<0>(coords(0));
    const int32_t col0 = int32_t(work.N_idx) * kTileN + get<1>(coords(0));
    constexpr int kPairs = kTileN / 8;  // the thread's column pairs
    uint32_t bias_pairs[kPairs];        // zero past the group's columns
    Element const* bias_row = bias.ptr_row != nullptr ? bias.ptr_row[l] : nullptr;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kPairs; ++j) {
      // cols is even (validate.cpp: D's rows are 16-byte aligned), so a pair is whole
      bias_pairs[j] = bias_row != nullptr && col0 + 8 * j < cols
                          ? __ldg(reinterpret_cast<uint32_t const*>(bias_row + col0 + 8 * j))
                          : 0u;
    }
    const float scale = group_scale.scale != nullptr ? __ldg(group_scale.scale + l) : 1.0f;
    float p[2];  // the row scales of rows row0, row0 + 8
    float const* p_rows = row_scale.ptr_col != nullptr ? row_scale.ptr_col[l] : nullptr;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      p[h] = p_rows != nullptr && row0 + 8 * h < rows ? __ldg(p_rows + row0 + 8 * h) : row_scale.null_default;
    }
    Tensor out = make_tensor_like<Element>(accum);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accum); i += 2) {
      const int h = (get<0>(coords(i)) - get<0>(coords(0))) / 8 % 2;
      const int j = (get<1>(coords(i)) - get<1>(coords(0))) / 8;
      const uint32_t b = bias_pairs[j];
      const float v0 = p[h] * (accum(i) * scale + __uint_as_float(b << 16));
      const float v1 = p[h] * (accum(i + 1) * scale + __uint_as_float(b & 0xffff0000u));
      const __nv_bfloat162 pair = __floats2bfloat162_rn(v0, v1);
      out(i) = Element::bitcast(__bfloat16_as_ushort(pair.x));
      out(i + 1) = Element::bitcast(__bfloat16_as_ushort(pair.y));
    }
    return out;
  }

  // The thread's D values into the tile buffer (stmatrix, as CUTLASS's epilogue), seen by the
  // TMA unit once the thread arrives on `full`.
  template <class Out>
  CUTLASS_DEVICE static void to_smem(TiledMma const& tiled_mma, Out const& out, Element* buffer, int mma_thread) {
    using namespace cute;
    Tensor s_tile = as_position_independent_swizzle_tensor(
        make_tensor(make_smem_ptr(buffer), tile_to_shape(typename Store::SmemAtom{}, CtaTile{})));
    auto r2s = make_tiled_copy_C(Copy_Atom<typename Store::CopyOpR2S, Element>{}, tiled_mma);
    auto thread_r2s = r2s.get_slice(mma_thread);
    copy(r2s, thread_r2s.retile_S(out), thread_r2s.partition_D(s_tile));
    cutlass::arch::fence_view_async_shared();
  }

  // The store warp: each tile's TMA stores once the consumers have written it, the buffer
  // freed once they have read it, until the consumers say there are no more tiles.
  CUTLASS_DEVICE static void store_tiles(typename Store::Params const& params, own_kernel::Handoff& handoff,
                                         Element* buffer, own_kernel::TileInfo const* info) {
    using namespace cute;
    uint32_t full_phase = 0;
    const bool leader = cute::elect_one_sync();
    while (true) {
      handoff.full.wait(full_phase);
      full_phase ^= 1;
      const own_kernel::TileInfo tile = *info;
      if (!tile.valid) break;
      if (leader) {
        // the group's rows through the descriptor's ragged modes (fixed_tma_store.cuh)
        const int32_t begin = tile.l == 0 ? 0 : params.offs[tile.l - 1];
        const int32_t rows = params.offs[tile.l] - begin;
        const int32_t row0 = tile.m * kTileM + fixed_tma::kBig - rows;
        const int32_t col0 = tile.n * kTileN;
        constexpr int kSubtiles = kTileN / Store::kEpiN;
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < kSubtiles; ++s) {
          if (col0 + s * Store::kEpiN < params.cols) {
            Store::template tma_store<CtaTile>(&params, buffer, row0, col0, begin + rows, 0, s, s, true);
          }
        }
        tma_store_arrive();
        tma_store_wait<0>();  // (the reads of the buffer)
      }
      __syncwarp();
      handoff.empty.arrive();  // every lane, each after its read of the tile's coordinates
    }
  }
};

}  // namespace cute_moe::detail

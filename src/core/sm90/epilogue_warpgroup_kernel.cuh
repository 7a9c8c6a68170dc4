// The fused activation backward (down-projection dgrad + act') with its epilogue in warps of
// its own, so a tile's epilogue runs while the next tile's mainloop keeps the tensor cores
// busy (docs/perf-notes.md, session 34).
//
// Why: in CUTLASS's cooperative kernel both consumer warpgroups run the epilogue (~46
// instructions per (gate, linear) pair, ~10 us of a ~36 us tile at GPT-OSS-20B) with the
// tensor cores idle: the tensor pipe is busy 68% of the time against a plain GEMM's 96%.
// Pingpong would hide it under the other warpgroup's mainloop, but a warpgroup that holds a
// whole 128x192 accumulator and runs this epilogue spills (sessions 22-33).
//
// Shape (512 threads; a fifth warpgroup would cap every thread at 96 registers at launch,
// and ptxas must fit the mainloop's WGMMA under that cap):
//   warpgroup 0     CUTLASS's producer warps (the mainloop's TMA loads, the scheduler)
//   warpgroup 1     the mainloop on the whole 128x192 tile (pingpong's collective: one
//                   warpgroup, 192 accumulator registers); at a tile's end the accumulator
//                   (fp32) goes to the CTA's scratch tile in global memory (L2: 96 KB a
//                   CTA, more than shared memory has beside four mainloop stages) and the
//                   next tile's mainloop starts at once
//   warpgroups 2-3  the epilogue, eight warps (two on each SM sub-partition): one row of the
//                   tile at a time per warp, each lane three column pairs 64 apart (so every
//                   global access of a warp is one contiguous run): dh from the scratch, pre
//                   from global memory (the tile's rows prefetched into L2 when it arrives),
//                   dpre and p * h stored directly, the row-scale-gradient partial by a warp
//                   sum, dpre's column sums (the up projection's bias gradient) per warp
// Two named barriers hand the scratch tile over (full: consumer -> epilogue; empty: back);
// the tile's coordinates go through shared memory.
// (Session 34 first handed dh over in shared memory as bf16, 128 x 200 with padded rows:
// 1.07x at GPT-OSS-20B, but the extra rounding broke two GPU tests; commit 63218b1. This
// fp32 handoff gives the default kernel's bits, at 0.97-1.04x on an H200: the scratch tile's
// 192 KB of L2 traffic a tile and the stores on the mainloop's critical path eat the gain.)
//
// The function of Sm90ActBackward (act_backward_epilogue.cuh), bit for bit in dpre and p * h;
// the fp32 sums (the row-scale-gradient partials, dpre's column sums) in another order.
// Gated activations; dpre interleaved or in [dgate | dlinear] halves.
#pragma once

#include <algorithm>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/bfloat16.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "activations.h"
#include "group_column_sum.h"  // kTileColumnSumWarps, tile_column_sum_slot

namespace cute_moe::detail {

namespace epi_wg {

constexpr int kTileM = 128;
constexpr int kTileN = 192;
constexpr int kEpiWarps = 8;              // two warpgroups
constexpr int kChunks = kTileN / 64;      // a lane's column pairs in a row
constexpr uint32_t kHandoffThreads = 128 + 32 * kEpiWarps;
constexpr uint32_t kFullBarrier = 0;      // named barriers (user ids: CUTLASS adds its reserved count)
constexpr uint32_t kEmptyBarrier = 1;

struct TileInfo {
  int32_t m, n, l, valid;
};
constexpr size_t kScratchTileBytes = size_t(kTileM) * kTileN * sizeof(float);

CUTLASS_DEVICE void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}
CUTLASS_DEVICE uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return reinterpret_cast<uint32_t const&>(v);
}
CUTLASS_DEVICE float lo_bf16(uint32_t w) { return __uint_as_float(w << 16); }
CUTLASS_DEVICE float hi_bf16(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

}  // namespace epi_wg

// Base: CUTLASS's pingpong grouped-GEMM kernel of the row (its collectives, scheduler and
// parameters are used; its operator() and shared storage are replaced).
template <class Base, class Activation, bool kHalvesOut>
struct EpilogueWarpgroupKernel : Base {
  static_assert(Activation::kGated, "the epilogue warpgroups handle gated activations");
  using typename Base::CollectiveMainloop;
  using typename Base::TileScheduler;
  using typename Base::TiledMma;
  using typename Base::TileShape;
  using typename Base::ClusterShape;
  using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
  using PipelineState = typename CollectiveMainloop::PipelineState;
  using SchedulerPipeline = typename TileScheduler::Pipeline;

  // CUTLASS's parameters, plus the CTAs' scratch tiles at the end of the workspace (one per
  // CTA of the persistent grid: at most one per SM, rounded up to whole clusters)
  using typename Base::Arguments;
  using BaseParams = typename Base::Params;
  struct Params : BaseParams {
    float* scratch = nullptr;
    int32_t scratch_tiles = 0;
  };
  static int32_t scratch_tiles(Arguments const& args) {
    const int32_t cluster = int32_t(cute::size(ClusterShape{}));
    return (std::max(args.hw_info.sm_count, 1) + cluster - 1) / cluster * cluster;
  }
  static size_t base_workspace(Arguments const& args) { return (Base::get_workspace_size(args) + 255) / 256 * 256; }
  static size_t get_workspace_size(Arguments const& args) {
    return base_workspace(args) + size_t(scratch_tiles(args)) * epi_wg::kScratchTileBytes;
  }
  static Params to_underlying_arguments(Arguments const& args, void* workspace) {
    Params p;
    static_cast<BaseParams&>(p) = Base::to_underlying_arguments(args, workspace);
    p.scratch = reinterpret_cast<float*>(static_cast<char*>(workspace) + base_workspace(args));
    p.scratch_tiles = scratch_tiles(args);
    return p;
  }

  // CUTLASS's storage less the collective epilogue's, plus the handed-over tile's coordinates
  // (named `epilogue`, where the collective's storage was)
  using BaseStorage = typename Base::SharedStorage;
  struct SharedStorage {
    struct TensorStorage : cute::aligned_struct<128, cute::_1> {
      typename BaseStorage::TensorStorage::MainloopTensorStorage mainloop;
      alignas(16) epi_wg::TileInfo epilogue;
    } tensors;
    typename BaseStorage::PipelineStorage pipelines;
    alignas(16) typename Base::TileSchedulerResponse scheduler_response[Base::TileSchedulerStages];
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static_assert(SharedStorageSize <= 227 * 1024, "shared memory: 227 KB a CTA");

  static constexpr uint32_t MaxThreadsPerBlock = 4 * cutlass::NumThreadsPerWarpGroup;
  static dim3 get_block_shape() { return dim3(MaxThreadsPerBlock, 1, 1); }
  // per warpgroup: the producer's, the consumer's (a 192-register accumulator), each epilogue one's
  static constexpr uint32_t kLoadRegs = 40, kMmaRegs = 232, kEpiRegs = 120;
  static_assert(kLoadRegs + kMmaRegs + 2 * kEpiRegs <= 512, "the register file: 64 K over 512 threads");
  static_assert(!Base::IsMainloopAuxiliaryLoadNeeded, "no auxiliary load warp");

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(size(TiledMma{}) == 128, "one consumer warpgroup holds the whole tile (pingpong's TiledMma)");
    static_assert(size<0>(TileShape{}) == epi_wg::kTileM && size<1>(TileShape{}) == epi_wg::kTileN,
                  "the scratch tile is 128 x 192");
    enum class Role { Mainloop = 0, MainloopAux = 1, Unused = 2, Scheduler = 3 };
    SharedStorage& storage = *reinterpret_cast<SharedStorage*>(smem_buf);
    TileScheduler scheduler{params.scheduler, storage.scheduler_response};
    CollectiveMainloop mainloop;

    const int thread_idx = int(threadIdx.x);
    const int warp_group = cutlass::canonical_warp_group_idx();
    const Role role = Role(cutlass::canonical_warp_idx_sync() % cutlass::NumWarpsPerWarpGroup);
    const bool producer = warp_group == 0;
    const bool consumer = warp_group == 1;  // warpgroups 2, 3: the epilogue
    const int mma_thread = thread_idx - int(cutlass::NumThreadsPerWarpGroup);
    const uint32_t block_rank = block_rank_in_cluster();

    typename SchedulerPipeline::Params sp;
    sp.role = producer && role == Role::Scheduler ? SchedulerPipeline::ThreadCategory::Producer
                                                  : SchedulerPipeline::ThreadCategory::Consumer;
    sp.consumer_arv_count =
        size(TiledMma{}) + cutlass::NumThreadsPerWarp * (1 + (Base::IsMainloopAuxiliaryLoadNeeded ? 1 : 0));
    sp.producer_arv_count = 1;
    SchedulerPipeline scheduler_pipeline(storage.pipelines.scheduler, sp);
    typename MainloopPipeline::Params mp;
    if (producer && role == Role::Mainloop) {
      mp.role = MainloopPipeline::ThreadCategory::Producer;
    }
    if (consumer) mp.role = MainloopPipeline::ThreadCategory::Consumer;
    mp.is_leader = thread_idx % cutlass::NumThreadsPerWarpGroup == 0;
    mp.num_consumers = size(TiledMma{});
    mp.num_producers = Base::NumProducerThreads;
    mp.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline pipeline(storage.pipelines.mainloop, mp, ClusterShape{});

    if constexpr (size(ClusterShape{}) > 1) {
      cluster_arrive_relaxed();
      cluster_wait();
    } else {
      __syncthreads();
    }

    epi_wg::TileInfo* info = &storage.tensors.epilogue;
    const int32_t cta = int32_t(blockIdx.x + blockIdx.y * gridDim.x + blockIdx.z * gridDim.x * gridDim.y);
    if (cta >= params.scratch_tiles) __trap();  // (the grid is at most one CTA per SM)
    float* scratch = params.scratch + int64_t(cta) * (epi_wg::kTileM * epi_wg::kTileN);  // (128, 192)

    auto work = scheduler.initial_work_tile_info(ClusterShape{});
    if (!work.is_valid()) return;  // (every warpgroup alike: the scheduler's answer is the CTA's)
    auto problem = append<4>(params.problem_shape.get_problem_shape(work.L_idx), 1);
    const auto blk_shape = TileShape{};
    typename SchedulerPipeline::PipelineState scheduler_read;
    auto next_work = [&] {
      auto [next, increment] = scheduler.fetch_next_work(work, scheduler_pipeline, scheduler_read);
      if (increment) ++scheduler_read;
      return next;
    };

    if (producer) {
      cutlass::arch::warpgroup_reg_dealloc<kLoadRegs>();
      if (role == Role::Scheduler) {
        auto write = cutlass::make_producer_start_state<SchedulerPipeline>();
        do {
          auto [next, increment] = scheduler.advance_to_next_work(scheduler_pipeline, write);
          work = next;
          if (increment) ++write;
        } while (work.is_valid());
        scheduler_pipeline.producer_tail(write);
      } else if (role == Role::Mainloop) {
        auto inputs = mainloop.load_init(problem, params.mainloop);
        auto write = cutlass::make_producer_start_state<MainloopPipeline>();
        const int lane = thread_idx % cutlass::NumThreadsPerWarp;
        int32_t loaded_group = -1;
        do {
          if (work.L_idx != loaded_group) {
            loaded_group = work.L_idx;
            problem = append<4>(params.problem_shape.get_problem_shape(loaded_group), 1);
            inputs = mainloop.tensors_perform_update(inputs, params.mainloop, problem, loaded_group);
          }
          const int k_tiles = TileScheduler::get_work_k_tile_count(work, problem, blk_shape);
          auto k_iter = make_coord_iterator(0, shape<3>(get<0>(inputs)));
          mainloop.load(params.mainloop, pipeline, write, inputs, make_tuple(nullptr, nullptr),
                        make_coord(work.M_idx, work.N_idx, _, 0), k_iter, k_tiles, lane, block_rank,
                        storage.tensors.mainloop);
          write.advance(k_tiles);
          work = next_work();
        } while (work.is_valid());
        mainloop.load_tail(pipeline, write);
      }
    } else if (consumer) {
      cutlass::arch::warpgroup_reg_alloc<kMmaRegs>();
      TiledMma tiled_mma;
      PipelineState read;
      Tensor coords = tiled_mma.get_slice(mma_thread).partition_C(make_identity_tensor(take<0, 2>(blk_shape)));
      do {
        problem = append<4>(params.problem_shape.get_problem_shape(work.L_idx), 1);
        const int k_tiles = TileScheduler::get_work_k_tile_count(work, problem, blk_shape);
        auto accum = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));
        mainloop.mma(pipeline, read, accum, k_tiles, mma_thread, storage.tensors.mainloop, params.mainloop);
        mainloop.mma_tail(pipeline, read, k_tiles);
        read.advance(k_tiles);
        const auto tile = work;
        work = next_work();
        // the scratch tile is the epilogue's until it has read the last tile; meanwhile the
        // producer already loads the next tile's k-tiles
        cutlass::arch::NamedBarrier::sync(epi_wg::kHandoffThreads, epi_wg::kEmptyBarrier);
        // (i, i + 1): adjacent columns of one row, at a compile-time offset from the thread's
        // first element (one address register, not one per store)
        float* first = scratch + get<0>(coords(0)) * epi_wg::kTileN + get<1>(coords(0));
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); i += 2) {
          const int offset = (get<0>(coords(i)) - get<0>(coords(0))) * epi_wg::kTileN + get<1>(coords(i)) -
                             get<1>(coords(0));
          *reinterpret_cast<float2*>(first + offset) = make_float2(accum(i), accum(i + 1));
        }
        if (mma_thread == 0) *info = {int32_t(tile.M_idx), int32_t(tile.N_idx), int32_t(tile.L_idx), 1};
        __threadfence_block();  // the stores before the arrive, for the epilogue's loads
        cutlass::arch::NamedBarrier::arrive(epi_wg::kHandoffThreads, epi_wg::kFullBarrier);
      } while (work.is_valid());
      cutlass::arch::NamedBarrier::sync(epi_wg::kHandoffThreads, epi_wg::kEmptyBarrier);
      if (mma_thread == 0) info->valid = 0;
      cutlass::arch::NamedBarrier::arrive(epi_wg::kHandoffThreads, epi_wg::kFullBarrier);
    } else {
      cutlass::arch::warpgroup_reg_dealloc<kEpiRegs>();  // (the launch gives every thread 128)
      epilogue(params, scratch, info, thread_idx - 2 * int(cutlass::NumThreadsPerWarpGroup));
    }
#endif
  }

  // The epilogue warps: tiles from the scratch until the consumer says there are none.
  // t: the thread's index among the epilogue's 32 * kEpiWarps.
  CUTLASS_DEVICE void epilogue(Params const& params, float const* scratch, epi_wg::TileInfo const* info, int t) {
    using namespace cute;
    using namespace epi_wg;
    auto const& node = params.epilogue.thread.op_3;  // Sm90ActBackward's params
    float const* const* row_scales = params.epilogue.thread.op_2.ptr_col;
    const int warp = t / 32, lane = t % 32;
    static_assert(kEpiWarps == kTileColumnSumWarps, "a column-sum row per epilogue warp");
    cutlass::arch::NamedBarrier::arrive(kHandoffThreads, kEmptyBarrier);  // the scratch tile starts free
    while (true) {
      cutlass::arch::NamedBarrier::sync(kHandoffThreads, kFullBarrier);
      const TileInfo tile = *info;
      if (!tile.valid) break;
      const int l = tile.l;
      auto shape = params.problem_shape.get_problem_shape(l);
      // n: dh's columns (I); a multiple of 8 (validate.cpp: the GEMM's output rows), so the
      // lanes' column pairs are whole
      const int32_t rows = get<0>(shape), n = get<1>(shape);
      const int32_t m0 = tile.m * kTileM, n0 = tile.n * kTileN;
      const int32_t tile_rows = min(kTileM, rows - m0);  // <= 0: a cluster's spare tile
      const int32_t cols = min(kTileN, n - n0);
      const int32_t begin = l == 0 ? 0 : __ldg(node.offs + l - 1);
      // the group's matrices at the tile's first row and column: pre (words), dpre (words, or
      // bf16 dgate with dlinear beside it), p * h (bf16 pairs)
      const int64_t ldc = get<0>(params.epilogue.dC[l]), ldd = get<0>(params.epilogue.dD[l]);
      uint32_t const* pre = reinterpret_cast<uint32_t const*>(params.epilogue.ptr_C[l]) + int64_t(m0) * ldc + n0;
      auto* d_base = reinterpret_cast<cutlass::bfloat16_t*>(params.epilogue.ptr_D[l]);  // (see d_at)
      const int64_t hp_ld = node.hp_out.ld / 2;
      uint32_t* hp = reinterpret_cast<uint32_t*>(static_cast<cutlass::bfloat16_t*>(node.hp_out.ptr) +
                                                 (int64_t(begin) + m0) * node.hp_out.ld + n0);
      const float scale = node.group_scale != nullptr ? __ldg(node.group_scale + l) : 1.0f;
      float const* p_rows = row_scales != nullptr ? row_scales[l] + m0 : nullptr;
      float* partial =
          node.ptr_partial != nullptr ? node.ptr_partial[l] + int64_t(tile.n) * node.partial_stride + m0 : nullptr;
      // the tile's pre rows into L2 now, so the row loads below wait on L2, not DRAM
      if (t < tile_rows) prefetch_l2(pre + int64_t(t) * ldc, uint32_t(cols) * 4u);

      const ActParams act = node.act;
      float sums[kChunks][4];  // dpre's column sums over the warp's rows: (dgate, dlinear) x 2 columns
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kChunks; ++k) {
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < 4; ++v) sums[k][v] = 0.0f;
      }
      // The lane's columns: pairs c = 2 lane + 64 k, those inside the tile's columns. A whole
      // tile (every tile at GPT-OSS-20B and Qwen3-30B-A3B) runs without a test per pair.
      auto in_tile = [&](int k) { return 2 * lane + 64 * k + 2 <= cols; };
      auto rows_loop = [&](auto whole) {
        constexpr bool kWhole = decltype(whole)::value;
        bool on[kChunks];
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < kChunks; ++k) on[k] = kWhole || in_tile(k);
        // the warp's rows r = warp + kEpiWarps i, by pointers stepped kEpiWarps rows at a time
        uint32_t const* pre_at = pre + int64_t(warp) * ldc + 2 * lane;
        // dpre: interleaved, a row of n words (D's element), the lane's pairs at 2 lane + 64 k;
        // halves, dgate a row of n bf16 (D's element) and dlinear n past it, at lane + 32 k
        const int64_t d_row = kHalvesOut ? ldd / 2 : ldd;  // in 32-bit words
        uint32_t* d_at = kHalvesOut ? reinterpret_cast<uint32_t*>(d_base + int64_t(m0 + warp) * ldd + n0) + lane
                                    : reinterpret_cast<uint32_t*>(d_base) + int64_t(m0 + warp) * ldd + n0 + 2 * lane;
        const int64_t dlinear_words = kHalvesOut ? int64_t(n) / 2 : 0;  // dlinear: n columns past dgate
        uint32_t* hp_at = hp + int64_t(warp) * hp_ld + lane;
        float const* dh_at = scratch + warp * kTileN + 2 * lane;
        float const* p_at = p_rows != nullptr ? p_rows + warp : nullptr;
        // a row's pre words, dh (from L2: the scratch tile is rewritten every tile, so not
        // through L1) and p
        auto load_row = [&](uint32_t const* src, float const* dh_src, float const* p_src, uint2 (&w)[kChunks],
                            float2 (&dh)[kChunks], float& p) {
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < kChunks; ++k) {
            w[k] = on[k] ? __ldg(reinterpret_cast<uint2 const*>(src + 64 * k)) : make_uint2(0, 0);
            dh[k] = on[k] ? __ldcg(reinterpret_cast<float2 const*>(dh_src + 64 * k)) : make_float2(0.0f, 0.0f);
          }
          p = p_src != nullptr ? __ldg(p_src) : 1.0f;
        };
        uint2 w[kChunks];
        float2 dh[kChunks];
        float p = 1.0f;
        if (warp < tile_rows) load_row(pre_at, dh_at, p_at, w, dh, p);
        CUTLASS_PRAGMA_NO_UNROLL
        for (int r = warp; r < tile_rows; r += kEpiWarps) {
          // the next row's pre, dh and p in flight under this row's math
          uint2 w_next[kChunks];
          float2 dh_next[kChunks];
          float p_next = 1.0f;
          if (r + kEpiWarps < tile_rows) {
            load_row(pre_at + kEpiWarps * ldc, dh_at + kEpiWarps * kTileN, p_at != nullptr ? p_at + kEpiWarps : nullptr,
                     w_next, dh_next, p_next);
          } else {
            CUTLASS_PRAGMA_UNROLL
            for (int k = 0; k < kChunks; ++k) {
              w_next[k] = make_uint2(0, 0);
              dh_next[k] = make_float2(0.0f, 0.0f);
            }
          }
          float hs = 0.0f;  // h * s over the row's columns (the row-scale gradient's part)
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < kChunks; ++k) {
            if (!on[k]) continue;
            const float acc[2] = {dh[k].x, dh[k].y};  // dy @ W^T of the pair's two columns
            const uint32_t words[2] = {w[k].x, w[k].y};
            float dg[2], dl[2], hv[2];
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < 2; ++j) {
              const float s = scale * acc[j];
              const float h = Activation::backward(lo_bf16(words[j]), hi_bf16(words[j]), p * s, act, dg[j], dl[j]);
              hv[j] = p * h;
              hs += h * s;
            }
            uint32_t out[2];  // interleaved: (dgate, dlinear) of each column; halves: dgate, dlinear pairs
            if constexpr (kHalvesOut) {
              out[0] = pack_bf16(dg[0], dg[1]);
              out[1] = pack_bf16(dl[0], dl[1]);
              d_at[32 * k] = out[0];
              d_at[32 * k + dlinear_words] = out[1];
              sums[k][0] += lo_bf16(out[0]);  // dpre as stored: (dgate, dlinear) of each column
              sums[k][1] += lo_bf16(out[1]);
              sums[k][2] += hi_bf16(out[0]);
              sums[k][3] += hi_bf16(out[1]);
            } else {
              out[0] = pack_bf16(dg[0], dl[0]);
              out[1] = pack_bf16(dg[1], dl[1]);
              *reinterpret_cast<uint2*>(d_at + 64 * k) = make_uint2(out[0], out[1]);
              sums[k][0] += lo_bf16(out[0]);
              sums[k][1] += hi_bf16(out[0]);
              sums[k][2] += lo_bf16(out[1]);
              sums[k][3] += hi_bf16(out[1]);
            }
            hp_at[32 * k] = pack_bf16(hv[0], hv[1]);
          }
          if (partial != nullptr) {
            CUTLASS_PRAGMA_UNROLL
            for (int bit = 16; bit >= 1; bit /= 2) hs += __shfl_xor_sync(0xffffffffu, hs, bit);
            if (lane == 0) partial[r] = hs;
          }
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < kChunks; ++k) {
            w[k] = w_next[k];
            dh[k] = dh_next[k];
          }
          p = p_next;
          pre_at += kEpiWarps * ldc;
          d_at += kEpiWarps * d_row;
          hp_at += kEpiWarps * hp_ld;
          dh_at += kEpiWarps * kTileN;
          if (p_at != nullptr) p_at += kEpiWarps;
        }
      };
      if (cols == kTileN) {
        rows_loop(cute::true_type{});
      } else {
        rows_loop(cute::false_type{});
      }
      // The tile's slot has one partial row per warp (tile_column_sums.cuh), in dpre's
      // column order: interleaved (dgate, dlinear) pairs, or the dgate half then the dlinear.
      if (node.col_partial != nullptr && tile_rows > 0) {
        const int64_t slot = tile_column_sum_slot(begin, tile.m, l);
        float* mine = node.col_partial + (slot * kTileColumnSumWarps + warp) * node.col_partial_ld;
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < kChunks; ++k) {
          if (!in_tile(k)) continue;
          const int32_t c = n0 + 2 * lane + 64 * k;
          if constexpr (kHalvesOut) {
            *reinterpret_cast<float2*>(mine + c) = make_float2(sums[k][0], sums[k][2]);
            *reinterpret_cast<float2*>(mine + n + c) = make_float2(sums[k][1], sums[k][3]);
          } else {
            *reinterpret_cast<float4*>(mine + 2 * c) = make_float4(sums[k][0], sums[k][1], sums[k][2], sums[k][3]);
          }
        }
      }
      cutlass::arch::NamedBarrier::arrive(kHandoffThreads, kEmptyBarrier);
    }
  }
};

// The kernel of a row: this one, on the pingpong twin's CUTLASS kernel, where kUse; else the
// row's own (the twin's types are built only when used).
template <bool kUse, class Kernel, class PingpongTypes, class Activation, bool kHalvesOut>
struct EpilogueWarpgroupOf {
  using type = Kernel;
};
template <class Kernel, class PingpongTypes, class Activation, bool kHalvesOut>
struct EpilogueWarpgroupOf<true, Kernel, PingpongTypes, Activation, kHalvesOut> {
  using type = EpilogueWarpgroupKernel<typename PingpongTypes::CutlassKernel, Activation, kHalvesOut>;
};

}  // namespace cute_moe::detail

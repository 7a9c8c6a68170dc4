// The fused activation backward (down-projection dgrad + act') with its epilogue in warps of
// its own, so a tile's epilogue runs while the next tile's mainloop keeps the tensor cores
// busy (docs/perf-notes.md, sessions 34-35).
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
//                   warpgroup, 192 accumulator registers, four 40 KB stages); at a tile's
//                   end the accumulator (fp32) goes to the epilogue in two halves of 64
//                   rows through one shared buffer, and the next tile's mainloop starts
//   warpgroups 2-3  the epilogue, eight warps (two on each SM sub-partition): one row of the
//                   tile at a time per warp, each lane three column pairs 64 apart (so every
//                   global access of a warp is one contiguous run): pre from global memory
//                   (the tile's rows prefetched into L2 when it arrives), dpre and p * h
//                   stored directly, the row-scale-gradient partial by a warp sum, dpre's
//                   column sums (the up projection's bias gradient) per warp
// The handoff: fp32 dh of a whole tile (96 KB) does not fit beside four stages (160 KB), half
// a tile does. The consumer writes the first half; the epilogue takes it into registers (48
// a thread) and frees the buffer; the consumer writes the second half, which the epilogue
// reads from the buffer after the first half's rows. The consumer waits only for that copy.
// Two mbarriers order it (full: consumer -> epilogue; empty: back); the tile's coordinates
// go through shared memory with the first half.
// (Session 34 handed dh over as bf16, 1.07x at GPT-OSS-20B but not the default kernel's
// bits, or in fp32 through a scratch tile in L2, the same bits at 0.97-1.04x; session 35
// tried fp32 whole tiles beside 3 stages of k = 64 or 6 of k = 32: 1.00 and 1.01-1.03x.)
//
// The function of Sm90ActBackward (act_backward_epilogue.cuh), bit for bit in dpre and p * h;
// the fp32 sums (the row-scale-gradient partials, dpre's column sums) in another order.
// Gated activations; dpre interleaved or in [dgate | dlinear] halves.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/bfloat16.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "activations.h"
#include "group_column_sum.h"  // kTileColumnSumWarps, tile_column_sum_slot
#include "own_kernel_parts.cuh"

namespace cute_moe::detail {

namespace epi_wg {

constexpr int kTileM = 128;
constexpr int kTileN = 192;
constexpr int kHalfM = kTileM / 2;        // the handoff buffer's rows: half a tile
constexpr int kBufLd = kTileN + 8;        // fp32 per buffer row (see the consumer's stores)
constexpr int kEpiWarps = 8;              // two warpgroups
constexpr int kChunks = kTileN / 64;      // a lane's column pairs in a row
// the buffer's handoff (own_kernel::Handoff)
constexpr uint32_t kWriters = 128;                 // the consumer warpgroup
constexpr uint32_t kReaders = 32 * kEpiWarps;      // the epilogue warps
// the mainloop's k-tile and stages: 4 x 40 KB beside the 50 KB handoff buffer
constexpr int kTileK = 64;
constexpr int kStages = 4;

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

  using typename Base::Params;

  // CUTLASS's storage less the collective epilogue's, plus the handoff buffer (named
  // `epilogue`, where the collective's storage was) and the tile it holds
  using BaseStorage = typename Base::SharedStorage;
  struct SharedStorage {
    struct TensorStorage : cute::aligned_struct<128, cute::_1> {
      typename BaseStorage::TensorStorage::MainloopTensorStorage mainloop;
      alignas(128) cute::array_aligned<float, epi_wg::kHalfM * epi_wg::kBufLd> epilogue;
      alignas(16) own_kernel::TileInfo info;
    } tensors;
    typename BaseStorage::PipelineStorage pipelines;
    alignas(16) own_kernel::Handoff handoff;
    alignas(16) typename Base::TileSchedulerResponse scheduler_response[Base::TileSchedulerStages];
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static_assert(SharedStorageSize <= 227 * 1024, "shared memory: 227 KB a CTA");

  static constexpr uint32_t MaxThreadsPerBlock = 4 * cutlass::NumThreadsPerWarpGroup;
  static dim3 get_block_shape() { return dim3(MaxThreadsPerBlock, 1, 1); }
  // per warpgroup: the producer's (two busy warps), the consumer's (a 192-register
  // accumulator), each epilogue one's (48 of them hold the first half's dh; at 120, ptxas spills)
  static constexpr uint32_t kLoadRegs = 24, kMmaRegs = 232, kEpiRegs = 128;
  static_assert(kLoadRegs + kMmaRegs + 2 * kEpiRegs <= 512, "the register file: 64 K over 512 threads");
  static_assert(!Base::IsMainloopAuxiliaryLoadNeeded, "no auxiliary load warp");

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(size(TiledMma{}) == 128, "one consumer warpgroup holds the whole tile (pingpong's TiledMma)");
    static_assert(size<0>(TileShape{}) == epi_wg::kTileM && size<1>(TileShape{}) == epi_wg::kTileN,
                  "the buffer holds a 128 x 192 tile");
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
    own_kernel::Handoff& handoff = storage.handoff;
    if (thread_idx == 0) handoff.init(epi_wg::kWriters, epi_wg::kReaders);
    own_kernel::start_cluster<ClusterShape>();

    float* buffer = storage.tensors.epilogue.data();  // (64, kBufLd)
    own_kernel::TileInfo* info = &storage.tensors.info;

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
        own_kernel::run_scheduler(scheduler, scheduler_pipeline);
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
      uint32_t empty_phase = 1;
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
        // The tile goes over in two halves of 64 rows through one 64-row buffer: the
        // epilogue takes the first into its registers and frees the buffer for the second.
        // (i, i + 1): adjacent columns of one row, at a compile-time offset from the thread's
        // first element (one address register, not one per store); the fragment's rows are
        // the thread's first row + 0, 8 (first half), 64, 72 (second). A warp's store covers
        // 8 rows x 4 lanes; rows kBufLd = 200 words apart put each bank under two of its
        // lanes (a 64-bit store's minimum of two wavefronts), where 192 would put it under eight.
        float* first = buffer + get<0>(coords(0)) * epi_wg::kBufLd + get<1>(coords(0));
        CUTLASS_PRAGMA_UNROLL
        for (int half = 0; half < 2; ++half) {
          // free once the epilogue has finished the last tile (first half) or taken this
          // tile's first half (second); meanwhile the producer loads the next tile's k-tiles
          handoff.empty.wait(empty_phase);
          empty_phase ^= 1;
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < size(accum); i += 2) {
            const int row = get<0>(coords(i)) - get<0>(coords(0));
            if (row / epi_wg::kHalfM != half) continue;
            const int offset = (row - half * epi_wg::kHalfM) * epi_wg::kBufLd + get<1>(coords(i)) - get<1>(coords(0));
            *reinterpret_cast<float2*>(first + offset) = make_float2(accum(i), accum(i + 1));
          }
          if (half == 0 && mma_thread == 0) {
            *info = {int32_t(tile.M_idx), int32_t(tile.N_idx), int32_t(tile.L_idx), 1};
          }
          handoff.full.arrive();
        }
      } while (work.is_valid());
      handoff.empty.wait(empty_phase);
      if (mma_thread == 0) info->valid = 0;
      handoff.full.arrive();
    } else {
      cutlass::arch::warpgroup_reg_dealloc<kEpiRegs>();  // (what the launch gives every thread)
      epilogue(params, handoff, buffer, info, thread_idx - 2 * int(cutlass::NumThreadsPerWarpGroup));
    }
#endif
  }

  // The epilogue warps: tiles from the buffer until the consumer says there are none.
  // t: the thread's index among the epilogue's 32 * kEpiWarps.
  CUTLASS_DEVICE void epilogue(Params const& params, own_kernel::Handoff& handoff, float const* buffer, own_kernel::TileInfo const* info, int t) {
    using namespace cute;
    using namespace epi_wg;
    auto const& node = params.epilogue.thread.op_3;  // Sm90ActBackward's params
    float const* const* row_scales = params.epilogue.thread.op_2.ptr_col;
    const int warp = t / 32, lane = t % 32;
    static_assert(kEpiWarps == kTileColumnSumWarps, "a column-sum row per epilogue warp");
    uint32_t full_phase = 0;
    while (true) {
      handoff.full.wait(full_phase);  // the tile's first half
      full_phase ^= 1;
      const own_kernel::TileInfo tile = *info;
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
      // The first half's dh into registers (a warp's rows warp + kEpiWarps i, i < kHalfRows),
      // which frees the buffer for the second half. Every row is read, those past the
      // group's end too (the consumer writes the whole tile): no tests.
      constexpr int kHalfRows = kHalfM / kEpiWarps;
      float2 dh_first[kHalfRows][kChunks];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kHalfRows; ++i) {
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < kChunks; ++k) {
          dh_first[i][k] = *reinterpret_cast<float2 const*>(buffer + (warp + kEpiWarps * i) * kBufLd + 2 * lane + 64 * k);
        }
      }
      handoff.empty.arrive();
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
        [[maybe_unused]] const int64_t dlinear_words = kHalvesOut ? int64_t(n) / 2 : 0;  // dlinear: n columns past dgate
        uint32_t* hp_at = hp + int64_t(warp) * hp_ld + lane;
        float const* p_at = p_rows != nullptr ? p_rows + warp : nullptr;
        // a row's pre words and p
        auto load_row = [&](uint32_t const* src, float const* p_src, uint2 (&w)[kChunks], float& p) {
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < kChunks; ++k) {
            w[k] = on[k] ? __ldg(reinterpret_cast<uint2 const*>(src + 64 * k)) : make_uint2(0, 0);
          }
          p = p_src != nullptr ? __ldg(p_src) : 1.0f;
        };
        uint2 w[kChunks];
        float p = 1.0f;
        if (warp < tile_rows) load_row(pre_at, p_at, w, p);
        // row r with its pre words w, p and dh; then the pointers one step on and the next
        // row's pre and p (in flight under this row's math) in w and p
        auto row = [&](int r, float2 const (&dh)[kChunks]) {
          uint2 w_next[kChunks];
          float p_next = 1.0f;
          if (r + kEpiWarps < tile_rows) {
            load_row(pre_at + kEpiWarps * ldc, p_at != nullptr ? p_at + kEpiWarps : nullptr, w_next, p_next);
          } else {
            CUTLASS_PRAGMA_UNROLL
            for (int k = 0; k < kChunks; ++k) w_next[k] = make_uint2(0, 0);
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
          for (int k = 0; k < kChunks; ++k) w[k] = w_next[k];
          p = p_next;
          pre_at += kEpiWarps * ldc;
          d_at += kEpiWarps * d_row;
          hp_at += kEpiWarps * hp_ld;
          if (p_at != nullptr) p_at += kEpiWarps;
        };
        // the first half from the registers (unrolled: the rows index them)
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kHalfRows; ++i) {
          if (warp + kEpiWarps * i < tile_rows) row(warp + kEpiWarps * i, dh_first[i]);
        }
        // the second half from the buffer, once the consumer has written it
        handoff.full.wait(full_phase);
        full_phase ^= 1;
        float const* dh_at = buffer + warp * kBufLd + 2 * lane;
        CUTLASS_PRAGMA_NO_UNROLL
        for (int r = kHalfM + warp; r < tile_rows; r += kEpiWarps) {
          float2 dh[kChunks];
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < kChunks; ++k) {
            dh[k] = on[k] ? *reinterpret_cast<float2 const*>(dh_at + 64 * k) : make_float2(0.0f, 0.0f);
          }
          row(r, dh);
          dh_at += kEpiWarps * kBufLd;
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
      handoff.empty.arrive();
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
  using T = PingpongTypes;
  // the twin's mainloop rebuilt with the k-tile and stage count that leave room for the buffer
  using Mainloop = typename T::Traits::Mainloop::template type<typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename T::ElementAB,
      typename T::Operands::template LayoutTagA<typename T::Traits::LayoutA>, T::kAlignAB, typename T::ElementAB,
      typename T::Operands::template LayoutTagB<typename T::Traits::LayoutB>, T::kAlignAB, float,
      cute::Shape<cute::Int<epi_wg::kTileM>, cute::Int<epi_wg::kTileN>, cute::Int<epi_wg::kTileK>>,
      typename T::ClusterShape, cutlass::gemm::collective::StageCount<epi_wg::kStages>,
      typename T::MainloopSchedule>::CollectiveOp>;
  using Base = cutlass::gemm::kernel::GemmUniversal<typename T::ProblemShape, Mainloop, typename T::CollectiveEpilogue>;
  using type = EpilogueWarpgroupKernel<Base, Activation, kHalvesOut>;
};

}  // namespace cute_moe::detail

// The up-projection's mainloop with the token gather fused into the A load.
//
// Routed row r of a ragged-M group reads token row rows[r] of x (the permutation of the
// MoE dispatch), so the sorted copy of x (M x H: top-k times the tokens) is never written
// or read. SM90's TMA copies boxes, not row lists, so A comes in with cp.async:
//
//   producer warp 0 (Mainloop)     TMA of the B tile (the expert's weight, multicast over
//                                  the cluster as in the plain kernel), and
//   producer warps 0 and 1         cp.async of half the tile's gathered A rows each, 16
//   (Mainloop, MainloopAux)        bytes per lane per copy, into the same swizzled smem
//                                  layout the TMA would have written; each lane arrives
//                                  on the stage's full barrier once its copies landed
//   consumers                      wait for the stage (65 arrivals and B's bytes), fence
//                                  (cp.async writes through the generic proxy, WGMMA reads
//                                  through the async proxy), then the unchanged WGMMA loop
//
// Everything else (tile scheduler, epilogue, TMA descriptor updates per group) is
// CUTLASS's ptr-array kernel, which runs the MainloopAux warp for dispatch policies that
// declare an auxiliary load. Rows past the group's end and K past the matrix are
// zero-filled; the row indices were range-checked by the setup kernel.
//
// Measured (H200, docs/perf-notes.md): the A copies are issue-bound in the two warps the
// kernel gives its mainloop (one warp: 0.58x, two: 0.77x the separate gather + TMA GEMM
// at GPT-OSS-20B), so the MoE layer keeps the separate gather; this kernel is the
// memory-saving route (no M x H copy of x).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/gemm/dispatch_policy.hpp>

namespace cute_moe::detail {

// The dispatch policy of the gathered mainloop: CUTLASS's ptr-array policy plus the
// auxiliary-load flag below (the kernel schedule, and so the kernel, are unchanged).
template <int Stages, class ClusterShape, class KernelSchedule>
struct MainloopSm90GatherA : cutlass::gemm::MainloopSm90ArrayTmaGmmaWarpSpecialized<Stages, ClusterShape, KernelSchedule> {};

}  // namespace cute_moe::detail

namespace cutlass::gemm::kernel::detail {
template <int Stages, class ClusterShape, class KernelSchedule>
struct HasAuxiliaryLoad<cute_moe::detail::MainloopSm90GatherA<Stages, ClusterShape, KernelSchedule>> : cute::true_type {};
}  // namespace cutlass::gemm::kernel::detail

namespace cute_moe::detail {

// Where the current group's A rows come from (third element of the load inputs).
struct GatherRows {
  const char* x = nullptr;         // x, row-major bf16
  int64_t ldx = 0;                 // row stride of x, elements
  const int32_t* rows = nullptr;   // the group's row indices into x (its first routed row's)
  int32_t m = 0;                   // rows of the group
  int32_t k = 0;                   // columns of x
};

__device__ __forceinline__ void cp_async_16_zfill(uint32_t smem_addr, const void* gmem, bool valid) {
  // src-size 0 writes 16 zero bytes and reads nothing
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
               "r"(valid ? 16 : 0));
}

// `Base` is the collective CUTLASS's builder makes for the ptr-array TMA kernel with the
// same tile, cluster, stages and schedule; this keeps its smem layouts, B's TMA and the
// descriptor updates, and replaces A's load and the consumer's wait.
template <class Base>
struct GatherAMainloop : Base {
  using DispatchPolicy = MainloopSm90GatherA<Base::DispatchPolicy::Stages, typename Base::DispatchPolicy::ClusterShape,
                                             typename Base::DispatchPolicy::Schedule>;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using typename Base::TiledMma;

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static constexpr int kChunk = 8;                            // bf16 elements per 16-byte copy
  static constexpr int kChunksPerRow = kTileK / kChunk;       // lanes per A row
  static constexpr int kRowsPerCopy = 32 / kChunksPerRow;     // rows one warp-wide copy covers
  static_assert(32 % kChunksPerRow == 0 && kTileM % 64 == 0, "tile shape the gathered A load does not cover");
  static_assert(sizeof(typename Base::ElementA) == 2, "the gathered A load copies bf16");

  // The full barrier of a stage: the B TMA's leader arrival plus one per lane of both
  // producer warps (each lane arrives once its A copies, possibly none, have landed).
  static constexpr int NumProducerThreadEvents = 1 + 64;
  static constexpr uint32_t kBBytes = static_cast<uint32_t>(cute::size<0>(SmemLayoutB{}) *
                                                            cute::size<1>(SmemLayoutB{}) * sizeof(typename Base::ElementB));

  struct Arguments : Base::Arguments {
    const int32_t* const* gather_rows = nullptr;  // per group: its first routed row's index
  };
  struct Params : Base::Params {
    const int32_t* const* gather_rows = nullptr;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args, void* workspace) {
    Params p{Base::to_underlying_arguments(shapes, args, workspace)};
    p.tma_transaction_bytes = kBBytes;  // A's bytes come through cp.async, counted as arrivals
    p.gather_rows = args.gather_rows;
    return p;
  }

  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& shape, Params const& params) const {
    auto tma_tensors = Base::load_init(shape, params);
    return cute::make_tuple(cute::get<0>(tma_tensors), cute::get<1>(tma_tensors), GatherRows{});
  }

  // Called by both producer warps whenever the group changes.
  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& in, Params const& params,
                                                     ProblemShape_MNKL shape, int32_t group) {
    InputTensors out = in;
    GatherRows& g = cute::get<2>(out);
    g.x = reinterpret_cast<const char*>(params.ptr_A[group]);
    g.ldx = cute::get<0>(params.dA[group]);
    g.rows = params.gather_rows[group];
    g.m = static_cast<int32_t>(cute::get<0>(shape));
    g.k = static_cast<int32_t>(cute::get<2>(shape));
    return out;
  }

  // One warp's share of a stage's A tile: tile rows [first, first + kRows). Lane l copies
  // 16-byte column chunk l % 8 of rows first + l / 8, + 4, ...; the x row of tile row
  // first + l + 32 j sits in lane l's x_row[j], and the lanes fetch each other's by shuffle.
  template <int kRows>
  struct ARows {
    static constexpr int kPerLane = kRows / 32;
    static constexpr int kCopies = kRows / kRowsPerCopy;
    int32_t x_row[kPerLane];  // -1: past the group's rows (zero-filled)
    int first;

    CUTLASS_DEVICE ARows(const GatherRows& g, int tile_row0, int first_, int lane) : first(first_) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kPerLane; ++j) {
        const int r = tile_row0 + first + lane + 32 * j;
        x_row[j] = r < g.m ? __ldg(g.rows + r) : -1;
      }
    }

    template <class SmemTensor>
    CUTLASS_DEVICE void copy(const GatherRows& g, SmemTensor& sA, int stage, int k_tile, int lane) const {
      const int chunk = lane % kChunksPerRow;
      const int col = k_tile * kTileK + chunk * kChunk;
      const bool col_ok = col < g.k;  // k is a multiple of 8: a chunk is wholly in or out
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kCopies; ++c) {
        const int row = c * kRowsPerCopy + lane / kChunksPerRow;  // within this warp's share
        const int src = __shfl_sync(0xffffffffu, x_row[(c * kRowsPerCopy) / 32], row % 32);
        const bool ok = src >= 0 && col_ok;
        const char* from = ok ? g.x + (static_cast<int64_t>(src) * g.ldx + col) * 2 : g.x;
        cp_async_16_zfill(cute::cast_smem_ptr_to_uint(&sA(first + row, chunk * kChunk, stage)), from, ok);
      }
    }
  };

  // Both producer warps, each copying half of A's rows; `on_stage` adds warp 0's B TMA.
  template <class LoadInputs, class KTileIterator, class BlockCoord, class OnStage>
  CUTLASS_DEVICE void load_a(MainloopPipeline& pipeline, PipelineState write, LoadInputs const& load_inputs,
                             BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count, int lane,
                             int warp, TensorStorage& storage, OnStage&& on_stage) {
    using namespace cute;
    const GatherRows& g = get<2>(load_inputs);
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    const ARows<kTileM / 2> rows(g, static_cast<int>(get<0>(blk_coord)) * kTileM, warp * (kTileM / 2), lane);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(write);
      on_stage(write, k_tile_iter);
      rows.copy(g, sA, write.index(), static_cast<int>(*k_tile_iter), lane);
      // arrives once this lane's copies have landed
      pipeline.producer_commit(write, cutlass::arch::cpasync_barrier_arrive_noinc);
      ++k_tile_iter;
      ++write;
    }
  }

  // Producer warp 0: B's TMA (one lane) and its share of A.
  template <class LoadInputs, class TensorMaps, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState write,
                           LoadInputs const& load_inputs, TensorMaps const& tensormaps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
                           uint32_t block_rank_in_cluster, TensorStorage& storage) {
    using namespace cute;
    const bool leader = cute::elect_one_sync();
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), SmemLayoutB{});
    constexpr uint32_t cluster_m = size<0>(typename DispatchPolicy::ClusterShape{});
    const uint32_t block_m = block_rank_in_cluster % cluster_m;
    const uint32_t block_n = block_rank_in_cluster / cluster_m;
    auto block_tma_b = params.tma_load_b.get_slice(block_m);
    Tensor gB = get<1>(load_inputs)(_, _, get<1>(blk_coord), _, get<3>(blk_coord));
    Tensor tBgB = block_tma_b.partition_S(gB);
    Tensor tBsB = block_tma_b.partition_D(sB);
    uint16_t mcast_mask_b = 0;
    if constexpr (cute::is_same_v<typename Base::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      auto block_layout = Layout<typename DispatchPolicy::ClusterShape>{};
      for (int m = 0; m < size<0>(block_layout); ++m) mcast_mask_b |= uint16_t(1) << block_layout(m, block_n, Int<0>{});
    }
    load_a(pipeline, write, load_inputs, blk_coord, k_tile_iter, k_tile_count, thread_idx % 32, 0, storage,
           [&](PipelineState const& stage, KTileIterator const& k) {
             if (leader) {
               auto* barrier = pipeline.producer_get_barrier(stage);
               copy(params.tma_load_b.with(get<1>(tensormaps), *barrier, mcast_mask_b), tBgB(_, _, _, *k),
                    tBsB(_, _, _, stage.index()));
             }
           });
  }

  // Producer warp 1: its share of A.
  template <class LoadInputs, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load_auxiliary(Params const& /*params*/, MainloopPipeline pipeline, PipelineState write,
                                     LoadInputs const& load_inputs, BlockCoord const& blk_coord,
                                     KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
                                     uint32_t /*block_rank_in_cluster*/, TensorStorage& storage) {
    load_a(pipeline, write, load_inputs, blk_coord, k_tile_iter, k_tile_count, thread_idx % 32, 1, storage,
           [](auto const&, auto const&) {});
  }

  // The consumer loop of CUTLASS's collective with one addition: a proxy fence after the
  // wait, so WGMMA (async proxy) sees the cp.async (generic proxy) writes. One WGMMA batch
  // stays in flight; a stage is released once the batch after it has been issued.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& storage, Params const& /*params*/) {
    using namespace cute;
    static_assert(Base::K_PIPE_MMAS == 1, "the release schedule below assumes one batch in flight (mma_tail)");
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), SmemLayoutB{});
    constexpr int kMmaWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    Layout warp_group_layout = make_layout(Int<kMmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int warp_group = __shfl_sync(0xffffffffu, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_group_layout(warp_group));
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));

    PipelineState release = read;
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    for (int k = 0; k < k_tile_count; ++k) {
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      cutlass::arch::fence_view_async_shared();
      const int stage = read.index();
      warpgroup_fence_operand(accum);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<1>();  // the previous batch is done with its stage
      warpgroup_fence_operand(accum);
      if (k > 0) {
        pipeline.consumer_release(release);
        ++release;
      }
      ++read;
    }
    warpgroup_fence_operand(accum);
  }
};

}  // namespace cute_moe::detail

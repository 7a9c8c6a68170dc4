// The FP8 variants: e4m3 x e4m3 with fp32 block scales (docs/fp8.md). Ragged M with the plain
// ragged-M epilogue (Fp8RaggedM: bias, group and row scales, bf16 out) or the fused activation
// epilogues of the bf16 kernels (Fp8ActFwd, Fp8ActBwd); ragged K (Fp8RaggedK: the weight
// gradients, with the bf16 weight gradients' epilogue and tile schedule). Only their
// translation units include this.
//
// Mainloop: CUTLASS's ptr-array blockwise-scaled collective (the scales loaded by a second
// producer warp with cp.async, one element per thread, predicated by the group's extents;
// the partial sums of every 128-long k-block promoted into the fp32 accumulator times
// scale_a[row] * scale_b[n-block]; its consumer and pipeline are kept), with two changes:
// * A and B through two descriptors made once over the whole x and the whole weight stack,
//   a group being a coordinate offset, instead of per-group descriptors rewritten whenever a
//   CTA's next tile belongs to another group (as the bf16 kernels' FixedTmaMainloop does for
//   2-byte operands, fixed_tma_mainloop.cuh; this is its ragged-M path for 1-byte ones).
//   Ragged K (kRaggedK): A and B are quantize_fp8_128x1's q_t copies (k, 128 blocks) and
//   (n, 128 blocks; B's with tile_scales), each group whole 128-column blocks (zero past its
//   last row), so a group is a k offset and needs no clipped ("ragged") loads;
// * the scale tensors with the caller's strides (BlockScaleStrides): the collective reads a
//   group's scales as compact column-major blocks, which would need a per-group layout from
//   the quantizers; the row-major outputs of quantize_fp8_1x128 / _128x128, and their
//   transposed views, are read in place.
#pragma once

#include <cutlass/detail/blockwise_scale_layout.hpp>

#include "act_backward_variants.cuh"  // ActBackwardEpilogue
#include "act_forward_variants.cuh"   // ActForwardEpilogue
#include "kernel_instance.cuh"
#include "fixed_tma_store.cuh"
#include "fp8_h_epilogue.cuh"     // Sm90ActForwardFp8H
#include "fp8_rows_epilogue.cuh"  // Sm90QuantizeRows
#include "ragged_k_variants.cuh"  // RaggedKEpilogue, the dynamic tile schedule
#include "ragged_m_variants.cuh"  // RaggedMEpilogue
#include "store_warp_kernel.cuh"  // StoreWarpKernel

namespace cute_moe::detail {

template <class Base, bool kRaggedK = false>
struct Fp8WholeOperandsMainloop : Base {
  using typename Base::GmemTiledCopyA;
  using typename Base::GmemTiledCopyB;
  using typename Base::InternalElementA;
  using typename Base::InternalElementB;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorMapStorage;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
  static constexpr int kGranularityM = Base::ScaleGranularityM;
  static constexpr int kGranularityN = Base::ScaleGranularityN;
  static constexpr int kGranularityK = Base::ScaleGranularityK;

  // Both operands k-contiguous: (mn, k, batch) with strides (ld, 1, batch stride).
  using WholeStride = cute::Stride<int64_t, cute::_1, int64_t>;
  template <class Element, class Copy, class SmemLayout, class Tile, class Multicast>
  static auto whole_tma(Element const* ptr, int32_t mn, int32_t k, int32_t batches, int64_t ld, int64_t batch_stride,
                        Copy copy, SmemLayout const& smem, Tile tile, Multicast multicast) {
    using namespace cute;
    return make_tma_copy(copy, make_tensor(ptr, make_layout(make_shape(mn, k, batches), WholeStride{ld, _1{}, batch_stride})),
                         smem, tile, multicast);
  }
  static auto tma_a(InternalElementA const* ptr, int32_t rows, int32_t k, int64_t ld) {
    using namespace cute;
    return whole_tma(ptr, rows, k, 1, ld, 0, GmemTiledCopyA{}, SmemLayoutA{}(_, _, Int<0>{}),
                     make_shape(shape<0>(TileShape{}), shape<2>(TileShape{})), size<1>(ClusterShape{}));
  }
  static auto tma_b(InternalElementB const* ptr, int32_t n, int32_t k, int32_t groups, int64_t ld, int64_t batch) {
    using namespace cute;
    return whole_tma(ptr, n, k, groups, ld, batch, GmemTiledCopyB{}, SmemLayoutB{}(_, _, Int<0>{}),
                     make_shape(shape<1>(TileShape{}), shape<2>(TileShape{})), size<0>(ClusterShape{}));
  }
  using TmaA = decltype(tma_a(nullptr, 1, 1, 1));
  using TmaB = decltype(tma_b(nullptr, 1, 1, 1, 1, 1));

  struct Arguments : Base::Arguments {
    WholeOperands whole;
    BlockScaleStrides strides;
  };
  struct Params : Base::Params {
    TmaA tma_a_all;
    TmaB tma_b_all;
    const int32_t* offs = nullptr;
    InternalElementA const* a = nullptr;  // ragged K: a group's k offset is ptr_A[group] - a
    int32_t a_rows = 1, n = 1, k = 1, groups = 1;
    BlockScaleStrides strides;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args, void* workspace) {
    const WholeOperands& w = args.whole;
    // A descriptor needs extents >= 1; a problem without rows or groups launches no tile.
    auto at_least_1 = [](int64_t v) { return int32_t(v < 1 ? 1 : v); };
    Params p{Base::to_underlying_arguments(shapes, args, workspace), TmaA{}, TmaB{}, w.offs,
             static_cast<InternalElementA const*>(w.a), 1, 1, 1, 1, args.strides};
    p.a_rows = at_least_1(w.a_rows);
    p.n = at_least_1(w.n);
    p.k = at_least_1(w.k);
    p.groups = kRaggedK ? 1 : at_least_1(w.groups);  // ragged K: B is one matrix
    p.tma_a_all = tma_a(p.a, p.a_rows, p.k, w.lda);
    p.tma_b_all = tma_b(static_cast<InternalElementB const*>(w.b), p.n, p.k, p.groups, w.ldb, kRaggedK ? 0 : w.b_batch);
    return p;
  }

  // ((G, blocks along mn), (128, blocks along k), 1): the collective's shape of a scale
  // tensor (G = its granularity along mn), with strides (mn_stride, k_stride) per block.
  template <int G>
  CUTLASS_DEVICE static auto scale_layout(int32_t mn, int32_t k, int64_t mn_stride, int64_t k_stride) {
    using namespace cute;
    return make_layout(make_shape(make_shape(Int<G>{}, (mn + G - 1) / G),
                                  make_shape(Int<kGranularityK>{}, (k + kGranularityK - 1) / kGranularityK), 1),
                       make_stride(make_stride(_0{}, mn_stride), make_stride(_0{}, k_stride), _0{}));
  }

  // The group's tiles in the whole descriptors' coordinates: ragged M, (BLK_M, BLK_K, m, k, l)
  // of x from the group's first row and (BLK_N, BLK_K, n, k, l) of its weight (l offset to
  // the group); ragged K, both from the group's first column (`begin`); and its scale
  // tensors with the caller's strides. The kernel reads only the k extent and the (unused)
  // m, n shapes from the first call's; before a group's first load tensors_perform_update
  // makes them again for that group.
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& shape, Params const& params,
                                typename Base::ElementBlockScale const* sfa = nullptr,
                                typename Base::ElementBlockScale const* sfb = nullptr, int32_t begin = 0,
                                int32_t group = 0) const {
    using namespace cute;
    using X = Underscore;
    auto [M, N, K, L] = shape;
    Tensor mA = params.tma_a_all.get_tma_tensor(make_shape(params.a_rows, params.k, 1));
    Tensor mB = params.tma_b_all.get_tma_tensor(make_shape(params.n, params.k, params.groups));
    auto a_origin = kRaggedK ? make_coord(0, begin, 0) : make_coord(begin, 0, 0);
    auto b_origin = kRaggedK ? make_coord(0, begin, 0) : make_coord(0, 0, group);
    Tensor gA = local_tile(domain_offset(a_origin, mA), TileShape{}, make_coord(_, _, _),
                           Step<_1, X, _1>{});  // (BLK_M, BLK_K, m, k, l)
    Tensor gB = local_tile(domain_offset(b_origin, mB), TileShape{}, make_coord(_, _, _),
                           Step<X, _1, _1>{});  // (BLK_N, BLK_K, n, k, l)
    const BlockScaleStrides& s = params.strides;
    Tensor mSFA = make_tensor(make_gmem_ptr(sfa), scale_layout<kGranularityM>(M, K, s.a_mn, s.a_k));
    Tensor mSFB = make_tensor(make_gmem_ptr(sfb), scale_layout<kGranularityN>(N, K, s.b_mn, s.b_k));
    return make_tuple(gA, gB, mSFA, mSFB);
  }

  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const&, Params const& params,
                                                     ProblemShape_MNKL shape, int32_t group) {
    int32_t begin;
    if constexpr (kRaggedK) {
      begin = static_cast<int32_t>(params.ptr_A[group] - params.a);  // the setup kernel's column
    } else {
      begin = group == 0 ? 0 : __ldg(params.offs + group - 1);
    }
    return load_init(shape, params, params.ptr_SFA[group], params.ptr_SFB[group], begin, group);
  }

  // The consumer: the collective's own waits for each k-block's WGMMAs before promoting
  // them, and both warpgroups of the cooperative tile promote at once, so the tensor cores
  // idle through every promotion. Here k-block t + 1 is issued into a second temporary
  // accumulator before k-block t is promoted (warpgroup_wait<1>): the promotion overlaps
  // the next block's WGMMAs. The smem stages are released as the collective does (each
  // after its promotion, the last by mma_tail).
  // Scales: one per row of A (1 x 128 blocks, or 128 x 1 blocks of A^T) and one per tile of B
  // (128 x 128 blocks), folded into the row scales when the k-block is issued.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& storage, Params const&) {
    using namespace cute;
    using TiledMma = typename Base::TiledMma;
    using SmemLayoutSFA = typename Base::SmemLayoutSFA;
    using SmemLayoutSFB = typename Base::SmemLayoutSFB;
    using Scale = typename Base::ElementBlockScale;
    static_assert(Base::ScaleMsPerTile == size<0>(TileShape{}) && Base::ScaleNsPerTile == 1,
                  "one scale per row of A and one per tile of B");
    static_assert(kGranularityK == size<2>(TileShape{}), "one scale block per k-tile: a promotion per k-tile");
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
    // the scales as (BLK_M, BLK_N, (BLK_K, PIPE)) views, broadcast along the other mode
    Tensor sSFA = make_tensor(make_smem_ptr(storage.smem_SFA.data()),
                              make_layout(make_shape(shape<0>(SmemLayoutSFA{}), get<1>(TileShape{}),
                                                     make_shape(shape<1>(SmemLayoutSFA{}), shape<2>(SmemLayoutSFA{}))),
                                          make_stride(stride<0>(SmemLayoutSFA{}), _0{},
                                                      make_stride(stride<1>(SmemLayoutSFA{}), stride<2>(SmemLayoutSFA{})))));
    Tensor sSFB = make_tensor(make_smem_ptr(storage.smem_SFB.data()),
                              make_layout(make_shape(get<0>(TileShape{}), shape<0>(SmemLayoutSFB{}),
                                                     make_shape(shape<1>(SmemLayoutSFB{}), shape<2>(SmemLayoutSFB{}))),
                                          make_stride(_0{}, stride<0>(SmemLayoutSFB{}),
                                                      make_stride(stride<1>(SmemLayoutSFB{}), stride<2>(SmemLayoutSFB{})))));
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    Layout warp_groups = make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int warp_group = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_groups(warp_group));
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (MMA, MMA_M, MMA_N, (MMA_K, PIPE))
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)

    Tensor tmp0 = make_fragment_like(accum);
    Tensor tmp1 = make_fragment_like(accum);
    Tensor sfa0 = make_tensor_like<Scale>(tCsSFA(_, _, _, _0{}));  // (MMA, MMA_M, MMA_N), one per row
    Tensor sfa1 = make_tensor_like<Scale>(tCsSFA(_, _, _, _0{}));
    clear(accum);
    // Without this fence ptxas schedules the clear inside the first k-tile's WGMMA window and
    // drains that batch (DEPBAR gsb0, 0) before issuing the second: no overlap per tile start.
    warpgroup_fence_operand(accum);

    PipelineState release = read;
    // k-tile `read` into `tmp` (its row scales times the tile's B scale into `sfa`)
    auto issue = [&](auto& tmp, auto& sfa) {
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      const int stage = read.index();
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), sfa);
      const Scale scale_b = tCsSFB(_0{}, _0{}, _0{}, make_coord(_0{}, stage));
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(filter_zeros(sfa)); ++i) filter_zeros(sfa)(i) = filter_zeros(sfa)(i) * scale_b;
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(tmp);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), tmp);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(tmp);
      ++read;
    };
    // the oldest k-tile in flight, once its WGMMAs are done (`pending` batches may stay in
    // flight): its stage released unless it is the last (mma_tail's), then promoted
    auto retire = [&](auto& tmp, auto& sfa, auto pending, bool last) {
      warpgroup_wait<decltype(pending)::value>();
      warpgroup_fence_operand(tmp);
      if (!last) {
        pipeline.consumer_release(release);
        ++release;
      }
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += tmp(i) * sfa(i);
      warpgroup_fence_operand(accum);
    };
    if (k_tile_count <= 0) return;  // an empty group's tile (ragged K): its zeros
    issue(tmp0, sfa0);
    int left = k_tile_count - 1;  // k-tiles not yet issued
    CUTLASS_PRAGMA_NO_UNROLL
    for (; left >= 2; left -= 2) {
      issue(tmp1, sfa1);
      retire(tmp0, sfa0, Int<1>{}, false);
      issue(tmp0, sfa0);
      retire(tmp1, sfa1, Int<1>{}, false);
    }
    if (left == 1) {
      issue(tmp1, sfa1);
      retire(tmp0, sfa0, Int<1>{}, false);
      retire(tmp1, sfa1, Int<0>{}, true);
    } else {
      retire(tmp0, sfa0, Int<0>{}, true);
    }
  }

  // No descriptors to rewrite.
  CUTLASS_DEVICE auto tensormaps_init(Params const&, TensorMapStorage&, int32_t, int32_t) {
    return cute::make_tuple(nullptr, nullptr);
  }
  template <class TensorMaps, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage&, Params const&, TensorMaps const&, ProblemShape_MNKL,
                                                int32_t) {}
  template <class TensorMaps>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage&, TensorMaps const&) {}
  template <class TensorMaps>
  CUTLASS_DEVICE void tensormaps_fence_acquire(TensorMaps const&) {}

  // The A and B loads through the whole descriptors (the scales are the collective's own
  // load_auxiliary, on the same pipeline stages).
  template <class LoadInputs, class TensorMaps, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState write,
                           LoadInputs const& load_inputs, TensorMaps const&, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int /*thread_idx*/,
                           uint32_t block_rank_in_cluster, TensorStorage& storage) {
    using namespace cute;
    if (!cute::elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
    constexpr uint32_t cluster_m = size<0>(ClusterShape{});
    const uint32_t block_m = block_rank_in_cluster % cluster_m;
    const uint32_t block_n = block_rank_in_cluster / cluster_m;
    Tensor gA = get<0>(load_inputs)(_, _, get<0>(blk_coord), _, 0);  // (BLK_M, BLK_K, k)
    Tensor gB = get<1>(load_inputs)(_, _, get<1>(blk_coord), _, 0);  // (BLK_N, BLK_K, k)
    auto block_tma_a = params.tma_a_all.get_slice(block_n);
    auto block_tma_b = params.tma_b_all.get_slice(block_m);
    Tensor tAgA = block_tma_a.partition_S(gA);
    Tensor tAsA = block_tma_a.partition_D(sA);
    Tensor tBgB = block_tma_b.partition_S(gB);
    Tensor tBsB = block_tma_b.partition_D(sB);

    uint16_t mcast_a = 0, mcast_b = 0;
    auto block_layout = Layout<ClusterShape>{};  // (m, n) -> block id
    if constexpr (cute::is_same_v<GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>) {
      for (int n = 0; n < size<1>(block_layout); ++n) mcast_a |= uint16_t(1) << block_layout(block_m, n, Int<0>{});
    }
    if constexpr (cute::is_same_v<GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      for (int m = 0; m < size<0>(block_layout); ++m) mcast_b |= uint16_t(1) << block_layout(m, block_n, Int<0>{});
    }

    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(write);
      auto* barrier = pipeline.producer_get_barrier(write);
      const int stage = write.index();
      copy(params.tma_a_all.with(*barrier, mcast_a), tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, stage));
      copy(params.tma_b_all.with(*barrier, mcast_b), tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, stage));
      ++k_tile_iter;
      ++write;
    }
  }
};

// A with one scale per row and k-block, B with one per 128 columns and k-block. Ragged M: A
// (x) by 1 x 128 blocks, B (the weight) by 128 x 128. Ragged K (the weight gradients): A (the
// activation, x or p h) by 128 x 1 blocks of the routed rows, B (the gradient, dpre or dy) by
// 128 x 128 (a 128-row block of one expert and 128 columns): a per-column B scale would cost a
// second FP32 operation per element in every promotion (1.4x slower at GPT-OSS-20B on an H100,
// docs/perf-notes.md, session 17).
template <bool kRaggedK>
struct Fp8BlockScaledMainloopOf {
  using ElementAB = cutlass::float_e4m3_t;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128>;
  template <class Built>
  using type = Fp8WholeOperandsMainloop<Built, kRaggedK>;
  template <class Args>
  static void set_arguments(Args& args, const GroupArrays& g, const LaunchContext& ctx) {
    args.ptr_SFA = g.a_scales;
    args.ptr_SFB = g.b_scales;
    args.strides = ctx.scales;
    args.whole = ctx.whole;
  }
};

// The plain FP8 GEMM's epilogue: the ragged-M one with 128 x 64 subtiles (two per tile) in
// two D store stages, each subtile's TMA store issued after the next one's math. Half the
// subtiles of CUTLASS's 128 x 32 choice, so half the barriers, fences and store issues a
// tile's epilogue spends while both warpgroups' tensor cores idle: 1.006-1.03x at the models'
// shapes on the H100 against four 128 x 32 subtiles in three stages (docs/perf-notes.md,
// session 30), the same bits. The 32 KB fit beside the mainloop's five stages because D's
// buffer is the collective's own (Sm90StoreD, fixed_tma_store.cuh).
struct Fp8RaggedMEpilogue : RaggedMEpilogue {
  using EpilogueTile = cute::Shape<cute::_128, cute::_64>;
  static constexpr int kStagesD = 2;
  static constexpr bool kDelayTmaStore = true;
  // The StoreWarp rows (short reductions): the cooperative tile's epilogue as one whole-tile
  // store into that D buffer and a store warp's TMA stores (store_warp_kernel.cuh; 1.12x at
  // K = 768, 0.96x at K = 5760 on an H200: docs/perf-notes.md, session 36).
  template <class Kernel, class TileShape, Schedule S, class PingpongTypes>
  using KernelWrap = std::conditional_t<S == Schedule::StoreWarp,
                                        StoreWarpKernel<Kernel, FixedTmaStore<bf16, EpilogueTile, kStagesD>>, Kernel>;
};
// A = x (m, k) k-contiguous; B = W_e (k, n) k-contiguous
template <> struct VariantTraits<KernelVariant::Fp8RaggedM, Act::Unfused>
    : Traits<RowMajor, ColMajor, bf16, Fp8RaggedMEpilogue, Fp8BlockScaledMainloopOf<false>> {};
// The bf16 kernels' fused activation epilogues (act_forward_variants.cuh,
// act_backward_variants.cuh) after the FP8 mainloop. A gated W's k-contiguous copy holds the
// interleaved (gate, linear) columns as adjacent rows, so the accumulator's column pairs are (gate, linear) pairs as in the bf16 kernels.
// For the gated activations the tree can write h's 1 x 128 e4m3 copy instead of the bf16 h
// (ctx.d_fp8; fp8_h_epilogue.cuh), the two CTAs of a 1 x 2 cluster exchanging each row's amax.
template <class Activation, bool = Activation::kGated>
struct Fp8ActForwardEpilogue : ActForwardEpilogue<Activation> {};
template <class Activation>
struct Fp8ActForwardEpilogue<Activation, true> : ActForwardEpilogue<Activation> {
  template <class TileShape, class ElementD, class EpiDesc>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<
      Sm90ActForwardFp8H<Activation, typename EpiDesc::EpilogueTile, EpiDesc::StagesD,
                         decltype(cute::size<0>(TileShape{}))::value, decltype(cute::size<1>(TileShape{}))::value>,
      ScaledBiasTree<TileShape, float>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {scaled_bias_arguments<decltype(Args{}.op_0)>(g),
            {{ctx.act, ctx.d, ctx.aux, ctx.whole.offs, ctx.swap_pairs}, ctx.d_fp8}};
  }
};
template <Act A> struct VariantTraits<KernelVariant::Fp8ActFwd, A>
    : Traits<RowMajor, ColMajor, bf16, Fp8ActForwardEpilogue<typename ActFunctor<A>::type>,
             Fp8BlockScaledMainloopOf<false>> {};
// The fused backward's tree with, for the gated activations, dpre's 1 x 128 e4m3 copy (the up
// projection's input-gradient operand) written by the epilogue too where the call asks for it
// (ctx.d_fp8); the non-gated kernels keep the bf16 tree (validate.cpp refuses the copy for them).
template <class Activation, bool = Activation::kGated>
struct Fp8ActBackwardEpilogue : ActBackwardEpilogue<Activation> {};
template <class Activation>
struct Fp8ActBackwardEpilogue<Activation, true> : ActBackwardEpilogue<Activation> {
  using Base = ActBackwardEpilogue<Activation>;
  template <class TileShape, class ElementD, class EpiDesc>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<Sm90QuantizeRows<typename EpiDesc::EpilogueTile>,
                                                  typename Base::template Tree<TileShape, ElementD, EpiDesc>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {Base::template arguments<decltype(Args{}.op_0)>(g, ctx), {ctx.d_fp8, ctx.whole.offs}};
  }
};
template <Act A> struct VariantTraits<KernelVariant::Fp8ActBwd, A>
    : Traits<RowMajor, ColMajor, ActBwdOut<A>, Fp8ActBackwardEpilogue<typename ActFunctor<A>::type>,
             Fp8BlockScaledMainloopOf<false>> {};
// A = x^T (k, 128 blocks) and B = dy^T (n, 128 blocks), both k-major (quantize_fp8_128x1's
// q_t, B's with tile_scales); every expert has the same output tiles: the weight gradients'
// dynamic tile schedule.
template <> struct VariantTraits<KernelVariant::Fp8RaggedK, Act::Unfused>
    : Traits<RowMajor, ColMajor, bf16, RaggedKEpilogue, Fp8BlockScaledMainloopOf<true>, true> {};

}  // namespace cute_moe::detail

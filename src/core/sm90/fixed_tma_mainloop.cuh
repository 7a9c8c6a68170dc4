// Grouped-GEMM mainloops with fixed TMA descriptors: no descriptor rewrite when the group
// changes.
//
// CUTLASS's ptr-array mainloop loads each group's A and B through TMA descriptors that
// its producer warp rewrites (in shared memory, copied out to global memory, fenced)
// every time the CTA's next tile belongs to another group; with the persistent grid
// striding over the groups' tiles that is most tiles at E = 32-128 experts (measured: a
// plain GEMM of fixed size loses 7-13% going from 1 group to 32-128, docs/perf-notes.md).
// Here every group's operands are parts of whole tensors, so descriptors made once on the
// host cover all groups, and a group is a coordinate offset:
//
//   ragged M   A (a_rows, K)     group g's tile (m, k) starts at row offs[g-1] + m * BLK_M;
//                                rows past the group's end are loaded (they belong to the
//                                next group, or are zero past the matrix) and their
//                                accumulator rows computed but never stored: the epilogue
//                                clips each tile to its group's rows
//              B (N, K, groups)  group g is batch coordinate g
//   ragged K   A (M, K'), B (N, K') with K' the rows of x and dy: the reduction of group g
//              runs over rows [begin, end) and must see zeros past `end`. A descriptor
//              clips only at its extents, so K' is described with two extra modes whose
//              strides cancel modulo 2^64 in the TMA unit's address arithmetic (the
//              "ragged TMA" construction Triton and QuACK use):
//                shape (MN, BIG, MAX, MAX), strides (1, ld, 2^34 - ld, ld) elements
//                coordinates (mn, BIG - len + k, BIG, begin + len)
//                address = base + 2 * (mn + (begin + k) * ld) + 2 * BIG * 2^34
//              with BIG = 2^30, the last term is 2^65 bytes = 0 mod 2^64, and k >= len
//              is past the extent BIG of the second mode: zero-filled.
//
// Paired B (the fused gated forward over a k-contiguous weight, kPairedB): the MMA wants
// each (gate, linear) pair in adjacent B rows (the epilogue pairs adjacent accumulator
// columns). The weight's N index is described as two modes, (member 2, feature N/2), with
// the strides of its storage in elements: interleaved (ldb, 2 ldb), [gate | linear] halves
// (N/2 ldb, ldb), or the halves as two tensors (linear - gate, ldb). One box of
// (BLK_K, 2, BLK_N/2) lands in shared memory as rows 2 * feature + member: the same tile
// every way, so halves need no repack.
//
// Split B (ragged M, not paired): B's k rows may come from two tensors with the same
// strides, k < b_k_split from one and the rest from the other (the input gradient
// dx = dpre W_up where W_up's [gate; linear] halves are torchtitan's two parameters w1, w3).
// A second descriptor over the second tensor, (n, k - b_k_split, groups); the producer picks
// one per k-tile and gives both the same tile coordinates (b_k_split is a multiple of BLK_K,
// checked on the host).
//
// The epilogue (D stores, C loads) is CUTLASS's, unchanged.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "kernel_registry.h"  // WholeOperands

namespace cute_moe::detail {

// The current group of the producer's tiles (the kernel's block coordinate carries no
// group: it passes L = 0 to the ptr-array collective, whose descriptors are per group).
struct GroupPos {
  int32_t row_begin = 0;  // the group's first row of A (ragged M) / of the reduction (ragged K)
  int32_t rows = 0;       // ragged K: the group's rows
  int32_t group = 0;      // ragged M: its batch coordinate in B
};

namespace fixed_tma {
constexpr int32_t kBig = int32_t(1) << 30;           // extent of the ragged mode
constexpr int32_t kMax = 2147483647;                 // extent of the wraparound modes
constexpr int64_t kWrap = int64_t(1) << 34;          // kBig * kWrap elements of 2 bytes = 2^65 bytes
}  // namespace fixed_tma

// `Base`: the collective CUTLASS's builder makes for the ptr-array TMA kernel. Its smem
// layouts, pipeline and consumer (mma) are kept; its descriptors and loads are replaced.
template <class Base, bool kRaggedK, bool kPairedB = false>
struct FixedTmaMainloop : Base {
  using typename Base::ElementA;
  using typename Base::ElementB;
  using typename Base::GmemTiledCopyA;
  using typename Base::GmemTiledCopyB;
  using typename Base::InternalElementA;
  using typename Base::InternalElementB;
  using typename Base::InternalStrideA;
  using typename Base::InternalStrideB;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorMapStorage;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
  static_assert(sizeof(InternalElementA) == 2 && sizeof(InternalElementB) == 2,
                "fixed_tma::kWrap assumes 2-byte elements");
  static_assert(!kPairedB || (!kRaggedK && cute::is_static<cute::tuple_element_t<1, InternalStrideB>>::value),
                "paired B: ragged M with a k-contiguous weight only");

  // The group stride types keep their static unit stride; the rest become int64.
  template <class S>
  using Dyn = std::conditional_t<cute::is_static<S>::value, S, int64_t>;
  template <class S>
  using Batched = cute::Stride<Dyn<cute::tuple_element_t<0, S>>, Dyn<cute::tuple_element_t<1, S>>, int64_t>;
  template <class S>
  using Wrapped =
      cute::Stride<Dyn<cute::tuple_element_t<0, S>>, Dyn<cute::tuple_element_t<1, S>>, int64_t, int64_t>;
  // ragged M: A one batch (the ptr-array stride type, L stride 0), B batched by group;
  // ragged K: both with the two wraparound modes.
  using StrideAAll = std::conditional_t<kRaggedK, Wrapped<InternalStrideA>, InternalStrideA>;
  // paired B: N as (member, feature), K contiguous, then the group
  using PairedStrideB = cute::Stride<cute::Stride<int64_t, int64_t>, cute::tuple_element_t<1, InternalStrideB>, int64_t>;
  using StrideBAll = std::conditional_t<kRaggedK, Wrapped<InternalStrideB>,
                                        std::conditional_t<kPairedB, PairedStrideB, Batched<InternalStrideB>>>;
  static constexpr int kBlkN = decltype(cute::size<1>(TileShape{}))::value;
  static constexpr int kBlkK = decltype(cute::size<2>(TileShape{}))::value;
  static_assert(!kPairedB || kBlkN % 16 == 0, "paired B: whole pairs per tile, 8-row smem atoms per member");
  // The B tile (and one stage of its smem layout) with N split as (member, feature).
  using PairedTileB = decltype(cute::make_shape(cute::make_shape(cute::_2{}, cute::Int<kBlkN / 2>{}),
                                                cute::Int<kBlkK>{}));
  static auto paired_smem_b() {
    using namespace cute;
    return composition(SmemLayoutB{}(_, _, Int<0>{}), make_layout(PairedTileB{}));
  }

  // The copy of one operand over its whole tensor (rank 4 for ragged K, else 3).
  template <class Stride, class Element, class SmemLayout, class Copy, class Tile, class Multicast>
  static auto tma_of(Element const* ptr, cute::array<int32_t, 4> shape, Stride stride, Copy copy,
                     SmemLayout const& smem, Tile tile, Multicast multicast) {
    using namespace cute;
    if constexpr (kRaggedK) {
      return make_tma_copy(copy, make_tensor(ptr, make_layout(make_shape(shape[0], shape[1], shape[2], shape[3]), stride)),
                           smem, tile, multicast);
    } else {
      return make_tma_copy(copy, make_tensor(ptr, make_layout(make_shape(shape[0], shape[1], shape[2]), stride)), smem,
                           tile, multicast);
    }
  }
  static constexpr cute::array<int32_t, 4> kNoShape = {0, 0, 0, 0};
  using TmaA = decltype(tma_of(static_cast<InternalElementA const*>(nullptr), kNoShape, StrideAAll{}, GmemTiledCopyA{},
                               SmemLayoutA{}(cute::_, cute::_, cute::Int<0>{}),
                               cute::make_shape(cute::shape<0>(TileShape{}), cute::shape<2>(TileShape{})),
                               cute::size<1>(ClusterShape{})));
  static auto paired_tma_b(InternalElementB const* ptr, cute::array<int32_t, 4> s, StrideBAll stride) {
    using namespace cute;
    auto shape = make_shape(make_shape(_2{}, s[0] / 2), s[1], s[2]);
    return make_tma_copy(GmemTiledCopyB{}, make_tensor(ptr, make_layout(shape, stride)), paired_smem_b(),
                         PairedTileB{}, size<0>(ClusterShape{}));
  }
  static auto tma_b_of(InternalElementB const* ptr, cute::array<int32_t, 4> s, StrideBAll stride) {
    if constexpr (kPairedB) {
      return paired_tma_b(ptr, s, stride);
    } else {
      return tma_of(ptr, s, stride, GmemTiledCopyB{}, SmemLayoutB{}(cute::_, cute::_, cute::Int<0>{}),
                    cute::make_shape(cute::shape<1>(TileShape{}), cute::shape<2>(TileShape{})),
                    cute::size<0>(ClusterShape{}));
    }
  }
  using TmaB = decltype(tma_b_of(static_cast<InternalElementB const*>(nullptr), kNoShape, StrideBAll{}));

  struct Arguments : Base::Arguments {
    WholeOperands whole;
  };
  struct Params : Base::Params {
    TmaA tma_a_all;
    TmaB tma_b_all;
    TmaB tma_b_hi;                   // split B: the k rows from b_k_split on
    int32_t b_split_tiles = INT32_MAX;  // split B: the first k-tile read through tma_b_hi
    const int32_t* offs = nullptr;
    cute::array<int32_t, 4> a_shape = {1, 1, 1, 1};
    cute::array<int32_t, 4> b_shape = {1, 1, 1, 1};
  };

  // A stride value of type S: the unit element stays static, the dynamic one is ld, and
  // ragged K appends the wraparound modes.
  template <class S>
  static S stride_of(int64_t ld, int64_t batch) {
    auto pick = [ld](auto s) {
      if constexpr (cute::is_static<decltype(s)>::value) {
        return s;
      } else {
        return ld;
      }
    };
    auto s0 = pick(cute::get<0>(S{}));
    auto s1 = pick(cute::get<1>(S{}));
    if constexpr (cute::rank_v<S> == 4) {
      return S{s0, s1, fixed_tma::kWrap - ld, ld};
    } else if constexpr (cute::is_static<cute::tuple_element_t<2, S>>::value) {
      return S{s0, s1, cute::tuple_element_t<2, S>{}};
    } else {
      return S{s0, s1, batch};
    }
  }

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args, void* workspace) {
    using namespace cute;
    Params p{Base::to_underlying_arguments(shapes, args, workspace), TmaA{}, TmaB{}, TmaB{}};
    const WholeOperands& w = args.whole;
    // A descriptor needs extents >= 1; a problem without rows or groups launches no tile.
    auto at_least_1 = [](int64_t v) { return int32_t(v < 1 ? 1 : v); };
    if constexpr (kRaggedK) {
      // GEMM (M, N, K) = (k, n, rows): A = x^T, B = dy^T, both read along their rows.
      p.a_shape = {at_least_1(w.k), fixed_tma::kBig, fixed_tma::kMax, fixed_tma::kMax};
      p.b_shape = {at_least_1(w.n), fixed_tma::kBig, fixed_tma::kMax, fixed_tma::kMax};
    } else {
      p.a_shape = {at_least_1(w.a_rows), at_least_1(w.k), 1, 1};
      p.b_shape = {at_least_1(w.n), at_least_1(w.k), at_least_1(w.groups), 1};
    }
    p.tma_a_all = tma_of(static_cast<InternalElementA const*>(w.a), p.a_shape, stride_of<StrideAAll>(w.lda, 0),
                         GmemTiledCopyA{}, SmemLayoutA{}(_, _, Int<0>{}),
                         make_shape(shape<0>(TileShape{}), shape<2>(TileShape{})), size<1>(ClusterShape{}));
    if constexpr (kPairedB) {
      // (member, feature) strides in elements; an odd n (not gated) never gets here
      const StrideBAll stride{{w.b_pair_stride, w.b_feature_stride}, {}, w.b_batch};
      p.tma_b_all = paired_tma_b(static_cast<InternalElementB const*>(w.b), p.b_shape, stride);
    } else {
      if constexpr (!kRaggedK) {
        if (w.b_k_split > 0) p.b_shape[1] = at_least_1(w.b_k_split);
      }
      p.tma_b_all = tma_b_of(static_cast<InternalElementB const*>(w.b), p.b_shape,
                             stride_of<StrideBAll>(w.ldb, w.b_batch));
      if constexpr (!kRaggedK) {
        if (w.b_k_split > 0) {  // its own k extent: rows past it read as zeros
          cute::array<int32_t, 4> hi_shape = p.b_shape;
          hi_shape[1] = at_least_1(w.k - w.b_k_split);
          p.tma_b_hi = tma_b_of(static_cast<InternalElementB const*>(w.b_hi), hi_shape,
                                stride_of<StrideBAll>(w.ldb, w.b_batch));
          p.b_split_tiles = int32_t(w.b_k_split / kBlkK);
        }
      }
    }
    p.offs = w.offs;
    return p;
  }

  template <class Tma>
  CUTLASS_DEVICE static auto whole_tensor(Tma const& tma, cute::array<int32_t, 4> const& s) {
    if constexpr (kRaggedK) {
      return tma.get_tma_tensor(cute::make_shape(s[0], s[1], s[2], s[3]));
    } else {
      return tma.get_tma_tensor(cute::make_shape(s[0], s[1], s[2]));
    }
  }

  // The kernel reads only shapes from the first two (m, n and l are plain indices to it;
  // the k extent names the k-tile coordinates) and passes the tuple back to load(); the
  // third is the current group, set by tensors_perform_update before its first load.
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& shape, Params const&) const {
    using namespace cute;
    using X = Underscore;
    auto [M, N, K, L] = shape;
    Tensor gA_mkl = local_tile(make_identity_tensor(make_shape(M, K, 1)), TileShape{}, make_coord(_, _, _),
                               Step<_1, X, _1>{});  // (BLK_M, BLK_K, m, k, l)
    Tensor gB_nkl = local_tile(make_identity_tensor(make_shape(N, K, 1)), TileShape{}, make_coord(_, _, _),
                               Step<X, _1, _1>{});  // (BLK_N, BLK_K, n, k, l)
    return make_tuple(gA_mkl, gB_nkl, GroupPos{});
  }

  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& in, Params const& params,
                                                     ProblemShape_MNKL, int32_t group) {
    InputTensors out = in;
    GroupPos& pos = cute::get<2>(out);
    pos.row_begin = group == 0 ? 0 : __ldg(params.offs + group - 1);
    pos.rows = __ldg(params.offs + group) - pos.row_begin;
    pos.group = group;
    return out;
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
    const GroupPos pos = get<2>(load_inputs);
    const auto tile_a = make_shape(shape<0>(TileShape{}), shape<2>(TileShape{}));
    const auto tile_b = make_shape(shape<1>(TileShape{}), shape<2>(TileShape{}));

    // The group's (MN, K) coordinates, then the block's tiles along k. (A local copy of
    // kBig: the coordinate calls take references, which device code cannot bind to the
    // namespace-scope constant.)
    const int32_t big = fixed_tma::kBig;
    Tensor mA = whole_tensor(params.tma_a_all, params.a_shape);
    auto a_group = [&] {
      if constexpr (kRaggedK) {
        return domain_offset(make_coord(0, big - pos.rows), mA(_, _, big, pos.row_begin + pos.rows));
      } else {
        return domain_offset(make_coord(pos.row_begin, 0), mA(_, _, 0));
      }
    }();
    Tensor gA = local_tile(a_group, tile_a, make_coord(get<0>(blk_coord), _));  // (BLK_M, BLK_K, k)
    auto block_tma_a = params.tma_a_all.get_slice(block_n);
    auto block_tma_b = params.tma_b_all.get_slice(block_m);
    Tensor tAgA = block_tma_a.partition_S(gA);
    Tensor tAsA = block_tma_a.partition_D(sA);
    auto b_tiles = [&] {  // (TMA, TMA_N, TMA_K, k) and (TMA, TMA_N, TMA_K, PIPE)
      if constexpr (kPairedB) {
        const auto& s = params.b_shape;
        Tensor mBp = params.tma_b_all.get_tma_tensor(make_shape(make_shape(_2{}, s[0] / 2), s[1], s[2]));
        Tensor gB = local_tile(mBp(_, _, pos.group), PairedTileB{},
                               make_coord(make_coord(0, get<1>(blk_coord)), _));  // ((2, BLK_N/2), BLK_K, k)
        Tensor sBp = make_tensor(make_smem_ptr(storage.smem_B.data()),
                                 composition(SmemLayoutB{}, make_layout(append(PairedTileB{}, size<2>(SmemLayoutB{})))));
        return make_tuple(block_tma_b.partition_S(gB), block_tma_b.partition_D(sBp));
      } else {
        Tensor mB = whole_tensor(params.tma_b_all, params.b_shape);
        auto b_group = [&] {
          if constexpr (kRaggedK) {
            return domain_offset(make_coord(0, big - pos.rows), mB(_, _, big, pos.row_begin + pos.rows));
          } else {
            return mB(_, _, pos.group);
          }
        }();
        Tensor gB = local_tile(b_group, tile_b, make_coord(get<1>(blk_coord), _));  // (BLK_N, BLK_K, k)
        return make_tuple(block_tma_b.partition_S(gB), block_tma_b.partition_D(sB));
      }
    }();
    Tensor tBgB = get<0>(b_tiles);
    Tensor tBsB = get<1>(b_tiles);

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
      const int k_tile = *k_tile_iter;
      copy(params.tma_a_all.with(*barrier, mcast_a), tAgA(_, _, _, k_tile), tAsA(_, _, _, stage));
      if constexpr (kRaggedK || kPairedB) {
        copy(params.tma_b_all.with(*barrier, mcast_b), tBgB(_, _, _, k_tile), tBsB(_, _, _, stage));
      } else if (k_tile < params.b_split_tiles) {
        copy(params.tma_b_all.with(*barrier, mcast_b), tBgB(_, _, _, k_tile), tBsB(_, _, _, stage));
      } else {  // the same coordinates in the second tensor: both descriptors have one shape
        copy(params.tma_b_hi.with(*barrier, mcast_b), tBgB(_, _, _, k_tile - params.b_split_tiles),
             tBsB(_, _, _, stage));
      }
      ++k_tile_iter;
      ++write;
    }
  }
};

}  // namespace cute_moe::detail

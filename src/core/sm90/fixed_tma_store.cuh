// An extra epilogue output of a grouped GEMM, written the way the collective epilogue
// writes D: registers -> shared memory -> TMA store, inside the collective's store pipeline
// (its smem buffer is the store iteration's, its TMA store is issued and committed with D's
// by the same thread, so the collective's waits cover it). Sm90StoreD below writes D itself
// this way, the collective's own D then void.
//
// Why not CUTLASS's aux store (Sm90AuxStore) or its ptr-array D: their descriptor is per
// tensor, so the ptr-array epilogue rewrites it whenever a CTA's next tile belongs to
// another group, after waiting for every TMA store in flight. Here one descriptor, made once
// on the host, covers every group's output (as fixed_tma_mainloop.cuh does for the loads),
// and a group is a coordinate:
//   kRagged   the group's rows of one (rows, cols) matrix (ragged M). Its last tile is
//             clipped at the group's end (the rows past it belong to the next group) by the
//             "ragged TMA" row modes of fixed_tma_mainloop.cuh:
//               shape (BIG, cols, MAX, MAX), strides (ld, 1, 2^34 - ld, ld) elements,
//               row r of a group starting at `begin` with `len` rows at
//               (BIG - len + r, c, BIG, begin + len),
//             so rows r >= len fall past the extent BIG and are not written.
//   kBatched  the group's own (rows, cols) block of a (groups, rows, cols) output (ragged K:
//             the weight gradient), the group the batch coordinate.
//
// Why not direct stores (what the fused epilogues did before): each st.global holds its
// registers until the LSU takes them, once per fragment, with the epilogue's math waiting
// behind it (docs/perf-notes.md, fused SwiGLU v1/v2); a TMA store leaves the consumer at once.
//
// kColumnsPerPair 2: the output has D's shape and tile (one element per accumulator), so
// the register fragment and the smem copy follow the collective's own partition of D.
// kColumnsPerPair 1: one element per pair of adjacent D columns (a gated activation's h,
// half as wide as its pre-activation); each thread writes its values into the smem buffer
// by coordinate.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "epilogue_nodes.cuh"      // NodeWithoutLoads
#include "fixed_tma_mainloop.cuh"  // fixed_tma::kBig, kMax, kWrap
#include "kernel_registry.h"       // OutputMatrix

namespace cute_moe::detail {

enum class OutputRows { kRagged, kBatched };

// EpiTile: the collective's epilogue subtile (M, N); kStages: its D store stages;
// kColumnsPerPair: output columns per two D columns (2 or 1, above).
template <class Element, class EpiTile, int kStages, int kColumnsPerPair = 2, OutputRows kRows = OutputRows::kRagged>
struct FixedTmaStore {
  static constexpr bool kRagged = kRows == OutputRows::kRagged;
  static_assert(kColumnsPerPair == 1 || kColumnsPerPair == 2, "one or two output columns per D column pair");
  static constexpr int kEpiM = decltype(cute::size<0>(EpiTile{}))::value;
  static constexpr int kEpiN = decltype(cute::size<1>(EpiTile{}))::value * kColumnsPerPair / 2;  // of the output
  using OutTile = cute::Shape<cute::Int<kEpiM>, cute::Int<kEpiN>>;
  using RowMajor = cutlass::detail::TagToStrideC_t<cutlass::layout::RowMajor>;
  // what CUTLASS's builder picks for a row-major D of this element
  using SmemAtom = decltype(cutlass::epilogue::collective::detail::sm90_get_epilogue_smem_swizzle_layout_atom<
                            RowMajor, Element, OutTile>());
  using CopyOpR2S = decltype(cutlass::epilogue::collective::detail::sm90_get_smem_store_op_for_accumulator<
                             RowMajor, Element, EpiTile>());
  using SmemLayoutStage = decltype(cute::tile_to_shape(SmemAtom{}, cute::Shape<cute::Int<kEpiM>, cute::Int<kEpiN>>{}));
  using SmemLayout =
      decltype(cute::tile_to_shape(SmemAtom{}, cute::Shape<cute::Int<kEpiM>, cute::Int<kEpiN>, cute::Int<kStages>>{}));

  struct SharedStorage {
    alignas(cutlass::detail::alignment_for_swizzle(SmemLayout{}))
        cute::array_aligned<Element, cute::cosize_v<SmemLayout>> smem;
  };

  // The whole output: (rows, cols, modes that place a group's rows; see the header).
  CUTLASS_HOST_DEVICE static auto whole_shape(int32_t rows, int32_t cols, int32_t batches) {
    if constexpr (kRagged) {
      const int32_t big = fixed_tma::kBig, max = fixed_tma::kMax;  // (locals: not odr-used)
      return cute::make_shape(big, cols, max, max);
    } else {
      return cute::make_shape(rows, cols, batches);
    }
  }
  using GmemStride = std::conditional_t<kRagged, cute::Stride<int64_t, cute::_1, int64_t, int64_t>,
                                        cute::Stride<int64_t, cute::_1, int64_t>>;
  static auto make_tma(Element* ptr, const OutputMatrix& out) {
    using namespace cute;
    GmemStride stride{};
    if constexpr (kRagged) {
      // kBig * kWrap = 2^64 elements: the wraparound terms cancel for any element size
      stride = GmemStride{out.ld, {}, fixed_tma::kWrap - out.ld, out.ld};
    } else {
      stride = GmemStride{out.ld, {}, out.batch_stride};
    }
    auto whole = make_layout(whole_shape(int32_t(out.rows), int32_t(out.cols), out.batches), stride);
    return make_tma_copy(SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(ptr), whole), SmemLayoutStage{}, OutTile{}, _1{});
  }
  using Tma = decltype(make_tma(nullptr, OutputMatrix{}));

  struct Params {
    Tma tma;                        // read in place: the descriptor must stay in param space
    int32_t rows = 0;               // kBatched: of each group's block
    int32_t cols = 0;
    int32_t batches = 0;            // kBatched
    const int32_t* offs = nullptr;  // kRagged: device, cumulative end rows per group
  };
  static Params to_params(const OutputMatrix& out, const int32_t* offs) {
    Params p;
    if (out.ptr != nullptr) p.tma = make_tma(static_cast<Element*>(out.ptr), out);
    p.rows = int32_t(out.rows);
    p.cols = int32_t(out.cols);
    p.batches = out.batches;
    p.offs = offs;
    return p;
  }

  // One tile's part of the output held by one thread, from the visit to the TMA store.
  // Only the values and the thread's smem partition stay live through the epilogue; the
  // storing thread rebuilds the gmem side from three coordinates when it stores.
  template <class Regs, class TiledR2S, class SmemR2S, class CtaTile>
  struct TileStore {
    Regs regs;           // (CPY,CPY_M,CPY_N): the thread's values of one epilogue subtile
    TiledR2S tiled_r2s;
    SmemR2S smem_r2s;    // (R2S,R2S_M,R2S_N,PIPE)
    Element* smem;       // the stages' buffers
    Params const* params;
    int32_t row0;        // TMA coordinates of the tile's origin: kRagged BIG - rows + m * CTA_M,
    int32_t col0;        //   n * CTA_N and the group's begin + rows (see the header);
    int32_t group;       //   kBatched m * CTA_M, n * CTA_N and the group

    // The values of the collective's fragment epi_v of the current subtile.
    template <int FragmentSize>
    CUTLASS_DEVICE void set(int epi_v, cutlass::Array<Element, FragmentSize> const& values) {
      auto fragments = cute::recast<cutlass::Array<Element, FragmentSize>>(cute::coalesce(regs));  // (EPI_V)
      fragments(epi_v) = values;
    }
    // postreduce: into the store iteration's smem buffer
    CUTLASS_DEVICE void to_smem(int, int, int store_iteration) {
      using RLayout = decltype(cute::layout(TiledR2S{}.get_slice(0).retile_S(Regs{})));
      cute::copy(tiled_r2s, cute::make_tensor(regs.data(), RLayout{}),
                 smem_r2s(cute::_, cute::_, cute::_, store_iteration % kStages));
    }
    CUTLASS_DEVICE void to_gmem(int epi_m, int epi_n, int store_iteration, bool issue) {
      tma_store<CtaTile>(params, smem, row0, col0, group, epi_m, epi_n, store_iteration, issue);
    }
  };

  // kColumnsPerPair 1: the thread's values, one per pair of its D fragment's columns, written
  // to smem by coordinate.
  template <class CTensor, int kValues, class CtaTile>
  struct PairTileStore {
    cutlass::Array<Element, kValues> values;  // of one subtile, in the fragments' order
    CTensor tCcD;        // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) D coordinates relative to the first element
    int32_t first_m;     // the thread's first D element in the tile
    int32_t first_n;
    Element* smem;
    Params const* params;
    int32_t row0, col0, group;  // as TileStore's

    template <int FragmentSize>
    CUTLASS_DEVICE void set(int epi_v, cutlass::Array<Element, FragmentSize / 2> const& pair_values) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize / 2; ++i) values[epi_v * (FragmentSize / 2) + i] = pair_values[i];
    }
    CUTLASS_DEVICE void to_smem(int epi_m, int epi_n, int store_iteration) {
      using namespace cute;
      Tensor s_epi = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(smem), SmemLayout{}));
      Tensor stage = s_epi(_, _, store_iteration % kStages);  // (EPI_TILE_M,EPI_TILE_N / 2)
      auto coords = tCcD(_, _, _, epi_m, epi_n);
      const int32_t m0 = first_m - epi_m * kEpiM;  // the first element's place in this subtile
      const int32_t n0 = first_n - epi_n * kEpiN * 2;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kValues; ++j) {
        auto c = coords(2 * j);  // the pair's first column (even)
        stage(m0 + get<0>(c), (n0 + get<1>(c)) / 2) = values[j];
      }
    }
    CUTLASS_DEVICE void to_gmem(int epi_m, int epi_n, int store_iteration, bool issue) {
      tma_store<CtaTile>(params, smem, row0, col0, group, epi_m, epi_n, store_iteration, issue);
    }
  };

  // The storing thread's TMA store of subtile (epi_m, epi_n) of the output tile at (row0,
  // col0) of `group` (see TileStore).
  template <class CtaTile>
  CUTLASS_DEVICE static void tma_store(Params const* params, Element* smem, int32_t row0, int32_t col0,
                                       int32_t group, int epi_m, int epi_n, int store_iteration, bool issue) {
    using namespace cute;
    if (!issue) return;
    Tensor whole = params->tma.get_tma_tensor(whole_shape(params->rows, params->cols, params->batches));
    auto rows_of_group = [&] {
      if constexpr (kRagged) {
        const int32_t big = fixed_tma::kBig;
        return whole(_, _, big, group);
      } else {
        return whole(_, _, group);
      }
    };
    Tensor g_tile = local_tile(domain_offset(make_coord(row0, col0), rows_of_group()), CtaTile{},
                               make_coord(0, 0));  // (CTA_M,CTA_N) of the output
    Tensor s_epi = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(smem), SmemLayout{}));
    auto s2g = params->tma.get_slice(_0{});
    Tensor src = s2g.partition_S(s_epi);                            // (S2G,S2G_M,S2G_N,PIPE)
    Tensor dst = s2g.partition_D(flat_divide(g_tile, OutTile{}));   // (S2G,S2G_M,S2G_N,EPI_M,EPI_N)
    copy(params->tma, src(_, _, _, store_iteration % kStages), dst(_, _, _, epi_m, epi_n));
  }

  // The tile (m, n) of group l (args: the collective's ConsumerStoreArgs).
  template <bool ReferenceSrc, class Args>
  CUTLASS_DEVICE static auto tile(Params const* params, SharedStorage& storage, Args const& args) {
    return tile<ReferenceSrc>(params, storage.smem.data(), args);
  }
  // The same over a buffer laid out as SharedStorage::smem that the caller owns.
  template <bool ReferenceSrc, class Args>
  CUTLASS_DEVICE static auto tile(Params const* params, Element* smem, Args const& args) {
    using namespace cute;
    const int m = get<0>(args.tile_coord_mnkl), n = get<1>(args.tile_coord_mnkl), l = get<3>(args.tile_coord_mnkl);
    constexpr int kCtaM = decltype(size<0>(args.tile_shape_mnk))::value;
    constexpr int kCtaN = decltype(size<1>(args.tile_shape_mnk))::value;  // of D
    static_assert(std::is_same_v<decltype(shape(args.epi_tile)), decltype(shape(EpiTile{}))>, "EpiTile: the collective's");
    using CtaTile = Shape<Int<kCtaM>, Int<kCtaN * kColumnsPerPair / 2>>;  // of the output
    const int32_t col0 = n * (kCtaN * kColumnsPerPair / 2);
    int32_t row0 = m * kCtaM, group = l;
    if constexpr (kRagged) {
      const int32_t rows = int32_t(get<0>(args.problem_shape_mnkl));  // the group's
      const int32_t begin = l == 0 ? 0 : params->offs[l - 1];
      row0 += fixed_tma::kBig - rows;
      group = begin + rows;
    }
    // the thread's D elements of one subtile, as the collective partitions them
    Tensor partition = cutlass::epilogue::fusion::detail::sm90_partition_for_epilogue<ReferenceSrc>(
        make_identity_tensor(take<0, 2>(args.tile_shape_mnk)), args.epi_tile, args.tiled_copy, args.thread_idx);
    if constexpr (kColumnsPerPair == 2) {
      Tensor regs = make_tensor<Element>(take<0, 3>(shape(partition)));  // (CPY,CPY_M,CPY_N)
      Tensor s_epi = as_position_independent_swizzle_tensor(
          make_tensor(make_smem_ptr(smem), SmemLayout{}));  // (EPI_TILE_M,EPI_TILE_N,PIPE)
      auto tiled_r2s = conditional_return<ReferenceSrc>(make_tiled_copy_S(Copy_Atom<CopyOpR2S, Element>{}, args.tiled_copy),
                                                        make_tiled_copy_D(Copy_Atom<CopyOpR2S, Element>{}, args.tiled_copy));
      Tensor smem_r2s = tiled_r2s.get_slice(args.thread_idx).partition_D(s_epi);
      return TileStore<decltype(regs), decltype(tiled_r2s), decltype(smem_r2s), CtaTile>{
          regs, tiled_r2s, smem_r2s, smem, params, row0, col0, group};
    } else {
      constexpr int kValues = decltype(size(take<0, 3>(shape(partition))))::value / 2;
      const int32_t first_m = int32_t(get<0>(args.problem_shape_mnkl)) - int32_t(get<0>(args.residue_tCcD)) - m * kCtaM;
      const int32_t first_n = int32_t(get<1>(args.problem_shape_mnkl)) - int32_t(get<1>(args.residue_tCcD)) - n * kCtaN;
      return PairTileStore<decltype(args.tCcD), kValues, CtaTile>{
          {}, args.tCcD, first_m, first_n, smem, params, row0, col0, group};
    }
  }
};

// The start of the kernel's dynamic shared memory, where CUTLASS's kernels place their
// SharedStorage (every extern __shared__ array of a kernel begins there).
CUTLASS_DEVICE char* kernel_smem_base() {
  extern __shared__ char cute_moe_kernel_smem[];
  return cute_moe_kernel_smem;
}

// D itself through a FixedTmaStore: the root of an epilogue tree whose child computes the
// output in fp32. The kernel's collective then has no D (ElementD void), which removes its
// per-group D descriptor, rewritten (after waiting for every TMA store in flight) whenever
// a CTA's next tile belongs to another group. Same bits: one rounding to Element.
//
// Its staging buffer is the collective's own D buffer: CUTLASS's ptr-array epilogue keeps
// that buffer (the subtile's shape and stages, of the tree's ElementAux, with the same swizzle)
// in its shared storage even when D is void, and never touches it then. Reusing it gives the
// mainloop back the bytes a second copy took (a stage of the FP8 kernels). The kernel type is
// not known here, so the buffer's byte offset in the kernel's shared memory is a parameter
// (LaunchContext::d_smem_offset, which GroupedGemmTypes sets; kernel_instance.cuh).
template <class Element, class EpiTile, int kStages, OutputRows kRows = OutputRows::kRagged>
struct Sm90StoreD : NodeWithoutLoads {
  using Store = FixedTmaStore<Element, EpiTile, kStages, 2, kRows>;
  using ElementAux = Element;  // CUTLASS takes a void D's element (and its D buffer's) from the tree's root
  struct Arguments {
    OutputMatrix d;
    const int32_t* offs = nullptr;  // device: cumulative end rows per group
    uint32_t smem_offset = 0;       // bytes from the kernel's shared memory to the collective's D buffer
  };
  struct SharedStorage {};
  struct Params {
    typename Store::Params store;
    uint32_t smem_offset = 0;
  };
  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const&, Arguments const& a, void*) {
    return {Store::to_params(a.d, a.offs), a.smem_offset};
  }

  Params const* params = nullptr;  // in place: the TMA descriptor stays in parameter space
  CUTLASS_HOST_DEVICE Sm90StoreD() {}
  CUTLASS_HOST_DEVICE Sm90StoreD(Params const& p, SharedStorage const&) : params(&p) {}

  template <class DStore>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE explicit ConsumerStoreCallbacks(DStore d_store) : d_store(d_store) {}
    DStore d_store;

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_d) {
      d_store.template set<FragmentSize>(
          epi_v, cutlass::NumericArrayConverter<Element, ElementInput, FragmentSize>{}(frg_d));
      return frg_d;
    }
    CUTLASS_DEVICE void postreduce(int epi_m, int epi_n, int store_iteration, bool issue_smem_store) {
      if (issue_smem_store) d_store.to_smem(epi_m, epi_n, store_iteration);
    }
    CUTLASS_DEVICE void tma_store(int epi_m, int epi_n, int store_iteration, bool issue_tma_store) {
      d_store.to_gmem(epi_m, epi_n, store_iteration, issue_tma_store);
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    Element* buffer = reinterpret_cast<Element*>(kernel_smem_base() + params->smem_offset);
    auto d_store = Store::template tile<ReferenceSrc>(&params->store, buffer, args);
    return ConsumerStoreCallbacks<decltype(d_store)>(d_store);
  }
};

// Stands in for a FixedTmaStore's TileStore where a variant has no such output.
struct NoTileStore {
  template <int FragmentSize, class Values>
  CUTLASS_DEVICE void set(int, Values const&) {}
  CUTLASS_DEVICE void to_smem(int, int, int) {}
  template <class... Ignored>
  CUTLASS_DEVICE void to_gmem(Ignored...) {}
};

}  // namespace cute_moe::detail

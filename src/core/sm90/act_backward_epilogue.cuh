// Epilogue visitor node (CUTLASS SM90 EVT) of the fused activation GEMMs, generic over
// the activation functor (activations.h). It relies on the WGMMA accumulator layout: every
// thread holds pairs of adjacent output columns (2j, 2j+1), so with interleaved gate/linear
// columns each (gate, linear) pair is in one thread's registers and no data moves between
// threads; the four threads of a quad hold the same rows.
//
//   ActBackward    down-projection input gradient: its inputs are acc = dy @ W_down^T
//                  (fp32), the forward's pre loaded by the collective's TMA source
//                  pipeline as the C operand (gated: 32-bit packed (gate, linear) words,
//                  one per column of acc; else bf16), and the row scale p (router
//                  probability, 1 without). With s = scale[group] * acc, dh = p * s; it
//                  returns dpre = dh * act'(pre), packed like pre, so the collective's TMA
//                  store writes it as D, and writes p * h (h = act(pre) recomputed, the
//                  forward's bit for bit) through smem and a TMA store of its own
//                  (fixed_tma_store.cuh).
//                  It also sums h * s over each row's columns in the tile: the tile's part
//                  of dp = dy . (scale * h @ W_down) (the gradient of p, without the bias
//                  term); one partial per (row, tile column), summed in order later.
//                  NOTE: the first version stored dpre directly and h as D; the direct
//                  8-byte stores of the wide output made the kernel latency bound (3.5x a
//                  plain GEMM, ncu: long-scoreboard stalls on the store registers); the
//                  second stored p * h directly (4-byte stores).
//                  kHalvesOut: dpre in [dgate | dlinear] halves instead; D is dgate (bf16)
//                  and dlinear a second TMA-stored output, n columns past it.
//                  With col_partial, it also sums dpre (as rounded to bf16) over the
//                  tile's rows per column: the tile's part of the up projection's bias
//                  gradient (tile_column_sums.cuh), in dpre's column order; cooperative
//                  128-row tiles only (kColumnSums, heuristics.h fuses_column_sums).
//
// The TMA-stored outputs are whole matrices whose descriptors clip each tile at its
// group's rows and the matrix's columns: nothing outside the group's problem is written.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/bfloat16.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "activations.h"
#include "epilogue_nodes.cuh"
#include "fixed_tma_store.cuh"
#include "tile_column_sums.cuh"

namespace cute_moe::detail {

namespace act_epilogue {

struct BackwardArguments {
  ActParams act = {};
  const float* group_scale = nullptr;    // (num_groups,) or null for 1
  float* const* ptr_partial = nullptr;   // per group, or null: no row-scale gradient
  int64_t partial_stride = 0;            // floats between tile columns
  OutputMatrix hp;                       // p * h, (rows, n)
  OutputMatrix dlinear;                  // kHalvesOut: the dlinear half of dpre, (rows, n)
  const int32_t* offs = nullptr;         // device: cumulative end rows per group
  float* col_partial = nullptr;          // dpre's column-sum partials (tile_column_sums.cuh), or null
  int64_t col_partial_ld = 0;            // floats between partial rows (dpre's width)
};

}  // namespace act_epilogue

template <class Activation, bool kHalvesOut, class EpiTile, int kStages>
struct Sm90ActBackward : NodeWithoutLoads {
  static_assert(!kHalvesOut || Activation::kGated, "halves: gated activations only");
  using ElementAux = cutlass::bfloat16_t;
  using Store = FixedTmaStore<ElementAux, EpiTile, kStages>;
  struct Absent {};
  template <class T>
  using IfHalves = std::conditional_t<kHalvesOut, T, Absent>;

  using Arguments = act_epilogue::BackwardArguments;
  struct SharedStorage {
    typename Store::SharedStorage hp;
    IfHalves<typename Store::SharedStorage> dlinear;
  };
  struct Params {
    ActParams act;
    const float* group_scale;
    float* const* ptr_partial;
    int64_t partial_stride;
    typename Store::Params hp;
    IfHalves<typename Store::Params> dlinear;
    const int32_t* offs;
    float* col_partial;
    int64_t col_partial_ld;
    // p * h as a plain matrix, for the direct stores of epilogue_warpgroup_kernel.cuh (which
    // writes dpre's dlinear half n columns past dgate, where lower(ActBackwardArgs) puts it)
    OutputMatrix hp_out;
  };
  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const&, Arguments const& a, void*) {
    Params p{a.act,  a.group_scale, a.ptr_partial, a.partial_stride, Store::to_params(a.hp, a.offs), {},
             a.offs, a.col_partial, a.col_partial_ld, a.hp};
    if constexpr (kHalvesOut) p.dlinear = Store::to_params(a.dlinear, a.offs);
    return p;
  }

  // Params in place, not a copy: the TMA descriptors must stay in kernel parameter space.
  Params const* params = nullptr;
  SharedStorage* storage = nullptr;
  CUTLASS_HOST_DEVICE Sm90ActBackward() {}
  CUTLASS_HOST_DEVICE Sm90ActBackward(Params const& p, SharedStorage const& s)
      : params(&p), storage(const_cast<SharedStorage*>(&s)) {}

  // dpre's column sums: values per column, and where a column's values go in a partial row
  // (dpre's own column order: interleaved pairs, [dgate | dlinear] halves, or one value).
  static constexpr int kSumValues = Activation::kGated ? 2 : 1;
  static constexpr int64_t kSumColStride = Activation::kGated && !kHalvesOut ? 2 : 1;
  // Only where a subtile spans the tile's 128 rows (two consumer warpgroups, cooperative;
  // heuristics.h, fuses_column_sums, says the same on the host): a pingpong warpgroup holds
  // a whole 128x192 tile's accumulators, and the sums' registers made it spill 640-856
  // bytes. A kernel without them leaves the bias gradient to a pass over dpre
  // (grouped_gemm.cpp, run_act_backward).
  static constexpr bool kColumnSums = decltype(cute::size<0>(EpiTile{}))::value == kColumnSumChunkRows;
  using ColumnSums = std::conditional_t<kColumnSums, TileColumnSums<kSumValues>, Absent>;

  // The tile's column sums: the warp's partial row (null: none) and the thread's first
  // column in the group's problem, of its n columns.
  struct ColumnSumTarget {
    float* row = nullptr;
    int32_t first = 0;
    int32_t cols = 0;
  };

  // kRowSlots: rows of the tile in steps of 8; a thread's rows sit 8 apart (WGMMA layout),
  // so slot (m - m_first) / 8 names each of its rows. The slot of an element is a
  // compile-time constant after unrolling, so the sums stay in registers.
  template <class CTensor, int kRowSlots, class HpStore, class DlinearStore>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor tCcD, ActParams act, float scale, float* partial, int64_t rows_left,
                                          HpStore hp_store, DlinearStore dlinear_store, ColumnSumTarget col_target)
        : tCcD(tCcD),
          act(act),
          scale(scale),
          partial(partial),
          rows_left(rows_left),
          hp_store(hp_store),
          dlinear_store(dlinear_store),
          col_target(col_target) {
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) {
        row_sum[s] = 0.0f;
        touched[s] = false;
      }
      if constexpr (kColumnSums) col_sums.clear();
    }
    CTensor tCcD;      // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to the first element
    ActParams act;
    float scale;
    float* partial;     // this thread's first row's partial of this tile column, or null
    int64_t rows_left;  // rows of the group from the thread's first row on
    HpStore hp_store;
    DlinearStore dlinear_store;
    float row_sum[kRowSlots];
    bool touched[kRowSlots];
    ColumnSumTarget col_target;
    ColumnSums col_sums;

    // frg_acc = dy @ W^T (fp32); frg_pre: the forward's pre (gated: 32-bit words, each
    // the bf16 (gate, linear) pair of one column, gate in the low half); frg_p: the row
    // scale. Returns dpre packed like pre (kHalvesOut: dgate; dlinear goes to its store).
    template <typename ElementAccumulator, typename ElementDh, typename ElementPre, typename ElementP, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
                              cutlass::Array<ElementDh, FragmentSize> const& frg_acc,
                              cutlass::Array<ElementPre, FragmentSize> const& frg_pre,
                              cutlass::Array<ElementP, FragmentSize> const& frg_p) {
      static_assert(FragmentSize % 2 == 0, "fragments must hold whole column pairs");
      static_assert(!Activation::kGated || sizeof(ElementPre) == 4, "gated: pre must arrive as 32-bit words");
      using ElementOut = std::conditional_t<Activation::kGated && !kHalvesOut, uint32_t, cutlass::bfloat16_t>;
      cutlass::Array<ElementOut, FragmentSize> dpre;
      cutlass::Array<ElementAux, FragmentSize> hp;
      cutlass::Array<ElementAux, FragmentSize> dlin;  // kHalvesOut
      auto coords = tCcD(cute::_, cute::_, cute::_, epi_m, epi_n);
      const bool sum_columns = kColumnSums && col_target.row != nullptr;  // the same in the whole tile
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; i += 2) {
        float hs = 0.0f;  // h * s over the pair
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 2; ++j) {
          const float s = scale * float(frg_acc[i + j]);
          const float p = float(frg_p[i + j]);
          float h;
          if constexpr (Activation::kGated) {
            const uint32_t word = reinterpret_cast<uint32_t const&>(frg_pre[i + j]);
            float dgate, dlinear;
            h = Activation::backward(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u), p * s, act,
                                     dgate, dlinear);
            if constexpr (kHalvesOut) {
              dpre[i + j] = cutlass::bfloat16_t(dgate);
              dlin[i + j] = cutlass::bfloat16_t(dlinear);
            } else {
              // one packed conversion (dgate in the low half), the same rounding as two
              const __nv_bfloat162 packed = __floats2bfloat162_rn(dgate, dlinear);
              dpre[i + j] = reinterpret_cast<uint32_t const&>(packed);
            }
          } else {
            float da;
            h = Activation::backward(float(frg_pre[i + j]), p * s, act, da);
            dpre[i + j] = cutlass::bfloat16_t(da);
          }
          hp[i + j] = cutlass::bfloat16_t(p * h);
          hs += h * s;
          if constexpr (kColumnSums) {
            if (sum_columns) add_to_column_sums(coords, epi_v * FragmentSize + i + j, dpre[i + j], dlin[i + j]);
          }
        }
        // No bounds test: a column past n has acc = 0 (B is zero-filled there), so s = 0
        // and h finite (pre is zero-filled too): it adds 0. A row past the group's end
        // sums garbage that end() never stores.
        const int slot = cute::get<0>(coords(epi_v * FragmentSize + i)) / 8;
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < kRowSlots; ++s) {
          if (s == slot) {
            row_sum[s] += hs;
            touched[s] = true;
          }
        }
      }
      hp_store.template set<FragmentSize>(epi_v, hp);
      dlinear_store.template set<FragmentSize>(epi_v, dlin);
      return dpre;
    }

    // Element e of the current subtile's dpre as stored (bf16; gated: both values of its
    // column; d the D element, dl the dlinear half's) into the thread's column sums; rows
    // past the group's end hold garbage and are left out.
    template <class Coords, class D, class Dl>
    CUTLASS_DEVICE void add_to_column_sums(Coords const& coords, int e, D d, Dl dl) {
      if (cute::get<0>(coords(e)) >= rows_left) return;
      const int dn = cute::get<1>(coords(e)) - cute::get<1>(coords(0));
      if constexpr (kHalvesOut) {
        col_sums.add(dn, 0, float(d));
        col_sums.add(dn, 1, float(dl));
      } else if constexpr (Activation::kGated) {
        col_sums.add(dn, 0, __uint_as_float(d << 16));
        col_sums.add(dn, 1, __uint_as_float(d & 0xffff0000u));
      } else {
        col_sums.add(dn, 0, float(d));
      }
    }

    CUTLASS_DEVICE void postreduce(int epi_m, int epi_n, int store_iteration, bool issue_smem_store) {
      // a subtile's columns are whole after its last row block (the collective walks a
      // column of subtiles before the next)
      constexpr int kEpiMs = decltype(cute::size<3>(std::declval<CTensor>()))::value;
      if constexpr (kColumnSums) {
        if (col_target.row != nullptr && epi_m == kEpiMs - 1) {
          const int32_t first = col_target.first + cute::get<1>(tCcD(0, 0, 0, epi_m, epi_n));
          col_sums.store(col_target.row, first, col_target.cols, kSumColStride, kHalvesOut ? col_target.cols : 1);
          col_sums.clear();
        }
      }
      if (issue_smem_store) {
        hp_store.to_smem(epi_m, epi_n, store_iteration);
        dlinear_store.to_smem(epi_m, epi_n, store_iteration);
      }
    }

    CUTLASS_DEVICE void tma_store(int epi_m, int epi_n, int store_iteration, bool issue_tma_store) {
      hp_store.to_gmem(epi_m, epi_n, store_iteration, issue_tma_store);
      dlinear_store.to_gmem(epi_m, epi_n, store_iteration, issue_tma_store);
    }

    // The quad's four threads hold the same rows: add their sums, one thread stores.
    CUTLASS_DEVICE void end() {
      const bool leader = (threadIdx.x & 3) == 0;
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) {
        if (touched[s]) {  // the same in every thread (the layout is)
          float v = row_sum[s];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          if (partial != nullptr && leader && 8 * s < rows_left) partial[8 * s] = v;
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    constexpr int kRowSlots = decltype(cute::size<0>(args.tile_shape_mnk))::value / 8;
    const int l = cute::get<3>(args.tile_coord_mnkl);
    const int64_t m_first = int64_t(cute::get<0>(args.problem_shape_mnkl)) - cute::get<0>(args.residue_tCcD);
    float* partial = nullptr;
    if (params->ptr_partial != nullptr) {
      partial = params->ptr_partial[l] + int64_t(cute::get<1>(args.tile_coord_mnkl)) * params->partial_stride + m_first;
    }
    const float scale = params->group_scale != nullptr ? params->group_scale[l] : 1.0f;
    ColumnSumTarget col_target;
    if constexpr (kColumnSums) {
      if (params->col_partial != nullptr) {
        constexpr int kCtaM = decltype(cute::size<0>(args.tile_shape_mnk))::value;
        constexpr int kThreads = decltype(cute::size(args.tiled_copy))::value;
        static_assert(kCtaM == kColumnSumChunkRows && kThreads == 32 * kTileColumnSumWarps &&
                          decltype(cute::size<1>(EpiTile{}))::value == 32,
                      "column sums: 128-row tiles, two consumer warpgroups, 32-column subtiles");
        const int m = cute::get<0>(args.tile_coord_mnkl);
        const int32_t rows = cute::get<0>(args.problem_shape_mnkl);
        if (rows > m * kCtaM) {  // not a cluster's spare tile past the group's rows
          const int64_t begin = l == 0 ? 0 : params->offs[l - 1];
          const int64_t slot = tile_column_sum_slot(begin, m, l);
          col_target.row =
              params->col_partial + (slot * kTileColumnSumWarps + int(args.thread_idx) / 32) * params->col_partial_ld;
          col_target.cols = cute::get<1>(args.problem_shape_mnkl);
          col_target.first = col_target.cols - int32_t(cute::get<1>(args.residue_tCcD));
        }
      }
    }
    auto hp_store = Store::template tile<ReferenceSrc>(&params->hp, storage->hp, args);
    auto dlinear_store = [&] {
      if constexpr (kHalvesOut) {
        return Store::template tile<ReferenceSrc>(&params->dlinear, storage->dlinear, args);
      } else {
        return NoTileStore{};
      }
    }();
    return ConsumerStoreCallbacks<decltype(args.tCcD), kRowSlots, decltype(hp_store), decltype(dlinear_store)>(
        args.tCcD, params->act, scale, partial, cute::get<0>(args.residue_tCcD), hp_store, dlinear_store, col_target);
  }
};

}  // namespace cute_moe::detail

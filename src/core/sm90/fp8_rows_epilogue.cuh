// An epilogue visitor node (CUTLASS SM90 EVT) that writes an e4m3 copy of the tree's output D
// by 1 x 128 blocks along its rows, with one fp32 scale per block (docs/fp8.md, "Formats"):
// the quantization of quantize_fp8_1x128 (fp8_quantize.cu) folded into the epilogue that
// computes the values, so the consumer of the copy (an FP8 ragged-M GEMM reducing along those
// columns) needs no separate pass over D. Used by the FP8 fused backward (Fp8ActBwd): dpre
// for the up projection's input gradient.
//
// D arrives packed as the gated activations' backward makes it: one 32-bit word per
// accumulator column holding the bf16 (dgate, dlinear) pair, D columns 2j and 2j + 1 (the
// non-gated kernels do not include the node: fp8_variants.cuh). The copy quantizes those bf16
// values (the bits quantize_fp8_1x128 would read back from D). A block of 128 D columns is
// kSubtiles epilogue subtiles (whole subtiles: the tile's columns start on a block boundary);
// the node keeps the values of a block's earlier subtiles in registers (the subtile loop is
// unrolled, so their indices are constants) and, in the reduce step of its last subtile, takes
// each row's amax over the thread's values and the quad's (the four threads of a quad hold the
// same rows, WGMMA's layout), then writes the e4m3 bytes and, from one thread per quad, the
// row's scale. Rows past the group and columns past D's are not written.
// Status (session 18): bit for bit quantize_fp8_1x128; slower than the separate pass it
// replaces (the cooperative kernel's epilogue runs between tiles: +1.0 ms on the GPT-OSS-20B
// fused backward against a 0.6 ms pass, docs/fp8.md), so the FP8 block leaves it off
// (fp8_ffn.FUSED_DPRE_COPY). (A one-bf16-per-column form for the non-gated activations wrote
// wrong bytes in its first test and was removed; they quantize dpre with the pass.)
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/bfloat16.h>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "../fp8_block_math.cuh"
#include "../kernel_registry.h"  // Fp8RowsOutput
#include "epilogue_nodes.cuh"

namespace cute_moe::detail {

struct QuantizeRowsArguments {
  Fp8RowsOutput out;               // out.q null: the node writes nothing
  const int32_t* offs = nullptr;   // device: cumulative end rows per group
};

// D's elements are 32-bit (bf16, bf16) pairs of adjacent columns (gated dpre).
template <class EpiTile>
struct Sm90QuantizeRows : SimpleNode<QuantizeRowsArguments> {
  static constexpr int kWidth = 2;  // D columns per element
  static constexpr int kEpiN = decltype(cute::size<1>(EpiTile{}))::value;
  static_assert(fp8_math::kBlock % (kEpiN * kWidth) == 0, "a 1 x 128 block must be whole epilogue subtiles");
  static constexpr int kSubtiles = fp8_math::kBlock / (kEpiN * kWidth);
  using ElementD = uint32_t;

  Params params;
  CUTLASS_HOST_DEVICE Sm90QuantizeRows() {}
  CUTLASS_HOST_DEVICE Sm90QuantizeRows(Params const& p, SharedStorage const&) : params(p) {}

  // kRowSlots as in Sm90ActBackward: a thread's rows sit 8 apart, slot = row / 8.
  template <class CTensor, int kRowSlots, int kPerSubtile>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CTensor tCcD;          // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates from the thread's first element
    uint8_t* q = nullptr;  // the thread's first element's row and D column, or null: no copy
    int64_t ld_q;
    float* scale;          // the thread's first row's scale of block 0, or null
    int64_t ld_scale;
    int block0;            // block of the tile's first D column
    int rows_left, cols_left;  // of the group's rows and the accumulator columns from the first element
    int tile_cols_left;        // accumulator columns of the problem from the tile's first on
    cutlass::Array<ElementD, kPerSubtile> held[kSubtiles > 1 ? kSubtiles - 1 : 1];

    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor t, uint8_t* q, int64_t ld_q, float* scale, int64_t ld_scale,
                                          int block0, int rows_left, int cols_left, int tile_cols_left)
        : tCcD(t), q(q), ld_q(ld_q), scale(scale), ld_scale(ld_scale), block0(block0), rows_left(rows_left),
          cols_left(cols_left), tile_cols_left(tile_cols_left) {}

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int, int,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_d) {
      return frg_d;  // D as it is
    }

    // The two bf16 values of element e of an epilogue subtile.
    CUTLASS_DEVICE static void values(ElementD e, float (&v)[kWidth]) {
      v[0] = __uint_as_float(e << 16);
      v[1] = __uint_as_float(e & 0xffff0000u);
    }

    CUTLASS_DEVICE static void store_one(uint8_t* dst, uint32_t bytes) {
      __stcg(reinterpret_cast<unsigned short*>(dst), static_cast<unsigned short>(bytes));
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor&&, SyncFn const&, int epi_m, int epi_n, bool, VTensor visit_results) {
      if (q == nullptr) return;
      constexpr int kFragment = int(std::decay_t<decltype(visit_results(0))>::kElements);
      static_assert(kFragment * int(decltype(cute::size(visit_results))::value) == kPerSubtile, "one subtile");
      static_assert(kPerSubtile % 2 == 0, "whole column pairs");
      const int part = epi_n % kSubtiles;
      if (part != kSubtiles - 1) {  // an earlier subtile of the block: keep its values
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kPerSubtile; ++i) held[part][i] = visit_results(i / kFragment)[i % kFragment];
        return;
      }
      auto element = [&](int sub, int i) -> ElementD {
        return sub == kSubtiles - 1 ? ElementD(visit_results(i / kFragment)[i % kFragment]) : held[sub][i];
      };
      // each row's amax over the block: the thread's values, then its quad's
      float amax[kRowSlots];
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) amax[s] = 0.0f;
      CUTLASS_PRAGMA_UNROLL
      for (int sub = 0; sub < kSubtiles; ++sub) {
        auto coords = tCcD(cute::_, cute::_, cute::_, epi_m, epi_n - (kSubtiles - 1) + sub);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kPerSubtile; ++i) {
          const int slot = cute::get<0>(coords(i)) / 8;
          float v[kWidth];
          values(element(sub, i), v);
          CUTLASS_PRAGMA_UNROLL
          for (int s = 0; s < kRowSlots; ++s) {
            if (s == slot) {
              CUTLASS_PRAGMA_UNROLL
              for (int w = 0; w < kWidth; ++w) amax[s] = fp8_math::nan_max(amax[s], fabsf(v[w]));
            }
          }
        }
      }
      float block_scale[kRowSlots];
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) {
        float a = amax[s];
        a = fp8_math::nan_max(a, __shfl_xor_sync(0xffffffffu, a, 1));
        a = fp8_math::nan_max(a, __shfl_xor_sync(0xffffffffu, a, 2));
        block_scale[s] = fp8_math::block_scale(a);
      }
      // the e4m3 bytes of each element, where its row and columns are inside; two elements of
      // adjacent columns (WGMMA's pairs) in one 4- (packed) or 2-byte store
      CUTLASS_PRAGMA_UNROLL
      for (int sub = 0; sub < kSubtiles; ++sub) {
        auto coords = tCcD(cute::_, cute::_, cute::_, epi_m, epi_n - (kSubtiles - 1) + sub);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kPerSubtile; i += 2) {
          const int m = cute::get<0>(coords(i)), n = cute::get<1>(coords(i));
          const bool paired = cute::get<0>(coords(i + 1)) == m && cute::get<1>(coords(i + 1)) == n + 1;
          const int slot = m / 8;
          float sc = 1.0f;
          CUTLASS_PRAGMA_UNROLL
          for (int s = 0; s < kRowSlots; ++s) sc = s == slot ? block_scale[s] : sc;
          const fp8_math::ScaleDivisor div{sc, 1.0f / sc};
          const bool fast = fp8_math::ScaleDivisor::fast_for(sc);
          auto quotient = [&](float x) { return fast ? div.fast(x) : div.exact(x); };
          float v[2 * kWidth];
          values(element(sub, i), reinterpret_cast<float(&)[kWidth]>(v[0]));
          values(element(sub, i + 1), reinterpret_cast<float(&)[kWidth]>(v[kWidth]));
          const uint32_t bytes = fp8_math::e4m3x2(quotient(v[0]), quotient(v[1])) |
                                 fp8_math::e4m3x2(quotient(v[2]), quotient(v[3])) << 16;
          uint8_t* dst = q + int64_t(m) * ld_q + int64_t(n) * kWidth;
          if (paired) {  // both columns in or out: n is even (WGMMA's pairs) and D's width too
            if (m < rows_left && n < cols_left) __stcg(reinterpret_cast<unsigned int*>(dst), bytes);
          } else {  // not expected from WGMMA's layout; kept correct regardless
            const int m1 = cute::get<0>(coords(i + 1)), n1 = cute::get<1>(coords(i + 1));
            if (m < rows_left && n < cols_left) store_one(dst, bytes & 0xffffu);
            if (m1 < rows_left && n1 < cols_left) store_one(q + int64_t(m1) * ld_q + int64_t(n1) * kWidth, bytes >> 16);
          }
        }
      }
      // the block's scale of each of the thread's rows, from the quad's first thread, where the
      // block starts inside D (a tile's last block may lie wholly past D's width)
      const bool block_inside = (epi_n - (kSubtiles - 1)) * kEpiN < tile_cols_left;
      if (scale != nullptr && block_inside && (threadIdx.x & 3) == 0) {
        const int block = block0 + epi_n / kSubtiles;
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < kRowSlots; ++s) {
          bool mine = false;
          auto coords = tCcD(cute::_, cute::_, cute::_, epi_m, epi_n);
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < kPerSubtile; ++i) mine |= cute::get<0>(coords(i)) / 8 == s;
          if (mine && 8 * s < rows_left) scale[int64_t(8 * s) * ld_scale + block] = block_scale[s];
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    constexpr int kRowSlots = decltype(size<0>(args.tile_shape_mnk))::value / 8;
    constexpr int kPerSubtile = decltype(size(args.tCcD(_, _, _, 0, 0)))::value;
    using Callbacks = ConsumerStoreCallbacks<decltype(args.tCcD), kRowSlots, kPerSubtile>;
    const Fp8RowsOutput& out = params.out;
    if (out.q == nullptr) return Callbacks(args.tCcD, nullptr, 0, nullptr, 0, 0, 0, 0, 0);
    const int l = get<3>(args.tile_coord_mnkl);
    const int rows_left = get<0>(args.residue_tCcD), cols_left = get<1>(args.residue_tCcD);
    // the thread's first element in the group's problem, and the group's first row overall
    const int64_t m_first = int64_t(get<0>(args.problem_shape_mnkl)) - rows_left;
    const int64_t n_first = int64_t(get<1>(args.problem_shape_mnkl)) - cols_left;
    const int64_t row0 = (l == 0 ? 0 : int64_t(params.offs[l - 1])) + m_first;
    const int64_t tile_n0 = int64_t(get<1>(args.tile_coord_mnkl)) * size<1>(args.tile_shape_mnk);
    const int64_t n = get<1>(args.problem_shape_mnkl);
    return Callbacks(args.tCcD, static_cast<uint8_t*>(out.q) + row0 * out.ld_q + n_first * kWidth, out.ld_q,
                     out.scale + row0 * out.ld_scale, out.ld_scale, int(tile_n0 * kWidth / fp8_math::kBlock),
                     rows_left, cols_left, int(n - tile_n0));
  }
};

}  // namespace cute_moe::detail

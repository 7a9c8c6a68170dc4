// Epilogue visitor nodes (CUTLASS SM90 EVT) of the fused activation GEMMs, generic over
// the activation functor (activations.h).
//
// Both rely on the WGMMA accumulator layout: every thread holds pairs of adjacent output
// columns (2j, 2j+1), so with interleaved gate/linear columns each (gate, linear) pair is
// in one thread's registers and no data moves between threads; the four threads of a
// quad hold the same rows.
//
//   ActForwardAux  up-projection: its input is pre = scale * acc + bias (fp32). It rounds
//                  pre to bf16 exactly as the D store will, computes h = act(pre) from the
//                  rounded values (gated: one h per (gate, linear) pair, width n/2; else
//                  one per column, width n), stores h straight to global memory, and
//                  passes pre on unchanged, so the collective stores pre as D.
//   ActBackward    down-projection input gradient: its inputs are acc = dy @ W_down^T
//                  (fp32), the forward's pre loaded by the collective's TMA source
//                  pipeline as the C operand (gated: 32-bit packed (gate, linear) words,
//                  one per column of acc; else bf16), and the row scale p (router
//                  probability, 1 without). With s = scale[group] * acc, dh = p * s; it
//                  returns dpre = dh * act'(pre), packed like pre, so the collective's TMA
//                  store writes it as D, and stores p * h (h = act(pre) recomputed, the
//                  forward's bit for bit) straight to global memory as the aux output.
//                  It also sums h * s over each row's columns in the tile: the tile's part
//                  of dp = dy . (scale * h @ W_down) (the gradient of p, without the bias
//                  term); one partial per (row, tile column), summed in order later.
//                  NOTE: the first version stored dpre directly and h as D; the direct
//                  8-byte stores of the wide output made the kernel latency bound (3.5x a
//                  plain GEMM, ncu: long-scoreboard stalls on the store registers).
//
// The aux output of group l is at ptr_aux[l] with row stride ld_aux[l] elements (per-group
// arrays built on the device by group_setup.cu). Elements outside the group's problem
// (tile residue) are neither read nor written.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/bfloat16.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "activations.h"
#include "epilogue_nodes.cuh"

namespace cute_moe::detail {

namespace act_epilogue {

struct ForwardArguments {
  void* const* ptr_aux = nullptr;
  int64_t const* ld_aux = nullptr;
  ActParams act = {};
};

struct BackwardArguments {
  void* const* ptr_aux = nullptr;
  int64_t const* ld_aux = nullptr;
  ActParams act = {};
  const float* group_scale = nullptr;    // (num_groups,) or null for 1
  float* const* ptr_partial = nullptr;   // per group, or null: no row-scale gradient
  int64_t partial_stride = 0;            // floats between tile columns
};

// Where this thread's elements live. NOTE: tCcD holds coordinates relative to the
// thread's FIRST element (not to the tile origin), and residue_tCcD = (M, N) minus that
// element's absolute coordinate; so that element sits at (M, N) - residue.
template <class CTensor, class Residue, class ElementAux>
struct ThreadView {
  CTensor tCcD;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to the first element
  Residue residue;
  ElementAux* aux;  // the aux element of the thread's first (m, n)
  int64_t ld;
};

// kAuxPerPair: aux columns per pair of output columns (1 for a gated forward's h, else 2).
// The first element's column is even (each thread owns whole column pairs).
template <class ElementAux, int kAuxPerPair, class Args>
CUTLASS_DEVICE auto make_thread_view(Args const& args, void* const* ptr_aux, int64_t const* ld_aux) {
  auto [M, N, K, L] = args.problem_shape_mnkl;
  const int l = cute::get<3>(args.tile_coord_mnkl);
  const int64_t m_first = int64_t(M) - cute::get<0>(args.residue_tCcD);
  const int64_t n_first = int64_t(N) - cute::get<1>(args.residue_tCcD);
  const int64_t ld = ld_aux[l];
  ElementAux* first = static_cast<ElementAux*>(ptr_aux[l]) + m_first * ld + (n_first / 2) * kAuxPerPair;
  return ThreadView<decltype(args.tCcD), decltype(args.residue_tCcD), ElementAux>{args.tCcD, args.residue_tCcD, first,
                                                                                  ld};
}

CUTLASS_DEVICE uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(cutlass::bfloat16_t(lo).raw()) | (uint32_t(cutlass::bfloat16_t(hi).raw()) << 16);
}

}  // namespace act_epilogue

template <class Activation>
struct Sm90ActForwardAux : SimpleNode<act_epilogue::ForwardArguments> {
  using ElementAux = cutlass::bfloat16_t;
  Params params;

  CUTLASS_HOST_DEVICE Sm90ActForwardAux() {}
  CUTLASS_HOST_DEVICE Sm90ActForwardAux(Params const& p, SharedStorage const&) : params(p) {}

  template <class View>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(View v, ActParams act) : view(v), act(act) {}
    View view;
    ActParams act;

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_pre) {
      static_assert(FragmentSize % 2 == 0, "fragments must hold whole column pairs");
      auto coords = view.tCcD(cute::_, cute::_, cute::_, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; i += 2) {
        auto c = coords(epi_v * FragmentSize + i);  // (m, n) from the first element, n even
        if (cute::elem_less(c, view.residue)) {
          // the values the D store will write
          const float p0 = float(cutlass::bfloat16_t(frg_pre[i]));
          const float p1 = float(cutlass::bfloat16_t(frg_pre[i + 1]));
          if constexpr (Activation::kGated) {
            view.aux[cute::get<0>(c) * view.ld + cute::get<1>(c) / 2] =
                cutlass::bfloat16_t(Activation::forward(p0, p1, act));
          } else {
            *reinterpret_cast<uint32_t*>(view.aux + cute::get<0>(c) * view.ld + cute::get<1>(c)) =
                act_epilogue::pack_bf16(Activation::forward(p0, act), Activation::forward(p1, act));
          }
        }
      }
      return frg_pre;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto view = act_epilogue::make_thread_view<ElementAux, Activation::kGated ? 1 : 2>(args, params.ptr_aux,
                                                                                       params.ld_aux);
    return ConsumerStoreCallbacks<decltype(view)>(view, params.act);
  }
};

template <class Activation>
struct Sm90ActBackward : SimpleNode<act_epilogue::BackwardArguments> {
  using ElementAux = cutlass::bfloat16_t;
  Params params;

  CUTLASS_HOST_DEVICE Sm90ActBackward() {}
  CUTLASS_HOST_DEVICE Sm90ActBackward(Params const& p, SharedStorage const&) : params(p) {}

  // kRowSlots: rows of the tile in steps of 8; a thread's rows sit 8 apart (WGMMA layout),
  // so slot (m - m_first) / 8 names each of its rows. The slot of an element is a
  // compile-time constant after unrolling, so the sums stay in registers.
  template <class View, int kRowSlots>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(View v, ActParams act, float scale, float* partial, int64_t rows_left)
        : view(v), act(act), scale(scale), partial(partial), rows_left(rows_left) {
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < kRowSlots; ++s) {
        row_sum[s] = 0.0f;
        touched[s] = false;
      }
    }
    View view;
    ActParams act;
    float scale;
    float* partial;     // this thread's first row's partial of this tile column, or null
    int64_t rows_left;  // rows of the group from the thread's first row on
    float row_sum[kRowSlots];
    bool touched[kRowSlots];

    // frg_acc = dy @ W^T (fp32); frg_pre: the forward's pre (gated: 32-bit words, each
    // the bf16 (gate, linear) pair of one column, gate in the low half); frg_p: the row
    // scale. Returns dpre packed like pre.
    template <typename ElementAccumulator, typename ElementDh, typename ElementPre, typename ElementP, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
                              cutlass::Array<ElementDh, FragmentSize> const& frg_acc,
                              cutlass::Array<ElementPre, FragmentSize> const& frg_pre,
                              cutlass::Array<ElementP, FragmentSize> const& frg_p) {
      static_assert(FragmentSize % 2 == 0, "fragments must hold whole column pairs");
      static_assert(!Activation::kGated || sizeof(ElementPre) == 4, "gated: pre must arrive as 32-bit words");
      using ElementOut = std::conditional_t<Activation::kGated, uint32_t, cutlass::bfloat16_t>;
      cutlass::Array<ElementOut, FragmentSize> dpre;
      auto coords = view.tCcD(cute::_, cute::_, cute::_, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; i += 2) {
        float hp[2];
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
            dpre[i + j] = act_epilogue::pack_bf16(dgate, dlinear);
          } else {
            float da;
            h = Activation::backward(float(frg_pre[i + j]), p * s, act, da);
            dpre[i + j] = cutlass::bfloat16_t(da);
          }
          hp[j] = p * h;
          hs += h * s;
        }
        auto c = coords(epi_v * FragmentSize + i);  // columns (n, n+1) from the first element
        const int slot = cute::get<0>(c) / 8;
        const bool inside = cute::elem_less(c, view.residue);
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < kRowSlots; ++s) {
          if (s == slot) {
            row_sum[s] += inside ? hs : 0.0f;
            touched[s] = true;
          }
        }
        if (inside) {
          *reinterpret_cast<uint32_t*>(view.aux + cute::get<0>(c) * view.ld + cute::get<1>(c)) =
              act_epilogue::pack_bf16(hp[0], hp[1]);
        }
      }
      return dpre;
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
    auto view = act_epilogue::make_thread_view<ElementAux, 2>(args, params.ptr_aux, params.ld_aux);
    constexpr int kRowSlots = decltype(cute::size<0>(args.tile_shape_mnk))::value / 8;
    const int l = cute::get<3>(args.tile_coord_mnkl);
    const int64_t m_first = int64_t(cute::get<0>(args.problem_shape_mnkl)) - cute::get<0>(args.residue_tCcD);
    float* partial = nullptr;
    if (params.ptr_partial != nullptr) {
      partial = params.ptr_partial[l] + int64_t(cute::get<1>(args.tile_coord_mnkl)) * params.partial_stride + m_first;
    }
    const float scale = params.group_scale != nullptr ? params.group_scale[l] : 1.0f;
    return ConsumerStoreCallbacks<decltype(view), kRowSlots>(view, params.act, scale, partial,
                                                             cute::get<0>(args.residue_tCcD));
  }
};

}  // namespace cute_moe::detail

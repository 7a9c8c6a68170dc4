// Epilogue visitor nodes (CUTLASS SM90 EVT) of the fused gated-activation GEMMs.
//
// Both rely on the WGMMA accumulator layout: every thread holds pairs of adjacent output
// columns (2j, 2j+1), so with interleaved gate/linear columns each (gate, linear) pair is
// in one thread's registers and no data moves between threads.
//
//   GluForwardAux  up-projection: its input is pre = acc + bias (fp32). It rounds pre to
//                  bf16 exactly as the D store will, computes h = act(gate, linear) from the
//                  rounded pair, stores h (width n/2) straight to global memory, and passes
//                  pre on unchanged, so the collective stores pre as D.
//   GluBackward    down-projection input gradient: its inputs are dh = acc (fp32) and the
//                  forward's pre, loaded by the collective's TMA source pipeline as the C
//                  operand viewed as 32-bit packed (gate, linear) pairs of width n. It
//                  returns dpre = (dh * dh/dgate, dh * dh/dlinear) packed the same way, so
//                  the collective's TMA store writes the wide output as D, and stores the
//                  recomputed h = act(pre) (width n; the forward's h, bit for bit: same
//                  rounded inputs, same code) straight to global memory as the aux output.
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

namespace cute_moe::detail {

namespace glu_epilogue {

// Interface members every node without smem or producer loads shares.
struct NodeBase {
  struct SharedStorage {};
  struct Arguments {
    void* const* ptr_aux = nullptr;
    int64_t const* ld_aux = nullptr;
    GluParams act = {};
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::detail::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }
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

// kAuxPerPair: aux columns per pair of output columns (1 for the forward's h, 2 for the
// backward's h, which has the GEMM's width). The first
// element's column is even (each thread owns whole column pairs).
template <class ElementAux, int kAuxPerPair, class Args, class Params>
CUTLASS_DEVICE auto make_thread_view(Args const& args, Params const& params) {
  auto [M, N, K, L] = args.problem_shape_mnkl;
  const int l = cute::get<3>(args.tile_coord_mnkl);
  const int64_t m_first = int64_t(M) - cute::get<0>(args.residue_tCcD);
  const int64_t n_first = int64_t(N) - cute::get<1>(args.residue_tCcD);
  const int64_t ld = params.ld_aux[l];
  ElementAux* first = static_cast<ElementAux*>(params.ptr_aux[l]) + m_first * ld + (n_first / 2) * kAuxPerPair;
  return ThreadView<decltype(args.tCcD), decltype(args.residue_tCcD), ElementAux>{args.tCcD, args.residue_tCcD, first,
                                                                                  ld};
}

}  // namespace glu_epilogue

template <class Activation>
struct Sm90GluForwardAux : glu_epilogue::NodeBase {
  using ElementAux = cutlass::bfloat16_t;
  Params params;

  CUTLASS_HOST_DEVICE Sm90GluForwardAux() {}
  CUTLASS_HOST_DEVICE Sm90GluForwardAux(Params const& p, SharedStorage const&) : params(p) {}

  template <class View>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(View v, GluParams act) : view(v), act(act) {}
    View view;
    GluParams act;

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_pre) {
      static_assert(FragmentSize % 2 == 0, "fragments must hold whole (gate, linear) pairs");
      auto coords = view.tCcD(cute::_, cute::_, cute::_, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; i += 2) {
        auto c = coords(epi_v * FragmentSize + i);  // (m, n) from the first element, n even: a gate column
        if (cute::elem_less(c, view.residue)) {
          const float gate = float(cutlass::bfloat16_t(frg_pre[i]));
          const float linear = float(cutlass::bfloat16_t(frg_pre[i + 1]));
          view.aux[cute::get<0>(c) * view.ld + cute::get<1>(c) / 2] =
              cutlass::bfloat16_t(Activation::forward(gate, linear, act));
        }
      }
      return frg_pre;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto view = glu_epilogue::make_thread_view<ElementAux, 1>(args, params);
    return ConsumerStoreCallbacks<decltype(view)>(view, params.act);
  }
};

template <class Activation>
struct Sm90GluBackward : glu_epilogue::NodeBase {
  using ElementAux = cutlass::bfloat16_t;
  Params params;

  CUTLASS_HOST_DEVICE Sm90GluBackward() {}
  CUTLASS_HOST_DEVICE Sm90GluBackward(Params const& p, SharedStorage const&) : params(p) {}

  template <class View>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(View v, GluParams act) : view(v), act(act) {}
    View view;
    GluParams act;

    // frg_dh: the fp32 accumulator; frg_pre: 32-bit words, each the bf16 (gate, linear)
    // pair of one column (gate in the low half: it sits at the lower address). Returns
    // dpre in the same packing.
    template <typename ElementAccumulator, typename ElementDh, typename ElementPre, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<uint32_t, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
        cutlass::Array<ElementDh, FragmentSize> const& frg_dh, cutlass::Array<ElementPre, FragmentSize> const& frg_pre) {
      static_assert(sizeof(ElementPre) == 4, "pre must arrive as 32-bit (gate, linear) words");
      static_assert(FragmentSize % 2 == 0, "fragments must hold whole column pairs");
      cutlass::Array<uint32_t, FragmentSize> dpre;
      auto coords = view.tCcD(cute::_, cute::_, cute::_, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; i += 2) {
        uint32_t h_pair = 0;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 2; ++j) {
          const uint32_t word = reinterpret_cast<uint32_t const&>(frg_pre[i + j]);
          const float gate = __uint_as_float(word << 16);
          const float linear = __uint_as_float(word & 0xffff0000u);
          float dgate, dlinear;
          const float h = Activation::backward(gate, linear, float(frg_dh[i + j]), act, dgate, dlinear);
          const cutlass::bfloat16_t lo(dgate), hi(dlinear), hb(h);
          dpre[i + j] = uint32_t(lo.raw()) | (uint32_t(hi.raw()) << 16);
          h_pair |= uint32_t(hb.raw()) << (16 * j);
        }
        auto c = coords(epi_v * FragmentSize + i);  // columns (n, n+1) from the first element
        if (cute::elem_less(c, view.residue)) {
          *reinterpret_cast<uint32_t*>(view.aux + cute::get<0>(c) * view.ld + cute::get<1>(c)) = h_pair;
        }
      }
      return dpre;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto view = glu_epilogue::make_thread_view<ElementAux, 2>(args, params);
    return ConsumerStoreCallbacks<decltype(view)>(view, params.act);
  }
};

}  // namespace cute_moe::detail

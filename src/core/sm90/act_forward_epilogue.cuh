// Epilogue visitor node (CUTLASS SM90 EVT) of the fused activation GEMMs, generic over
// the activation functor (activations.h). It relies on the WGMMA accumulator layout: every
// thread holds pairs of adjacent output columns (2j, 2j+1), so with interleaved gate/linear
// columns each (gate, linear) pair is in one thread's registers and no data moves between
// threads; the four threads of a quad hold the same rows.
//
//   ActForwardAux  up-projection: its input is pre = scale * acc + bias (fp32). It rounds
//                  pre to bf16, computes h = act(pre) from the rounded values (gated: one h
//                  per (gate, linear) pair, width n/2; else one per column, width n), and
//                  writes both, pre as D, through smem and TMA stores of its own
//                  (fixed_tma_store.cuh; the collective has no D). With swap_pairs the
//                  mainloop loaded each pair as (linear, gate) (the halves as two tensors,
//                  the linear one lower in memory): it swaps them back first.
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

namespace cute_moe::detail {

namespace act_epilogue {

struct ForwardArguments {
  ActParams act = {};
  OutputMatrix pre;                // D: (rows, n)
  OutputMatrix h;                  // (rows, n / 2) gated, else (rows, n)
  const int32_t* offs = nullptr;   // device: cumulative end rows per group
  bool swap_pairs = false;         // gated: each column pair arrives as (linear, gate)
};

}  // namespace act_epilogue

template <class Activation, class EpiTile, int kStages>
struct Sm90ActForwardAux : NodeWithoutLoads {
  using ElementAux = cutlass::bfloat16_t;  // also what CUTLASS takes the (void) D's element to be
  using PreStore = FixedTmaStore<ElementAux, EpiTile, kStages>;
  // gated: one h per (gate, linear) pair of adjacent columns
  using HStore = FixedTmaStore<ElementAux, EpiTile, kStages, Activation::kGated ? 1 : 2>;
  using Arguments = act_epilogue::ForwardArguments;
  struct SharedStorage {
    typename PreStore::SharedStorage pre;
    typename HStore::SharedStorage h;
  };
  struct Params {
    ActParams act;
    typename PreStore::Params pre;
    typename HStore::Params h;
    bool swap_pairs;
  };
  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const&, Arguments const& a, void*) {
    return {a.act, PreStore::to_params(a.pre, a.offs), HStore::to_params(a.h, a.offs), a.swap_pairs};
  }

  // Params in place, not a copy: the TMA descriptors must stay in kernel parameter space.
  Params const* params = nullptr;
  SharedStorage* storage = nullptr;
  CUTLASS_HOST_DEVICE Sm90ActForwardAux() {}
  CUTLASS_HOST_DEVICE Sm90ActForwardAux(Params const& p, SharedStorage const& s)
      : params(&p), storage(const_cast<SharedStorage*>(&s)) {}

  template <class PreTile, class HTile>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(ActParams act, PreTile pre_store, HTile h_store, bool swap_pairs)
        : act(act), pre_store(pre_store), h_store(h_store), swap_pairs(swap_pairs) {}
    ActParams act;
    PreTile pre_store;
    HTile h_store;
    bool swap_pairs;

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_pre) {
      static_assert(FragmentSize % 2 == 0, "fragments must hold whole column pairs");
      cutlass::Array<ElementAux, FragmentSize> pre;  // D, rounded once; h is computed from it
      if constexpr (Activation::kGated) {
        // each pair as loaded, or swapped back (swap_pairs is uniform over the kernel); two
        // selects per pair from the fp32 inputs
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; i += 2) {
          const float first = frg_pre[i], second = frg_pre[i + 1];
          pre[i] = ElementAux(swap_pairs ? second : first);
          pre[i + 1] = ElementAux(swap_pairs ? first : second);
        }
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) pre[i] = ElementAux(frg_pre[i]);
      }
      pre_store.template set<FragmentSize>(epi_v, pre);
      if constexpr (Activation::kGated) {
        cutlass::Array<ElementAux, FragmentSize / 2> h;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; i += 2) {
          h[i / 2] = ElementAux(Activation::forward(float(pre[i]), float(pre[i + 1]), act));
        }
        h_store.template set<FragmentSize>(epi_v, h);
      } else {
        cutlass::Array<ElementAux, FragmentSize> h;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) h[i] = ElementAux(Activation::forward(float(pre[i]), act));
        h_store.template set<FragmentSize>(epi_v, h);
      }
      return frg_pre;
    }

    CUTLASS_DEVICE void postreduce(int epi_m, int epi_n, int store_iteration, bool issue_smem_store) {
      if (issue_smem_store) {
        pre_store.to_smem(epi_m, epi_n, store_iteration);
        h_store.to_smem(epi_m, epi_n, store_iteration);
      }
    }
    CUTLASS_DEVICE void tma_store(int epi_m, int epi_n, int store_iteration, bool issue_tma_store) {
      pre_store.to_gmem(epi_m, epi_n, store_iteration, issue_tma_store);
      h_store.to_gmem(epi_m, epi_n, store_iteration, issue_tma_store);
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto pre_store = PreStore::template tile<ReferenceSrc>(&params->pre, storage->pre, args);
    auto h_store = HStore::template tile<ReferenceSrc>(&params->h, storage->h, args);
    return ConsumerStoreCallbacks<decltype(pre_store), decltype(h_store)>(params->act, pre_store, h_store,
                                                                          params->swap_pairs);
  }
};

}  // namespace cute_moe::detail

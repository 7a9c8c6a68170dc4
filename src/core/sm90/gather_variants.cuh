// The gathered up-projection variants (ActFwdGather_*): the activation forward
// epilogue over A rows gathered from x (gather_mainloop.cuh). Only their translation units
// include this, so the gathered mainloop does not recompile the other kernels.
#pragma once

#include "gather_mainloop.cuh"
#include "act_forward_variants.cuh"

namespace cute_moe::detail {

// The A rows gathered from x through the per-group row indices.
struct GatherAMainloopOf {
  template <class Built>
  using type = GatherAMainloop<Built>;
  template <class Args>
  static void set_arguments(Args& args, const GroupArrays& g, const LaunchContext&) {
    args.gather_rows = g.gather_rows;
  }
};
template <Act A> struct VariantTraits<KernelVariant::ActFwdGather_BRow, A>
    : Traits<RowMajor, RowMajor, bf16, ActForwardEpilogue<typename ActFunctor<A>::type>, GatherAMainloopOf> {};

}  // namespace cute_moe::detail

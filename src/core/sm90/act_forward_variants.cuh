// The fused up-projection kernel variants (ActFwd_*): their epilogue tree and operand
// traits, one kernel per activation (ActFwdGather_*: gather_variants.cuh). Only their
// translation units (and the families built on them) include this, so changes here do
// not recompile the plain GEMMs or the fused backward.
#pragma once

#include "act_forward_epilogue.cuh"
#include "act_functors.h"  // generated: ActFunctor<Act> -> functor of activations.h
#include "kernel_instance.cuh"

namespace cute_moe::detail {

// D = pre = scale[group] * acc + bias[group]; aux = h = act(pre); both written by the tree
// through fixed descriptors (kWritesD: the collective has no D)
template <class Activation>
struct ActForwardEpilogue {
  using ElementC = void;
  static constexpr bool kWritesD = true;
  template <class TileShape, class ElementD, class EpiDesc>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<
      Sm90ActForwardAux<Activation, typename EpiDesc::EpilogueTile, EpiDesc::StagesD>, ScaledBiasTree<TileShape, float>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {scaled_bias_arguments<decltype(Args{}.op_0)>(g), {ctx.act, ctx.d, ctx.aux, ctx.whole.offs, ctx.swap_pairs}};
  }
};

template <Act A> struct VariantTraits<KernelVariant::ActFwd_BRow, A>
    : Traits<RowMajor, RowMajor, bf16, ActForwardEpilogue<typename ActFunctor<A>::type>, FixedTmaMainloopOf<false>> {};
// k-contiguous W of a gated activation: B's (gate, linear) pairs loaded as adjacent rows
// from either column layout (fixed_tma_mainloop.cuh, "paired B")
template <Act A> struct VariantTraits<KernelVariant::ActFwd_BCol, A>
    : Traits<RowMajor, ColMajor, bf16, ActForwardEpilogue<typename ActFunctor<A>::type>,
             FixedTmaMainloopOf<false, ActFunctor<A>::type::kGated>> {};

}  // namespace cute_moe::detail

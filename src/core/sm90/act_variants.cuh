// The fused activation kernel variants (ActFwd_*, ActBwd_*): their epilogue trees and
// operand traits, one kernel per activation (ActFwdGather_*: gather_variants.cuh). Only
// their translation units include this, so changes here do not recompile the plain GEMMs.
#pragma once

#include "act_epilogue.cuh"
#include "act_functors.h"  // generated: ActFunctor<Act> -> functor of activations.h
#include "kernel_instance.cuh"

namespace cute_moe::detail {

// D = pre = scale[group] * acc + bias[group]; aux = h = act(pre)
template <class Activation>
struct ActForwardEpilogue {
  using ElementC = void;
  template <class TileShape, class ElementD>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<Sm90ActForwardAux<Activation>, ScaledBiasTree<TileShape, float>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {scaled_bias_arguments<decltype(Args{}.op_0)>(g), {g.aux, g.ldaux, ctx.act}};
  }
};

// C = pre (gated: packed (gate, linear) words); D = dpre = act'(pre) * row_scale * scale
// * acc, packed like pre; aux = row_scale * act(pre); row-scale-gradient partials
template <class Activation>
struct ActBackwardEpilogue {
  using ElementC = std::conditional_t<Activation::kGated, uint32_t, cutlass::bfloat16_t>;
  template <class TileShape, class ElementD>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<Sm90ActBackward<Activation>, cutlass::epilogue::fusion::Sm90AccFetch,
                                                  cutlass::epilogue::fusion::Sm90SrcFetch<ElementC>,
                                                  RowScaleCol<TileShape>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {{},
            {},
            {reinterpret_cast<const float* const*>(g.row_scale), 1.0f, {}},
            {g.aux, g.ldaux, ctx.act, g.group_scale, g.row_partial, g.row_partial_stride}};
  }
};

template <Act A>
using ActBwdOut = std::conditional_t<ActFunctor<A>::type::kGated, uint32_t, bf16>;  // dpre's D element

template <Act A> struct VariantTraits<KernelVariant::ActFwd_BRow, A>
    : Traits<RowMajor, RowMajor, bf16, ActForwardEpilogue<typename ActFunctor<A>::type>, FixedTmaMainloopOf<false>> {};
template <Act A> struct VariantTraits<KernelVariant::ActFwd_BCol, A>
    : Traits<RowMajor, ColMajor, bf16, ActForwardEpilogue<typename ActFunctor<A>::type>, FixedTmaMainloopOf<false>> {};
template <Act A> struct VariantTraits<KernelVariant::ActBwd_BRow, A>
    : Traits<RowMajor, RowMajor, ActBwdOut<A>, ActBackwardEpilogue<typename ActFunctor<A>::type>, FixedTmaMainloopOf<false>> {};
template <Act A> struct VariantTraits<KernelVariant::ActBwd_BCol, A>
    : Traits<RowMajor, ColMajor, ActBwdOut<A>, ActBackwardEpilogue<typename ActFunctor<A>::type>, FixedTmaMainloopOf<false>> {};

}  // namespace cute_moe::detail

// The fused activation kernel variants of kernel_table.h (GluFwd_*, GluBwd_*): their
// epilogue trees and operand traits, one kernel per activation (GluFwdGather_*:
// gather_variants.cuh). Only the GLU translation
// units include this, so changes here do not recompile the plain GEMMs.
#pragma once

#include "kernel_instance.cuh"
#include "glu_epilogue.cuh"

namespace cute_moe::detail {

template <Act A> struct ActFunctor;
template <> struct ActFunctor<Act::SwigluOai> { using type = SwigluOai; };
template <> struct ActFunctor<Act::Swiglu> { using type = Swiglu; };
template <> struct ActFunctor<Act::Geglu> { using type = Geglu; };
template <> struct ActFunctor<Act::Srelu> { using type = SquaredRelu; };
template <> struct ActFunctor<Act::Identity> { using type = Identity; };

// D = pre = scale[group] * acc + bias[group]; aux = h = act(pre)
template <class Activation>
struct GluForwardEpilogue {
  using ElementC = void;
  template <class TileShape, class ElementD>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<Sm90GluForwardAux<Activation>, ScaledBiasTree<TileShape, float>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {scaled_bias_arguments<decltype(Args{}.op_0)>(g), {g.aux, g.ldaux, ctx.glu}};
  }
};

// C = pre (gated: packed (gate, linear) words); D = dpre = act'(pre) * row_scale * scale
// * acc, packed like pre; aux = row_scale * act(pre); row-scale-gradient partials
template <class Activation>
struct GluBackwardEpilogue {
  using ElementC = std::conditional_t<Activation::kGated, uint32_t, cutlass::bfloat16_t>;
  template <class TileShape, class ElementD>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<Sm90GluBackward<Activation>, cutlass::epilogue::fusion::Sm90AccFetch,
                                                  cutlass::epilogue::fusion::Sm90SrcFetch<ElementC>,
                                                  RowScaleCol<TileShape>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {{},
            {},
            {reinterpret_cast<const float* const*>(g.row_scale), 1.0f, {}},
            {g.aux, g.ldaux, ctx.glu, g.group_scale, g.row_partial, g.row_partial_stride}};
  }
};

template <Act A>
using GluBwdOut = std::conditional_t<ActFunctor<A>::type::kGated, uint32_t, bf16>;  // dpre's D element

template <Act A> struct VariantTraits<KernelVariant::GluFwd_BRow, A>
    : Traits<RowMajor, RowMajor, bf16, GluForwardEpilogue<typename ActFunctor<A>::type>> {};
template <Act A> struct VariantTraits<KernelVariant::GluFwd_BCol, A>
    : Traits<RowMajor, ColMajor, bf16, GluForwardEpilogue<typename ActFunctor<A>::type>> {};
template <Act A> struct VariantTraits<KernelVariant::GluBwd_BRow, A>
    : Traits<RowMajor, RowMajor, GluBwdOut<A>, GluBackwardEpilogue<typename ActFunctor<A>::type>> {};
template <Act A> struct VariantTraits<KernelVariant::GluBwd_BCol, A>
    : Traits<RowMajor, ColMajor, GluBwdOut<A>, GluBackwardEpilogue<typename ActFunctor<A>::type>> {};

}  // namespace cute_moe::detail

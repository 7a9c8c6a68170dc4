// The fused gated-activation kernel variants of kernel_table.h (GluFwd_*, GluBwd_*): their
// epilogue trees and operand traits. Only the GLU translation units include this, so
// changes here do not recompile the plain GEMMs.
#pragma once

#include "kernel_instance.cuh"
#include "glu_epilogue.cuh"

namespace cute_moe::detail {

// D = pre = acc + bias[group]; aux = h = act(pre)
struct GluForwardEpilogue {
  using ElementC = void;
  template <class TileShape, class ElementD>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<Sm90GluForwardAux<SwigluOai>, BiasTree<TileShape, float>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {{{}, {reinterpret_cast<const cutlass::bfloat16_t* const*>(g.bias), cutlass::bfloat16_t(0), {}}, {}},
            {g.aux, g.ldaux, ctx.glu}};
  }
};

// C = pre as packed (gate, linear) words; D = dpre = dact(acc, pre) packed the same way;
// aux = h = act(pre)
struct GluBackwardEpilogue {
  using ElementC = uint32_t;
  template <class TileShape, class ElementD>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<Sm90GluBackward<SwigluOai>, cutlass::epilogue::fusion::Sm90AccFetch,
                                                  cutlass::epilogue::fusion::Sm90SrcFetch<uint32_t>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {{}, {}, {g.aux, g.ldaux, ctx.glu}};
  }
};

template <> struct VariantTraits<KernelVariant::GluFwd_BRow> : Traits<RowMajor, RowMajor, bf16, GluForwardEpilogue> {};
template <> struct VariantTraits<KernelVariant::GluFwd_BCol> : Traits<RowMajor, ColMajor, bf16, GluForwardEpilogue> {};
// (the backward's D is dpre as 32-bit (dgate, dlinear) words)
template <> struct VariantTraits<KernelVariant::GluBwd_BRow> : Traits<RowMajor, RowMajor, uint32_t, GluBackwardEpilogue> {};
template <> struct VariantTraits<KernelVariant::GluBwd_BCol> : Traits<RowMajor, ColMajor, uint32_t, GluBackwardEpilogue> {};

}  // namespace cute_moe::detail

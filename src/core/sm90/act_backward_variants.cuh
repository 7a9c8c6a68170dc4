// The fused down-projection input-gradient kernel variants (ActBwd_*): their epilogue
// tree and operand traits, one kernel per activation. Only their translation units (and
// the FP8 family's) include this, so changes here do not recompile the plain GEMMs or the
// fused forward.
#pragma once

#include "act_backward_epilogue.cuh"
#include "act_functors.h"  // generated: ActFunctor<Act> -> functor of activations.h
#include "kernel_instance.cuh"
#include "epilogue_warpgroup_kernel.cuh"

namespace cute_moe::detail {

// C = pre (gated: packed (gate, linear) words); D = dpre = act'(pre) * row_scale * scale
// * acc, packed like pre (kHalvesOut: D = dgate, the dlinear half a second TMA-stored
// output); aux = row_scale * act(pre), TMA-stored; row-scale-gradient partials; dpre's
// column-sum partials (the up projection's bias gradient) where asked
template <class Activation, bool kHalvesOut = false>
struct ActBackwardEpilogue {
  using ElementC = std::conditional_t<Activation::kGated, uint32_t, cutlass::bfloat16_t>;
  // CUTLASS takes 4 C stages (16 KB each at 128x32 words); p * h's (and dlinear's) smem
  // buffers (16 KB each) come out of those rather than out of the mainloop's stages (at
  // 128x192: 4 and 3 stages, as with CUTLASS's 4 C stages and no buffers of ours).
  static constexpr int kStagesC = 3;
  // The 128x192 cooperative row of a gated activation runs the kernel with the epilogue in
  // warps of its own (epilogue_warpgroup_kernel.cuh: 1.11-1.12x at GPT-OSS-20B on an H200,
  // the same bits) on the pingpong twin's collectives.
  template <class Kernel, class TileShape, Schedule S, class PingpongTypes>
  using KernelWrap = typename EpilogueWarpgroupOf<
      S == Schedule::Cooperative && Activation::kGated && decltype(cute::size<0>(TileShape{}))::value == 128 &&
          decltype(cute::size<1>(TileShape{}))::value == 192,
      Kernel, PingpongTypes, Activation, kHalvesOut>::type;
  template <class TileShape, class ElementD, class EpiDesc>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<
      Sm90ActBackward<Activation, kHalvesOut, typename EpiDesc::EpilogueTile, EpiDesc::StagesD>,
      cutlass::epilogue::fusion::Sm90AccFetch, cutlass::epilogue::fusion::Sm90SrcFetch<ElementC>,
      RowScaleCol<TileShape>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {{},
            {},
            {reinterpret_cast<const float* const*>(g.row_scale), 1.0f, {}},
            {ctx.act, g.group_scale, g.row_partial, g.row_partial_stride, ctx.aux, ctx.aux2, ctx.whole.offs,
             ctx.col_partial, ctx.col_partial_ld}};
  }
};

template <Act A>
using ActBwdOut = std::conditional_t<ActFunctor<A>::type::kGated, uint32_t, bf16>;  // dpre's D element

template <Act A> struct VariantTraits<KernelVariant::ActBwd_BRow, A>
    : Traits<RowMajor, RowMajor, ActBwdOut<A>, ActBackwardEpilogue<typename ActFunctor<A>::type>, FixedTmaMainloopOf<false>> {};
template <Act A> struct VariantTraits<KernelVariant::ActBwd_BCol, A>
    : Traits<RowMajor, ColMajor, ActBwdOut<A>, ActBackwardEpilogue<typename ActFunctor<A>::type>, FixedTmaMainloopOf<false>> {};
template <Act A> struct VariantTraits<KernelVariant::ActBwdHalves_BRow, A>
    : Traits<RowMajor, RowMajor, bf16, ActBackwardEpilogue<typename ActFunctor<A>::type, true>, FixedTmaMainloopOf<false>> {};

}  // namespace cute_moe::detail

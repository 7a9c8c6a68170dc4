// The plain ragged-M variants (RaggedM_*: the forward GEMMs and the input gradients): their
// epilogue and operand traits. Only their translation units include this.
#pragma once

#include "kernel_instance.cuh"
#include "fixed_tma_store.cuh"

namespace cute_moe::detail {

// Ragged M: D = row_scale[row] * (scale[group] * acc + bias[group]), written by the tree
// through a fixed descriptor (Sm90StoreD; kWritesD: the collective has no D).
struct RaggedMEpilogue {
  using ElementC = void;
  static constexpr bool kWritesD = true;
  template <class TileShape, class ElementD, class EpiDesc>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<
      Sm90StoreD<ElementD, typename EpiDesc::EpilogueTile, EpiDesc::StagesD>,
      cutlass::epilogue::fusion::Sm90EVT<
          cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float,
                                                 cutlass::FloatRoundStyle::round_to_nearest>,
          RowScaleCol<TileShape>, ScaledBiasTree<TileShape, float>>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {{{reinterpret_cast<const float* const*>(g.row_scale), 1.0f, {}},
             scaled_bias_arguments<decltype(Args{}.op_0.op_1)>(g), {}},
            {ctx.d, ctx.whole.offs, ctx.d_smem_offset}};
  }
};

// A = x (m, k) k-contiguous; B = W_e (k, n) n-contiguous (BRow) or k-contiguous (BCol)
template <> struct VariantTraits<KernelVariant::RaggedM_BRow, Act::Unfused> : Traits<RowMajor, RowMajor, bf16, RaggedMEpilogue, FixedTmaMainloopOf<false>> {};
template <> struct VariantTraits<KernelVariant::RaggedM_BCol, Act::Unfused> : Traits<RowMajor, ColMajor, bf16, RaggedMEpilogue, FixedTmaMainloopOf<false>> {};

}  // namespace cute_moe::detail

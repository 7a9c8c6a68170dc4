// The ragged-K variants (RaggedK_*: the weight gradients): their epilogue and operand traits.
// Only their translation units include this.
#pragma once

#include "dynamic_group_scheduler.cuh"
#include "fixed_tma_store.cuh"
#include "kernel_instance.cuh"

namespace cute_moe::detail {

// Ragged K: D = acc (the weight gradient; scale and bias arrays are null), written by the
// tree through one descriptor over the (groups, k, n) output (Sm90StoreD, kBatched;
// kWritesD: the collective has no D, so no per-group D descriptor rewrites).
struct RaggedKEpilogue {
  using ElementC = void;
  static constexpr bool kWritesD = true;
  template <class TileShape, class ElementD, class EpiDesc>
  using Tree = cutlass::epilogue::fusion::Sm90EVT<
      Sm90StoreD<ElementD, typename EpiDesc::EpilogueTile, EpiDesc::StagesD, OutputRows::kBatched>,
      ScaledBiasTree<TileShape, float>>;
  template <class Args>
  static Args arguments(const GroupArrays& g, const LaunchContext& ctx) {
    return {scaled_bias_arguments<decltype(Args{}.op_0)>(g), {ctx.d, nullptr}};
  }
};

// A = x_e^T (k, rows) k-contiguous; B = dy_e (rows, n) n-contiguous. Tiles from the dynamic
// scheduler: every expert has the same output tiles but its own reduction length.
template <> struct VariantTraits<KernelVariant::RaggedK_OutBF16, Act::Unfused> : Traits<ColMajor, RowMajor, bf16, RaggedKEpilogue, FixedTmaMainloopOf<true>, true> {};
template <> struct VariantTraits<KernelVariant::RaggedK_OutF32, Act::Unfused> : Traits<ColMajor, RowMajor, float, RaggedKEpilogue, FixedTmaMainloopOf<true>, true> {};

}  // namespace cute_moe::detail

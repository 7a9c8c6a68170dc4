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
    return {scaled_bias_arguments<decltype(Args{}.op_0)>(g), {ctx.d, nullptr, ctx.d_smem_offset}};
  }
};

// Ragged K's mainloop: the whole-tensor loads of fixed_tma_mainloop.cuh, and the tiles of an
// empty group. Those run with no k-blocks (the group's reduction has no rows): CUTLASS's
// consumer then issues no MMA and leaves the accumulators unset, so they are cleared here
// and the epilogue stores the group's zero gradient. Empty groups come last in the walking
// order (ragged_k_order.h). This way the GEMM writes every gradient and the setup kernel
// is one block (it had a grid for the zero fill).
template <class Built>
struct RaggedKMainloop : FixedTmaMainloop<Built, true> {
  using Fixed = FixedTmaMainloop<Built, true>;
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(typename Fixed::MainloopPipeline pipeline, typename Fixed::PipelineState read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx, typename Fixed::TensorStorage& storage,
                          typename Fixed::Params const& params) {
    if (k_tile_count <= 0) {
      cute::clear(accum);
      return;
    }
    Fixed::mma(pipeline, read, accum, k_tile_count, thread_idx, storage, params);
  }
};
struct RaggedKMainloopOf : FixedTmaMainloopOf<true> {
  template <class Built>
  using type = RaggedKMainloop<Built>;
};

// A = x_e^T (k, rows) k-contiguous; B = dy_e (rows, n) n-contiguous. Tiles from the dynamic
// scheduler: every expert has the same output tiles but its own reduction length.
template <> struct VariantTraits<KernelVariant::RaggedK_OutBF16, Act::Unfused> : Traits<ColMajor, RowMajor, bf16, RaggedKEpilogue, RaggedKMainloopOf, true> {};
template <> struct VariantTraits<KernelVariant::RaggedK_OutF32, Act::Unfused> : Traits<ColMajor, RowMajor, float, RaggedKEpilogue, RaggedKMainloopOf, true> {};

}  // namespace cute_moe::detail

// The FP8 ragged-M variant (Fp8RaggedM): e4m3 x e4m3 with fp32 block scales (docs/fp8.md),
// the plain ragged-M epilogue (bias, group and row scales, bf16 out). Only its translation
// units include this.
//
// Mainloop: CUTLASS's ptr-array blockwise-scaled collective (per-group TMA descriptors,
// rewritten when the group changes; the scales loaded by a second producer warp with
// cp.async, one element per thread, predicated by the group's extents; the partial sums of
// every 128-long k-block promoted into the fp32 accumulator times scale_a[row] *
// scale_b[n-block]). It reads each group's scales as compact column-major blocks; here its
// scale tensors take the caller's strides instead (BlockScaleStrides), so the quantizers'
// row-major outputs, and their transposed views, are read in place.
#pragma once

#include <cutlass/detail/blockwise_scale_layout.hpp>

#include "kernel_instance.cuh"
#include "fixed_tma_store.cuh"
#include "ragged_m_variants.cuh"  // RaggedMEpilogue

namespace cute_moe::detail {

template <class Base>
struct StridedScalesMainloop : Base {
  using typename Base::TileShape;
  static constexpr int kGranularityM = Base::ScaleGranularityM;
  static constexpr int kGranularityN = Base::ScaleGranularityN;
  static constexpr int kGranularityK = Base::ScaleGranularityK;

  struct Arguments : Base::Arguments {
    BlockScaleStrides strides;
  };
  struct Params : Base::Params {
    BlockScaleStrides strides;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args, void* workspace) {
    return {Base::to_underlying_arguments(shapes, args, workspace), args.strides};
  }

  // ((G, blocks along mn), (128, blocks along k), 1): the collective's shape of a scale
  // tensor (G = its granularity along mn), with strides (mn_stride, k_stride) per block.
  template <int G>
  CUTLASS_DEVICE static auto scale_layout(int32_t mn, int32_t k, int64_t mn_stride, int64_t k_stride) {
    using namespace cute;
    return make_layout(make_shape(make_shape(Int<G>{}, (mn + G - 1) / G),
                                  make_shape(Int<kGranularityK>{}, (k + kGranularityK - 1) / kGranularityK), 1),
                       make_stride(make_stride(_0{}, mn_stride), make_stride(_0{}, k_stride), _0{}));
  }

  // The collective's A and B tensors, and the group's scale tensors with the caller's
  // strides (the kernel calls it with the shapes alone; tensors_perform_update then with
  // the group's scale pointers before the group's first load).
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& shape, Params const& params,
                                typename Base::ElementBlockScale const* sfa = nullptr,
                                typename Base::ElementBlockScale const* sfb = nullptr) const {
    using namespace cute;
    auto base = Base::load_init(shape, params, sfa, sfb);
    auto [M, N, K, L] = shape;
    const BlockScaleStrides& s = params.strides;
    Tensor mSFA = make_tensor(make_gmem_ptr(sfa), scale_layout<kGranularityM>(M, K, s.a_mn, s.a_k));
    Tensor mSFB = make_tensor(make_gmem_ptr(sfb), scale_layout<kGranularityN>(N, K, s.b_mn, s.b_k));
    return make_tuple(get<0>(base), get<1>(base), mSFA, mSFB);
  }

  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const&, Params const& params,
                                                     ProblemShape_MNKL shape, int32_t group) {
    return load_init(shape, params, params.ptr_SFA[group], params.ptr_SFB[group]);
  }
};

// A by 1 x 128 blocks (one scale per row and k-block), B by 128 x 128.
struct Fp8BlockScaledMainloopOf {
  using ElementAB = cutlass::float_e4m3_t;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128>;
  template <class Built>
  using type = StridedScalesMainloop<Built>;
  template <class Args>
  static void set_arguments(Args& args, const GroupArrays& g, const LaunchContext& ctx) {
    args.ptr_SFA = g.a_scales;
    args.ptr_SFB = g.b_scales;
    args.strides = ctx.scales;
  }
};

// A = x (m, k) k-contiguous; B = W_e (k, n) k-contiguous
template <> struct VariantTraits<KernelVariant::Fp8RaggedM, Act::Unfused>
    : Traits<RowMajor, ColMajor, bf16, RaggedMEpilogue, Fp8BlockScaledMainloopOf> {};

}  // namespace cute_moe::detail

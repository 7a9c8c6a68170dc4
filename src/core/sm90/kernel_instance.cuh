// One grouped-GEMM kernel of the dispatch table, assembled from CUTLASS 3.x SM90 pieces.
//
// Included, through the header of a variant family, only by the generated one-row
// translation units (build/generated/kernels/*.cu, codegen/generate.py), so each
// instantiation compiles on its own and in parallel. Each family's traits and epilogue live
// in its own header (ragged_m_variants.cuh, ragged_k_variants.cuh, act_forward_variants.cuh,
// act_backward_variants.cuh, gather_variants.cuh), so a change to one recompiles only that
// family's kernels.
//
// Kernel: CUTLASS's ptr-array ("grouped") GEMM, warp-specialized and persistent.
//   warpgroup 0      producer: TMA loads of A/B tiles into a multi-stage smem pipeline
//                    (one warp). Ragged M: two fixed descriptors over the whole operands
//                    (fixed_tma_mainloop.cuh); ragged K: CUTLASS's per-group descriptors,
//                    rewritten when the group changes; gathered variants: A rows by
//                    cp.async in a second warp (gather_mainloop.cuh)
//   warpgroups 1..2  consumers: WGMMA on the smem tiles, then the epilogue
//                    (Cooperative: both work on one tile; Pingpong: alternate tiles)
//   scheduler        PersistentTileSchedulerSm90Group: walks the groups' tiles reading
//                    the per-group (M, N, K) from device memory, so the host never needs
//                    the routing. Groups with M == 0 contribute no tile. Variants with
//                    kDynamicSchedule take their tiles from an atomic counter instead
//                    (dynamic_group_scheduler.cuh; LaunchContext::dynamic_schedule).
// Epilogue (EVT), per variant (VariantTraits below): D = acc + bias[group] (a row broadcast
//   through an array of per-group pointers; a null array means no bias), or the fused
//   gated-activation forward / backward of act_forward_epilogue.cuh /
//   act_backward_epilogue.cuh. Outputs are rounded once.
//   D is written by the tree through one descriptor over the whole output
//   (fixed_tma_store.cuh; the collective's D is void: no per-group D descriptor rewrites),
//   except in the fused backward, whose dpre shares the collective's C buffers.
#pragma once

#include <cstddef>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "epilogue_nodes.cuh"
#include "fixed_tma_mainloop.cuh"
#include "gemm_launch.h"
#include "kernel_registry.h"

namespace cute_moe::detail {

// The problem shape that selects the dynamic tile scheduler; defined, with the scheduler,
// in dynamic_group_scheduler.cuh, which only the variant families that use it include (so
// a change to it recompiles only their kernels).
template <class UnderlyingProblemShape>
struct DynamicGroupProblemShape;

// --- Epilogues: what is computed after the mainloop, as an EVT tree plus its arguments.
// Tree<TileShape, ElementD, EpiDesc>: EpiDesc is CUTLASS's EpilogueDescriptor of the
// kernel (its epilogue subtile and store stages, for nodes with smem stores of their own).
template <class TileShape>
using BiasRow = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, cutlass::bfloat16_t*, float,
                                                            cute::Stride<cute::_0, cute::_1, cute::_0>>;
// scale[group] * acc + bias[group] (a row broadcast through an array of per-group
// pointers; a null array means no bias, a null scale 1)
template <class TileShape, class ElementOut>
using ScaledBiasTree = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementOut, float,
                                           cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90AccFetch, Sm90GroupScalar, BiasRow<TileShape>>;
template <class Args>
Args scaled_bias_arguments(const GroupArrays& g) {
  return {{}, {g.group_scale}, {reinterpret_cast<const cutlass::bfloat16_t* const*>(g.bias), cutlass::bfloat16_t(0), {}},
          {}};
}
// The row scale (router probability) of each output row, per group a pointer to its first
// row's; unaligned (groups start anywhere), so loaded element by element; null: 1.
template <class TileShape>
using RowScaleCol = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float*, float,
                                                                cute::Stride<cute::_1, cute::_0, cute::_0>, 1>;

// An epilogue's count of source (C) smem stages: its kStagesC where it sets one (to make
// room for smem outputs of its own, fixed_tma_store.cuh), else 0: CUTLASS's choice.
template <class Epilogue, class = void>
constexpr int stages_c_v = 0;
template <class Epilogue>
constexpr int stages_c_v<Epilogue, std::void_t<decltype(Epilogue::kStagesC)>> = Epilogue::kStagesC;
// Its count of D store stages (kStagesD; 0: CUTLASS's choice) and whether each subtile's TMA
// store is issued after the next subtile's math (kDelayTmaStore, CUTLASS's DelayTmaStore).
template <class Epilogue, class = void>
constexpr int stages_d_v = 0;
template <class Epilogue>
constexpr int stages_d_v<Epilogue, std::void_t<decltype(Epilogue::kStagesD)>> = Epilogue::kStagesD;
template <class Epilogue, class = void>
constexpr bool delay_tma_store_v = false;
template <class Epilogue>
constexpr bool delay_tma_store_v<Epilogue, std::void_t<decltype(Epilogue::kDelayTmaStore)>> = Epilogue::kDelayTmaStore;
// Its epilogue subtile (EpilogueTile, an (M, N) shape; else CUTLASS's choice).
template <class Epilogue, class = void>
struct epilogue_tile {
  using type = cutlass::epilogue::collective::EpilogueTileAuto;
};
template <class Epilogue>
struct epilogue_tile<Epilogue, std::void_t<typename Epilogue::EpilogueTile>> {
  using type = typename Epilogue::EpilogueTile;
};
// Whether an epilogue's tree writes D itself (kWritesD): then the collective's D is void.
template <class Epilogue, class = void>
constexpr bool writes_d_v = false;
template <class Epilogue>
constexpr bool writes_d_v<Epilogue, std::void_t<decltype(Epilogue::kWritesD)>> = Epilogue::kWritesD;
// CUTLASS's epilogue policy with the epilogue's own stage counts and store delay.
template <class Policy, class Epilogue>
struct EpiloguePolicyOf {
  using type = Policy;
};
template <int C, int D, int F, bool R, bool Delay, int W, class Epilogue>
struct EpiloguePolicyOf<cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<C, D, F, R, Delay, W>, Epilogue> {
  static constexpr int kC = stages_c_v<Epilogue> == 0 ? C : stages_c_v<Epilogue>;
  static constexpr int kD = stages_d_v<Epilogue> == 0 ? D : stages_d_v<Epilogue>;
  static_assert(kC > kD || !R, "reusing C's buffers for D needs more C stages than D's");
  using type = cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<kC, kD, F, R, Delay || delay_tma_store_v<Epilogue>, W>;
};
// CUTLASS's epilogue descriptor as the trees see it: the epilogue's D stages where it sets them
// (a node with smem stores of its own sizes its buffers by the collective's store stages).
template <class Desc, class Epilogue>
struct EpilogueDescOf : Desc {
  static constexpr int StagesD = stages_d_v<Epilogue> == 0 ? Desc::StagesD : stages_d_v<Epilogue>;
};

// The kernel a variant's epilogue asks for in place of CUTLASS's (KernelWrap), else CUTLASS's.
// Kernel: CUTLASS's kernel of the row (cooperative for the StoreWarp schedule);
// PingpongTypes: the GroupedGemmTypes of the same row on the pingpong schedule.
template <class Epilogue, class Kernel, class TileShape, Schedule S, class PingpongTypes, class = void>
struct kernel_of {
  static_assert(S != Schedule::StoreWarp, "a StoreWarp tile needs a variant whose epilogue has the store-warp kernel "
                                          "(KernelWrap; codegen/kernel_space.py, SCHEDULES)");
  using type = Kernel;
};
template <class Epilogue, class Kernel, class TileShape, Schedule S, class PingpongTypes>
struct kernel_of<Epilogue, Kernel, TileShape, S, PingpongTypes,
                 std::void_t<typename Epilogue::template KernelWrap<Kernel, TileShape, S, PingpongTypes>>> {
  using type = typename Epilogue::template KernelWrap<Kernel, TileShape, S, PingpongTypes>;
};

// --- Mainloops: the collective CUTLASS's builder makes, unless a variant wraps it (the
// gathered A load of gather_mainloop.cuh), and the wrap's own arguments.
struct BuiltMainloop {
  template <class Built>
  using type = Built;
  template <class Args>
  static void set_arguments(Args&, const GroupArrays&, const LaunchContext&) {}
};
// A and B each one whole tensor: fixed descriptors, no per-group rewrites (kPairedB: B's
// (gate, linear) pairs loaded as adjacent rows from either layout).
template <bool kRaggedK, bool kPairedB = false>
struct FixedTmaMainloopOf {
  template <class Built>
  using type = FixedTmaMainloop<Built, kRaggedK, kPairedB>;
  template <class Args>
  static void set_arguments(Args& args, const GroupArrays&, const LaunchContext& ctx) {
    args.whole = ctx.whole;
  }
};

// The operand element type, the collective builder's layout arguments and the kernel
// schedule a mainloop policy implies: bf16 operands, unless the policy names a ScaleConfig
// (CUTLASS's blockwise scale layouts): then FP8 operands whose partial sums are promoted
// with their block scales once per k-block (fp8_variants.cuh).
template <class Mainloop, class = void>
struct OperandsOf {
  using ElementAB = cutlass::bfloat16_t;
  template <class Layout>
  using LayoutTagA = Layout*;
  template <class Layout>
  using LayoutTagB = Layout*;
  template <bool kCooperative>
  using Schedule = std::conditional_t<kCooperative, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>;
};
template <class Mainloop>
struct OperandsOf<Mainloop, std::void_t<typename Mainloop::ScaleConfig>> {
  using ElementAB = typename Mainloop::ElementAB;
  using ScaleConfig = typename Mainloop::ScaleConfig;
  template <class Layout>
  using LayoutTagA = cute::tuple<Layout*, decltype(ScaleConfig::deduce_layoutSFA())*>;
  template <class Layout>
  using LayoutTagB = cute::tuple<Layout*, decltype(ScaleConfig::deduce_layoutSFB())*>;
  template <bool kCooperative>
  using Schedule =
      std::conditional_t<kCooperative, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise>;
};

// --- Variants: operand layouts, output type, epilogue, mainloop and tile scheduler of
// each variant (kDynamicSchedule: dynamic_group_scheduler.cuh, else CUTLASS's static one).
template <class LayoutA_, class LayoutB_, class ElementD_, class Epilogue_, class Mainloop_ = BuiltMainloop,
          bool kDynamicSchedule_ = false>
struct Traits {
  using LayoutA = LayoutA_;
  using LayoutB = LayoutB_;
  using ElementD = ElementD_;
  using Epilogue = Epilogue_;
  using Mainloop = Mainloop_;
  static constexpr bool kDynamicSchedule = kDynamicSchedule_;
};
using RowMajor = cutlass::layout::RowMajor;
using ColMajor = cutlass::layout::ColumnMajor;
using bf16 = cutlass::bfloat16_t;

// Specialised per variant family in the family's header (codegen/kernel_space.py, HEADERS),
// which only that family's translation units include.
template <KernelVariant V, Act A>
struct VariantTraits;

template <KernelVariant V, int TM, int TN, int TK, int CM, int CN, Schedule S, Act A>
struct GroupedGemmTypes {
  using Traits = VariantTraits<V, A>;
  using Operands = OperandsOf<typename Traits::Mainloop>;
  using ElementAB = typename Operands::ElementAB;
  using ElementD = typename Traits::ElementD;
  using ElementC = typename Traits::Epilogue::ElementC;
  using ElementAccumulator = float;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  static constexpr int kAlignC = std::is_void_v<ElementC> ? kAlignD : 16 / int(sizeof(std::conditional_t<std::is_void_v<ElementC>, char, ElementC>));

  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Int<TK>>;
  using ClusterShape = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;
  static constexpr bool kCooperative = S != Schedule::Pingpong;  // the store warp's collectives are cooperative
  using MainloopSchedule = typename Operands::template Schedule<kCooperative>;
  using EpilogueSchedule = std::conditional_t<kCooperative, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
                                              cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
  using ProblemShape = std::conditional_t<Traits::kDynamicSchedule, DynamicGroupProblemShape<cute::Shape<int, int, int>>,
                                          cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>>;
  using EpiDesc = EpilogueDescOf<cutlass::epilogue::collective::detail::EpilogueDescriptor<
      TileShape, typename epilogue_tile<typename Traits::Epilogue>::type, ElementC, ElementD, EpilogueSchedule>,
      typename Traits::Epilogue>;
  using EpilogueTree = typename Traits::Epilogue::template Tree<TileShape, ElementD, EpiDesc>;
  // CUTLASS's builder, with the variant's stage counts and store delay where it sets them
  using EpiPolicy = typename EpiloguePolicyOf<typename EpiDesc::DispatchPolicy, typename Traits::Epilogue>::type;
  static constexpr bool kTreeWritesD = writes_d_v<typename Traits::Epilogue>;
  using CollectiveElementD = std::conditional_t<kTreeWritesD, void, ElementD>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::detail::Sm90TmaBuilderImpl<
      TileShape, typename EpiDesc::EpilogueTile, ElementAccumulator, float, ElementC, LayoutD*, kAlignC,
      CollectiveElementD, LayoutD*, kAlignD, EpilogueTree, EpiPolicy>::CollectiveOp;

  using BuiltCollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB,
      typename Operands::template LayoutTagA<typename Traits::LayoutA>, kAlignAB, ElementAB,
      typename Operands::template LayoutTagB<typename Traits::LayoutB>, kAlignAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using CollectiveMainloop = typename Traits::Mainloop::template type<BuiltCollectiveMainloop>;

  using CutlassKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Kernel = typename kernel_of<typename Traits::Epilogue, CutlassKernel, TileShape, S,
                                    GroupedGemmTypes<V, TM, TN, TK, CM, CN, Schedule::Pingpong, A>>::type;
  // Where the collective epilogue's D buffer lies in the kernel's shared memory (its
  // SharedStorage starts the dynamic shared memory): a tree that writes D itself stages its
  // subtiles there (Sm90StoreD, fixed_tma_store.cuh), since a void D leaves that buffer unused.
  using KernelTensorStorage = typename Kernel::SharedStorage::TensorStorage;
  static constexpr size_t kCollectiveDOffset =
      offsetof(typename Kernel::SharedStorage, tensors) + offsetof(KernelTensorStorage, epilogue) +
      offsetof(typename CollectiveEpilogue::TensorStorage, collective);
  static_assert(!kTreeWritesD ||
                    sizeof(typename CollectiveEpilogue::TensorStorage::CollectiveStorage) >=
                        size_t(cute::size(typename EpiDesc::EpilogueTile{})) * EpiDesc::StagesD * sizeof(ElementD),
                "the collective's D buffer holds the tree's D subtiles");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
  // group_setup.cu writes one int64 leading dimension per group; a packed CUTLASS stride
  // of a 2-D operand holds exactly that one dynamic value (the others are static 0/1).
  static_assert(sizeof(StrideA) == sizeof(int64_t) && sizeof(StrideB) == sizeof(int64_t) &&
                    sizeof(StrideC) == sizeof(int64_t) && sizeof(StrideD) == sizeof(int64_t),
                "expected packed strides with a single int64 leading dimension");
  static_assert(sizeof(typename ProblemShape::UnderlyingProblemShape) == 3 * sizeof(int32_t),
                "expected (M, N, K) int32 problem shapes");

  static typename Gemm::Arguments arguments(const GroupArrays& g, const LaunchContext& ctx) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = ctx.device;
    hw.sm_count = ctx.sm_count;
    using ElementCPtr = std::conditional_t<std::is_void_v<ElementC>, const void**, const ElementC**>;
    typename Kernel::MainloopArguments mainloop{};
    mainloop.ptr_A = reinterpret_cast<const ElementAB**>(g.a);
    mainloop.dA = reinterpret_cast<StrideA*>(g.lda);
    mainloop.ptr_B = reinterpret_cast<const ElementAB**>(g.b);
    mainloop.dB = reinterpret_cast<StrideB*>(g.ldb);
    Traits::Mainloop::set_arguments(mainloop, g, ctx);
    ProblemShape shapes;  // no host copy of the shapes: the scheduler reads them on the device
    shapes.num_groups = g.num_groups;
    shapes.problem_shapes = reinterpret_cast<typename ProblemShape::UnderlyingProblemShape*>(g.problem_shapes);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        shapes,
        mainloop,
        {{}, reinterpret_cast<ElementCPtr>(g.c), reinterpret_cast<StrideC*>(g.ldc),
         kTreeWritesD ? nullptr : reinterpret_cast<CollectiveElementD**>(g.d),
         kTreeWritesD ? nullptr : reinterpret_cast<StrideD*>(g.ldd)},
        hw};
    using Raster = typename Kernel::TileScheduler::RasterOrderOptions;
    args.scheduler.raster_order = ctx.raster_along_n ? Raster::AlongN : Raster::AlongM;
    args.scheduler.max_swizzle_size = ctx.swizzle;
    if constexpr (Traits::kDynamicSchedule) {
      args.scheduler.dynamic = ctx.dynamic_schedule;
      args.scheduler.lookahead = ctx.schedule_lookahead;
    }
    LaunchContext epilogue_ctx = ctx;
    epilogue_ctx.d_smem_offset = kCollectiveDOffset;
    args.epilogue.thread =
        Traits::Epilogue::template arguments<decltype(args.epilogue.thread)>(g, epilogue_ctx);
    return args;
  }
};

template <Arch AR, KernelVariant V, int TM, int TN, int TK, int CM, int CN, Schedule S, Act A>
size_t KernelInstance<AR, V, TM, TN, TK, CM, CN, S, A>::workspace_size(int32_t num_groups, int sm_count) {
  static_assert(AR == Arch::Sm90, "sm90/kernel_instance.cuh builds SM90 kernels only");
  using Types = GroupedGemmTypes<V, TM, TN, TK, CM, CN, S, A>;
  GroupArrays g;
  g.num_groups = num_groups;
  LaunchContext ctx;
  ctx.sm_count = sm_count;
  return Types::Gemm::get_workspace_size(Types::arguments(g, ctx));
}

template <Arch AR, KernelVariant V, int TM, int TN, int TK, int CM, int CN, Schedule S, Act A>
Result KernelInstance<AR, V, TM, TN, TK, CM, CN, S, A>::launch(const GroupArrays& groups, const LaunchContext& ctx) {
  using Types = GroupedGemmTypes<V, TM, TN, TK, CM, CN, S, A>;
  using Kernel = typename Types::Kernel;
  auto args = Types::arguments(groups, ctx);
  cutlass::Status st = Types::Gemm::can_implement(args);
  if (st != cutlass::Status::kSuccess) {
    return Result::error(Status::kInternalError,
                         std::string("CUTLASS cannot implement this grouped GEMM: ") + cutlassGetStatusString(st));
  }
  size_t need = Types::Gemm::get_workspace_size(args);
  if (need > ctx.workspace_bytes) {
    return Result::error(Status::kInternalError, "CUTLASS workspace too small: need " + std::to_string(need) +
                                                     " bytes, have " + std::to_string(ctx.workspace_bytes));
  }
  // What CUTLASS's adapter does in initialize() and run(), launched by gemm_launch.h, which
  // sets the kernel's shared memory limit once per device instead of on every call.
  st = Kernel::initialize_workspace(args, ctx.workspace, ctx.stream);
  if (st != cutlass::Status::kSuccess) {
    cudaError_t err = cudaGetLastError();
    return Result::error(Status::kCudaError, std::string("grouped GEMM workspace initialization failed: ") +
                                                 cutlassGetStatusString(st) + " (" + cudaGetErrorString(err) + ")");
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, ctx.workspace);
  using ClusterShape = typename Kernel::DispatchPolicy::ClusterShape;
  static PreparedDevices prepared{0};
  GemmLaunch l;
  l.kernel = reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>);
  l.params = &params;
  l.grid = Kernel::get_grid_shape(params);
  l.block = Kernel::get_block_shape();
  l.cluster = dim3(cute::size<0>(ClusterShape{}), cute::size<1>(ClusterShape{}), cute::size<2>(ClusterShape{}));
  l.smem_bytes = Kernel::SharedStorageSize;
  l.device = ctx.device;
  l.stream = ctx.stream;
  return launch_gemm(l, &prepared);
}

}  // namespace cute_moe::detail

// Expands one row of the generated dispatch table into an explicit instantiation (the
// role is the heuristic's, not part of the kernel).
#define CUTE_MOE_INSTANTIATE_KERNEL(arch, variant, tm, tn, tk, cm, cn, schedule, act, role)               \
  template struct cute_moe::detail::KernelInstance<                                                       \
      cute_moe::detail::Arch::arch, cute_moe::detail::KernelVariant::variant, tm, tn, tk, cm, cn,         \
      cute_moe::detail::Schedule::schedule, cute_moe::detail::Act::act>;

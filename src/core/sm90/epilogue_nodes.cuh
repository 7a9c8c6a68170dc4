// Small epilogue visitor nodes (CUTLASS SM90 EVT) shared by the kernel variants.
#pragma once

#include <cutlass/array.h>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

namespace cute_moe::detail {

// The interface members of a node with no workspace and no producer loads.
struct NodeWithoutLoads {
  template <class ProblemShape, class Arguments>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  template <class ProblemShape, class Arguments>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape, class Arguments>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::detail::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }
};

// ... and with no shared memory, its Params its Arguments.
template <class Arguments_>
struct SimpleNode : NodeWithoutLoads {
  struct SharedStorage {};
  using Arguments = Arguments_;
  using Params = Arguments_;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
};

struct GroupScalarArguments {
  const float* scale = nullptr;  // (num_groups,), or null for 1
};

// Broadcasts the tile's group's scalar, scale[group], read once per tile.
struct Sm90GroupScalar : SimpleNode<GroupScalarArguments> {
  Params params;

  CUTLASS_HOST_DEVICE Sm90GroupScalar() {}
  CUTLASS_HOST_DEVICE Sm90GroupScalar(Params const& p, SharedStorage const&) : params(p) {}

  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    float value;
    CUTLASS_DEVICE explicit ConsumerStoreCallbacks(float v) : value(v) {}
    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize> visit(cutlass::Array<ElementAccumulator, FragmentSize> const&,
                                                             int, int, int) {
      cutlass::Array<float, FragmentSize> out;
      out.fill(value);
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    const int l = cute::get<3>(args.tile_coord_mnkl);
    return ConsumerStoreCallbacks(params.scale != nullptr ? params.scale[l] : 1.0f);
  }
};

}  // namespace cute_moe::detail

#include "gemm_launch.h"

#include <string>

#include "device_info.h"  // cuda_error

namespace cute_moe::detail {

namespace {

constexpr int kDefaultSmemLimit = 48 << 10;  // dynamic shared memory allowed without the attribute

Result raise_smem_limit(const GemmLaunch& l) {
  const cudaError_t err = cudaFuncSetAttribute(l.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, l.smem_bytes);
  return err == cudaSuccess ? Result::success() : cuda_error("cudaFuncSetAttribute (dynamic shared memory)", err);
}

cudaError_t launch(const GemmLaunch& l) {
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = l.cluster.x;
  cluster.val.clusterDim.y = l.cluster.y;
  cluster.val.clusterDim.z = l.cluster.z;
  cudaLaunchConfig_t config = {};
  config.gridDim = l.grid;
  config.blockDim = l.block;
  config.dynamicSmemBytes = static_cast<size_t>(l.smem_bytes);
  config.stream = l.stream;
  // a 1x1x1 cluster launches as a plain grid, as CUTLASS's adapter launches it
  const bool clustered = l.cluster.x * l.cluster.y * l.cluster.z > 1;
  config.attrs = clustered ? &cluster : nullptr;
  config.numAttrs = clustered ? 1 : 0;
  void* args[] = {l.params};
  return cudaLaunchKernelExC(&config, l.kernel, args);
}

}  // namespace

Result launch_gemm(const GemmLaunch& l, PreparedDevices* prepared) {
  if (l.cluster.x == 0 || l.cluster.y == 0 || l.cluster.z == 0 || l.grid.x % l.cluster.x != 0 ||
      l.grid.y % l.cluster.y != 0 || l.grid.z % l.cluster.z != 0) {
    return Result::error(Status::kInternalError,
                         "grouped GEMM launch: grid (" + std::to_string(l.grid.x) + ", " + std::to_string(l.grid.y) +
                             ", " + std::to_string(l.grid.z) + ") is not a whole number of clusters (" +
                             std::to_string(l.cluster.x) + ", " + std::to_string(l.cluster.y) + ", " +
                             std::to_string(l.cluster.z) + ")");
  }
  const uint64_t bit = l.device >= 0 && l.device < 64 ? uint64_t(1) << l.device : 0;
  const bool needs_limit = l.smem_bytes > kDefaultSmemLimit;
  const bool known = bit != 0 && (prepared->load(std::memory_order_relaxed) & bit) != 0;
  if (needs_limit && !known) {
    Result r = raise_smem_limit(l);
    if (!r.ok()) return r;
    if (bit != 0) prepared->fetch_or(bit, std::memory_order_relaxed);
  }
  cudaError_t err = launch(l);
  if (err != cudaSuccess && needs_limit && known) {
    // The context lost the attribute (a device reset): raise it again and retry once.
    (void)cudaGetLastError();
    Result r = raise_smem_limit(l);
    if (!r.ok()) return r;
    err = launch(l);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_error("grouped GEMM launch failed", err);
  }
  return Result::success();
}

}  // namespace cute_moe::detail

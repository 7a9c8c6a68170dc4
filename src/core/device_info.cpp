// Device queries, cached per device: cudaDeviceGetAttribute is cheap but not free, and every
// call of the API asks.
#include "device_info.h"

#include <mutex>
#include <string>

namespace cute_moe::detail {

Result cuda_error(const char* what, cudaError_t err) {
  return Result::error(Status::kCudaError, std::string(what) + ": " + cudaGetErrorString(err));
}

Result current_device(DeviceInfo* info) {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static DeviceInfo cached[kMaxDevices];
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_error("cudaGetDevice", err);
  std::lock_guard<std::mutex> lock(mu);
  if (device < kMaxDevices && cached[device].sm_count > 0) {
    *info = cached[device];
    return Result::success();
  }
  DeviceInfo d;
  d.device = device;
  for (auto [attr, out] : {std::pair{cudaDevAttrMultiProcessorCount, &d.sm_count},
                           std::pair{cudaDevAttrComputeCapabilityMajor, &d.cc_major},
                           std::pair{cudaDevAttrComputeCapabilityMinor, &d.cc_minor}}) {
    err = cudaDeviceGetAttribute(out, attr, device);
    if (err != cudaSuccess) return cuda_error("cudaDeviceGetAttribute", err);
  }
  if (device < kMaxDevices) cached[device] = d;
  *info = d;
  return Result::success();
}

}  // namespace cute_moe::detail

// The current CUDA device as the host side needs it (multiprocessors, compute capability),
// queried once per device; CUDA errors as Results; workspace alignment.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "cute_moe/status.h"

namespace cute_moe::detail {

struct DeviceInfo {
  int device = 0;
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
};

// The current device's, cached per device (thread-safe).
Result current_device(DeviceInfo* info);

// Status::kCudaError with "what: <CUDA's message>".
Result cuda_error(const char* what, cudaError_t err);

constexpr size_t align_up(size_t v, size_t alignment) { return (v + alignment - 1) / alignment * alignment; }

}  // namespace cute_moe::detail

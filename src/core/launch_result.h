// The outcome of the last kernel launch as the core API's Result, for the files that
// launch their own kernels (permute, routing, FP8 quantizers).
#pragma once

#include <cuda_runtime_api.h>

#include "device_info.h"  // cuda_error

namespace cute_moe::detail {

// cudaGetLastError(): success, or Status::kCudaError with "what: <CUDA's message>".
inline Result launched(const char* what) {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? Result::success() : cuda_error(what, err);
}

}  // namespace cute_moe::detail

// The launch of one grouped-GEMM kernel of the dispatch table (sm90/kernel_instance.cuh),
// outside the templates so that every kernel shares it.
//
// CUTLASS's device adapter calls cudaFuncSetAttribute on every launch (the dynamic shared
// memory limit in initialize(), the non-portable cluster size in its cluster launcher). In a
// PyTorch process each of those calls costs 1-3 us of host time (the driver looks the
// function up under a lock; docs/perf-notes.md, session 39), as much as the launch itself.
// The shared memory limit is an attribute of the function in the device's context, so it is
// raised once per device and kernel here; clusters of 1-2 CTAs need no non-portable size.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cute_moe/status.h"

namespace cute_moe::detail {

// A kernel whose one parameter is its Params struct (CUTLASS's device_kernel<Kernel>).
struct GemmLaunch {
  const void* kernel = nullptr;  // the __global__ function
  void* params = nullptr;        // its Params, passed by value
  dim3 grid;
  dim3 block;
  dim3 cluster;
  int smem_bytes = 0;  // dynamic shared memory
  int device = 0;      // the current device
  cudaStream_t stream = nullptr;
};

// Per kernel: bit d set once device d's context has its shared memory limit raised.
using PreparedDevices = std::atomic<uint64_t>;

// Raises the kernel's shared memory limit on l.device unless `prepared` says it is done,
// then launches it with its cluster shape on l.stream.
Result launch_gemm(const GemmLaunch& l, PreparedDevices* prepared);

}  // namespace cute_moe::detail

// CUTE_MOE_HOST_DEVICE: for the small math functions the setup kernels run on the device
// and the C++ tests run on the host.
#pragma once

#if defined(__CUDACC__)
#define CUTE_MOE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CUTE_MOE_HOST_DEVICE inline
#endif

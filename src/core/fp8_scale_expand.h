// The FP8 ragged-M kernels read B's (the weight's) block scales one per 64 columns
// (sm90/fp8_variants.cuh: a 128 x 192 tile straddles two 128-column blocks, and the
// collective's scale loads need one granularity that divides every tile), while the
// recipe and the API give one per 128 x 128 block. Each call copies the weight's scales
// into its workspace with every 128-column block's scale twice, on its stream, before the
// GEMM: (groups, 2 * ceil(n / 128), ceil(k / 128)) fp32, a few hundred kilobytes at most.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "gemm_problem.h"

namespace cute_moe::detail {

// Bytes of the expanded copy of `s` for a problem of `groups` B matrices (n, k).
inline size_t expanded_b_scale_bytes(int32_t groups, int64_t n, int64_t k) {
  return static_cast<size_t>(groups) * static_cast<size_t>(2 * ((n + 127) / 128)) *
         static_cast<size_t>((k + 127) / 128) * sizeof(float);
}

// Writes the expanded copy of `s` to `out` and returns its description (the strides the
// kernels take: group, 64-column block, k-block).
cudaError_t launch_expand_b_scales(const BlockScales& s, int32_t groups, int64_t n, int64_t k, float* out,
                                   cudaStream_t stream, BlockScales* expanded);

}  // namespace cute_moe::detail

// The gradient of the router probabilities that scaled an expert block's output rows:
// dp[r] = sum over tile columns t of partial[t, r]  (the fused GLU backward's per-tile
//         sums of h * s * u, see act_backward_epilogue.cuh)
//       + sum_n dy[r, n] * bias[group(r), n]      (when the scaled output had a bias)
// in a fixed order (deterministic); padding rows (past offs[E-1]) get 0.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace cute_moe::detail {

struct RowScaleGradArgs {
  const float* partial = nullptr;  // (tiles, m) with row stride m
  int64_t tiles = 0;
  int64_t m = 0;
  const void* dy = nullptr;  // bf16 (m, n), row stride lddy; read only with a bias
  int64_t lddy = 0;
  int64_t n = 0;  // a multiple of 8
  const void* bias = nullptr;  // optional bf16 (num_groups, n), row stride bias_stride
  int64_t bias_stride = 0;
  const int32_t* offs = nullptr;
  int32_t num_groups = 0;
  float* out = nullptr;  // (m,)
};

cudaError_t launch_row_scale_grad(const RowScaleGradArgs& args, cudaStream_t stream);

}  // namespace cute_moe::detail

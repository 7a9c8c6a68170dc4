// One warp per row: the lanes split the tile partials and the bias dot product, then a
// fixed shuffle tree adds the lanes' sums (deterministic).
#include <cuda_bf16.h>

#include "group_setup.h"
#include "row_scale_grad.h"

namespace cute_moe::detail {

namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void row_scale_grad_kernel(RowScaleGradArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= a.m) return;
  const int32_t g = group_of_row(a.offs, a.num_groups, row);
  float sum = 0.0f;
  if (g < a.num_groups) {
    for (int64_t t = lane; t < a.tiles; t += 32) sum += a.partial[t * a.m + row];
    if (a.bias != nullptr) {
      const auto* dy = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.dy) + row * a.lddy);
      const auto* b = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.bias) + g * a.bias_stride);
      for (int64_t v = lane; v < a.n / 8; v += 32) {
        const uint4 x = dy[v], y = b[v];
        const auto* x2 = reinterpret_cast<const __nv_bfloat162*>(&x);
        const auto* y2 = reinterpret_cast<const __nv_bfloat162*>(&y);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 xf = __bfloat1622float2(x2[i]), yf = __bfloat1622float2(y2[i]);
          sum += xf.x * yf.x + xf.y * yf.y;
        }
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) a.out[row] = sum;
}

}  // namespace

cudaError_t launch_row_scale_grad(const RowScaleGradArgs& args, cudaStream_t stream) {
  if (args.m == 0) return cudaSuccess;
  const int64_t blocks = (args.m + kWarpsPerBlock - 1) / kWarpsPerBlock;
  row_scale_grad_kernel<<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace cute_moe::detail

// Device helpers of the memory-bound kernels that move rows as 16-byte vectors of 8 bf16
// (permute.cu, group_column_sum.cu): a vector's dot product in fp32, and the warp's sum.
#pragma once

#include <cuda_bf16.h>

namespace cute_moe::detail {

// acc + a . b over the 8 bf16 pairs, fp32 fused multiply-adds in element order.
__device__ __forceinline__ float dot_bf16x8(uint4 a, uint4 b, float acc) {
  const __nv_bfloat162* ha = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* hb = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(ha[i]);
    const float2 fb = __bfloat1622float2(hb[i]);
    acc = fmaf(fa.x, fb.x, acc);
    acc = fmaf(fa.y, fb.y, acc);
  }
  return acc;
}

// The sum over the 32 lanes of a full warp, the same butterfly on every call: every lane's
// result is the same and reproducible.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace cute_moe::detail

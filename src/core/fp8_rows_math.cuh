// One 1 x 128 block of a row held by a half warp (16 lanes x 8 consecutive columns): its amax,
// scale and e4m3 bytes. Shared by the 1x128 quantizer (fp8_quantize.cu) and the column sums
// that quantize the rows they read (group_column_sum.cu), so both write the bits of
// cute_moe.reference.fp8's quantize_1x128.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "fp8_block_math.cuh"

namespace cute_moe::fp8_math {

// Eight quotients divide(x[j], j) as e4m3 bytes, x[0] lowest.
template <class Divide>
__device__ __forceinline__ uint2 e4m3x8(const float (&x)[8], Divide divide) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) w[j] = e4m3x2(divide(x[2 * j], 2 * j), divide(x[2 * j + 1], 2 * j + 1));
  return make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
}

// e4m3x8 with one scale for the eight; the test on the scale is outside the element loop.
__device__ __forceinline__ uint2 e4m3x8(const float (&x)[8], const ScaleDivisor& d, bool fast) {
  return fast ? e4m3x8(x, [&](float v, int) { return d.fast(v); }) : e4m3x8(x, [&](float v, int) { return d.exact(v); });
}

// Pair p (columns 2p, 2p + 1) of eight bf16 loaded as one uint4.
__device__ __forceinline__ __nv_bfloat162 bf16_pair(const uint4& v, int p) {
  const uint32_t w = p == 0 ? v.x : p == 1 ? v.y : p == 2 ? v.z : v.w;
  return *reinterpret_cast<const __nv_bfloat162*>(&w);
}

__device__ __forceinline__ void to_float(const uint4& v, float (&x)[8]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const float2 f = __bfloat1622float2(bf16_pair(v, p));
    x[2 * p] = f.x;
    x[2 * p + 1] = f.y;
  }
}

// The lane's eight values x (zeros for a lane past the row's end) of the 1 x 128 block its half
// warp holds: the block's scale (every lane of the warp calls this; each half warp reduces its
// own block), and the lane's eight e4m3 bytes in *q when `store`.
__device__ __forceinline__ float quantize_half_warp_block(const float (&x)[8], bool store, uint8_t* q) {
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) amax = nan_max(amax, fabsf(x[j]));
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, o));  // within each half
  const float scale = block_scale(amax);
  if (store) {
    const ScaleDivisor div{scale, 1.0f / scale};
    *reinterpret_cast<uint2*>(q) = e4m3x8(x, div, ScaleDivisor::fast_for(scale));
  }
  return scale;
}

}  // namespace cute_moe::fp8_math

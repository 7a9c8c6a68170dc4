// 1 x 128 blocks of rows held by a half warp (16 lanes x 8 consecutive columns), one row or 4 or
// 8 at a time: their amaxes, scales and e4m3 bytes. Shared by the quantizers (fp8_quantize.cu)
// and the column sums that quantize the rows they read (group_column_sum.cu), so all write the
// bits of cute_moe.reference.fp8's quantize_1x128.
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

// The largest magnitude of eight bf16 (a NaN among them: NaN), in fp32.
__device__ __forceinline__ float bf16_abs_max(const uint4& v) {
  __nv_bfloat162 m = __hmax2_nan(__hmax2_nan(__habs2(bf16_pair(v, 0)), __habs2(bf16_pair(v, 1))),
                                 __hmax2_nan(__habs2(bf16_pair(v, 2)), __habs2(bf16_pair(v, 3))));
  return nan_max(__low2float(m), __high2float(m));
}

// The 1x128 blocks of kRows (4 or 8) consecutive rows held by a half warp, each lane 8 columns
// of each row as bf16 (zeros outside the matrix): the rows' scales and e4m3 bytes, the bits of
// cute_moe.reference.fp8's quantize_1x128. A reduce-scatter over the half warp's 16 lanes (the
// steps over lane bits log2(kRows) .. 1 halve the rows a lane keeps; the steps over bit 0, and
// bit 3 for 4 rows, complete the maximum) leaves lanes 2i, 2i + 1 (and, for 4 rows, 2i + 8,
// 2i + 9) with row i's amax, so a block's scale and its reciprocal are divided by 2 (4) lanes,
// not sixteen (2.5 instructions per element before: session 41), and shuffled to the row's lanes
// when its values are divided. `rows`: the valid rows (0 .. kRows); `store`: the lane's columns
// are inside; `scales`: the half warp's block is (its scale of row i at scale[i * ld_scale]).
// Every lane of the warp calls this.
template <int kRows>
__device__ __forceinline__ void quantize_rows_1x128(const uint4 (&raw)[kRows], int rows, bool store, uint8_t* q,
                                                    int64_t ld_q, bool scales, float* scale, int64_t ld_scale) {
  static_assert(kRows == 4 || kRows == 8, "4 or 8 rows a half warp");
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  float m[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) m[i] = bf16_abs_max(raw[i]);
#pragma unroll
  for (int half = kRows / 2; half >= 1; half >>= 1) {  // rows kept: kRows / 2, .., 1
    const bool upper = (lane & (2 * half)) != 0;
#pragma unroll
    for (int j = 0; j < half; ++j) {
      const float keep = upper ? m[j + half] : m[j];
      const float give = upper ? m[j] : m[j + half];
      m[j] = nan_max(keep, __shfl_xor_sync(kAll, give, 2 * half));
    }
  }
  float amax = nan_max(m[0], __shfl_xor_sync(kAll, m[0], 1));
  if constexpr (kRows == 4) amax = nan_max(amax, __shfl_xor_sync(kAll, amax, 8));
  const float row_scale = block_scale(amax);
  const float row_recip = 1.0f / row_scale;
  const int mine = (lane >> 1) & (kRows - 1);  // the row whose scale this lane holds
  if (scales && (lane & 1) == 0 && (lane & 15) < 2 * kRows && mine < rows) scale[mine * ld_scale] = row_scale;
  const bool fast = __all_sync(kAll, ScaleDivisor::fast_for(row_scale));  // the warp's rows
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int from = (lane & 16) | (2 * i);  // a lane of this half holding row i's scale
    const ScaleDivisor div{__shfl_sync(kAll, row_scale, from), __shfl_sync(kAll, row_recip, from)};
    if (i < rows && store) {
      float x[8];
      to_float(raw[i], x);
      *reinterpret_cast<uint2*>(q + i * ld_q) = e4m3x8(x, div, fast);
    }
  }
}

}  // namespace cute_moe::fp8_math

// The arithmetic of one FP8 block (docs/fp8.md, "Formats"), shared by the quantizers
// (fp8_quantize.cu) and the quantizing epilogues (sm90/fp8_rows_epilogue.cuh), so that a block
// quantized in either place has the same bits as cute_moe.reference.fp8's.
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

namespace cute_moe::fp8_math {

constexpr int kBlock = 128;
constexpr float kFp8Max = 448.0f;  // e4m3's largest finite magnitude

// max that keeps a NaN, as torch's amax does (one FMNMX.NAN)
__device__ __forceinline__ float nan_max(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ float warp_nan_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The reference's where(amax > 0, amax / 448, 1) and (x / scale).clamp(-448, 448) in fp32,
// rounded to nearest even. The quotient must be IEEE division's (no fast-math); the clamp is
// the conversion's saturation (satfinite: beyond +-448, infinities included, to +-448; a NaN
// stays NaN, as through torch.clamp).
__device__ __forceinline__ float block_scale(float amax) { return amax > 0.0f ? amax / kFp8Max : 1.0f; }

// x / s as IEEE division rounds it, for the elements of one block: the reciprocal r = RN(1 / s)
// once, then per element q = RN(x r) and Markstein's correction RN(q + (x - s q) r), both
// steps FMAs (the compiler's division recomputed the reciprocal, a range check and a slow-path
// call per element: the 1x128 pass was issue-bound). Where s lies in [2^-80, 2^100] that is
// the correctly rounded quotient for every x that e4m3 can tell apart: checked on the host
// against IEEE division (every finite bf16 x with |x| <= 448 s, 3000 scales), the only
// differences had |x| below 2^-100 or a quotient below 2^-12, and for such x (|x / s| < 2^-20
// here) both round to a zero in e4m3. The residual is formed negated, e = RN(s q - x) =
// -RN(x - s q), and added as RN(q - e r): the same number, except that a zero x keeps its sign
// (x = -0: q = -0, e = +0, -0 r + -0 = -0; with RN(x - s q) the sum would be +0), so no
// copysign is needed (it cost one instruction per element; session 41). Outside that range
// (subnormal or enormous blocks) the exact division.
struct ScaleDivisor {
  float s, r;
  __device__ __forceinline__ static bool fast_for(float scale) { return scale >= 0x1p-80f && scale <= 0x1p100f; }
  __device__ __forceinline__ float fast(float x) const {
    const float q = x * r;
    return fmaf(-fmaf(s, q, -x), r, q);
  }
  __device__ __forceinline__ float exact(float x) const { return x / s; }
};

__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

}  // namespace cute_moe::fp8_math

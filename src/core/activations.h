// Activations of an expert FFN, as functors shared by the fused epilogues (device) and
// the C++ tests (host); codegen/kernel_space.py declares which exist (name, functor,
// gated, default limit) and cute_moe/activation.h, generated from it, their formulas.
//
// Gated activations (kGated) map a (gate a, linear b) pair of the up-projection output to
// one value h = f(g) * (u + offset), with g = min(a, L) and u = clamp(b, -L, L) when a
// limit L is set; in backward they map (a, b, dh) to (da, db) and h again. The
// non-gated ones map one value to one value. Derivatives follow PyTorch autograd of the
// reference exactly, clamp masks included (clamp passes the gradient where the input
// lies inside the closed interval). Adding an activation is adding a functor here and a
// row in codegen/kernel_space.py's ACTIVATIONS; the epilogues are generic over the functor.
#pragma once

#include <cmath>  // INFINITY

#include "host_device.h"

namespace cute_moe::detail {

// Runtime parameters of the activations (unused fields are ignored).
struct ActParams {
  float alpha = 1.702f;   // swiglu_oai: sigmoid scale
  float limit = 7.0f;     // gated activations: clamp limit
  bool has_limit = true;  // false: no clamping
};

// 1 / (1 + e^-x). On the device e^-x is ex2.approx with denormals flushed: the
// denormal-preserving form costs three instructions more per call (a range test, a
// pre-scale, a squaring) and gives the same sigmoid, since 1 + e rounds to 1 for any e
// below 2^-24. x -> -inf: 1 / inf = 0, as wanted.
CUTE_MOE_HOST_DEVICE float sigmoid(float x) {
#if defined(__CUDA_ARCH__)
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
  return __fdividef(1.0f, 1.0f + e);
#else
  return 1.0f / (1.0f + std::exp(-x));
#endif
}

#if defined(__CUDA_ARCH__)
// min / max that return NaN when either input is NaN (as torch.clamp passes a NaN through);
// the bound is never NaN.
__device__ __forceinline__ float min_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#endif

CUTE_MOE_HOST_DEVICE float tanh_fast(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));  // max rel. error 2^-11: below bf16's
  return y;
#else
  return std::tanh(x);
#endif
}

// Gate functions f(g) of the gated activations, with their derivative f'(g).
struct SiluAlphaGate {  // g * sigmoid(alpha * g) (GPT-OSS)
  CUTE_MOE_HOST_DEVICE static float value(float g, const ActParams& p, float* deriv) {
    const float s = sigmoid(p.alpha * g);
    if (deriv != nullptr) *deriv = s + p.alpha * g * s * (1.0f - s);
    return g * s;
  }
};

struct SiluGate {  // g * sigmoid(g)
  CUTE_MOE_HOST_DEVICE static float value(float g, const ActParams&, float* deriv) {
    const float s = sigmoid(g);
    if (deriv != nullptr) *deriv = s + g * s * (1.0f - s);
    return g * s;
  }
};

struct GeluTanhGate {  // 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))  (torch's approximate="tanh")
  CUTE_MOE_HOST_DEVICE static float value(float g, const ActParams&, float* deriv) {
    constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
    constexpr float kKappa = 0.044715f;
    const float t = tanh_fast(kBeta * g * (1.0f + kKappa * g * g));
    if (deriv != nullptr) {
      *deriv = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kBeta * (1.0f + 3.0f * kKappa * g * g);
    }
    return 0.5f * g * (1.0f + t);
  }
};

// h = f(min(a, L)) * (clamp(b, -L, L) + kLinearOffset)
//
// Written without branches for the epilogues, where they run once per element: the bound
// is L, or +inf without a limit (no clamp then: nothing exceeds +inf), and each clamp is a
// min / max on the device (a compare and a select on the host). A NaN passes through as
// it would through torch.clamp, and the masks are PyTorch's (inside the closed interval;
// everything without a limit).
// kClamps false: the limit-free twin, h = f(a) * (b + kLinearOffset) with no clamps and no
// masks compiled in (ActParams' limit ignored). The same values as the clamping unit without a
// limit; the host serves calls without a limit with it where such a kernel is compiled
// (codegen/kernel_space.py, LIMIT_FREE): the clamps and masks were ~18% of the fused
// backward's instructions, and a runtime branch around them cost more than it saved.
template <class Gate, int kLinearOffset, bool kClamps = true>
struct GatedUnit {
  static constexpr bool kGated = true;

  CUTE_MOE_HOST_DEVICE static float bound(const ActParams& p) { return p.has_limit ? p.limit : INFINITY; }
  // On the device min / max with NaN propagation (FMNMX, one instruction per bound where a
  // compare and a select took two): the same values as the host's ternaries, NaN included.
  CUTE_MOE_HOST_DEVICE static float clamp_gate(float a, float hi) {
#if defined(__CUDA_ARCH__)
    return min_nan(a, hi);
#else
    return a > hi ? hi : a;
#endif
  }
  CUTE_MOE_HOST_DEVICE static float clamp_linear(float b, float hi) {
#if defined(__CUDA_ARCH__)
    return max_nan(min_nan(b, hi), -hi);
#else
    return b < -hi ? -hi : (b > hi ? hi : b);
#endif
  }

  // b + kLinearOffset, without an add of 0 (not folded away: -0 + 0 is +0)
  CUTE_MOE_HOST_DEVICE static float offset(float b) {
    if constexpr (kLinearOffset == 0) return b;
    return b + float(kLinearOffset);
  }

  CUTE_MOE_HOST_DEVICE static float forward(float a, float b, const ActParams& p) {
    if constexpr (!kClamps) return Gate::value(a, p, nullptr) * offset(b);
    const float hi = bound(p);
    return Gate::value(clamp_gate(a, hi), p, nullptr) * offset(clamp_linear(b, hi));
  }

  // Returns h; writes dh * dh/da and dh * dh/db.
  CUTE_MOE_HOST_DEVICE static float backward(float a, float b, float dh, const ActParams& p, float& da, float& db) {
    if constexpr (!kClamps) {
      float df;
      const float f = Gate::value(a, p, &df);
      const float v = offset(b);
      da = dh * v * df;
      db = dh * f;
      return f * v;
    }
    const float hi = bound(p);
    const bool a_in = a <= hi || !p.has_limit;
    const bool b_in = fabsf(b) <= hi || !p.has_limit;  // -hi <= b <= hi; false for NaN
    float df;
    const float f = Gate::value(clamp_gate(a, hi), p, &df);
    const float v = offset(clamp_linear(b, hi));
    da = a_in ? dh * v * df : 0.0f;
    db = b_in ? dh * f : 0.0f;
    return f * v;
  }
};

using SwigluOai = GatedUnit<SiluAlphaGate, 1>;  // GPT-OSS
using Swiglu = GatedUnit<SiluGate, 0>;          // Llama, Qwen, DeepSeek, Mixtral
using Geglu = GatedUnit<GeluTanhGate, 0>;
using SwigluNoLimit = GatedUnit<SiluGate, 0, false>;  // "swiglu" called without a limit

// h = relu(a)^2, not gated.
struct SquaredRelu {
  static constexpr bool kGated = false;
  // relu as torch has it: a NaN stays NaN (so a NaN in training stays visible).
  CUTE_MOE_HOST_DEVICE static float relu(float a) { return a < 0.0f ? 0.0f : a; }
  CUTE_MOE_HOST_DEVICE static float forward(float a, const ActParams&) {
    const float r = relu(a);
    return r * r;
  }
  // Returns h; writes dh * dh/da.
  CUTE_MOE_HOST_DEVICE static float backward(float a, float dh, const ActParams&, float& da) {
    const float r = relu(a);
    da = dh * 2.0f * r;
    return r * r;
  }
};

// h = a: the "none" activation. Only its backward is fused (the forward is a plain
// scaled GEMM): it gives the down projection's dgrad the router-probability gradient and
// p * h in the epilogue, as for the other activations.
struct Identity {
  static constexpr bool kGated = false;
  CUTE_MOE_HOST_DEVICE static float forward(float a, const ActParams&) { return a; }
  CUTE_MOE_HOST_DEVICE static float backward(float a, float dh, const ActParams&, float& da) {
    da = dh;
    return a;
  }
};

}  // namespace cute_moe::detail

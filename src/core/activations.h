// Gated activations of an expert FFN, as functors shared by the fused epilogues (device)
// and the C++ tests (host).
//
// A gated activation maps a (gate a, linear b) pair of the up-projection output to one
// value h, and in backward maps (a, b, dh) to (da, db) and h again. Derivatives follow
// PyTorch autograd of the reference exactly, clamp masks included (clamp passes the
// gradient where the input lies inside the closed interval; NaN propagates like
// torch.clamp). Adding an activation is adding a functor here.
#pragma once

#include <cmath>

#include "host_device.h"

namespace cute_moe::detail {

// Runtime parameters of the gated activations (unused fields are ignored).
struct GluParams {
  float alpha = 1.702f;  // swiglu_oai: sigmoid scale
  float limit = 7.0f;    // swiglu_oai: clamp limit
  bool has_limit = true;  // false: no clamping
};

CUTE_MOE_HOST_DEVICE float sigmoid(float x) {
#if defined(__CUDA_ARCH__)
  return __fdividef(1.0f, 1.0f + __expf(-x));  // x -> -inf: 1/inf = 0, as wanted
#else
  return 1.0f / (1.0f + std::exp(-x));
#endif
}

// GPT-OSS: g = min(a, L), u = clamp(b, -L, L), h = g * sigmoid(alpha * g) * (u + 1).
struct SwigluOai {
  CUTE_MOE_HOST_DEVICE static float forward(float a, float b, const GluParams& p) {
    const float g = p.has_limit && a > p.limit ? p.limit : a;
    const float u = !p.has_limit ? b : (b < -p.limit ? -p.limit : (b > p.limit ? p.limit : b));
    return g * sigmoid(p.alpha * g) * (u + 1.0f);
  }

  // Returns h; writes dh * dh/da and dh * dh/db.
  CUTE_MOE_HOST_DEVICE static float backward(float a, float b, float dh, const GluParams& p, float& da, float& db) {
    const bool a_in = !p.has_limit || a <= p.limit;
    const bool b_in = !p.has_limit || (b >= -p.limit && b <= p.limit);
    const float g = p.has_limit && a > p.limit ? p.limit : a;  // the forward's clamps
    const float u = !p.has_limit ? b : (b < -p.limit ? -p.limit : (b > p.limit ? p.limit : b));
    const float s = sigmoid(p.alpha * g);
    const float gs = g * s;
    da = a_in ? dh * (u + 1.0f) * (s + p.alpha * gs * (1.0f - s)) : 0.0f;
    db = b_in ? dh * gs : 0.0f;
    return gs * (u + 1.0f);
  }
};

}  // namespace cute_moe::detail

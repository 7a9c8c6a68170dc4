// The host-side rules of an activation's options (ActivationOptions), shared by the checkers
// of the fused GEMMs (validate.cpp) and of the activation-quantizing pass (fp8_quantize_validate.cpp).
#pragma once

#include <cmath>

#include "cute_moe/fused_activation.h"

namespace cute_moe::detail {

// False for a value outside the enum (recorded as the error): nothing else can be checked.
template <class Rules>
bool check_activation(Rules& c, const ActivationOptions& g) {
  const int act = static_cast<int>(g.activation);
  if (act < 0 || act >= kNumActivations) {
    c.require(false, "unknown activation ", act, " (expected one of ", activation_names(), ")");
    return false;
  }
  c.require(is_gated(g.activation) || !g.has_limit, activation_name(g.activation),
            " takes no clamp limit (has_limit must be false): only gated activations clamp");
  c.require(std::isfinite(g.alpha), "the activation's alpha must be finite, got ", g.alpha);
  c.require(!g.has_limit || (std::isfinite(g.limit) && g.limit >= 0), "the activation's limit must be finite and >= 0, got ",
            g.limit);
  return true;
}

}  // namespace cute_moe::detail

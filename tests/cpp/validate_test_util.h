// Shared by the validation tests: fake operand addresses and the rejection check.
#pragma once

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "cute_moe/status.h"

namespace cute_moe::test {

// Host-side validation never dereferences: aligned fake addresses are enough.
template <typename T = void>
T* fake(uintptr_t a) { return reinterpret_cast<T*>(a); }

// validate(a) (found by argument-dependent lookup) rejects a with a message containing `needle`.
template <typename Args>
void expect_rejected(const Args& a, const std::string& needle) {
  Result r = validate(a);
  EXPECT_EQ(r.status, Status::kInvalidArgument) << "expected a rejection mentioning '" << needle << "'";
  EXPECT_NE(r.message.find(needle), std::string::npos) << r.message;
}

}  // namespace cute_moe::test

// Host-side argument checks: a collector of rules that keeps the first one broken as an
// error Result whose message names the op and carries the values. Each API's checker
// derives from it (CRTP, so its own rules chain) and adds the rules of its domain.
#pragma once

#include <sstream>

#include "cute_moe/status.h"

namespace cute_moe::detail {

template <class Derived>
class ArgRules {
 public:
  explicit ArgRules(const char* op) : op_(op) {}

  template <typename... Parts>
  Derived& require(bool ok, const Parts&... parts) {
    if (!ok && result_.ok()) {
      std::ostringstream msg;
      msg << op_ << ": ";
      (msg << ... << parts);
      result_ = Result::error(Status::kInvalidArgument, msg.str());
    }
    return static_cast<Derived&>(*this);
  }

  Result result() const { return result_; }

 private:
  const char* op_;
  Result result_;
};

}  // namespace cute_moe::detail

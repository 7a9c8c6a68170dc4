// Status and error reporting of the cute-moe core API.
//
// Every entry point of the core returns a Result instead of throwing: the core is
// usable from plain C++ (no PyTorch, no exceptions across the boundary), and the
// message carries the offending values so a caller can show it unchanged.
#pragma once

#include <string>
#include <utility>

namespace cute_moe {

enum class Status {
  kSuccess = 0,
  kInvalidArgument,  // the caller passed something outside the documented contract
  kNotSupported,     // valid in principle, but no kernel of this build handles it
  kCudaError,        // a CUDA runtime call failed
  kInternalError,    // CUTLASS rejected a configuration we built (a bug on our side)
};

const char* status_name(Status s);

struct Result {
  Status status = Status::kSuccess;
  std::string message;

  bool ok() const { return status == Status::kSuccess; }
  static Result success() { return {}; }
  static Result error(Status s, std::string msg) { return {s, std::move(msg)}; }
};

}  // namespace cute_moe

// Host-side argument validation of the routing kernels (routing.h), with messages that carry
// the values, and sort_by_expert's workspace size. The ids and logits are data: the kernels
// take every value (out-of-range ids are padding rows, NaN logits sort first).
#include <cstdint>
#include <limits>

#include "arg_rules.h"
#include "cute_moe/routing.h"
#include "expert_sort_slices.h"

namespace cute_moe {

namespace {

class Rules : public detail::ArgRules<Rules> {
 public:
  using ArgRules::ArgRules;

  // A device array that is read or written when `used`: non-null and aligned to its elements.
  Rules& array(const char* name, const void* p, bool used, size_t bytes) {
    if (!used) return *this;
    require(p != nullptr, name, " must not be null");
    return require(reinterpret_cast<uintptr_t>(p) % bytes == 0, name, " must be ", bytes, "-byte aligned, got address ",
                   p);
  }
};

}  // namespace

size_t sort_by_expert_workspace_bytes(int64_t entries, int64_t num_experts) {
  if (entries <= 0 || num_experts <= 0) return 0;
  return static_cast<size_t>(detail::sort_buckets(num_experts)) *
         static_cast<size_t>(detail::sort_slices(entries, num_experts)) * sizeof(int32_t);
}

Result validate(const TopKArgs& a) {
  Rules c("top_k");
  c.require(a.rows >= 0, "rows must be >= 0, got rows=", a.rows)
      .require(a.cols >= 1 && a.cols <= kTopKMaxColumns, "cols must be in [1, ", kTopKMaxColumns, "], got cols=", a.cols)
      .require(a.k >= 1 && a.k <= kTopKMaxChoices && a.k <= a.cols, "k must be in [1, min(cols, ", kTopKMaxChoices,
               ")], got k=", a.k, " with cols=", a.cols)
      .require(a.ld_logits >= a.cols, "ld_logits must be >= cols=", a.cols, ", got ld_logits=", a.ld_logits);
  if (!c.result().ok()) return c.result();
  const bool used = a.rows > 0;
  c.array("logits", a.logits, used, sizeof(float)).array("values", a.values, used, sizeof(float));
  return c.array("indices", a.indices, used, sizeof(int64_t)).result();
}

Result validate(const SortByExpertArgs& a) {
  Rules c("sort_by_expert");
  constexpr int64_t kMaxEntries = std::numeric_limits<int32_t>::max();
  c.require(a.rows >= 0, "rows must be >= 0, got rows=", a.rows)
      .require(a.k >= 0, "k must be >= 0, got k=", a.k)
      .require(a.num_experts >= 1 && a.num_experts <= kSortMaxExperts, "num_experts must be in [1, ", kSortMaxExperts,
               "], got num_experts=", a.num_experts);
  if (!c.result().ok()) return c.result();
  c.require(a.k == 0 || a.rows <= kMaxEntries / a.k, "rows * k must be below 2^31 (int32 row numbers), got rows=",
            a.rows, ", k=", a.k);
  if (!c.result().ok()) return c.result();
  const bool used = a.rows * a.k > 0;
  c.array("experts", a.experts, used, a.experts_int32 ? sizeof(int32_t) : sizeof(int64_t))
      .array("row_token", a.row_token, used, sizeof(int32_t))
      .array("token_rows", a.token_rows, used, sizeof(int32_t))
      .array("offs", a.offs, true, sizeof(int32_t))
      .array("workspace", a.workspace, used, sizeof(int32_t))
      .array("weights", a.weights, used && a.weights != nullptr, sizeof(float))
      .array("prob", a.prob, used && a.weights != nullptr, sizeof(float));
  return c.require(a.weights != nullptr || a.prob == nullptr, "prob is written only with weights: pass both or neither")
      .result();
}

}  // namespace cute_moe

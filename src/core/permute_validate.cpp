// Host-side argument validation of the permute / unpermute gathers (permute.h): every
// rule the vectorised kernels rely on, with messages that carry the actual values. The
// index values are data, checked on the device by the kernels.
#include <cstdint>
#include <string>

#include "arg_rules.h"
#include "cute_moe/permute.h"

namespace cute_moe {

namespace {

// The rules of this file's API (arg_rules.h collects the first broken one).
class Rules : public detail::ArgRules<Rules> {
 public:
  using ArgRules::ArgRules;

  Rules& count(const char* name, int64_t v) { return require(v >= 0, name, " must be >= 0, got ", name, "=", v); }

  Rules& row_length(int64_t cols) {
    return require(cols >= 0 && cols % 8 == 0, "cols must be a non-negative multiple of 8 (rows of 16-byte vectors), got cols=",
                   cols);
  }

  // A bf16 matrix of `rows` x `cols` read or written with 16-byte vectors; unused when empty.
  Rules& matrix(const char* name, const void* p, const char* ld_name, int64_t ld, int64_t rows, int64_t cols) {
    if (rows == 0 || cols == 0) return *this;
    require(p != nullptr, name, " must not be null");
    require(reinterpret_cast<uintptr_t>(p) % 16 == 0, name, " must be 16-byte aligned, got address ", p);
    return require(ld >= cols && ld % 8 == 0, ld_name, " must be a multiple of 8 elements (16 bytes) and >= cols=", cols,
                   ", got ", ld_name, "=", ld);
  }

  // A device array of `n` elements of `bytes` bytes read element by element.
  Rules& array(const char* name, const void* p, int64_t n, size_t bytes, bool required = true) {
    if (n == 0 || (p == nullptr && !required)) return *this;
    require(p != nullptr, name, " must not be null");
    return require(reinterpret_cast<uintptr_t>(p) % bytes == 0, name, " must be ", bytes, "-byte aligned, got address ",
                   p);
  }

};

}  // namespace

Result validate(const GatherRowsArgs& a) {
  Rules c("gather_rows");
  c.count("rows", a.rows).count("src_rows", a.src_rows).row_length(a.cols);
  if (!c.result().ok()) return c.result();
  c.matrix("src", a.src, "ld_src", a.ld_src, a.src_rows, a.cols).matrix("out", a.out, "ld_out", a.ld_out, a.rows, a.cols);
  c.array("index", a.index, a.rows, sizeof(int32_t)).array("scale", a.scale, a.rows, sizeof(float), false);
  return c.result();
}

Result validate(const GatherSumRowsArgs& a) {
  Rules c("gather_sum_rows");
  c.count("rows", a.rows).count("k", a.k).count("src_rows", a.src_rows).row_length(a.cols);
  if (!c.result().ok()) return c.result();
  c.matrix("src", a.src, "ld_src", a.ld_src, a.src_rows, a.cols).matrix("out", a.out, "ld_out", a.ld_out, a.rows, a.cols);
  c.array("index", a.index, a.rows * a.k, sizeof(int32_t)).array("weight", a.weight, a.rows * a.k, sizeof(float), false);
  return c.result();
}

Result validate(const GatherRowsDotArgs& a) {
  Rules c("gather_rows_dot");
  c.count("rows", a.rows).count("k", a.k).count("src_rows", a.src_rows).row_length(a.cols);
  if (!c.result().ok()) return c.result();
  c.matrix("a", a.a, "ld_a", a.ld_a, a.rows, a.cols).matrix("src", a.src, "ld_src", a.ld_src, a.src_rows, a.cols);
  c.array("index", a.index, a.rows * a.k, sizeof(int32_t)).array("out", a.out, a.rows * a.k, sizeof(float));
  return c.result();
}

}  // namespace cute_moe

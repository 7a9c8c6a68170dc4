// Host-side argument validation of the FP8 quantizers (fp8_quantize.h): the layout rules
// the kernels' 16-byte vectors rely on, with messages that carry the actual values.
#include <cstdint>
#include <string>

#include "activation_rules.h"
#include "arg_rules.h"
#include "cute_moe/fp8_quantize.h"

namespace cute_moe {

namespace {

class Rules : public detail::ArgRules<Rules> {
 public:
  using ArgRules::ArgRules;

  Rules& dim(const char* name, int64_t v) {
    return require(v >= 0 && v % 16 == 0, name, " must be a non-negative multiple of 16, got ", name, "=", v);
  }
  Rules& count(const char* name, int64_t v) { return require(v >= 0, name, " must be >= 0, got ", name, "=", v); }
  Rules& aligned(const char* name, const void* p, size_t bytes) {
    require(p != nullptr, name, " must not be null");
    return require(reinterpret_cast<uintptr_t>(p) % bytes == 0, name, " must be ", bytes, "-byte aligned, got address ",
                   p);
  }
  Rules& stride(const char* name, int64_t v, int64_t at_least) {
    return require(v >= at_least && v % 16 == 0, name, " must be a multiple of 16 elements and >= ", at_least, ", got ",
                   name, "=", v);
  }
};

}  // namespace

Result validate(const QuantizeFp8RowsArgs& a) {
  Rules c("quantize_fp8_1x128");
  c.count("rows", a.rows).dim("cols", a.cols);
  if (!c.result().ok() || a.rows == 0 || a.cols == 0) return c.result();
  c.aligned("src", a.src, 16).stride("ld_src", a.ld_src, a.cols);
  c.aligned("q", a.q, 16).stride("ld_q", a.ld_q, a.cols);
  c.aligned("scale", a.scale, sizeof(float));
  if (a.index != nullptr) {
    c.aligned("index", a.index, sizeof(int32_t));
    c.require(a.src_rows >= 1, "src_rows must be >= 1 with an index (the rows index selects from), got src_rows=",
              a.src_rows);
  }
  return c.result();
}

Result validate(const QuantizeFp8TilesArgs& a) {
  Rules c("quantize_fp8_128x128");
  c.count("batches", a.batches).dim("k", a.k).dim("n", a.n);
  c.require(a.q != nullptr || a.q_t != nullptr, "q and q_t are both null: ask for at least one output");
  if (!c.result().ok() || a.batches == 0 || a.k == 0 || a.n == 0) return c.result();
  c.aligned("src", a.src, 16).stride("ld_src", a.ld_src, a.n);
  c.require(a.batches == 1 || (a.batch_stride_src % 16 == 0 && a.batch_stride_src >= a.k * a.ld_src),
            "batch_stride_src must be a multiple of 16 elements and >= k * ld_src=", a.k * a.ld_src,
            ", got batch_stride_src=", a.batch_stride_src);
  if (a.q != nullptr) c.aligned("q", a.q, 16).aligned("scale", a.scale, sizeof(float));
  if (a.q_t != nullptr) {
    c.aligned("q_t", a.q_t, 16).aligned("scale_t", a.scale_t, sizeof(float));
    if (a.ld_q_t != 0) c.stride("ld_q_t", a.ld_q_t, a.k);
  }
  return c.result();
}

Result validate(const QuantizeFp8GroupColumnsArgs& a) {
  Rules c("quantize_fp8_128x1");
  c.count("rows", a.rows).dim("cols", a.cols);
  c.require(a.num_groups >= 1 && a.num_groups <= 65536, "num_groups must be in [1, 65536], got ", a.num_groups);
  if (!c.result().ok() || a.cols == 0) return c.result();
  c.aligned("offs", a.offs, sizeof(int32_t));
  if (a.rows > 0) c.aligned("src", a.src, 16).stride("ld_src", a.ld_src, a.cols);
  const int64_t blocks = fp8_group_row_blocks(a.rows, a.num_groups);
  c.aligned("q_t", a.q_t, 16).stride("ld_q_t", a.ld_q_t, 128 * blocks);
  c.aligned("scale", a.scale, sizeof(float));
  if (a.q != nullptr && a.rows > 0) {  // the 1x128 copy from the same read
    c.aligned("q", a.q, 16).stride("ld_q", a.ld_q, a.cols);
    c.aligned("q_scale", a.q_scale, sizeof(float));
  }
  if (a.index != nullptr && a.rows > 0) {
    c.aligned("index", a.index, sizeof(int32_t));
    c.require(a.src_rows >= 1, "src_rows must be >= 1 with an index (the rows index selects from), got src_rows=",
              a.src_rows);
  }
  return c.result();
}

Result validate(const ActQuantizeFp8RowsArgs& a) {
  Rules c("act_quantize_fp8_1x128");
  if (!detail::check_activation(c, a.act)) return c.result();
  const QuantizeFp8RowsArgs& r = a.rows;
  c.require(r.index == nullptr, "rows.index must be null: the activation's pass reads pre's rows in place");
  c.count("rows", r.rows).dim("cols", r.cols);
  if (!c.result().ok() || r.rows == 0 || r.cols == 0) return c.result();
  const int64_t width = is_gated(a.act.activation) ? 2 * r.cols : r.cols;  // pre's
  c.aligned("src", r.src, 16).stride("ld_src", r.ld_src, width);
  c.aligned("q", r.q, 16).stride("ld_q", r.ld_q, r.cols);
  c.aligned("scale", r.scale, sizeof(float));
  return c.result();
}

Result validate(const QuantizeFp8RowsColumnSumsArgs& a) {
  Result rows = validate(a.rows);
  if (!rows.ok()) return Result::error(rows.status, "quantize_fp8_1x128_column_sums: " + rows.message);
  Rules c("quantize_fp8_1x128_column_sums");
  c.require(a.rows.index == nullptr, "rows.index must be null: the column sums read the sorted rows in place");
  c.require(a.num_groups >= 1 && a.num_groups <= 65536, "num_groups must be in [1, 65536], got ", a.num_groups);
  if (!c.result().ok()) return c.result();
  c.aligned("offs", a.offs, sizeof(int32_t));
  if (a.rows.cols > 0) c.aligned("sums", a.sums, 16);
  return c.result();
}

}  // namespace cute_moe

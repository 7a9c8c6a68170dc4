// Host-side argument validation of the core API: every rule a kernel relies on, checked
// before anything is enqueued, with messages that carry the actual values.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include <cmath>

#include "activation_rules.h"
#include "arg_rules.h"
#include "cute_moe/fp8_gemm.h"
#include "cute_moe/fused_activation.h"

namespace cute_moe {

const char* status_name(Status s) {
  switch (s) {
    case Status::kSuccess: return "success";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kNotSupported: return "not supported";
    case Status::kCudaError: return "CUDA error";
    case Status::kInternalError: return "internal error";
  }
  return "unknown status";
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bfloat16";
    case DType::kF32: return "float32";
  }
  return "unknown dtype";
}

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// The rules of this file's API (arg_rules.h collects the first broken one).
class Checker : public detail::ArgRules<Checker> {
 public:
  using ArgRules::ArgRules;

  Checker& group_count(int32_t num_groups) {
    return require(num_groups >= 1 && num_groups <= kMaxGroups, "num_groups must be in [1, ", kMaxGroups,
                   "], got ", num_groups);
  }
  // A dimension that becomes the contiguous extent of a TMA-loaded row.
  Checker& row_dim(const char* name, int64_t v) {
    return require(v > 0 && v % 8 == 0 && v <= kInt32Max, name,
                   " must be a positive multiple of 8 (rows of 16 bytes for TMA) below 2^31, got ", name, "=", v);
  }
  Checker& rows(int64_t m) {
    return require(m >= 0 && m <= kInt32Max, "m (rows) must be in [0, 2^31), got m=", m);
  }
  Checker& leading_dim(const char* name, int64_t ld, int64_t min, const char* min_name) {
    return require(ld >= min && ld % 8 == 0, name, " must be a multiple of 8 elements (16 bytes) and >= ", min_name,
                   "=", min, ", got ", name, "=", ld);
  }
  Checker& pointer(const char* name, const void* p, bool required = true) {
    if (p == nullptr) return require(!required, name, " must not be null");
    return require(reinterpret_cast<uintptr_t>(p) % 16 == 0, name, " must be 16-byte aligned, got address ", p);
  }
  // An optional fp32 vector read element by element.
  Checker& scalars(const char* name, const float* p) {
    return require(reinterpret_cast<uintptr_t>(p) % 4 == 0, name, " must be 4-byte aligned, got address ",
                   static_cast<const void*>(p));
  }

};

}  // namespace

namespace {

// The rules of RaggedMGemmArgs; `gather`, `split`: whether the calling op takes gather_rows,
// w_hi.
Result validate_ragged_m(const RaggedMGemmArgs& a, const char* op, bool gather, bool split = false) {
  Checker c(op);
  if (a.gather_rows != nullptr) {
    c.require(gather, "gather_rows is fused into act_forward only (gather the rows first, e.g. with permute_rows)");
    c.require(a.w_stride_n == 1, "gather_rows needs a weight with unit stride along n (a row-major (E, k, n) tensor)");
    c.require(a.x_rows >= 1 && a.x_rows <= kInt32Max, "x_rows (rows of the gathered x) must be in [1, 2^31), got x_rows=",
              a.x_rows);
    c.require(reinterpret_cast<uintptr_t>(a.gather_rows) % 4 == 0, "gather_rows must be 4-byte aligned");
  }
  c.group_count(a.num_groups).rows(a.m).row_dim("n", a.n).row_dim("k", a.k);
  c.pointer("offs", a.offs).pointer("w", a.w).pointer("x", a.x, a.m > 0).pointer("y", a.y, a.m > 0);
  c.pointer("bias", a.bias, false).scalars("group_scale", a.group_scale).scalars("row_scale", a.row_scale);
  c.leading_dim("ldx", a.ldx, a.k, "k").leading_dim("ldy", a.ldy, a.n, "n");
  c.require(a.w_stride_k == 1 || a.w_stride_n == 1,
            "the weight needs a unit stride along k or along n (a row-major (E, k, n) tensor or a transposed view of "
            "an (E, n, k) one), got w_stride_k=", a.w_stride_k, ", w_stride_n=", a.w_stride_n);
  if (a.w_stride_n == 1) {
    c.leading_dim("w_stride_k", a.w_stride_k, a.n, "n");
  } else if (a.w_hi != nullptr && a.k_split > 0 && a.k_split < a.k) {  // each tensor holds its own rows
    c.leading_dim("w_stride_n", a.w_stride_n, std::max(a.k_split, a.k - a.k_split), "the rows of w and of w_hi");
  } else {
    c.leading_dim("w_stride_n", a.w_stride_n, a.k, "k");
  }
  c.require(a.w_stride_group >= 0 && a.w_stride_group % 8 == 0,
            "w_stride_group must be a non-negative multiple of 8 elements (16-byte aligned expert matrices), got ",
            a.w_stride_group);
  if (a.bias != nullptr) {
    c.require(a.bias_stride_group >= 0 && a.bias_stride_group % 8 == 0,
              "bias_stride_group must be a non-negative multiple of 8 elements, got ", a.bias_stride_group);
  }
  if (a.w_hi != nullptr || a.k_split != 0) {
    c.require(split, "w_hi / k_split (W's k rows in two tensors) are taken by ragged_m_gemm only");
    c.pointer("w_hi", a.w_hi);
    c.require(a.k_split > 0 && a.k_split < a.k && a.k_split % kSplitKMultiple == 0,
              "k_split (W's rows from w, the rest from w_hi) must be a positive multiple of ", kSplitKMultiple,
              " below k=", a.k, ", got k_split=", a.k_split);
  }
  return c.result();
}

}  // namespace

Result validate(const RaggedMGemmArgs& a) { return validate_ragged_m(a, "ragged_m_gemm", false, true); }

Result validate(const RaggedKGemmArgs& a) {
  Checker c("ragged_k_gemm");
  c.group_count(a.num_groups).rows(a.m).row_dim("k", a.k).row_dim("n", a.n);
  c.pointer("offs", a.offs).pointer("dw", a.dw).pointer("x", a.x, a.m > 0).pointer("dy", a.dy, a.m > 0);
  c.pointer("dbias", a.dbias, false);
  c.leading_dim("ldx", a.ldx, a.k, "k").leading_dim("lddy", a.lddy, a.n, "n");
  c.require(a.dw_dtype == DType::kBF16 || a.dw_dtype == DType::kF32, "dw_dtype must be bfloat16 or float32");
  return c.result();
}

namespace {

using detail::check_activation;

// The activation forward's rules beyond its GEMM's (act_forward, fp8_act_forward).
bool check_act_forward(Checker& c, const ActivationOptions& act, int64_t m, int64_t n, const float* row_scale,
                       const void* h, int64_t ldh, const char* plain_gemm, bool bf16_h = true) {
  if (!check_activation(c, act)) return false;
  c.require(activation_info(act.activation).fused_forward, "activation ", activation_name(act.activation),
            " has no fused forward (h = pre: run ", plain_gemm, ")");
  const bool gated = is_gated(act.activation);
  c.require(!gated || n % 16 == 0, "n (the up-projection width 2I) must be a multiple of 16 (I a multiple of 8), got n=",
            n);
  c.require(row_scale == nullptr, "row_scale must be null (it scales the down projection)");
  const int64_t h_cols = gated ? n / 2 : n;
  if (bf16_h) c.pointer("h", h, m > 0).leading_dim("ldh", ldh, h_cols, gated ? "n/2" : "n");
  return true;
}

// The activation backward's rules beyond its GEMM's (act_backward, fp8_act_backward).
bool check_act_backward(Checker& c, const ActivationOptions& act, int64_t m, int64_t n, int64_t k, const void* bias,
                        const float* row_scale, const void* pre, int64_t ldpre, const void* dpre, int64_t lddpre,
                        const float* row_scale_grad, const void* out_bias, int64_t out_bias_stride,
                        const float* bias_grad) {
  c.require(bias == nullptr, "bias must be null (the input gradient has no bias)");
  if (!check_activation(c, act)) return false;
  const bool gated = is_gated(act.activation);
  const int64_t pre_cols = gated ? 2 * n : n;
  const char* pre_name = gated ? "2n" : "n";
  c.pointer("pre", pre, m > 0).pointer("dpre", dpre, m > 0);
  c.leading_dim("ldpre", ldpre, pre_cols, pre_name).leading_dim("lddpre", lddpre, pre_cols, pre_name);
  c.require(row_scale_grad == nullptr || row_scale != nullptr,
            "row_scale_grad needs row_scale (the gradient of a row scale the forward did not apply)");
  c.scalars("row_scale_grad", row_scale_grad);
  c.require(out_bias == nullptr || row_scale_grad != nullptr, "out_bias is only read for row_scale_grad");
  c.scalars("bias_grad", bias_grad);
  c.pointer("out_bias", out_bias, false);
  if (out_bias != nullptr) {
    c.require(out_bias_stride >= k && out_bias_stride % 8 == 0, "out_bias_stride must be a multiple of 8 elements and >= k=",
              k, ", got ", out_bias_stride);
  }
  return true;
}

}  // namespace

Result validate(const ActForwardArgs& a) {
  Result r = validate_ragged_m(a.gemm, "act_forward", true);
  if (!r.ok()) return r;
  Checker c("act_forward");
  if (!check_act_forward(c, a.act, a.gemm.m, a.gemm.n, a.gemm.row_scale, a.h, a.ldh, "ragged_m_gemm")) {
    return c.result();
  }
  const bool gated = is_gated(a.act.activation);
  if (a.gate_linear == GateLinear::kHalves) {
    c.require(gated, "gate_linear kHalves needs a gated activation, got ", activation_name(a.act.activation));
    c.require(a.gemm.gather_rows == nullptr, "gate_linear kHalves: no gathered rows (gather first, or interleave W)");
    c.require(a.gemm.w_stride_k == 1,
              "gate_linear kHalves needs W k-contiguous (w_stride_k == 1, e.g. the (E, 2I, H) storage read "
              "transposed), got w_stride_k=",
              a.gemm.w_stride_k);
  }
  if (a.w_linear != nullptr) {
    c.require(a.gate_linear == GateLinear::kHalves, "w_linear (the linear half as its own tensor) needs gate_linear kHalves");
    const int64_t apart = int64_t(reinterpret_cast<uintptr_t>(a.w_linear)) - int64_t(reinterpret_cast<uintptr_t>(a.gemm.w));
    const int64_t distance = apart < 0 ? -apart : apart;
    c.require(apart != 0 && distance % 16 == 0 && distance < (int64_t(1) << 40),
              "w_linear must lie a multiple of 16 bytes and less than 2^40 bytes from w (the gate half), not on it "
              "(one TMA stride spans the two tensors), got ", apart, " bytes");
    c.require(apart > 0 || a.gemm.bias == nullptr,
              "w_linear before w (the gate half) is served without a bias only (the kernel loads such pairs as "
              "(linear, gate)); got a bias and w_linear ", -apart, " bytes before w");
  }
  return c.result();
}

Result validate(const ActBackwardArgs& a) {
  Result r = validate_ragged_m(a.gemm, "act_backward", false);
  if (!r.ok()) return r;
  Checker c("act_backward");
  if (!check_act_backward(c, a.act, a.gemm.m, a.gemm.n, a.gemm.k, a.gemm.bias, a.gemm.row_scale, a.pre, a.ldpre,
                          a.dpre, a.lddpre, a.row_scale_grad, a.out_bias, a.out_bias_stride, a.bias_grad)) {
    return c.result();
  }
  const bool gated = is_gated(a.act.activation);
  if (a.dpre_layout == GateLinear::kHalves) {
    c.require(gated, "dpre_layout kHalves needs a gated activation, got ", activation_name(a.act.activation));
    c.require(a.gemm.w_stride_n == 1, "dpre_layout kHalves needs W n-contiguous (w_stride_n == 1), got w_stride_n=",
              a.gemm.w_stride_n);
    c.require(a.gemm.n % 8 == 0, "dpre_layout kHalves: n (I) must be a multiple of 8, got ", a.gemm.n);
  }
  return c.result();
}

namespace {

Result validate_fp8_ragged_m(const Fp8RaggedMGemmArgs& a, const char* op) {
  Checker c(op);
  c.group_count(a.num_groups).rows(a.m).row_dim("n", a.n);
  c.require(a.k > 0 && a.k % 16 == 0 && a.k <= kInt32Max,
            "k must be a positive multiple of 16 (e4m3 rows of 16 bytes for TMA) below 2^31, got k=", a.k);
  c.pointer("offs", a.offs).pointer("w", a.w).pointer("x", a.x, a.m > 0).pointer("y", a.y, a.m > 0);
  c.require(a.x_scale != nullptr || a.m == 0, "x_scale must not be null").scalars("x_scale", a.x_scale);
  c.require(a.w_scale != nullptr, "w_scale must not be null").scalars("w_scale", a.w_scale);
  c.pointer("bias", a.bias, false).scalars("group_scale", a.group_scale).scalars("row_scale", a.row_scale);
  c.require(a.ldx >= a.k && a.ldx % 16 == 0, "ldx must be a multiple of 16 elements (16 bytes) and >= k=", a.k,
            ", got ldx=", a.ldx);
  c.leading_dim("ldy", a.ldy, a.n, "n");
  c.require(a.w_stride_n >= a.k && a.w_stride_n % 16 == 0,
            "w_stride_n must be a multiple of 16 elements (16 bytes) and >= k=", a.k,
            " (W k-contiguous: FP8 tensor cores read no other layout), got w_stride_n=", a.w_stride_n);
  c.require(a.w_stride_group >= 0 && a.w_stride_group % 16 == 0,
            "w_stride_group must be a non-negative multiple of 16 elements (16-byte aligned expert matrices), got ",
            a.w_stride_group);
  c.require(a.x_scale_stride_row >= 0 && a.x_scale_stride_block >= 0,
            "x_scale's strides must be non-negative, got ", a.x_scale_stride_row, ", ", a.x_scale_stride_block);
  c.require(a.w_scale_stride_group >= 0 && a.w_scale_stride_k >= 0 && a.w_scale_stride_n >= 0,
            "w_scale's strides must be non-negative, got ", a.w_scale_stride_group, ", ", a.w_scale_stride_k, ", ",
            a.w_scale_stride_n);
  if (a.bias != nullptr) {
    c.require(a.bias_stride_group >= 0 && a.bias_stride_group % 8 == 0,
              "bias_stride_group must be a non-negative multiple of 8 elements, got ", a.bias_stride_group);
  }
  return c.result();
}

}  // namespace

Result validate(const Fp8RaggedMGemmArgs& a) { return validate_fp8_ragged_m(a, "fp8_ragged_m_gemm"); }

Result validate(const Fp8ActForwardArgs& a) {
  Result r = validate_fp8_ragged_m(a.gemm, "fp8_act_forward");
  if (!r.ok()) return r;
  Checker c("fp8_act_forward");
  const bool copy = a.h_q != nullptr || a.h_scale != nullptr;
  if (!copy) {
    check_act_forward(c, a.act, a.gemm.m, a.gemm.n, a.gemm.row_scale, a.h, a.ldh, "fp8_ragged_m_gemm");
    return c.result();
  }
  // h's 1 x 128 e4m3 copy instead of the bf16 h
  if (!check_act_forward(c, a.act, a.gemm.m, a.gemm.n, a.gemm.row_scale, nullptr, 0, "fp8_ragged_m_gemm", false)) {
    return c.result();
  }
  const int64_t width = a.gemm.n / 2, blocks = (width + 127) / 128;
  c.require(a.h == nullptr, "h must be null when h_q is given (h is written as its e4m3 copy instead)");
  c.require(a.h_q != nullptr && a.h_scale != nullptr, "h_q and h_scale come together (h's e4m3 copy and its 1 x 128 "
            "block scales)");
  if (!c.result().ok()) return c.result();
  c.require(is_gated(a.act.activation), "h_q is written for the gated activations only (swiglu_oai, swiglu, geglu); "
            "quantize h with quantize_fp8_1x128 for ", activation_name(a.act.activation));
  c.require(a.gemm.n % 32 == 0, "with h_q, n (the up-projection width 2I) must be a multiple of 32 (h's rows whole "
            "16-byte pieces), got n=", a.gemm.n);
  c.require(reinterpret_cast<uintptr_t>(a.h_q) % 16 == 0, "h_q must be 16-byte aligned");
  c.scalars("h_scale", a.h_scale);
  c.require(a.ld_h_q >= width && a.ld_h_q % 16 == 0, "ld_h_q must be a multiple of 16 bytes and >= h's width n/2=",
            width, ", got ld_h_q=", a.ld_h_q);
  c.require(a.ld_h_scale >= blocks, "ld_h_scale must be >= ceil(n / 256)=", blocks, ", got ld_h_scale=",
            a.ld_h_scale);
  return c.result();
}

Result validate(const Fp8ActBackwardArgs& a) {
  Result r = validate_fp8_ragged_m(a.gemm, "fp8_act_backward");
  if (!r.ok()) return r;
  Checker c("fp8_act_backward");
  if (!check_act_backward(c, a.act, a.gemm.m, a.gemm.n, a.gemm.k, a.gemm.bias, a.gemm.row_scale, a.pre, a.ldpre,
                          a.dpre, a.lddpre, a.row_scale_grad, a.out_bias, a.out_bias_stride, nullptr)) {
    return c.result();
  }
  if (a.out_bias != nullptr) {  // its term of the row-scale gradient reads the bf16 dy
    c.pointer("dy", a.dy, a.gemm.m > 0).leading_dim("lddy", a.lddy, a.gemm.k, "k");
  }
  if (a.dpre_q != nullptr || a.dpre_scale != nullptr) {  // dpre's 1 x 128 e4m3 copy
    const int64_t width = is_gated(a.act.activation) ? 2 * a.gemm.n : a.gemm.n;
    const int64_t blocks = (width + 127) / 128;
    c.require(a.dpre_q != nullptr && a.dpre_scale != nullptr, "dpre_q and dpre_scale come together (dpre's e4m3 "
              "copy and its 1 x 128 block scales)");
    c.require(is_gated(a.act.activation), "dpre_q is written for the gated activations only (swiglu_oai, swiglu, "
              "geglu); quantize dpre with quantize_fp8_1x128 for ", activation_name(a.act.activation));
    c.pointer("dpre_q", a.dpre_q).scalars("dpre_scale", a.dpre_scale);
    c.require(a.ld_dpre_q >= width && a.ld_dpre_q % 16 == 0, "ld_dpre_q must be a multiple of 16 bytes and >= dpre's "
              "width=", width, ", got ld_dpre_q=", a.ld_dpre_q);
    c.require(a.ld_dpre_scale >= blocks, "ld_dpre_scale must be >= ceil(width / 128)=", blocks, ", got ld_dpre_scale=",
              a.ld_dpre_scale);
  }
  return c.result();
}

Result validate(const Fp8RaggedKGemmArgs& a) {
  Checker c("fp8_ragged_k_gemm");
  c.group_count(a.num_groups).rows(a.m);
  c.require(a.k > 0 && a.k % 16 == 0 && a.k <= kInt32Max, "k (rows of each dw[e]) must be a positive multiple of 16 "
            "below 2^31, got k=", a.k);
  c.require(a.n > 0 && a.n % 16 == 0 && a.n <= kInt32Max, "n (columns of each dw[e]) must be a positive multiple of "
            "16 below 2^31, got n=", a.n);
  const int64_t cols = 128 * fp8_group_row_blocks(a.m, a.num_groups);
  c.require(cols <= kInt32Max, "the operands' 128 * (ceil(m / 128) + num_groups) columns must be below 2^31, got ",
            cols);
  c.pointer("offs", a.offs).pointer("dw", a.dw);
  c.pointer("a_t", a.a_t, a.m > 0).pointer("b_t", a.b_t, a.m > 0);
  c.require(a.a_scale != nullptr || a.m == 0, "a_scale must not be null").scalars("a_scale", a.a_scale);
  c.require(a.b_scale != nullptr || a.m == 0, "b_scale must not be null").scalars("b_scale", a.b_scale);
  c.require(a.lda_t >= cols && a.lda_t % 16 == 0, "lda_t must be a multiple of 16 elements (16 bytes) and >= ",
            "128 * (ceil(m / 128) + num_groups)=", cols, ", got lda_t=", a.lda_t);
  c.require(a.ldb_t >= cols && a.ldb_t % 16 == 0, "ldb_t must be a multiple of 16 elements (16 bytes) and >= ",
            "128 * (ceil(m / 128) + num_groups)=", cols, ", got ldb_t=", a.ldb_t);
  c.require(a.a_scale_stride_block >= a.k, "a_scale_stride_block must be >= k=", a.k, ", got ",
            a.a_scale_stride_block);
  c.require(a.b_scale_stride_block >= (a.n + 127) / 128, "b_scale_stride_block must be >= ceil(n / 128)=",
            (a.n + 127) / 128, ", got ", a.b_scale_stride_block);
  return c.result();
}

Result validate(const GroupColumnSumArgs& a) {
  Checker c("group_column_sum");
  c.group_count(a.num_groups).rows(a.m).row_dim("n", a.n);
  c.pointer("offs", a.offs).pointer("out", a.out);
  c.scalars("row_scale", a.row_scale);
  c.leading_dim("ld", a.ld, a.n, "n");
  if (a.index != nullptr) {
    c.require(reinterpret_cast<uintptr_t>(a.index) % 4 == 0, "index must be 4-byte aligned");
    c.require(a.src_rows >= 0 && a.src_rows <= kInt32Max, "src_rows (rows of the gathered src) must be in [0, 2^31), "
              "got src_rows=", a.src_rows);
    c.require(a.m == 0 || a.src_rows > 0, "src_rows must be >= 1 to gather m=", a.m, " rows from it");
    c.pointer("src", a.src, a.m > 0).pointer("gathered", a.gathered, a.m > 0);
    c.leading_dim("ld_gathered", a.ld_gathered, a.n, "n");
  } else {
    c.require(a.gathered == nullptr, "gathered is written only with an index to gather by");
    c.pointer("src", a.src, a.m > 0);
  }
  c.require(a.m == 0 || (a.bias == nullptr) == (a.row_dot == nullptr), "bias and row_dot go together (row_dot[r] = row r . "
            "bias[group(r)]): got ", a.bias == nullptr ? "no bias" : "a bias", " and ",
            a.row_dot == nullptr ? "no row_dot" : "a row_dot");
  if (a.bias != nullptr && a.m > 0) {
    c.pointer("bias", a.bias).scalars("row_dot", a.row_dot);
    c.leading_dim("ld_bias", a.ld_bias, a.n, "n");
  }
  return c.result();
}

}  // namespace cute_moe

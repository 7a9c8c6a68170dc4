// Tensor checks, argument builders and the call runner shared by the op files: each
// check names the tensor and says what was expected.
#pragma once

#include <type_traits>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "cute_moe/fused_activation.h"
#include "cute_moe/grouped_gemm.h"

namespace cute_moe::torch_ops {

// The fused activation ops' activation arguments in their schemas, with the declared defaults
// (cute_moe/activation.h): the default activation and alpha, no limit.
inline std::string act_schema_defaults() {
  return std::string("str activation=\"") + activation_name(kDefaultActivation) +
         "\", float alpha=" + std::to_string(kDefaultAlpha) + ", float? limit=None";
}

// The fused activation ops' activation arguments (limit taken literally: None, no clamp).
inline ActivationOptions activation_options(const std::string& activation, double alpha, std::optional<double> limit) {
  ActivationOptions o;
  TORCH_CHECK(parse_activation(activation.c_str(), &o.activation), "cute_moe: activation must be one of ",
              activation_names(), ", got '", activation, "'");
  o.alpha = static_cast<float>(alpha);
  o.has_limit = limit.has_value();
  o.limit = limit.has_value() ? static_cast<float>(*limit) : 0.0f;
  return o;
}

inline void check_cuda_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim,
                       const at::Tensor& ref) {
  TORCH_CHECK(t.is_cuda(), "cute_moe: ", name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == ref.device(), "cute_moe: ", name, " is on ", t.device(), " but x is on ", ref.device());
  TORCH_CHECK(t.scalar_type() == dtype, "cute_moe: ", name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, "cute_moe: ", name, " must be ", dim, "-D, got shape ", t.sizes());
}

inline void check_offs(const at::Tensor& offs, const at::Tensor& x, int64_t num_groups) {
  check_cuda_tensor(offs, "offs", at::kInt, 1, x);
  TORCH_CHECK(offs.size(0) == num_groups, "cute_moe: offs must hold one cumulative end offset per group (",
              num_groups, "), got shape ", offs.sizes());
  TORCH_CHECK(offs.stride(0) == 1 || offs.size(0) == 1, "cute_moe: offs must be contiguous, got stride ",
              offs.strides());
}

// An empty tensor has no layout to check (autograd hands e.g. expanded (0, n) gradients
// with strides [0, 0]); the core reads no element of it.
inline void check_row_major(const at::Tensor& t, const char* name) {
  if (t.numel() == 0) return;
  TORCH_CHECK(t.stride(-1) == 1 || t.size(-1) == 1, "cute_moe: ", name,
              " must have unit stride along its last dimension (call .contiguous()), got strides ", t.strides());
}

// Row pitch of a matrix the core reads or writes: a matrix of at most one row (or none)
// may carry any stride along its rows, so it gets its row length.
inline int64_t row_stride(const at::Tensor& t) { return t.size(0) <= 1 ? t.size(1) : t.stride(0); }

inline void throw_if_error(const Result& r) {
  if (!r.ok()) TORCH_CHECK(false, "cute_moe: ", r.message, " [", status_name(r.status), "]");
}

// A workspace tensor of `bytes` on `like`'s device. Freed when the op returns: the caching
// allocator reuses it only for work queued behind this call on the same stream.
inline at::Tensor workspace_tensor(size_t bytes, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, like.options().dtype(at::kByte));
}

// Runs one of the core's planned GEMM calls (ragged_m_gemm, act_forward, ...) on the current
// stream: planned once, with the options the environment variables ask for
// (options_from_environment: CUTE_MOE_CONFIG, ...), its workspace allocated on `like`'s device.
template <typename Args>
void enqueue_planned(Result (*call)(const Args&, const WorkspaceAllocator&, cudaStream_t, const GemmOptions&),
                     const Args& a, const at::Tensor& like) {
  at::Tensor ws;
  const WorkspaceAllocator allocate = [&](size_t bytes) {
    ws = workspace_tensor(bytes, like);
    return ws.data_ptr();
  };
  throw_if_error(call(a, allocate, at::cuda::getCurrentCUDAStream(), options_from_environment()));
}

// Runs a call that takes a sized workspace and no options (group_column_sum).
template <typename Args>
void enqueue_with_workspace(Result (*call)(const Args&, void*, size_t, cudaStream_t), const Args& a,
                            const at::Tensor& like) {
  size_t bytes = 0;
  throw_if_error(workspace_size(a, &bytes));
  at::Tensor ws = workspace_tensor(bytes, like);
  throw_if_error(call(a, ws.data_ptr(), bytes, at::cuda::getCurrentCUDAStream()));
}

// Ragged-M GEMM arguments for y = x @ w[e] (+ bias[e]) with w (E, K, N) in either layout.
inline RaggedMGemmArgs ragged_m_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                                     const std::optional<at::Tensor>& bias, const at::Tensor& y) {
  RaggedMGemmArgs a;
  a.m = x.size(0);
  a.n = w.size(2);
  a.k = x.size(1);
  a.num_groups = static_cast<int32_t>(w.size(0));
  a.offs = offs.data_ptr<int32_t>();
  a.x = x.data_ptr();
  a.ldx = row_stride(x);
  a.w = w.data_ptr();
  a.w_stride_group = w.stride(0);
  // A dimension of size 1 has an arbitrary stride: keep the one that says "contiguous".
  a.w_stride_k = w.stride(1) == 1 && w.stride(2) != 1 ? 1 : w.stride(1);
  a.w_stride_n = w.stride(2) == 1 ? 1 : w.stride(2);
  if (bias.has_value()) {
    a.bias = bias->data_ptr();
    a.bias_stride_group = bias->stride(0);
  }
  a.y = y.data_ptr();
  a.ldy = row_stride(y);
  return a;
}

// x (M, K) bf16 row-major, w (E, K, N) bf16 in one of its two layouts, offs (E,) int32.
// w_rows: w's K when it holds only the first of x's columns' rows (the rest elsewhere).
inline void check_ragged_m_operands(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                                    int64_t w_rows = -1) {
  check_cuda_tensor(x, "x", at::kBFloat16, 2, x);
  check_cuda_tensor(w, "w", at::kBFloat16, 3, x);
  const int64_t k = w_rows < 0 ? x.size(1) : w_rows;
  TORCH_CHECK(w.size(1) == k, "cute_moe: w must be (E, K, N) with K = ", k, w_rows < 0 ? " = x.size(1)" : "",
              ", got w of shape ", w.sizes());
  check_row_major(x, "x");
  TORCH_CHECK(w.stride(2) == 1 || w.stride(1) == 1,
              "cute_moe: w (E, K, N) must be contiguous along N (row-major) or along K (a transposed view of an "
              "(E, N, K) tensor), got strides ",
              w.strides());
  check_offs(offs, x, w.size(0));
}

// Optional per-group bias (E, N) matching w (E, K, N).
// The activation backward's extra tensors (act_backward, fp8_act_backward): pre (m, pre_cols)
// bf16 row-major; prob needed for prob_grad; out_bias (E, H) bf16 row-major, only with
// prob_grad. dy is (m, H), the experts E.
inline void check_act_backward_tensors(const at::Tensor& pre, int64_t pre_cols, const at::Tensor& dy, int64_t experts,
                                       const std::optional<at::Tensor>& prob,
                                       const std::optional<at::Tensor>& out_bias, bool prob_grad,
                                       const std::string& what) {
  const int64_t m = dy.size(0);
  check_cuda_tensor(pre, "pre", at::kBFloat16, 2, dy);
  TORCH_CHECK(pre.size(0) == m && pre.size(1) == pre_cols, "cute_moe: pre must be (M, ", pre_cols, ") = (", m, ", ",
              pre_cols, ") for ", what, ", got ", pre.sizes());
  check_row_major(pre, "pre");
  TORCH_CHECK(!prob_grad || prob.has_value(), "cute_moe: prob_grad needs prob");
  TORCH_CHECK(!out_bias.has_value() || prob_grad, "cute_moe: out_bias is only read for prob_grad");
  if (out_bias.has_value()) {
    check_cuda_tensor(*out_bias, "out_bias", at::kBFloat16, 2, dy);
    TORCH_CHECK(out_bias->size(0) == experts && out_bias->size(1) == dy.size(1), "cute_moe: out_bias must be (E, H) = (",
                experts, ", ", dy.size(1), "), got ", out_bias->sizes());
    check_row_major(*out_bias, "out_bias");
  }
}

// The activation backward's outputs and extra inputs into its arguments (ActBackwardArgs,
// Fp8ActBackwardArgs): pre read, dpre written, dprob when prob_grad, out_bias for its term.
template <typename Args>
void set_act_backward_tensors(Args& a, const at::Tensor& pre, at::Tensor& dpre, at::Tensor& dprob, bool prob_grad,
                              const std::optional<at::Tensor>& out_bias) {
  a.pre = pre.data_ptr();
  a.ldpre = row_stride(pre);
  a.dpre = dpre.data_ptr();
  a.lddpre = row_stride(dpre);
  if (prob_grad) a.row_scale_grad = dprob.data_ptr<float>();
  if (out_bias.has_value()) {
    a.out_bias = out_bias->data_ptr();
    a.out_bias_stride = out_bias->stride(0);
  }
}

// n: the output's columns where w holds only part of them (-1: w's N).
inline void check_bias(const std::optional<at::Tensor>& bias, const at::Tensor& w, const at::Tensor& x,
                       int64_t n = -1) {
  if (!bias.has_value()) return;
  if (n < 0) n = w.size(2);
  check_cuda_tensor(*bias, "bias", at::kBFloat16, 2, x);
  TORCH_CHECK(bias->size(0) == w.size(0) && bias->size(1) == n, "cute_moe: bias must be (E, N) = (", w.size(0),
              ", ", n, "), got ", bias->sizes());
  check_row_major(*bias, "bias");
}

// Optional fp32 vector of `length` elements (a per-group or per-row scale), contiguous.
inline const float* optional_scales(const std::optional<at::Tensor>& t, const char* name, int64_t length,
                                    const char* length_name, const at::Tensor& x) {
  if (!t.has_value()) return nullptr;
  check_cuda_tensor(*t, name, at::kFloat, 1, x);
  TORCH_CHECK(t->size(0) == length, "cute_moe: ", name, " must have ", length_name, " = ", length,
              " elements, got shape ", t->sizes());
  TORCH_CHECK(t->is_contiguous(), "cute_moe: ", name, " must be contiguous, got strides ", t->strides());
  return t->data_ptr<float>();
}

}  // namespace cute_moe::torch_ops

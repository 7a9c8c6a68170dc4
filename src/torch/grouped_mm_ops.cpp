// PyTorch ops over the core grouped GEMMs: schemas (TORCH_LIBRARY) and CUDA kernels.
//
// This layer only checks tensors (naming each one in its errors), allocates outputs and
// the workspace through PyTorch's caching allocator, and calls the core on the current
// stream. Fake (meta) kernels, CPU kernels (the reference) and autograd are registered
// from Python (cute_moe/_ops.py), so no pybind11 is needed: load this library with
// torch.ops.load_library.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cute_moe/grouped_gemm.h"
#include "tensor_checks.h"

namespace cute_moe::torch_ops {

namespace {

// w_hi: W's rows past w's in a tensor of their own, y = x @ [w; w_hi] (the input gradient
// through an up projection kept as two parameters, torchtitan's w1 and w3). Read in place
// where both have one set of strides and w's rows are a multiple of kSplitKMultiple; else
// joined into one tensor first (a copy).
at::Tensor grouped_mm_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                           const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& w_hi) {
  if (w_hi.has_value()) {
    check_cuda_tensor(*w_hi, "w_hi", at::kBFloat16, 3, x);
    check_cuda_tensor(w, "w", at::kBFloat16, 3, x);
    TORCH_CHECK(x.dim() == 2 && w_hi->size(0) == w.size(0) && w_hi->size(2) == w.size(2) &&
                    w.size(1) + w_hi->size(1) == x.size(1),
                "cute_moe: w and w_hi must be (E, K1, N) and (E, K2, N) with K1 + K2 = x.size(1), got x ", x.sizes(),
                ", w ", w.sizes(), ", w_hi ", w_hi->sizes());
    if (w.size(1) == 0 || w_hi->size(1) == 0 || w.size(1) % kSplitKMultiple != 0 || w_hi->strides() != w.strides()) {
      return grouped_mm_cuda(x, at::cat({w, *w_hi}, 1), offs, bias, std::nullopt);
    }
  }
  check_ragged_m_operands(x, w, offs, w_hi.has_value() ? w.size(1) : -1);
  check_bias(bias, w, x);

  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({x.size(0), w.size(2)}, x.options());
  RaggedMGemmArgs a = ragged_m_args(x, w, offs, bias, y);
  if (w_hi.has_value()) {
    a.w_hi = w_hi->data_ptr();
    a.k_split = w.size(1);
  }
  if (a.m == 0) return y;

  enqueue_planned(ragged_m_gemm, a, x);
  return y;
}

std::tuple<at::Tensor, at::Tensor> grouped_mm_wgrad_cuda(const at::Tensor& x, const at::Tensor& dy,
                                                         const at::Tensor& offs,
                                                         std::optional<at::ScalarType> out_dtype, bool bias_grad) {
  check_cuda_tensor(x, "x", at::kBFloat16, 2, x);
  check_cuda_tensor(dy, "dy", at::kBFloat16, 2, x);
  TORCH_CHECK(dy.size(0) == x.size(0), "cute_moe: dy must have as many rows as x (", x.size(0), "), got shape ",
              dy.sizes());
  check_row_major(x, "x");
  check_row_major(dy, "dy");
  const at::ScalarType dtype = out_dtype.value_or(at::kBFloat16);
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat,
              "cute_moe: out_dtype of the weight gradient must be bfloat16 or float32, got ", dtype);
  const int64_t num_groups = offs.dim() == 1 ? offs.size(0) : -1;
  check_offs(offs, x, num_groups);

  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dw = at::empty({num_groups, x.size(1), dy.size(1)}, x.options().dtype(dtype));
  at::Tensor db = bias_grad ? at::empty({num_groups, dy.size(1)}, x.options().dtype(at::kFloat))
                            : at::empty({0}, x.options().dtype(at::kFloat));
  RaggedKGemmArgs a;
  a.m = x.size(0);
  a.k = x.size(1);
  a.n = dy.size(1);
  a.num_groups = static_cast<int32_t>(num_groups);
  a.offs = offs.data_ptr<int32_t>();
  a.x = x.data_ptr();
  a.ldx = row_stride(x);
  a.dy = dy.data_ptr();
  a.lddy = row_stride(dy);
  a.dw = dw.data_ptr();
  a.dw_dtype = dtype == at::kFloat ? DType::kF32 : DType::kBF16;
  a.dbias = bias_grad ? db.data_ptr<float>() : nullptr;

  enqueue_planned(ragged_k_gemm, a, x);
  return {dw, db};
}

// y = prob[r] * (scale[e] * (x @ w[e]) + bias[e]): the down projection of an expert FFN
// with the router probabilities and the per-expert scale in its epilogue.
at::Tensor grouped_mm_scaled_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                                  const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& scale,
                                  const std::optional<at::Tensor>& prob) {
  check_ragged_m_operands(x, w, offs);
  check_bias(bias, w, x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({x.size(0), w.size(2)}, x.options());
  RaggedMGemmArgs a = ragged_m_args(x, w, offs, bias, y);
  a.group_scale = optional_scales(scale, "scale", w.size(0), "E", x);
  a.row_scale = optional_scales(prob, "prob", x.size(0), "M", x);
  if (a.m == 0) return y;
  enqueue_planned(ragged_m_gemm, a, x);
  return y;
}

at::Tensor grouped_column_sum_cuda(const at::Tensor& src, const at::Tensor& offs,
                                   const std::optional<at::Tensor>& row_scale) {
  check_cuda_tensor(src, "src", at::kBFloat16, 2, src);
  check_row_major(src, "src");
  const int64_t num_groups = offs.dim() == 1 ? offs.size(0) : -1;
  check_offs(offs, src, num_groups);

  const c10::cuda::CUDAGuard guard(src.device());
  at::Tensor out = at::empty({num_groups, src.size(1)}, src.options().dtype(at::kFloat));
  GroupColumnSumArgs a;
  a.m = src.size(0);
  a.n = src.size(1);
  a.num_groups = static_cast<int32_t>(num_groups);
  a.offs = offs.data_ptr<int32_t>();
  a.src = src.data_ptr();
  a.ld = row_stride(src);
  a.row_scale = optional_scales(row_scale, "row_scale", src.size(0), "M", src);
  a.out = out.data_ptr<float>();
  enqueue_with_workspace(group_column_sum, a, src);
  return out;
}

// The output-side gradients of y = row_scale * (h @ W[e] + bias[e]) from its gradient dy,
// in one pass over dy: db (E, N) fp32 = the column sums of row_scale * dy per group,
// bias_dot (M,) fp32 = dy[r] . bias[group(r)] (the bias term of row_scale's gradient; (0,)
// without a bias), and, with index, dy gathered from src (the combine's output gradient,
// dy[r] = src[index[r]]) returned as `gathered` ((0, N) without an index).
std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_bias_grads_cuda(const at::Tensor& src, const at::Tensor& offs,
                                                                      const std::optional<at::Tensor>& row_scale,
                                                                      const std::optional<at::Tensor>& bias,
                                                                      const std::optional<at::Tensor>& index) {
  check_cuda_tensor(src, "src", at::kBFloat16, 2, src);
  check_row_major(src, "src");
  const int64_t num_groups = offs.dim() == 1 ? offs.size(0) : -1;
  check_offs(offs, src, num_groups);
  int64_t m = src.size(0);
  if (index.has_value()) {
    check_cuda_tensor(*index, "index", at::kInt, 1, src);
    TORCH_CHECK(index->is_contiguous(), "cute_moe: index must be contiguous, got strides ", index->strides());
    m = index->size(0);
  }
  const int64_t n = src.size(1);
  if (bias.has_value()) {
    check_cuda_tensor(*bias, "bias", at::kBFloat16, 2, src);
    TORCH_CHECK(bias->size(0) == num_groups && bias->size(1) == n, "cute_moe: bias must be (E, N) = (", num_groups,
                ", ", n, "), got ", bias->sizes());
    check_row_major(*bias, "bias");
  }

  const c10::cuda::CUDAGuard guard(src.device());
  at::Tensor db = at::empty({num_groups, n}, src.options().dtype(at::kFloat));
  at::Tensor bias_dot = at::empty({bias.has_value() ? m : 0}, src.options().dtype(at::kFloat));
  at::Tensor gathered = at::empty({index.has_value() ? m : 0, n}, src.options());
  GroupColumnSumArgs a;
  a.m = m;
  a.n = n;
  a.num_groups = static_cast<int32_t>(num_groups);
  a.offs = offs.data_ptr<int32_t>();
  a.src = src.data_ptr();
  a.ld = row_stride(src);
  a.row_scale = optional_scales(row_scale, "row_scale", m, "M (rows of dy)", src);
  a.out = db.data_ptr<float>();
  if (index.has_value()) {
    a.index = index->data_ptr<int32_t>();
    a.src_rows = src.size(0);
    a.gathered = gathered.data_ptr();
    a.ld_gathered = row_stride(gathered);
  }
  if (bias.has_value()) {
    a.bias = bias->data_ptr();
    a.ld_bias = row_stride(*bias);
    a.row_dot = bias_dot.data_ptr<float>();
  }
  enqueue_with_workspace(group_column_sum, a, src);
  return {db, bias_dot, gathered};
}

// The compiled kernels as "call:activation:config" strings (see cute_moe::list_kernels).
std::vector<std::string> kernel_table() {
  std::vector<std::string> rows;
  for (const auto& k : list_kernels()) rows.push_back(k.call + ":" + k.activation + ":" + k.config);
  return rows;
}

}  // namespace

TORCH_LIBRARY(cute_moe, m) {
  m.def("kernel_table() -> str[]", &kernel_table);
  m.def("grouped_mm(Tensor x, Tensor w, Tensor offs, Tensor? bias=None, Tensor? w_hi=None) -> Tensor");
  m.def(
      "grouped_mm_wgrad(Tensor x, Tensor dy, Tensor offs, ScalarType? out_dtype=None, bool bias_grad=False) "
      "-> (Tensor, Tensor)");
  m.def("grouped_column_sum(Tensor src, Tensor offs, Tensor? row_scale=None) -> Tensor");
  m.def("grouped_bias_grads(Tensor src, Tensor offs, Tensor? row_scale=None, Tensor? bias=None, "
        "Tensor? index=None) -> (Tensor db, Tensor bias_dot, Tensor gathered)");
  m.def("grouped_mm_scaled(Tensor x, Tensor w, Tensor offs, Tensor? bias=None, Tensor? scale=None, "
        "Tensor? prob=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(cute_moe, CUDA, m) {
  m.impl("grouped_mm", &grouped_mm_cuda);
  m.impl("grouped_mm_wgrad", &grouped_mm_wgrad_cuda);
  m.impl("grouped_column_sum", &grouped_column_sum_cuda);
  m.impl("grouped_bias_grads", &grouped_bias_grads_cuda);
  m.impl("grouped_mm_scaled", &grouped_mm_scaled_cuda);
}

}  // namespace cute_moe::torch_ops

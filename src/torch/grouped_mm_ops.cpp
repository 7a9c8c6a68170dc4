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

namespace cute_moe::torch_ops {

namespace {

void check_cuda_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim,
                       const at::Tensor& ref) {
  TORCH_CHECK(t.is_cuda(), "cute_moe: ", name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == ref.device(), "cute_moe: ", name, " is on ", t.device(), " but x is on ", ref.device());
  TORCH_CHECK(t.scalar_type() == dtype, "cute_moe: ", name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, "cute_moe: ", name, " must be ", dim, "-D, got shape ", t.sizes());
}

void check_offs(const at::Tensor& offs, const at::Tensor& x, int64_t num_groups) {
  check_cuda_tensor(offs, "offs", at::kInt, 1, x);
  TORCH_CHECK(offs.size(0) == num_groups, "cute_moe: offs must hold one cumulative end offset per group (",
              num_groups, "), got shape ", offs.sizes());
  TORCH_CHECK(offs.stride(0) == 1 || offs.size(0) == 1, "cute_moe: offs must be contiguous, got stride ",
              offs.strides());
}

void check_row_major(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.stride(-1) == 1 || t.size(-1) == 1, "cute_moe: ", name,
              " must have unit stride along its last dimension (call .contiguous()), got strides ", t.strides());
}

void throw_if_error(const Result& r) {
  if (!r.ok()) TORCH_CHECK(false, "cute_moe: ", r.message, " [", status_name(r.status), "]");
}

at::Tensor workspace(size_t bytes, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, like.options().dtype(at::kByte));
}

at::Tensor grouped_mm_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                           const std::optional<at::Tensor>& bias) {
  check_cuda_tensor(x, "x", at::kBFloat16, 2, x);
  check_cuda_tensor(w, "w", at::kBFloat16, 3, x);
  TORCH_CHECK(w.size(1) == x.size(1), "cute_moe: w must be (E, K, N) with K = x.size(1) = ", x.size(1),
              ", got w of shape ", w.sizes());
  check_row_major(x, "x");
  TORCH_CHECK(w.stride(2) == 1 || w.stride(1) == 1,
              "cute_moe: w (E, K, N) must be contiguous along N (row-major) or along K (a transposed view of an "
              "(E, N, K) tensor), got strides ",
              w.strides());
  const int64_t num_groups = w.size(0);
  check_offs(offs, x, num_groups);
  if (bias.has_value()) {
    check_cuda_tensor(*bias, "bias", at::kBFloat16, 2, x);
    TORCH_CHECK(bias->size(0) == num_groups && bias->size(1) == w.size(2), "cute_moe: bias must be (E, N) = (",
                num_groups, ", ", w.size(2), "), got ", bias->sizes());
    check_row_major(*bias, "bias");
  }

  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({x.size(0), w.size(2)}, x.options());
  RaggedMGemmArgs a;
  a.m = x.size(0);
  a.n = w.size(2);
  a.k = x.size(1);
  a.num_groups = static_cast<int32_t>(num_groups);
  a.offs = offs.data_ptr<int32_t>();
  a.x = x.data_ptr();
  a.ldx = x.stride(0);
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
  a.ldy = y.stride(0);
  if (a.m == 0) return y;

  size_t bytes = 0;
  throw_if_error(workspace_size(a, &bytes));
  at::Tensor ws = workspace(bytes, x);
  throw_if_error(ragged_m_gemm(a, ws.data_ptr(), bytes, at::cuda::getCurrentCUDAStream()));
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
  a.ldx = x.stride(0);
  a.dy = dy.data_ptr();
  a.lddy = dy.stride(0);
  a.dw = dw.data_ptr();
  a.dw_dtype = dtype == at::kFloat ? DType::kF32 : DType::kBF16;
  a.dbias = bias_grad ? db.data_ptr<float>() : nullptr;

  size_t bytes = 0;
  throw_if_error(workspace_size(a, &bytes));
  at::Tensor ws = workspace(bytes, x);
  throw_if_error(ragged_k_gemm(a, ws.data_ptr(), bytes, at::cuda::getCurrentCUDAStream()));
  return {dw, db};
}

at::Tensor grouped_column_sum_cuda(const at::Tensor& src, const at::Tensor& offs) {
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
  a.ld = src.stride(0);
  a.out = out.data_ptr<float>();
  size_t bytes = 0;
  throw_if_error(workspace_size(a, &bytes));
  at::Tensor ws = workspace(bytes, src);
  throw_if_error(group_column_sum(a, ws.data_ptr(), bytes, at::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace

TORCH_LIBRARY(cute_moe, m) {
  m.def("grouped_mm(Tensor x, Tensor w, Tensor offs, Tensor? bias=None) -> Tensor");
  m.def(
      "grouped_mm_wgrad(Tensor x, Tensor dy, Tensor offs, ScalarType? out_dtype=None, bool bias_grad=False) "
      "-> (Tensor, Tensor)");
  m.def("grouped_column_sum(Tensor src, Tensor offs) -> Tensor");
}

TORCH_LIBRARY_IMPL(cute_moe, CUDA, m) {
  m.impl("grouped_mm", &grouped_mm_cuda);
  m.impl("grouped_mm_wgrad", &grouped_mm_wgrad_cuda);
  m.impl("grouped_column_sum", &grouped_column_sum_cuda);
}

}  // namespace cute_moe::torch_ops

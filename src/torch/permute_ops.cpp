// PyTorch ops over the permute / unpermute gathers (cute_moe/permute.h): schemas and
// CUDA kernels. Fake kernels, CPU kernels (the references) and the autograd of
// permute / unpermute, which spans several ops, live in Python (cute_moe/permute.py).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cute_moe/permute.h"
#include "tensor_checks.h"

namespace cute_moe::torch_ops {

namespace {

// dtype, rank and device, naming `ref` in the device message.
void check_operand(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim, const at::Tensor& ref,
                   const char* ref_name) {
  TORCH_CHECK(t.is_cuda(), "cute_moe: ", name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == ref.device(), "cute_moe: ", name, " is on ", t.device(), " but ", ref_name, " is on ",
              ref.device());
  TORCH_CHECK(t.scalar_type() == dtype, "cute_moe: ", name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, "cute_moe: ", name, " must be ", dim, "-D, got shape ", t.sizes());
}

// bf16 rows read with 16-byte vectors: unit column stride, row stride a multiple of 8
// elements, 16-byte aligned start (the core repeats the last two with raw values).
void check_vector_rows(const at::Tensor& t, const char* name) {
  check_row_major(t, name);
  if (t.numel() == 0) return;
  TORCH_CHECK(t.size(0) == 1 || t.stride(0) % 8 == 0,
              "cute_moe: ", name, " must have a row stride that is a multiple of 8 elements (call .contiguous()), got "
              "strides ", t.strides(), " for shape ", t.sizes());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "cute_moe: ", name,
              " must start 16-byte aligned (a view at a storage offset of ", t.storage_offset(),
              " elements is not; call .contiguous())");
}

void check_row_length(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.size(1) % 8 == 0, "cute_moe: ", name,
              " must have a multiple of 8 columns (rows of 16-byte vectors), got shape ", t.sizes());
}

void check_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_contiguous(), "cute_moe: ", name, " must be contiguous, got strides ", t.strides(), " for shape ",
              t.sizes());
}

// index (T, k) int32 contiguous, and the optional fp32 weight of the same shape.
void check_choices(const at::Tensor& index, const std::optional<at::Tensor>& weight, const at::Tensor& ref,
                   const char* ref_name) {
  check_operand(index, "index", at::kInt, 2, ref, ref_name);
  check_contiguous(index, "index");
  if (!weight.has_value()) return;
  check_operand(*weight, "weight", at::kFloat, 2, ref, ref_name);
  TORCH_CHECK(weight->sizes() == index.sizes(), "cute_moe: weight must have index's shape ", index.sizes(), ", got ",
              weight->sizes());
  check_contiguous(*weight, "weight");
}

at::Tensor gather_rows_cuda(const at::Tensor& src, const at::Tensor& index, const std::optional<at::Tensor>& scale) {
  check_operand(src, "src", at::kBFloat16, 2, src, "src");
  check_row_length(src, "src");
  check_vector_rows(src, "src");
  check_operand(index, "index", at::kInt, 1, src, "src");
  check_contiguous(index, "index");
  if (scale.has_value()) {
    check_operand(*scale, "scale", at::kFloat, 1, src, "src");
    TORCH_CHECK(scale->size(0) == index.size(0), "cute_moe: scale must have one entry per index (", index.size(0),
                "), got shape ", scale->sizes());
    check_contiguous(*scale, "scale");
  }

  const c10::cuda::CUDAGuard guard(src.device());
  at::Tensor out = at::empty({index.size(0), src.size(1)}, src.options());
  GatherRowsArgs a;
  a.rows = index.size(0);
  a.cols = src.size(1);
  a.src_rows = src.size(0);
  a.src = src.data_ptr();
  a.ld_src = row_stride(src);
  a.index = index.data_ptr<int32_t>();
  a.scale = scale.has_value() ? scale->data_ptr<float>() : nullptr;
  a.out = out.data_ptr();
  a.ld_out = row_stride(out);
  throw_if_error(gather_rows(a, at::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor gather_sum_rows_cuda(const at::Tensor& src, const at::Tensor& index,
                                const std::optional<at::Tensor>& weight) {
  check_operand(src, "src", at::kBFloat16, 2, src, "src");
  check_row_length(src, "src");
  check_vector_rows(src, "src");
  check_choices(index, weight, src, "src");

  const c10::cuda::CUDAGuard guard(src.device());
  at::Tensor out = at::empty({index.size(0), src.size(1)}, src.options());
  GatherSumRowsArgs a;
  a.rows = index.size(0);
  a.k = index.size(1);
  a.cols = src.size(1);
  a.src_rows = src.size(0);
  a.src = src.data_ptr();
  a.ld_src = row_stride(src);
  a.index = index.data_ptr<int32_t>();
  a.weight = weight.has_value() ? weight->data_ptr<float>() : nullptr;
  a.out = out.data_ptr();
  a.ld_out = row_stride(out);
  throw_if_error(gather_sum_rows(a, at::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor gather_rows_dot_cuda(const at::Tensor& a_in, const at::Tensor& src, const at::Tensor& index) {
  check_operand(a_in, "a", at::kBFloat16, 2, a_in, "a");
  check_row_length(a_in, "a");
  check_vector_rows(a_in, "a");
  check_operand(src, "src", at::kBFloat16, 2, a_in, "a");
  TORCH_CHECK(src.size(1) == a_in.size(1), "cute_moe: src must have as many columns as a (", a_in.size(1),
              "), got shape ", src.sizes());
  check_vector_rows(src, "src");
  check_choices(index, std::nullopt, a_in, "a");
  TORCH_CHECK(index.size(0) == a_in.size(0), "cute_moe: index must have one row per row of a (", a_in.size(0),
              "), got shape ", index.sizes());

  const c10::cuda::CUDAGuard guard(a_in.device());
  at::Tensor out = at::empty({index.size(0), index.size(1)}, a_in.options().dtype(at::kFloat));
  GatherRowsDotArgs a;
  a.rows = index.size(0);
  a.k = index.size(1);
  a.cols = a_in.size(1);
  a.src_rows = src.size(0);
  a.a = a_in.data_ptr();
  a.ld_a = row_stride(a_in);
  a.src = src.data_ptr();
  a.ld_src = row_stride(src);
  a.index = index.data_ptr<int32_t>();
  a.out = out.data_ptr<float>();
  throw_if_error(gather_rows_dot(a, at::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cute_moe, m) {
  m.def("gather_rows(Tensor src, Tensor index, Tensor? scale=None) -> Tensor");
  m.def("gather_sum_rows(Tensor src, Tensor index, Tensor? weight=None) -> Tensor");
  m.def("gather_rows_dot(Tensor a, Tensor src, Tensor index) -> Tensor");
}

TORCH_LIBRARY_IMPL(cute_moe, CUDA, m) {
  m.impl("gather_rows", &gather_rows_cuda);
  m.impl("gather_sum_rows", &gather_sum_rows_cuda);
  m.impl("gather_rows_dot", &gather_rows_dot_cuda);
}

}  // namespace cute_moe::torch_ops

// PyTorch ops over the routing kernels (cute_moe/routing.h): schemas and CUDA kernels.
// Fake kernels, CPU kernels (the references) and the autograd of top_k's values and of the
// sorted router weights live in Python (cute_moe/ops/routing.py, cute_moe/nn/).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cute_moe/routing.h"
#include "tensor_checks.h"

namespace cute_moe::torch_ops {

namespace {

void check_contiguous_cuda(const at::Tensor& t, const char* name, const at::Tensor& ref) {
  TORCH_CHECK(t.is_cuda(), "cute_moe: ", name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == ref.device(), "cute_moe: ", name, " is on ", t.device(), " but the first input is on ",
              ref.device());
  TORCH_CHECK(t.dim() == 2, "cute_moe: ", name, " must be 2-D, got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), "cute_moe: ", name, " must be contiguous, got strides ", t.strides(), " for shape ",
              t.sizes());
}

std::tuple<at::Tensor, at::Tensor> top_k_cuda(const at::Tensor& logits, int64_t k) {
  check_contiguous_cuda(logits, "logits", logits);
  TORCH_CHECK(logits.scalar_type() == at::kFloat, "cute_moe: logits must be float32, got ", logits.scalar_type());
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor values = at::empty({logits.size(0), k}, logits.options());
  at::Tensor indices = at::empty({logits.size(0), k}, logits.options().dtype(at::kLong));
  TopKArgs a;
  a.rows = logits.size(0);
  a.cols = logits.size(1);
  a.k = k;
  a.logits = logits.data_ptr<float>();
  a.ld_logits = logits.size(1);
  a.values = values.data_ptr<float>();
  a.indices = indices.data_ptr<int64_t>();
  throw_if_error(top_k(a, at::cuda::getCurrentCUDAStream()));
  return {values, indices};
}

// prob: the weights in sorted order, or an empty tensor without weights.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sort_by_expert_cuda(
    const at::Tensor& experts, int64_t num_experts, const std::optional<at::Tensor>& weights) {
  check_contiguous_cuda(experts, "experts", experts);
  TORCH_CHECK(experts.scalar_type() == at::kLong || experts.scalar_type() == at::kInt,
              "cute_moe: experts must be int64 or int32, got ", experts.scalar_type());
  if (weights.has_value()) {
    check_contiguous_cuda(*weights, "weights", experts);
    TORCH_CHECK(weights->scalar_type() == at::kFloat, "cute_moe: weights must be float32, got ",
                weights->scalar_type());
    TORCH_CHECK(weights->sizes() == experts.sizes(), "cute_moe: weights must have experts' shape ", experts.sizes(),
                ", got ", weights->sizes());
  }
  const c10::cuda::CUDAGuard guard(experts.device());
  const int64_t rows = experts.size(0), k = experts.size(1), m = rows * k;
  const auto int32 = experts.options().dtype(at::kInt);
  at::Tensor row_token = at::empty({m}, int32);
  at::Tensor token_rows = at::empty({rows, k}, int32);
  at::Tensor offs = at::empty({num_experts}, int32);
  at::Tensor prob = at::empty({weights.has_value() ? m : 0}, experts.options().dtype(at::kFloat));
  at::Tensor ws = workspace_tensor(sort_by_expert_workspace_bytes(m, num_experts), experts);
  SortByExpertArgs a;
  a.rows = rows;
  a.k = k;
  a.num_experts = num_experts;
  a.experts = experts.data_ptr();
  a.experts_int32 = experts.scalar_type() == at::kInt;
  a.weights = weights.has_value() ? weights->data_ptr<float>() : nullptr;
  a.row_token = row_token.data_ptr<int32_t>();
  a.token_rows = token_rows.data_ptr<int32_t>();
  a.offs = offs.data_ptr<int32_t>();
  a.prob = weights.has_value() ? prob.data_ptr<float>() : nullptr;
  a.workspace = ws.data_ptr();
  throw_if_error(sort_by_expert(a, at::cuda::getCurrentCUDAStream()));
  return {row_token, token_rows, offs, prob};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cute_moe, m) {
  m.def("top_k(Tensor logits, int k) -> (Tensor values, Tensor indices)");
  m.def("sort_by_expert(Tensor experts, int num_experts, Tensor? weights=None) -> "
        "(Tensor row_token, Tensor token_rows, Tensor offs, Tensor prob)");
}

TORCH_LIBRARY_IMPL(cute_moe, CUDA, m) {
  m.impl("top_k", &top_k_cuda);
  m.impl("sort_by_expert", &sort_by_expert_cuda);
}

}  // namespace cute_moe::torch_ops

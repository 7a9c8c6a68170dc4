// PyTorch ops over the fused gated-activation GEMMs (cute_moe/fused_glu.h): the expert
// up-projection with SwiGLU in its epilogue, and the down-projection input gradient with
// the SwiGLU backward in its epilogue. Autograd across the pair lives in Python
// (cute_moe/expert_ffn.py), since the forward hands `pre` to the backward.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cute_moe/fused_glu.h"
#include "tensor_checks.h"

namespace cute_moe::torch_ops {

namespace {

GluOptions swiglu_options(double alpha, std::optional<double> limit) {
  GluOptions o;
  o.activation = GluActivation::kSwigluOai;
  o.alpha = static_cast<float>(alpha);
  o.has_limit = limit.has_value();
  o.limit = limit.has_value() ? static_cast<float>(*limit) : 0.0f;
  return o;
}

std::tuple<at::Tensor, at::Tensor> grouped_mm_swiglu_cuda(const at::Tensor& x, const at::Tensor& w,
                                                          const at::Tensor& offs,
                                                          const std::optional<at::Tensor>& bias, double alpha,
                                                          std::optional<double> limit) {
  check_ragged_m_operands(x, w, offs);
  check_bias(bias, w, x);
  TORCH_CHECK(w.size(2) % 2 == 0, "cute_moe: w must have an even number of columns (interleaved gate/linear), got ",
              w.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor pre = at::empty({x.size(0), w.size(2)}, x.options());
  at::Tensor h = at::empty({x.size(0), w.size(2) / 2}, x.options());
  GluForwardArgs a;
  a.gemm = ragged_m_args(x, w, offs, bias, pre);
  a.h = h.data_ptr();
  a.ldh = h.stride(0);
  a.glu = swiglu_options(alpha, limit);
  if (a.gemm.m == 0) return {h, pre};
  size_t bytes = 0;
  throw_if_error(workspace_size(a, &bytes));
  at::Tensor ws = workspace(bytes, x);
  throw_if_error(glu_forward(a, ws.data_ptr(), bytes, at::cuda::getCurrentCUDAStream()));
  return {h, pre};
}

std::tuple<at::Tensor, at::Tensor> grouped_mm_swiglu_bwd_cuda(const at::Tensor& dy, const at::Tensor& w,
                                                              const at::Tensor& offs, const at::Tensor& pre,
                                                              double alpha, std::optional<double> limit) {
  check_ragged_m_operands(dy, w, offs);
  check_cuda_tensor(pre, "pre", at::kBFloat16, 2, dy);
  TORCH_CHECK(pre.size(0) == dy.size(0) && pre.size(1) == 2 * w.size(2), "cute_moe: pre must be (M, 2I) = (",
              dy.size(0), ", ", 2 * w.size(2), ") for dy ", dy.sizes(), " and w ", w.sizes(), ", got ", pre.sizes());
  check_row_major(pre, "pre");
  const c10::cuda::CUDAGuard guard(dy.device());
  at::Tensor h = at::empty({dy.size(0), w.size(2)}, dy.options());
  at::Tensor dpre = at::empty({dy.size(0), 2 * w.size(2)}, dy.options());
  GluBackwardArgs a;
  a.gemm = ragged_m_args(dy, w, offs, std::nullopt, h);
  a.pre = pre.data_ptr();
  a.ldpre = pre.stride(0);
  a.dpre = dpre.data_ptr();
  a.lddpre = dpre.stride(0);
  a.glu = swiglu_options(alpha, limit);
  if (a.gemm.m == 0) return {dpre, h};
  size_t bytes = 0;
  throw_if_error(workspace_size(a, &bytes));
  at::Tensor ws = workspace(bytes, dy);
  throw_if_error(glu_backward(a, ws.data_ptr(), bytes, at::cuda::getCurrentCUDAStream()));
  return {dpre, h};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cute_moe, m) {
  m.def(
      "grouped_mm_swiglu(Tensor x, Tensor w, Tensor offs, Tensor? bias=None, float alpha=1.702, "
      "float? limit=7.0) -> (Tensor, Tensor)");
  m.def(
      "grouped_mm_swiglu_bwd(Tensor dy, Tensor w, Tensor offs, Tensor pre, float alpha=1.702, "
      "float? limit=7.0) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(cute_moe, CUDA, m) {
  m.impl("grouped_mm_swiglu", &grouped_mm_swiglu_cuda);
  m.impl("grouped_mm_swiglu_bwd", &grouped_mm_swiglu_bwd_cuda);
}

}  // namespace cute_moe::torch_ops

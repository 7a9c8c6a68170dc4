// PyTorch ops over the FP8 quantizers (cute_moe/fp8_quantize.h): schemas and CUDA kernels.
// Fake kernels and the CPU kernels (the references) live in Python (cute_moe/ops/fp8.py).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cute_moe/fp8_quantize.h"
#include "tensor_checks.h"

namespace cute_moe::torch_ops {

namespace {

int64_t blocks(int64_t n) { return (n + 127) / 128; }

// (rows, cols) bf16 -> (q e4m3 (rows, cols), scale fp32 (rows, ceil(cols / 128)))
std::tuple<at::Tensor, at::Tensor> quantize_fp8_1x128_cuda(const at::Tensor& x) {
  check_cuda_tensor(x, "x", at::kBFloat16, 2, x);
  check_row_major(x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty({x.size(0), blocks(x.size(1))}, x.options().dtype(at::kFloat));
  QuantizeFp8RowsArgs a;
  a.rows = x.size(0);
  a.cols = x.size(1);
  a.src = x.data_ptr();
  a.ld_src = row_stride(x);
  a.q = q.data_ptr();
  a.ld_q = x.size(1);
  a.scale = scale.data_ptr<float>();
  throw_if_error(quantize_fp8_1x128(a, at::cuda::getCurrentCUDAStream()));
  return {q, scale};
}

// (E, k, n) bf16 -> q (E, k, n), scale (E, kb, nb) when `as_is`; q_t (E, n, k), scale_t
// (E, nb, kb) when `transposed`; empty tensors for what was not asked.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_128x128_cuda(const at::Tensor& w, bool as_is,
                                                                                    bool transposed) {
  check_cuda_tensor(w, "w", at::kBFloat16, 3, w);
  TORCH_CHECK(as_is || transposed, "cute_moe: quantize_fp8_128x128: ask for q (as_is) or q_t (transposed) or both");
  TORCH_CHECK(w.stride(2) == 1 || w.size(2) <= 1, "cute_moe: w must have unit stride along its last dimension, got "
              "strides ", w.strides(), " for shape ", w.sizes(), " (call .contiguous())");
  const c10::cuda::CUDAGuard guard(w.device());
  const int64_t e = w.size(0), k = w.size(1), n = w.size(2);
  auto fp8 = w.options().dtype(at::kFloat8_e4m3fn);
  auto f32 = w.options().dtype(at::kFloat);
  at::Tensor q = as_is ? at::empty({e, k, n}, fp8) : at::empty({0}, fp8);
  at::Tensor s = as_is ? at::empty({e, blocks(k), blocks(n)}, f32) : at::empty({0}, f32);
  at::Tensor qt = transposed ? at::empty({e, n, k}, fp8) : at::empty({0}, fp8);
  at::Tensor st = transposed ? at::empty({e, blocks(n), blocks(k)}, f32) : at::empty({0}, f32);
  QuantizeFp8TilesArgs a;
  a.batches = e;
  a.k = k;
  a.n = n;
  a.src = w.data_ptr();
  a.ld_src = k <= 1 ? n : w.stride(1);
  a.batch_stride_src = e <= 1 ? k * a.ld_src : w.stride(0);
  a.q = as_is ? q.data_ptr() : nullptr;
  a.scale = as_is ? s.data_ptr<float>() : nullptr;
  a.q_t = transposed ? qt.data_ptr() : nullptr;
  a.scale_t = transposed ? st.data_ptr<float>() : nullptr;
  throw_if_error(quantize_fp8_128x128(a, at::cuda::getCurrentCUDAStream()));
  return {q, s, qt, st};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cute_moe, m) {
  m.def("quantize_fp8_1x128(Tensor x) -> (Tensor, Tensor)");
  m.def("quantize_fp8_128x128(Tensor w, bool as_is=True, bool transposed=False) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(cute_moe, CUDA, m) {
  m.impl("quantize_fp8_1x128", &quantize_fp8_1x128_cuda);
  m.impl("quantize_fp8_128x128", &quantize_fp8_128x128_cuda);
}

}  // namespace cute_moe::torch_ops

// PyTorch ops over the FP8 quantizers (cute_moe/fp8_quantize.h) and the FP8 grouped GEMMs
// (cute_moe/fp8_gemm.h: the plain one, the fused activation forward and backward, the weight
// gradient): schemas and CUDA kernels.
// Fake kernels and the CPU kernels (the references) live in Python (cute_moe/ops/fp8.py).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cute_moe/fp8_gemm.h"
#include "cute_moe/fp8_quantize.h"
#include "tensor_checks.h"

namespace cute_moe::torch_ops {

namespace {

int64_t blocks(int64_t n) { return (n + 127) / 128; }

// The 1x128 quantizers' row arguments: `rows` rows of `cols` bf16 values read from src (row
// stride as src's; cols is q's width, src may be wider: pre for a gated activation) into q
// (rows, cols) e4m3 contiguous and scale (rows, blocks(cols)) fp32.
QuantizeFp8RowsArgs rows_args(const at::Tensor& src, int64_t rows, int64_t cols, at::Tensor& q, at::Tensor& scale) {
  QuantizeFp8RowsArgs a;
  a.rows = rows;
  a.cols = cols;
  a.src = src.data_ptr();
  a.ld_src = row_stride(src);
  a.q = q.data_ptr();
  a.ld_q = cols;
  a.scale = scale.data_ptr<float>();
  return a;
}

// A gathering quantizer's index: (M,) int32, contiguous, on x's device (its values are
// checked by the kernel: rows of x).
void check_row_index(const at::Tensor& index, const at::Tensor& x) {
  check_cuda_tensor(index, "index", at::kInt, 1, x);
  TORCH_CHECK(index.stride(0) == 1 || index.size(0) <= 1, "cute_moe: index must be contiguous, got stride ",
              index.strides());
}

// (rows, cols) bf16 -> (q e4m3 (rows, cols), scale fp32 (rows, ceil(cols / 128))); with an index
// (M,) int32, q's row r is x[index[r]]'s: (M, cols) and (M, ceil(cols / 128)).
std::tuple<at::Tensor, at::Tensor> quantize_fp8_1x128_cuda(const at::Tensor& x, const std::optional<at::Tensor>& index) {
  check_cuda_tensor(x, "x", at::kBFloat16, 2, x);
  check_row_major(x, "x");
  if (index) check_row_index(*index, x);
  const int64_t rows = index ? index->size(0) : x.size(0);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor q = at::empty({rows, x.size(1)}, x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty({rows, blocks(x.size(1))}, x.options().dtype(at::kFloat));
  QuantizeFp8RowsArgs a = rows_args(x, rows, x.size(1), q, scale);
  if (index) {
    a.index = index->data_ptr<int32_t>();
    a.src_rows = x.size(0);
  }
  throw_if_error(quantize_fp8_1x128(a, at::cuda::getCurrentCUDAStream()));
  return {q, scale};
}

// x: bf16 (m, n) row-major rows sorted by group; offs: int32 (E,) contiguous on x's device, E >= 1.
void check_grouped_rows(const at::Tensor& x, const at::Tensor& offs) {
  check_cuda_tensor(x, "x", at::kBFloat16, 2, x);
  check_row_major(x, "x");
  check_offs(offs, x, offs.size(0));  // int32, 1-D, contiguous, on x's device
  TORCH_CHECK(offs.size(0) >= 1, "cute_moe: offs must hold at least one group, got shape ", offs.sizes());
}

// (m, n) bf16 rows sorted by group -> quantize_fp8_1x128's (q, scale) and each group's column
// sums (E, n) fp32, from one read of x (the up projection's dpre: its input-gradient operand and
// its bias gradient).
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_fp8_1x128_column_sums_cuda(const at::Tensor& x,
                                                                                   const at::Tensor& offs) {
  check_grouped_rows(x, offs);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t m = x.size(0), n = x.size(1);
  at::Tensor q = at::empty({m, n}, x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty({m, blocks(n)}, x.options().dtype(at::kFloat));
  at::Tensor sums = at::empty({offs.size(0), n}, x.options().dtype(at::kFloat));
  QuantizeFp8RowsColumnSumsArgs a;
  a.rows = rows_args(x, m, n, q, scale);
  a.num_groups = static_cast<int32_t>(offs.size(0));
  a.offs = offs.data_ptr<int32_t>();
  a.sums = sums.data_ptr<float>();
  enqueue_with_workspace(quantize_fp8_1x128_column_sums, a, x);
  return {q, scale, sums};
}

// pre (rows, w) bf16 -> h = act(pre) as the fused up projection rounds it, quantized 1x128:
// (q e4m3 (rows, cols), scale fp32 (rows, ceil(cols / 128))), cols = w / 2 for a gated activation
// (pre's columns interleaved (gate, linear)), else w.
std::tuple<at::Tensor, at::Tensor> act_quantize_fp8_1x128_cuda(const at::Tensor& pre, const std::string& activation,
                                                               double alpha, std::optional<double> limit) {
  check_cuda_tensor(pre, "pre", at::kBFloat16, 2, pre);
  check_row_major(pre, "pre");
  ActQuantizeFp8RowsArgs a;
  a.act = activation_options(activation, alpha, limit);
  const bool gated = is_gated(a.act.activation);
  TORCH_CHECK(!gated || pre.size(1) % 2 == 0, "cute_moe: act_quantize_fp8_1x128: a gated activation ('", activation,
              "') needs an even count of pre columns ((gate, linear) pairs), got shape ", pre.sizes());
  const int64_t cols = gated ? pre.size(1) / 2 : pre.size(1);
  const c10::cuda::CUDAGuard guard(pre.device());
  at::Tensor q = at::empty({pre.size(0), cols}, pre.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty({pre.size(0), blocks(cols)}, pre.options().dtype(at::kFloat));
  a.rows = rows_args(pre, pre.size(0), cols, q, scale);
  throw_if_error(act_quantize_fp8_1x128(a, at::cuda::getCurrentCUDAStream()));
  return {q, scale};
}

// (E, k, n) bf16 -> q (E, k, n), scale (E, kb, nb) when `as_is`; q_t (E, n, k), scale_t
// (E, nb, kb) when `transposed`; empty tensors for what was not asked. q_t's rows are padded
// to whole 128-byte lines (strides (n * kp, kp, 1), kp = k rounded up to 128; ops/fp8.py's
// fake kernel allocates the same): the kernel writes them 128 k at a time, and k = 2880's
// 64-byte offsets slowed the cast 1.16-1.24x (H100 / H200, session 26).
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
  const int64_t kp = blocks(k) * 128;
  at::Tensor qt = transposed ? at::empty_strided({e, n, k}, {n * kp, kp, 1}, fp8) : at::empty({0}, fp8);
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
  a.ld_q_t = kp;
  a.scale_t = transposed ? st.data_ptr<float>() : nullptr;
  throw_if_error(quantize_fp8_128x128(a, at::cuda::getCurrentCUDAStream()));
  return {q, s, qt, st};
}

// (m, n) bf16 rows sorted by group -> (q_t e4m3 (n, 128 * blocks), scale fp32 (blocks, n), or
// (blocks, ceil(n / 128)) with tile_scales), blocks = ceil(m / 128) + E: the transposed,
// group-blocked copy for a weight gradient; with `rows` also quantize_fp8_1x128's (q, scale) from
// the same read, returned first. With an index (M,) int32 the sorted rows are x[index] (m = M),
// gathered by the same read.
std::vector<at::Tensor> quantize_group_columns(const at::Tensor& x, const at::Tensor& offs, bool rows,
                                               bool tile_scales, const std::optional<at::Tensor>& index = {}) {
  check_grouped_rows(x, offs);
  if (index) check_row_index(*index, x);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t m = index ? index->size(0) : x.size(0), n = x.size(1);
  const int64_t row_blocks = fp8_group_row_blocks(m, static_cast<int32_t>(offs.size(0)));
  at::Tensor q_t = at::empty({n, 128 * row_blocks}, x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty({row_blocks, tile_scales ? blocks(n) : n}, x.options().dtype(at::kFloat));
  QuantizeFp8GroupColumnsArgs a;
  a.tile_scales = tile_scales;
  a.rows = m;
  a.cols = n;
  a.num_groups = static_cast<int32_t>(offs.size(0));
  a.offs = offs.data_ptr<int32_t>();
  a.src = x.data_ptr();
  a.ld_src = row_stride(x);
  a.q_t = q_t.data_ptr();
  a.ld_q_t = 128 * row_blocks;
  a.scale = scale.data_ptr<float>();
  if (index) {
    a.index = index->data_ptr<int32_t>();
    a.src_rows = x.size(0);
  }
  if (!rows) {
    throw_if_error(quantize_fp8_128x1(a, at::cuda::getCurrentCUDAStream()));
    return {q_t, scale};
  }
  at::Tensor q = at::empty({m, n}, x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor q_scale = at::empty({m, blocks(n)}, x.options().dtype(at::kFloat));
  a.q = q.data_ptr();
  a.ld_q = n;
  a.q_scale = q_scale.data_ptr<float>();
  throw_if_error(quantize_fp8_128x1(a, at::cuda::getCurrentCUDAStream()));
  return {q, q_scale, q_t, scale};
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_128x1_cuda(const at::Tensor& x, const at::Tensor& offs,
                                                           bool tile_scales) {
  auto out = quantize_group_columns(x, offs, false, tile_scales);
  return {out[0], out[1]};
}

// quantize_fp8_1x128 and quantize_fp8_128x1 of x (or of x[index]) from one read: (q, scale, q_t,
// scale_t).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_1x128_128x1_cuda(
    const at::Tensor& x, const at::Tensor& offs, bool tile_scales, const std::optional<at::Tensor>& index) {
  auto out = quantize_group_columns(x, offs, true, tile_scales, index);
  return {out[0], out[1], out[2], out[3]};
}

// A scale tensor of `dim` dimensions and the given block counts, fp32 on x's device; any
// non-negative strides (the kernel loads scales one by one).
void check_scales(const at::Tensor& s, const char* name, std::initializer_list<int64_t> shape, const at::Tensor& x) {
  check_cuda_tensor(s, name, at::kFloat, static_cast<int64_t>(shape.size()), x);
  TORCH_CHECK(s.sizes() == at::IntArrayRef(shape), "cute_moe: ", name, " must have shape ", at::IntArrayRef(shape),
              " (one scale per 128-long block), got ", s.sizes());
  for (int64_t st : s.strides()) TORCH_CHECK(st >= 0, "cute_moe: ", name, " must have non-negative strides, got ", s.strides());
}

// The GEMM part of every FP8 op: x (m, k) e4m3 by 1 x 128 blocks, w (E, k, n) e4m3
// k-contiguous (a transposed view of an (E, n, k) tensor) by 128 x 128, output y (m, n).
Fp8RaggedMGemmArgs fp8_args(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& w,
                            const at::Tensor& w_scale, const at::Tensor& offs, const std::optional<at::Tensor>& bias,
                            const at::Tensor& y) {
  check_cuda_tensor(x, "x", at::kFloat8_e4m3fn, 2, x);
  check_cuda_tensor(w, "w", at::kFloat8_e4m3fn, 3, x);
  check_row_major(x, "x");
  const int64_t m = x.size(0), k = x.size(1), e = w.size(0), n = w.size(2);
  TORCH_CHECK(w.size(1) == k, "cute_moe: w must be (E, k, n) with k = x.size(1) = ", k, ", got w of shape ", w.sizes());
  TORCH_CHECK(w.stride(1) == 1 || k <= 1,
              "cute_moe: w (E, k, n) must be contiguous along k (a transposed view of an (E, n, k) tensor, such as "
              "quantize_fp8_128x128's q_t.transpose(-2, -1)): FP8 tensor cores read k-major operands only; got "
              "strides ", w.strides());
  check_offs(offs, x, e);
  check_scales(x_scale, "x_scale", {m, blocks(k)}, x);
  check_scales(w_scale, "w_scale", {e, blocks(k), blocks(n)}, x);
  check_bias(bias, w, x);
  Fp8RaggedMGemmArgs a;
  a.m = m;
  a.n = n;
  a.k = k;
  a.num_groups = static_cast<int32_t>(e);
  a.offs = offs.data_ptr<int32_t>();
  a.x = x.data_ptr();
  a.ldx = row_stride(x);
  a.x_scale = x_scale.data_ptr<float>();
  a.x_scale_stride_row = x_scale.stride(0);
  a.x_scale_stride_block = x_scale.stride(1);
  a.w = w.data_ptr();
  a.w_stride_group = e <= 1 ? 0 : w.stride(0);  // one expert: never stepped over
  a.w_stride_n = n <= 1 ? k : w.stride(2);
  a.w_scale = w_scale.data_ptr<float>();
  a.w_scale_stride_group = w_scale.stride(0);
  a.w_scale_stride_k = w_scale.stride(1);
  a.w_scale_stride_n = w_scale.stride(2);
  if (bias.has_value()) {
    a.bias = bias->data_ptr();
    a.bias_stride_group = e <= 1 ? 0 : bias->stride(0);
  }
  a.y = y.data_ptr();
  a.ldy = row_stride(y);
  return a;
}

// y = row_scale[r] * (deq(x) @ deq(w[e]) + bias[e]) in bf16.
at::Tensor grouped_mm_fp8_cuda(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& w,
                               const at::Tensor& w_scale, const at::Tensor& offs, const std::optional<at::Tensor>& bias,
                               const std::optional<at::Tensor>& row_scale) {
  check_cuda_tensor(w, "w", at::kFloat8_e4m3fn, 3, x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({x.size(0), w.size(2)}, x.options().dtype(at::kBFloat16));
  Fp8RaggedMGemmArgs a = fp8_args(x, x_scale, w, w_scale, offs, bias, y);
  a.row_scale = optional_scales(row_scale, "row_scale", x.size(0), "M", x);
  if (a.m == 0) return y;
  enqueue_planned(fp8_ragged_m_gemm, a, x);
  return y;
}

// (h, pre): pre = deq(x) @ deq(w[e]) + bias[e] (bf16), h = act(pre) (bf16); w's columns
// interleaved (gate, linear) for a gated activation.
std::tuple<at::Tensor, at::Tensor> grouped_mm_fp8_act_cuda(const at::Tensor& x, const at::Tensor& x_scale,
                                                           const at::Tensor& w, const at::Tensor& w_scale,
                                                           const at::Tensor& offs,
                                                           const std::optional<at::Tensor>& bias,
                                                           const std::string& activation, double alpha,
                                                           std::optional<double> limit) {
  const ActivationOptions opts = activation_options(activation, alpha, limit);
  TORCH_CHECK(activation_info(opts.activation).fused_forward, "cute_moe: grouped_mm_fp8_act: activation '",
              activation, "' has no fused forward (h = pre): use grouped_mm_fp8");
  check_cuda_tensor(w, "w", at::kFloat8_e4m3fn, 3, x);
  const bool gated = is_gated(opts.activation);
  TORCH_CHECK(!gated || w.size(2) % 2 == 0, "cute_moe: ", activation,
              " needs an even number of columns in w (gate/linear pairs), got ", w.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor pre = at::empty({x.size(0), w.size(2)}, x.options().dtype(at::kBFloat16));
  at::Tensor h = at::empty({x.size(0), gated ? w.size(2) / 2 : w.size(2)}, pre.options());
  Fp8ActForwardArgs a;
  a.gemm = fp8_args(x, x_scale, w, w_scale, offs, bias, pre);
  a.h = h.data_ptr();
  a.ldh = row_stride(h);
  a.act = opts;
  if (a.gemm.m == 0) return {h, pre};
  enqueue_planned(fp8_act_forward, a, x);
  return {h, pre};
}

// (h_q, h_scale, pre): the same kernel with h written as its 1 x 128 e4m3 copy instead of bf16
// (gated activations; bit for bit act_quantize_fp8_1x128(pre)): h_q (m, n / 2) e4m3, h_scale
// (m, ceil(n / 256)) fp32, their rows past offs[-1] unwritten.
std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_mm_fp8_act_quant_cuda(
    const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& w, const at::Tensor& w_scale,
    const at::Tensor& offs, const std::optional<at::Tensor>& bias, const std::string& activation, double alpha,
    std::optional<double> limit) {
  const ActivationOptions opts = activation_options(activation, alpha, limit);
  TORCH_CHECK(is_gated(opts.activation), "cute_moe: grouped_mm_fp8_act_quant: activation '", activation,
              "' is not gated: h's e4m3 copy comes from the epilogue for swiglu_oai, swiglu and geglu only");
  check_cuda_tensor(w, "w", at::kFloat8_e4m3fn, 3, x);
  TORCH_CHECK(w.size(2) % 32 == 0, "cute_moe: grouped_mm_fp8_act_quant: w.shape[2] (2I) must be a multiple of 32 "
              "(h's rows whole 16-byte pieces), got ", w.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t m = x.size(0), width = w.size(2) / 2;
  at::Tensor pre = at::empty({m, w.size(2)}, x.options().dtype(at::kBFloat16));
  at::Tensor h_q = at::empty({m, width}, x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor h_scale = at::empty({m, (width + 127) / 128}, x.options().dtype(at::kFloat));
  Fp8ActForwardArgs a;
  a.gemm = fp8_args(x, x_scale, w, w_scale, offs, bias, pre);
  a.act = opts;
  a.h_q = h_q.data_ptr();
  a.ld_h_q = width;
  a.h_scale = h_scale.data_ptr<float>();
  a.ld_h_scale = h_scale.size(1);
  if (a.gemm.m == 0) return {h_q, h_scale, pre};
  enqueue_planned(fp8_act_forward, a, x);
  return {h_q, h_scale, pre};
}

// (dpre, prob * h, dprob, dpre_q, dpre_scale): dy (m, H) e4m3 by 1 x 128 blocks, w = W_down as the
// k-contiguous (E, H, I) view of the (E, I, H) weight quantized 128 x 128; pre (m, 2I or I) bf16.
// dy_bf16 (the unquantized dy) is read for out_bias's term of dprob only. dprob is empty unless
// prob_grad; dpre_q (m, width) e4m3 and dpre_scale (m, ceil(width / 128)) fp32, dpre's 1 x 128
// copy from the same epilogue, are empty unless dpre_fp8 (their rows past offs[-1] unwritten).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> grouped_mm_fp8_act_bwd_cuda(
    const at::Tensor& dy, const at::Tensor& dy_scale, const at::Tensor& w, const at::Tensor& w_scale,
    const at::Tensor& offs, const at::Tensor& pre, const std::optional<at::Tensor>& prob,
    const std::optional<at::Tensor>& out_bias, const std::optional<at::Tensor>& dy_bf16, bool prob_grad,
    const std::string& activation, double alpha, std::optional<double> limit, bool dpre_fp8) {
  const ActivationOptions opts = activation_options(activation, alpha, limit);
  check_cuda_tensor(dy, "dy", at::kFloat8_e4m3fn, 2, dy);
  check_cuda_tensor(w, "w", at::kFloat8_e4m3fn, 3, dy);
  const int64_t m = dy.size(0), inter = w.size(2);
  const int64_t pre_cols = is_gated(opts.activation) ? 2 * inter : inter;
  check_act_backward_tensors(pre, pre_cols, dy, w.size(0), prob, out_bias, prob_grad,
                             "dy " + c10::str(dy.sizes()) + ", w " + c10::str(w.sizes()) + " and " + activation);
  TORCH_CHECK(!out_bias.has_value() || dy_bf16.has_value(),
              "cute_moe: out_bias's term of dprob reads dy_bf16 (the unquantized dy)");
  if (dy_bf16.has_value()) {
    check_cuda_tensor(*dy_bf16, "dy_bf16", at::kBFloat16, 2, dy);
    TORCH_CHECK(dy_bf16->sizes() == dy.sizes(), "cute_moe: dy_bf16 must have dy's shape ", dy.sizes(), ", got ",
                dy_bf16->sizes());
    check_row_major(*dy_bf16, "dy_bf16");
  }
  const c10::cuda::CUDAGuard guard(dy.device());
  at::Tensor h = at::empty({m, inter}, pre.options());
  at::Tensor dpre = at::empty({m, pre_cols}, pre.options());
  at::Tensor dprob = at::empty({prob_grad ? m : 0}, pre.options().dtype(at::kFloat));
  Fp8ActBackwardArgs a;
  a.gemm = fp8_args(dy, dy_scale, w, w_scale, offs, std::nullopt, h);
  a.gemm.row_scale = optional_scales(prob, "prob", m, "M", dy);
  set_act_backward_tensors(a, pre, dpre, dprob, prob_grad, out_bias);
  if (out_bias.has_value()) {  // its term of dprob reads the unquantized dy
    a.dy = dy_bf16->data_ptr();
    a.lddy = row_stride(*dy_bf16);
  }
  a.act = opts;
  TORCH_CHECK(!dpre_fp8 || is_gated(opts.activation), "cute_moe: dpre_fp8 (dpre's e4m3 copy from the epilogue) "
              "is for the gated activations (swiglu_oai, swiglu, geglu), got ", activation);
  const int64_t q_rows = dpre_fp8 ? m : 0;
  const int64_t ld_q = (pre_cols + 15) / 16 * 16;  // 16-byte rows: the next GEMM's TMA loads
  at::Tensor dpre_q = at::empty({q_rows, ld_q}, pre.options().dtype(at::kFloat8_e4m3fn))
                          .narrow(1, 0, dpre_fp8 ? pre_cols : 0);
  at::Tensor dpre_scale = at::empty({q_rows, (pre_cols + 127) / 128}, pre.options().dtype(at::kFloat));
  if (dpre_fp8 && m > 0) {
    a.dpre_q = dpre_q.data_ptr();
    a.ld_dpre_q = ld_q;
    a.dpre_scale = dpre_scale.data_ptr<float>();
    a.ld_dpre_scale = dpre_scale.stride(0);
  }
  if (m == 0) return {dpre, h, dprob, dpre_q, dpre_scale};
  enqueue_planned(fp8_act_backward, a, dy);
  return {dpre, h, dprob, dpre_q, dpre_scale};
}

// dw (E, k, n) bf16 = the weight gradient from quantize_fp8_128x1's operands: a_t (k, 128 blocks)
// with scales (blocks, k), b_t (n, 128 blocks) with tile scales (blocks, ceil(n / 128)), blocks =
// ceil(m / 128) + E for the m rows they were quantized from (m a multiple of 128 here: the
// largest the shapes admit, an upper bound the device checks offs against).
at::Tensor grouped_mm_fp8_wgrad_cuda(const at::Tensor& a_t, const at::Tensor& a_scale, const at::Tensor& b_t,
                                     const at::Tensor& b_scale, const at::Tensor& offs) {
  check_cuda_tensor(a_t, "a_t", at::kFloat8_e4m3fn, 2, a_t);
  check_cuda_tensor(b_t, "b_t", at::kFloat8_e4m3fn, 2, a_t);
  check_row_major(a_t, "a_t");
  check_row_major(b_t, "b_t");
  check_offs(offs, a_t, offs.size(0));
  const int64_t e = offs.size(0), k = a_t.size(0), n = b_t.size(0), cols = a_t.size(1);
  TORCH_CHECK(e >= 1, "cute_moe: offs must hold at least one group, got shape ", offs.sizes());
  TORCH_CHECK(cols % 128 == 0 && cols / 128 >= e, "cute_moe: a_t must be (k, 128 * blocks) with blocks = ceil(m / 128) "
              "+ E >= E = ", e, " (quantize_fp8_128x1's q_t), got shape ", a_t.sizes());
  TORCH_CHECK(b_t.size(1) == cols, "cute_moe: b_t must be (n, ", cols, ") like a_t ", a_t.sizes(), ", got ",
              b_t.sizes());
  TORCH_CHECK(k > 0 && k % 16 == 0, "cute_moe: a_t must have a positive multiple of 16 rows (k), got shape ",
              a_t.sizes());
  TORCH_CHECK(n > 0 && n % 16 == 0, "cute_moe: b_t must have a positive multiple of 16 rows (n), got shape ",
              b_t.sizes());
  const int64_t blocks = cols / 128;
  check_scales(a_scale, "a_scale", {blocks, k}, a_t);
  check_scales(b_scale, "b_scale", {blocks, (n + 127) / 128}, a_t);
  TORCH_CHECK((a_scale.stride(1) == 1 || k <= 1) && (b_scale.stride(1) == 1 || n <= 128),
              "cute_moe: a_scale and b_scale must be contiguous along their last dimension, got strides ",
              a_scale.strides(), " and ", b_scale.strides());
  const c10::cuda::CUDAGuard guard(a_t.device());
  at::Tensor dw = at::empty({e, k, n}, a_t.options().dtype(at::kBFloat16));
  Fp8RaggedKGemmArgs a;
  a.m = 128 * (blocks - e);
  a.k = k;
  a.n = n;
  a.num_groups = static_cast<int32_t>(e);
  a.offs = offs.data_ptr<int32_t>();
  a.a_t = a_t.data_ptr();
  a.lda_t = row_stride(a_t);
  a.a_scale = a_scale.data_ptr<float>();
  a.a_scale_stride_block = a_scale.stride(0);
  a.b_t = b_t.data_ptr();
  a.ldb_t = row_stride(b_t);
  a.b_scale = b_scale.data_ptr<float>();
  a.b_scale_stride_block = b_scale.stride(0);
  a.dw = dw.data_ptr();
  enqueue_planned(fp8_ragged_k_gemm, a, a_t);
  return dw;
}

}  // namespace

const std::string kFp8ActDefaults = act_schema_defaults();

TORCH_LIBRARY_FRAGMENT(cute_moe, m) {
  m.def("quantize_fp8_1x128(Tensor x, Tensor? index=None) -> (Tensor, Tensor)");
  m.def("quantize_fp8_1x128_column_sums(Tensor x, Tensor offs) -> (Tensor, Tensor, Tensor)");
  m.def("quantize_fp8_128x128(Tensor w, bool as_is=True, bool transposed=False) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("quantize_fp8_128x1(Tensor x, Tensor offs, bool tile_scales=False) -> (Tensor, Tensor)");
  m.def("quantize_fp8_1x128_128x1(Tensor x, Tensor offs, bool tile_scales=False, Tensor? index=None) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
  m.def(("act_quantize_fp8_1x128(Tensor pre, " + kFp8ActDefaults + ") -> (Tensor, Tensor)").c_str());
  m.def("grouped_mm_fp8(Tensor x, Tensor x_scale, Tensor w, Tensor w_scale, Tensor offs, Tensor? bias=None, "
        "Tensor? row_scale=None) -> Tensor");
  m.def(("grouped_mm_fp8_act(Tensor x, Tensor x_scale, Tensor w, Tensor w_scale, Tensor offs, Tensor? bias=None, " +
         kFp8ActDefaults + ") -> (Tensor, Tensor)")
            .c_str());
  m.def(("grouped_mm_fp8_act_quant(Tensor x, Tensor x_scale, Tensor w, Tensor w_scale, Tensor offs, "
         "Tensor? bias=None, " + kFp8ActDefaults + ") -> (Tensor, Tensor, Tensor)")
            .c_str());
  m.def(("grouped_mm_fp8_act_bwd(Tensor dy, Tensor dy_scale, Tensor w, Tensor w_scale, Tensor offs, Tensor pre, "
         "Tensor? prob=None, Tensor? out_bias=None, Tensor? dy_bf16=None, bool prob_grad=False, " +
         kFp8ActDefaults + ", bool dpre_fp8=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
            .c_str());
  m.def("grouped_mm_fp8_wgrad(Tensor a_t, Tensor a_scale, Tensor b_t, Tensor b_scale, Tensor offs) -> Tensor");
}

TORCH_LIBRARY_IMPL(cute_moe, CUDA, m) {
  m.impl("quantize_fp8_1x128", &quantize_fp8_1x128_cuda);
  m.impl("quantize_fp8_1x128_column_sums", &quantize_fp8_1x128_column_sums_cuda);
  m.impl("quantize_fp8_128x128", &quantize_fp8_128x128_cuda);
  m.impl("quantize_fp8_128x1", &quantize_fp8_128x1_cuda);
  m.impl("quantize_fp8_1x128_128x1", &quantize_fp8_1x128_128x1_cuda);
  m.impl("act_quantize_fp8_1x128", &act_quantize_fp8_1x128_cuda);
  m.impl("grouped_mm_fp8", &grouped_mm_fp8_cuda);
  m.impl("grouped_mm_fp8_act", &grouped_mm_fp8_act_cuda);
  m.impl("grouped_mm_fp8_act_quant", &grouped_mm_fp8_act_quant_cuda);
  m.impl("grouped_mm_fp8_act_bwd", &grouped_mm_fp8_act_bwd_cuda);
  m.impl("grouped_mm_fp8_wgrad", &grouped_mm_fp8_wgrad_cuda);
}

}  // namespace cute_moe::torch_ops

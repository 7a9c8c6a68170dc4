// PyTorch ops over the fused activation GEMMs (cute_moe/fused_activation.h): the expert
// up-projection with the activation in its epilogue, and the down-projection input
// gradient with the activation's backward (and the router-probability gradient) in its
// epilogue. Autograd across the pair lives in Python (cute_moe/expert_ffn.py), since the
// forward hands `pre` to the backward. grouped_mm_swiglu(_bwd) are the GPT-OSS entry points
// of the seed API (python/cutlass_op), kept with their schemas; grouped_mm_act(_bwd) are the
// general ones. The ops take `limit` literally (None: no clamp); the activations' default
// limits are applied by the Python API.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cute_moe/fused_activation.h"
#include "tensor_checks.h"

namespace cute_moe::torch_ops {

namespace {

// gate_linear: "interleaved" (gate j at column 2j, linear j at 2j+1) or "halves" (gate j
// at j, linear j at I + j) for the up projection's columns, weights, bias and dpre.
GateLinear gate_linear_of(const std::string& s, const ActivationOptions& o) {
  TORCH_CHECK(s == "interleaved" || s == "halves", "cute_moe: gate_linear must be 'interleaved' or 'halves', got '",
              s, "'");
  if (s == "interleaved") return GateLinear::kInterleaved;
  TORCH_CHECK(is_gated(o.activation), "cute_moe: gate_linear='halves' needs a gated activation, got ",
              activation_name(o.activation));
  return GateLinear::kHalves;
}

// (E, ..., 2I) halves columns as interleaved ones (a copy): the layouts the kernels do not
// read in place (an n-contiguous weight, the bias) go through it.
at::Tensor interleave_halves(const at::Tensor& t) {
  auto sizes = t.sizes().vec();
  const int64_t n = sizes.back();
  std::vector<int64_t> split(sizes.begin(), sizes.end() - 1);
  split.push_back(2);
  split.push_back(n / 2);
  return t.reshape(split).transpose(-2, -1).reshape(sizes);
}

// [w | w_linear] (E, K, I) x 2 -> (E, K, 2I), k-contiguous where both are.
at::Tensor join_halves(const at::Tensor& w, const at::Tensor& w_linear) {
  if (w.stride(1) == 1 && w_linear.stride(1) == 1) {
    return at::cat({w.transpose(1, 2), w_linear.transpose(1, 2)}, 1).transpose(1, 2);
  }
  return at::cat({w, w_linear}, 2);
}

// Whether the forward reads the halves as two tensors in place (ActForwardArgs::w_linear):
// one set of strides, k-contiguous, the two a multiple of 16 bytes below 2^40 apart (one
// TMA stride spans them), the linear half after the gate half or, without a bias, before it.
bool halves_in_place(const at::Tensor& w, const at::Tensor& w_linear, bool has_bias) {
  const int64_t apart = reinterpret_cast<intptr_t>(w_linear.data_ptr()) - reinterpret_cast<intptr_t>(w.data_ptr());
  const int64_t distance = apart < 0 ? -apart : apart;
  return w.stride(1) == 1 && w_linear.strides() == w.strides() && apart != 0 && distance % 16 == 0 &&
         distance < (int64_t(1) << 40) && (apart > 0 || !has_bias);
}

// (h, pre): pre = scale[e] * (x @ w[e]) + bias[e], h = act(pre). w_linear: the [gate |
// linear] halves as two tensors, w the gate half and w_linear the linear one, each (E, K, I)
// (torchtitan's w1, w3 read transposed); read in place where halves_in_place, else joined.
std::tuple<at::Tensor, at::Tensor> grouped_mm_act_cuda(const at::Tensor& x, const at::Tensor& w,
                                                       const at::Tensor& offs, const std::optional<at::Tensor>& bias,
                                                       const std::optional<at::Tensor>& scale,
                                                       const std::string& activation, double alpha,
                                                       std::optional<double> limit, const std::string& gate_linear,
                                                       const std::optional<at::Tensor>& w_linear) {
  const ActivationOptions opts = activation_options(activation, alpha, limit);
  TORCH_CHECK(activation_info(opts.activation).fused_forward, "cute_moe: grouped_mm_act: activation '", activation,
              "' has no fused forward (h = pre): use grouped_mm_scaled");
  const bool gated = is_gated(opts.activation);
  const GateLinear layout = gate_linear_of(gate_linear, opts);
  if (w_linear.has_value()) {
    TORCH_CHECK(layout == GateLinear::kHalves,
                "cute_moe: w_linear (the linear half as its own tensor) needs gate_linear='halves'");
    check_cuda_tensor(w, "w", at::kBFloat16, 3, x);
    check_cuda_tensor(*w_linear, "w_linear", at::kBFloat16, 3, x);
    TORCH_CHECK(w_linear->sizes() == w.sizes(), "cute_moe: w_linear must have the gate half's shape (E, K, I) = ",
                w.sizes(), ", got ", w_linear->sizes());
    if (!halves_in_place(w, *w_linear, bias.has_value())) {
      return grouped_mm_act_cuda(x, join_halves(w, *w_linear), offs, bias, scale, activation, alpha, limit,
                                 gate_linear, std::nullopt);
    }
  }
  const int64_t n = w_linear.has_value() ? 2 * w.size(2) : w.size(2);  // pre's columns
  check_ragged_m_operands(x, w, offs);
  check_bias(bias, w, x, n);
  TORCH_CHECK(!gated || n % 2 == 0, "cute_moe: ", activation,
              " needs an even number of columns in w (gate/linear pairs), got ", w.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  // The kernel adds the bias in the order it computes the columns, interleaved: halves are
  // reordered here (E x 2I, a small copy).
  const std::optional<at::Tensor> b =
      bias.has_value() && layout == GateLinear::kHalves ? std::optional<at::Tensor>(interleave_halves(*bias)) : bias;
  if (layout == GateLinear::kHalves && w.stride(1) != 1) {
    // halves are read in place from a k-contiguous W only; an n-contiguous one is copied
    return grouped_mm_act_cuda(x, interleave_halves(w), offs, b, scale, activation, alpha, limit, "interleaved",
                               std::nullopt);
  }
  at::Tensor pre = at::empty({x.size(0), n}, x.options());
  at::Tensor h = at::empty({x.size(0), gated ? n / 2 : n}, x.options());
  ActForwardArgs a;
  a.gemm = ragged_m_args(x, w, offs, b, pre);
  a.gemm.n = n;
  a.gemm.group_scale = optional_scales(scale, "scale", w.size(0), "E", x);
  a.h = h.data_ptr();
  a.ldh = row_stride(h);
  a.act = opts;
  a.gate_linear = layout;
  if (w_linear.has_value()) a.w_linear = w_linear->data_ptr();
  if (a.gemm.m == 0) return {h, pre};
  enqueue_planned(act_forward, a, x);
  return {h, pre};
}

// (h, pre) of grouped_mm_act over x[rows]: row r of the result reads token row rows[r] of
// x (T, K), gathered inside the GEMM's A load. Weights with unit stride along N only.
std::tuple<at::Tensor, at::Tensor> grouped_mm_act_gathered_cuda(
    const at::Tensor& x, const at::Tensor& rows, const at::Tensor& w, const at::Tensor& offs,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& scale, const std::string& activation,
    double alpha, std::optional<double> limit) {
  const ActivationOptions opts = activation_options(activation, alpha, limit);
  TORCH_CHECK(opts.activation != Activation::kIdentity,
              "cute_moe: grouped_mm_act_gathered: activation 'none' has no fused forward (h = pre)");
  const bool gated = is_gated(opts.activation);
  check_ragged_m_operands(x, w, offs);
  check_cuda_tensor(rows, "rows", at::kInt, 1, x);
  TORCH_CHECK(rows.is_contiguous(), "cute_moe: rows must be contiguous, got strides ", rows.strides());
  TORCH_CHECK(w.stride(2) == 1 || w.size(2) == 1,
              "cute_moe: grouped_mm_act_gathered needs w (E, K, N) contiguous along N, got strides ", w.strides());
  TORCH_CHECK(x.size(0) >= 1 || rows.size(0) == 0, "cute_moe: x has no rows to gather");
  check_bias(bias, w, x);
  TORCH_CHECK(!gated || w.size(2) % 2 == 0, "cute_moe: ", activation,
              " needs an even number of columns in w (interleaved gate/linear), got ", w.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t m = rows.size(0);
  at::Tensor pre = at::empty({m, w.size(2)}, x.options());
  at::Tensor h = at::empty({m, gated ? w.size(2) / 2 : w.size(2)}, x.options());
  ActForwardArgs a;
  a.gemm = ragged_m_args(x, w, offs, bias, pre);
  a.gemm.m = m;
  a.gemm.gather_rows = rows.data_ptr<int32_t>();
  a.gemm.x_rows = x.size(0);
  a.gemm.group_scale = optional_scales(scale, "scale", w.size(0), "E", x);
  a.h = h.data_ptr();
  a.ldh = row_stride(h);
  a.act = opts;
  if (m == 0) return {h, pre};
  enqueue_planned(act_forward, a, x);
  return {h, pre};
}

// (dpre, prob * h, dprob, db); w is the matrix multiplied, (E, H, I): the down-projection
// weight's transpose. dprob is empty unless prob_grad; db (E, width of dpre) fp32, dpre's
// column sums per group (the up projection's bias gradient), is empty unless bias_grad.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> grouped_mm_act_bwd_cuda(
    const at::Tensor& dy, const at::Tensor& w, const at::Tensor& offs, const at::Tensor& pre,
    const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& prob,
    const std::optional<at::Tensor>& out_bias, bool prob_grad, const std::string& activation, double alpha,
    std::optional<double> limit, const std::string& gate_linear, bool bias_grad) {
  const ActivationOptions opts = activation_options(activation, alpha, limit);
  const GateLinear layout = gate_linear_of(gate_linear, opts);
  if (layout == GateLinear::kHalves && w.stride(2) != 1) {
    // halves are written in place for an n-contiguous W only; else interleaved, then copied
    auto [dpre, h, dprob, db] = grouped_mm_act_bwd_cuda(dy, w, offs, pre, scale, prob, out_bias, prob_grad,
                                                        activation, alpha, limit, "interleaved", bias_grad);
    const c10::cuda::CUDAGuard guard(dy.device());
    auto to_halves = [](const at::Tensor& t) {
      return t.view({t.size(0), t.size(1) / 2, 2}).transpose(1, 2).reshape(t.sizes());
    };
    return {to_halves(dpre), h, dprob, bias_grad ? to_halves(db) : db};
  }
  const int64_t pre_cols = is_gated(opts.activation) ? 2 * w.size(2) : w.size(2);
  check_ragged_m_operands(dy, w, offs);
  check_act_backward_tensors(pre, pre_cols, dy, w.size(0), prob, out_bias, prob_grad,
                             "dy " + c10::str(dy.sizes()) + ", w " + c10::str(w.sizes()) + " and " + activation);
  const c10::cuda::CUDAGuard guard(dy.device());
  at::Tensor h = at::empty({dy.size(0), w.size(2)}, dy.options());
  at::Tensor dpre = at::empty({dy.size(0), pre_cols}, dy.options());
  at::Tensor dprob = at::empty({prob_grad ? dy.size(0) : 0}, dy.options().dtype(at::kFloat));
  at::Tensor db = at::empty({bias_grad ? w.size(0) : 0, bias_grad ? pre_cols : 0}, dy.options().dtype(at::kFloat));
  if (dy.size(0) == 0) db.zero_();  // no rows: no launch, and every group's sum is 0
  ActBackwardArgs a;
  a.gemm = ragged_m_args(dy, w, offs, std::nullopt, h);
  a.gemm.group_scale = optional_scales(scale, "scale", w.size(0), "E", dy);
  a.gemm.row_scale = optional_scales(prob, "prob", dy.size(0), "M", dy);
  set_act_backward_tensors(a, pre, dpre, dprob, prob_grad, out_bias);
  if (bias_grad) a.bias_grad = db.data_ptr<float>();
  a.act = opts;
  a.dpre_layout = layout;
  if (a.gemm.m == 0) return {dpre, h, dprob, db};
  enqueue_planned(act_backward, a, dy);
  return {dpre, h, dprob, db};
}

std::tuple<at::Tensor, at::Tensor> grouped_mm_swiglu_cuda(const at::Tensor& x, const at::Tensor& w,
                                                          const at::Tensor& offs,
                                                          const std::optional<at::Tensor>& bias, double alpha,
                                                          std::optional<double> limit) {
  return grouped_mm_act_cuda(x, w, offs, bias, std::nullopt, "swiglu_oai", alpha, limit, "interleaved", std::nullopt);
}

std::tuple<at::Tensor, at::Tensor> grouped_mm_swiglu_bwd_cuda(const at::Tensor& dy, const at::Tensor& w,
                                                              const at::Tensor& offs, const at::Tensor& pre,
                                                              double alpha, std::optional<double> limit) {
  auto [dpre, h, dprob, db] = grouped_mm_act_bwd_cuda(dy, w, offs, pre, std::nullopt, std::nullopt, std::nullopt,
                                                      false, "swiglu_oai", alpha, limit, "interleaved", false);
  return {dpre, h};
}

}  // namespace

// The schemas' defaults are the declared ones (cute_moe/activation.h): the general ops' default
// activation and alpha, and swiglu_oai's alpha and limit for the GPT-OSS entry points.
const std::string kActDefaults = act_schema_defaults();
const std::string kSwigluOaiDefaults =
    "float alpha=" + std::to_string(kDefaultAlpha) +
    ", float? limit=" + std::to_string(activation_info(Activation::kSwigluOai).default_limit);

TORCH_LIBRARY_FRAGMENT(cute_moe, m) {
  m.def(("grouped_mm_swiglu(Tensor x, Tensor w, Tensor offs, Tensor? bias=None, " + kSwigluOaiDefaults +
         ") -> (Tensor, Tensor)")
            .c_str());
  m.def(("grouped_mm_swiglu_bwd(Tensor dy, Tensor w, Tensor offs, Tensor pre, " + kSwigluOaiDefaults +
         ") -> (Tensor, Tensor)")
            .c_str());
  m.def(("grouped_mm_act(Tensor x, Tensor w, Tensor offs, Tensor? bias=None, Tensor? scale=None, " + kActDefaults +
         ", str gate_linear=\"interleaved\", Tensor? w_linear=None) -> (Tensor, Tensor)")
            .c_str());
  m.def(("grouped_mm_act_gathered(Tensor x, Tensor rows, Tensor w, Tensor offs, Tensor? bias=None, "
         "Tensor? scale=None, " +
         kActDefaults + ") -> (Tensor, Tensor)")
            .c_str());
  m.def(("grouped_mm_act_bwd(Tensor dy, Tensor w, Tensor offs, Tensor pre, Tensor? scale=None, Tensor? prob=None, "
         "Tensor? out_bias=None, bool prob_grad=False, " +
         kActDefaults + ", str gate_linear=\"interleaved\", bool bias_grad=False) -> (Tensor, Tensor, Tensor, "
         "Tensor)")
            .c_str());
}

TORCH_LIBRARY_IMPL(cute_moe, CUDA, m) {
  m.impl("grouped_mm_swiglu", &grouped_mm_swiglu_cuda);
  m.impl("grouped_mm_swiglu_bwd", &grouped_mm_swiglu_bwd_cuda);
  m.impl("grouped_mm_act", &grouped_mm_act_cuda);
  m.impl("grouped_mm_act_gathered", &grouped_mm_act_gathered_cuda);
  m.impl("grouped_mm_act_bwd", &grouped_mm_act_bwd_cuda);
}

}  // namespace cute_moe::torch_ops

// Public C++ API of the grouped GEMMs with an activation fused into the epilogue: the
// up-projection of an expert FFN forward, and the input gradient of the down-projection
// with the activation's backward (no PyTorch). The activations and their formulas:
// cute_moe/activation.h, generated from codegen/kernel_space.py.
//
// Gated activations read the up-projection's columns interleaved: column 2j is gate j,
// column 2j+1 is linear j (the HF GPT-OSS layout; cute_moe.repack converts [gate | linear]
// halves), so the up-projection is 2I wide and h is I wide. Non-gated ones (srelu, none)
// map each column to one: both are I wide. Conventions and guarantees as in grouped_gemm.h
// (device-side offs, no host sync, validation with messages, padding rows zero in every
// output).
#pragma once

#include "cute_moe/activation.h"  // generated from codegen/kernel_space.py: enum Activation
#include "cute_moe/grouped_gemm.h"

namespace cute_moe {

// Where a gated activation's (gate, linear) columns sit in the up-projection's 2I columns
// (of the weight, the bias and the gradient of pre): kInterleaved, gate j at 2j and
// linear j at 2j+1 (HF GPT-OSS); kHalves, gate j at j and linear j at I + j (HF Qwen3-MoE,
// Mixtral, DeepSeek-V3: [gate | up]).
enum class GateLinear { kInterleaved, kHalves };

// The activation and its parameters; the defaults are the declared default activation's.
struct ActivationOptions {
  Activation activation = kDefaultActivation;
  float alpha = kDefaultAlpha;  // swiglu_oai's sigmoid scale
  float limit = activation_info(kDefaultActivation).default_limit;  // gated activations: clamp limit
  bool has_limit = activation_info(kDefaultActivation).has_default_limit;  // false: no clamping
                                                                           // (must be false when not gated)
};

// Forward of the up-projection, one launch:
//   pre[r, :] = group_scale[e] * (x[r, :] @ W_e) + bias[e, :]   width gemm.n, stored in gemm.y
//   h[r, :]   = act(pre[r, :])  width gemm.n / 2 (gated) or gemm.n, stored in h (bf16),
//               computed from pre as rounded to bf16, so a recomputation from the stored
//               pre is exact.
// gemm.row_scale must be null. gate_linear: the layout of W's (and the bias's) columns;
// kHalves needs a gated activation and a k-contiguous W (w_stride_k == 1): the kernel
// loads each (gate, linear) pair into adjacent rows of its tile, so pre always comes out
// interleaved (the layout act_backward reads), and h is the same either way.
// w_linear (kHalves only, optional): the two halves as two tensors (torchtitan's w1, w3).
// gemm.w then holds the gate half (columns j < n/2) and w_linear the linear half (column
// n/2 + j at w_linear + j * w_stride_n), with gemm.w's strides, a multiple of 16 bytes and
// less than 2^40 bytes from gemm.w (one TMA stride spans the two): after it, or, without a
// bias, before it (the kernel then loads each pair as (linear, gate) and its epilogue swaps
// the two back, so pre and h are the same).
struct ActForwardArgs {
  RaggedMGemmArgs gemm;
  void* h = nullptr;  // bf16 (gemm.m, width above), row stride ldh
  int64_t ldh = 0;
  ActivationOptions act;
  GateLinear gate_linear = GateLinear::kInterleaved;
  const void* w_linear = nullptr;
};

// Input gradient of the down-projection with the activation's backward, one launch:
//   u  = dy @ W_e  (gemm.x = dy (m, H); gemm.w = the matrix multiplied, (E, H, I): pass the
//        down-projection weight's transpose; gemm.n = I), kept in fp32
//   dh = p[r] * s[e] * u, with p = gemm.row_scale (router probabilities; optional, 1) and
//        s = gemm.group_scale (the down projection's per-expert scale; optional, 1)
//   dpre = dh * act'(pre), width 2I (gated: (dgate, dlinear) pairs) or I, bf16
//   gemm.y = p[r] * act(pre), width I (bf16): h recomputed (equal to the forward's) times
//        the row scale, the operand of the down projection's weight gradient
//   row_scale_grad[r] = sum_j act(pre)[r, j] * s[e] * u[r, j] + sum_n dy[r, n] * out_bias[e, n]
//        (optional fp32 (m,), needs row_scale): the gradient of p when the forward's output
//        was p * (s * h @ W_down + out_bias); out_bias (E, H) optional. Deterministic.
//   bias_grad[e, :] = the sum of dpre (as stored, bf16) over group e's rows, in fp32, in
//        dpre's column order (optional (num_groups, width of dpre) contiguous: the up
//        projection's bias gradient, from the epilogue's registers instead of a pass over
//        dpre; 0 for an empty group). Deterministic.
// gemm.bias must be null. Padding rows get zeros in every output.
struct ActBackwardArgs {
  RaggedMGemmArgs gemm;
  const void* pre = nullptr;  // bf16 (gemm.m, 2 * gemm.n or gemm.n) from the forward, row stride ldpre
  int64_t ldpre = 0;
  void* dpre = nullptr;  // bf16, the shape of pre, row stride lddpre
  int64_t lddpre = 0;
  float* row_scale_grad = nullptr;
  const void* out_bias = nullptr;  // bf16 (num_groups, gemm.k), row stride out_bias_stride
  int64_t out_bias_stride = 0;
  float* bias_grad = nullptr;  // fp32 (num_groups, width of dpre), or null
  ActivationOptions act;
  // The layout dpre is written in (pre is always interleaved). kHalves ([dgate | dlinear],
  // the up-projection weight's own layout, so its gradients need no repack) needs a gated
  // activation and an n-contiguous gemm.w (w_stride_n == 1).
  GateLinear dpre_layout = GateLinear::kInterleaved;
};

Result validate(const ActForwardArgs& args);
Result validate(const ActBackwardArgs& args);
Result workspace_size(const ActForwardArgs& args, size_t* bytes, const GemmOptions& opts = {});
Result workspace_size(const ActBackwardArgs& args, size_t* bytes, const GemmOptions& opts = {});
Result act_forward(const ActForwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                   const GemmOptions& opts = {});
Result act_backward(const ActBackwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                    const GemmOptions& opts = {});
Result act_forward(const ActForwardArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                   const GemmOptions& opts = {});
Result act_backward(const ActBackwardArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                    const GemmOptions& opts = {});

}  // namespace cute_moe

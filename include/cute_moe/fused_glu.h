// Public C++ API of the grouped GEMMs with a gated activation (GLU) fused into the
// epilogue: the up-projection of an expert FFN forward, and the input gradient of the
// down-projection with the activation's backward (no PyTorch).
//
// The up-projection's columns are interleaved: column 2j is gate j, column 2j+1 is
// linear j (the HF GPT-OSS layout; cute_moe.repack converts [gate | linear] halves).
// Conventions and guarantees as in grouped_gemm.h (device-side offs, no host sync,
// validation with messages, padding rows zero in every output).
#pragma once

#include "cute_moe/grouped_gemm.h"

namespace cute_moe {

enum class GluActivation {
  kSwigluOai,  // GPT-OSS: g = min(a, L), u = clamp(b, -L, L), h = g * sigmoid(alpha * g) * (u + 1)
};

struct GluOptions {
  GluActivation activation = GluActivation::kSwigluOai;
  float alpha = 1.702f;
  float limit = 7.0f;
  bool has_limit = true;  // false: no clamping (limit=None)
};

// Forward of the up-projection, one launch:
//   pre[r, :] = x[r, :] @ W_e + bias[e, :]   width gemm.n = 2I, stored in gemm.y (bf16)
//   h[r, j]   = act(pre[r, 2j], pre[r, 2j+1]) width I, stored in h (bf16), computed from
//               pre as rounded to bf16, so a recomputation from the stored pre is exact.
struct GluForwardArgs {
  RaggedMGemmArgs gemm;
  void* h = nullptr;  // bf16 (gemm.m, gemm.n / 2), row stride ldh
  int64_t ldh = 0;
  GluOptions glu;
};

// Input gradient of the down-projection with the activation's backward, one launch:
//   dh = dy @ W_e  (gemm.x = dy (m, H); gemm.w = the matrix multiplied, (E, H, I): pass the
//        down-projection weight's transpose; gemm.n = I), kept in fp32
//   dpre[r, 2j], dpre[r, 2j+1] = dh * dh/dgate, dh * dh/dlinear   width 2I, bf16
//   h = act(pre) recomputed, width I, stored in gemm.y (bf16), equal to the forward's h
// gemm.bias must be null.
struct GluBackwardArgs {
  RaggedMGemmArgs gemm;
  const void* pre = nullptr;  // bf16 (gemm.m, 2 * gemm.n) from the forward, row stride ldpre
  int64_t ldpre = 0;
  void* dpre = nullptr;  // bf16 (gemm.m, 2 * gemm.n), row stride lddpre
  int64_t lddpre = 0;
  GluOptions glu;
};

Result validate(const GluForwardArgs& args);
Result validate(const GluBackwardArgs& args);
Result workspace_size(const GluForwardArgs& args, size_t* bytes, const GemmOptions& opts = {});
Result workspace_size(const GluBackwardArgs& args, size_t* bytes, const GemmOptions& opts = {});
Result glu_forward(const GluForwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                   const GemmOptions& opts = {});
Result glu_backward(const GluBackwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                    const GemmOptions& opts = {});

}  // namespace cute_moe

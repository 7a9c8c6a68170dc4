// Public C++ API of the FP8 grouped GEMMs of the training recipe (docs/fp8.md; no PyTorch).
//
// e4m3 operands, each with fp32 block scales (x ~= q * scale, as fp8_quantize.h makes
// them), the scales applied to the fp32 accumulator once per 128-long block of the
// reduction; each output rounded once. Same conventions as grouped_gemm.h: offs on the
// device, never read on the host (no sync, CUDA-graph safe), checked on the device; every
// call validates its arguments on the host and returns a Result naming the bad argument.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cute_moe/fp8_quantize.h"     // fp8_group_row_blocks
#include "cute_moe/fused_activation.h"  // ActivationOptions
#include "cute_moe/grouped_gemm.h"      // GemmOptions, WorkspaceAllocator, kMaxGroups
#include "cute_moe/status.h"

namespace cute_moe {

// y[r, :] = row_scale[r] * (group_scale[e] * (deq(x)[r, :] @ deq(W_e)) + bias[e, :]) for every
// row r of group e (each of row_scale, group_scale and bias optional: 1, 1, 0); rows at or
// past offs[E-1] of y are written with zeros. The forward and input-gradient GEMMs.
//
// deq(x)[r, c] = x[r, c] * x_scale[r, c / 128]: x by 1 x 128 blocks (quantize_fp8_1x128).
// deq(W_e)[i, j] = W_e[i, j] * w_scale[e, i / 128, j / 128]: by 128 x 128 blocks
// (quantize_fp8_128x128). W_e is the (k x n) matrix whose element (i, j) sits at
// w + e * w_stride_group + i + j * w_stride_n: k-contiguous, the only layout FP8 tensor cores
// read (an (E, n, k) row-major tensor, e.g. quantize_fp8_128x128's q_t, used as x @ W[e].T).
// A scale array's element (i, j) sits at stride_row * i + stride_block * j (any
// non-negative strides: the kernel loads scales one by one).
struct Fp8RaggedMGemmArgs {
  int64_t m = 0;  // rows of x and y (an upper bound of offs[E-1])
  int64_t n = 0;  // columns of y, a multiple of 8
  int64_t k = 0;  // columns of x, a multiple of 16
  int32_t num_groups = 0;
  const int32_t* offs = nullptr;  // device, num_groups cumulative end offsets

  const void* x = nullptr;  // e4m3 (m, k), row stride ldx (a multiple of 16), unit column stride
  int64_t ldx = 0;
  const float* x_scale = nullptr;  // (m, ceil(k / 128))
  int64_t x_scale_stride_row = 0, x_scale_stride_block = 0;
  const void* w = nullptr;  // e4m3, see above; w_stride_n and w_stride_group multiples of 16
  int64_t w_stride_group = 0, w_stride_n = 0;
  const float* w_scale = nullptr;  // (num_groups, ceil(k / 128), ceil(n / 128))
  int64_t w_scale_stride_group = 0, w_scale_stride_k = 0, w_scale_stride_n = 0;
  const void* bias = nullptr;  // optional bf16 (num_groups, n), row stride bias_stride_group
  int64_t bias_stride_group = 0;
  const float* group_scale = nullptr;  // optional fp32 (num_groups,)
  const float* row_scale = nullptr;    // optional fp32 (m,)
  void* y = nullptr;  // bf16 (m, n), row stride ldy (a multiple of 8)
  int64_t ldy = 0;
};

Result validate(const Fp8RaggedMGemmArgs& args);
Result workspace_size(const Fp8RaggedMGemmArgs& args, size_t* bytes, const GemmOptions& opts = {});
Result fp8_ragged_m_gemm(const Fp8RaggedMGemmArgs& args, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream, const GemmOptions& opts = {});
Result fp8_ragged_m_gemm(const Fp8RaggedMGemmArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                         const GemmOptions& opts = {});
Result chosen_tile_config(const Fp8RaggedMGemmArgs& args, std::string* name, const GemmOptions& opts = {});

// The fused activation epilogues of fused_activation.h after the FP8 mainloop: the same
// outputs, from deq(x) @ deq(W_e) instead of x @ W_e. Gated activations read W's columns
// interleaved (column 2j gate j, 2j + 1 linear j: the k-contiguous W holds them as rows 2j and
// 2j + 1).
//
// Forward of the up-projection, one launch (act_forward's contract):
//   pre = group_scale[e] * (deq(x) @ deq(W_e)) + bias[e]   gemm.n wide, bf16 in gemm.y
//   h   = act(pre as rounded to bf16)                      gemm.n / 2 (gated) or gemm.n wide, bf16
// gemm.row_scale must be null.
// h_q (gated activations), instead of the bf16 h: h's e4m3 copy by 1 x 128 blocks along its
// columns, the down projection's operand, bit for bit act_quantize_fp8_1x128 of the bf16 pre
// (fp8_quantize.h): h_q (gemm.m, gemm.n / 2) e4m3, row stride ld_h_q bytes (a multiple of 16,
// as is h_q's address); h_scale (gemm.m, ceil(gemm.n / 256)) fp32, row stride ld_h_scale; gemm.n a
// multiple of 32. Rows past the groups' are not written. h must then be null.
struct Fp8ActForwardArgs {
  Fp8RaggedMGemmArgs gemm;
  void* h = nullptr;  // bf16, row stride ldh
  int64_t ldh = 0;
  ActivationOptions act;
  void* h_q = nullptr;
  int64_t ld_h_q = 0;
  float* h_scale = nullptr;
  int64_t ld_h_scale = 0;
};

// Input gradient of the down-projection with the activation's backward, one launch
// (act_backward's contract, interleaved dpre): gemm.x = dy quantized 1 x 128 (m, H), gemm.w =
// W_down as the k-contiguous (I x H) matrices (the (E, I, H) tensor itself, quantized 128 x 128),
// gemm.n = I, gemm.k = H;
//   u    = deq(dy) @ deq(W_down[e])^T, fp32;  dh = p[r] * s[e] * u  (p = gemm.row_scale, s =
//          gemm.group_scale, each optional)
//   dpre = dh * act'(pre), the width of pre, bf16;  gemm.y = p[r] * act(pre), I wide, bf16
//   row_scale_grad[r] = sum_j act(pre)[r, j] * s[e] * u[r, j] + sum_n dy[r, n] * out_bias[e, n]
//          (optional, needs row_scale; the bias term reads the bf16 dy, required with out_bias)
// gemm.bias must be null. Padding rows get zeros in every output.
// dpre_q (optional, gated activations): dpre's e4m3 copy by 1 x 128 blocks along its columns,
// written by the same epilogue (the operand of the up projection's input gradient; bit for bit
// quantize_fp8_1x128 of the bf16 dpre): dpre_q (gemm.m, dpre's width) e4m3, row stride ld_dpre_q
// bytes; dpre_scale (gemm.m, ceil(width / 128)) fp32, row stride ld_dpre_scale. Rows past the
// groups' are not written. (On an H100 it costs the kernel more than quantize_fp8_1x128 costs.)
struct Fp8ActBackwardArgs {
  Fp8RaggedMGemmArgs gemm;
  const void* pre = nullptr;  // bf16 (gemm.m, 2 * gemm.n or gemm.n), row stride ldpre
  int64_t ldpre = 0;
  void* dpre = nullptr;  // bf16, the shape of pre, row stride lddpre
  int64_t lddpre = 0;
  float* row_scale_grad = nullptr;
  const void* dy = nullptr;  // bf16 (gemm.m, gemm.k), row stride lddy: with out_bias only
  int64_t lddy = 0;
  const void* out_bias = nullptr;  // bf16 (num_groups, gemm.k), row stride out_bias_stride
  int64_t out_bias_stride = 0;
  ActivationOptions act;
  void* dpre_q = nullptr;  // null: no e4m3 copy
  int64_t ld_dpre_q = 0;
  float* dpre_scale = nullptr;
  int64_t ld_dpre_scale = 0;
};

Result validate(const Fp8ActForwardArgs& args);
Result validate(const Fp8ActBackwardArgs& args);
Result workspace_size(const Fp8ActForwardArgs& args, size_t* bytes, const GemmOptions& opts = {});
Result workspace_size(const Fp8ActBackwardArgs& args, size_t* bytes, const GemmOptions& opts = {});
Result fp8_act_forward(const Fp8ActForwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                       const GemmOptions& opts = {});
Result fp8_act_forward(const Fp8ActForwardArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                       const GemmOptions& opts = {});
Result fp8_act_backward(const Fp8ActBackwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                        const GemmOptions& opts = {});
Result fp8_act_backward(const Fp8ActBackwardArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                        const GemmOptions& opts = {});

// The weight gradients: dw[e] = deq(a_e)^T @ deq(b_e), a (k x n) fp32 sum over the routed rows
// of expert e rounded once to bf16; empty experts give exact zeros. The operands are
// quantize_fp8_128x1's (fp8_quantize.h): the (m, k) and (m, n) row-sorted matrices in blocks of
// 128 of each expert's rows, transposed, blocks = fp8_group_row_blocks(m, num_groups):
//   a_t  e4m3 (k, 128 blocks), row stride lda_t: block b of expert e's rows in columns
//        128 b .. 128 b + 127 (zeros past its last row); expert e's blocks follow those of
//        the experts before it, ceil(rows_e / 128) of them
//   a_scale  fp32 (blocks, k): one per 128 x 1 block, element (b, i) at
//        a_scale + b * a_scale_stride_block + i
//   b_t  the same layout for the (m, n) operand (the gradient), quantized with tile_scales:
//   b_scale  fp32 (blocks, ceil(n / 128)): one per 128 x 128 block (a 128-row block and 128
//        columns), element (b, j) at b_scale + b * b_scale_stride_block + j
// deq(a_e)[r, i] = a_t[i, column of r] * a_scale[block of r, i]; deq(b_e)[r, j] =
// b_t[j, column of r] * b_scale[block of r, j / 128].
struct Fp8RaggedKGemmArgs {
  int64_t m = 0;  // rows the operands were quantized from (an upper bound of offs[E-1])
  int64_t k = 0;  // rows of each dw[e] (of a_t), a multiple of 16
  int64_t n = 0;  // columns of each dw[e] (rows of b_t), a multiple of 16
  int32_t num_groups = 0;
  const int32_t* offs = nullptr;  // device, num_groups cumulative end offsets

  const void* a_t = nullptr;  // e4m3 (k, 128 blocks), row stride lda_t (a multiple of 16)
  int64_t lda_t = 0;
  const float* a_scale = nullptr;  // (blocks, k)
  int64_t a_scale_stride_block = 0;
  const void* b_t = nullptr;  // e4m3 (n, 128 blocks), row stride ldb_t (a multiple of 16)
  int64_t ldb_t = 0;
  const float* b_scale = nullptr;  // (blocks, ceil(n / 128))
  int64_t b_scale_stride_block = 0;
  void* dw = nullptr;  // bf16 (num_groups, k, n) contiguous
};

Result validate(const Fp8RaggedKGemmArgs& args);
Result workspace_size(const Fp8RaggedKGemmArgs& args, size_t* bytes, const GemmOptions& opts = {});
Result fp8_ragged_k_gemm(const Fp8RaggedKGemmArgs& args, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream, const GemmOptions& opts = {});
Result fp8_ragged_k_gemm(const Fp8RaggedKGemmArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                         const GemmOptions& opts = {});
Result chosen_tile_config(const Fp8RaggedKGemmArgs& args, std::string* name, const GemmOptions& opts = {});

}  // namespace cute_moe

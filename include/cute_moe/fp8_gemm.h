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

#include "cute_moe/grouped_gemm.h"  // GemmOptions, WorkspaceAllocator, kMaxGroups
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

}  // namespace cute_moe

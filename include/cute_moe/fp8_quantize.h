// Public C++ API of the FP8 quantizers of the training recipe (docs/fp8.md; no PyTorch).
//
// e4m3 values with one fp32 scale per block, x ~= q * scale, scale = amax(block) / 448 (1 for
// an all-zero block), q = round-to-nearest-even(clamp(x / scale, -448, 448)): bit for bit
// what cute_moe.reference.fp8 computes (a NaN in a block leaves the block's scale as the
// finite values give it and its own q NaN; an inf makes the block's scale inf).
//   quantize_fp8_1x128     activations: one scale per row and 128 consecutive columns
//   quantize_fp8_128x128   weights: one scale per 128 x 128 tile of each (k, n) matrix, into
//                          the matrix as it is (q) and/or transposed (q_t, (n, k) row-major,
//                          the operand layout of the other GEMM), in one pass
// The amax and the scales are computed on the device (no host sync; CUDA-graph safe).
// Requirements: bf16 input with unit column stride, row stride and column count multiples
// of 16 elements and 16-byte aligned base pointers (the fp8 outputs are 16-byte rows of the
// TMA loads that will read them); outputs contiguous as described per field. Every call
// validates on the host and returns a Result naming the bad argument.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cute_moe/status.h"

namespace cute_moe {

// (rows, cols) bf16 -> q (rows, cols) e4m3 and scale (rows, ceil(cols / 128)) fp32.
struct QuantizeFp8RowsArgs {
  int64_t rows = 0;
  int64_t cols = 0;             // a multiple of 16
  const void* src = nullptr;    // bf16, row stride ld_src (a multiple of 16)
  int64_t ld_src = 0;
  void* q = nullptr;            // e4m3 (rows, cols), row stride ld_q (a multiple of 16)
  int64_t ld_q = 0;
  float* scale = nullptr;       // (rows, ceil(cols / 128)), contiguous
};

// batches of (k, n) bf16 -> q (batches, k, n) and/or q_t (batches, n, k) e4m3, both
// contiguous; scale (batches, ceil(k / 128), ceil(n / 128)) and/or scale_t (batches,
// ceil(n / 128), ceil(k / 128)) fp32, contiguous. At least one of q, q_t.
struct QuantizeFp8TilesArgs {
  int64_t batches = 0;
  int64_t k = 0;                  // a multiple of 16
  int64_t n = 0;                  // a multiple of 16
  const void* src = nullptr;      // bf16 (batches, k, n): row stride ld_src, batch stride batch_stride_src
  int64_t ld_src = 0;             // a multiple of 16
  int64_t batch_stride_src = 0;   // a multiple of 16
  void* q = nullptr;              // optional
  float* scale = nullptr;         // with q
  void* q_t = nullptr;            // optional
  float* scale_t = nullptr;       // with q_t
};

// Argument checks alone (also run by the calls).
Result validate(const QuantizeFp8RowsArgs& args);
Result validate(const QuantizeFp8TilesArgs& args);

Result quantize_fp8_1x128(const QuantizeFp8RowsArgs& args, cudaStream_t stream);
Result quantize_fp8_128x128(const QuantizeFp8TilesArgs& args, cudaStream_t stream);

}  // namespace cute_moe

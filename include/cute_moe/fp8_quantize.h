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
//   quantize_fp8_128x1     activations and gradients entering a weight gradient (reduction
//                          along the routed rows): one scale per column and 128 rows of one
//                          group, transposed and padded per group (the k-major operand the
//                          FP8 tensor cores read)
//   act_quantize_fp8_1x128 the up projection's activation and h's 1x128 quantization in one
//                          pass over pre (the down projection's FP8 operand)
//   quantize_fp8_1x128_column_sums
//                          1x128 of rows sorted by group, with each group's column sums (a
//                          bias gradient) from the same read
// The amax and the scales are computed on the device (no host sync; CUDA-graph safe).
// Requirements: bf16 input with unit column stride, row stride and column count multiples
// of 16 elements and 16-byte aligned base pointers (the fp8 outputs are 16-byte rows of the
// TMA loads that will read them); outputs contiguous as described per field. Every call
// validates on the host and returns a Result naming the bad argument.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cute_moe/fused_activation.h"  // ActivationOptions
#include "cute_moe/status.h"

namespace cute_moe {

// (rows, cols) bf16 -> q (rows, cols) e4m3 and scale (rows, ceil(cols / 128)) fp32; with an
// index, row r of q is quantized from row index[r] of src (the gather of the combine's
// backward: dy's 1x128 copy read from the tokens' gradient, no bf16 dy in between).
struct QuantizeFp8RowsArgs {
  int64_t rows = 0;
  int64_t cols = 0;             // a multiple of 16
  const void* src = nullptr;    // bf16, row stride ld_src (a multiple of 16)
  int64_t ld_src = 0;
  void* q = nullptr;            // e4m3 (rows, cols), row stride ld_q (a multiple of 16)
  int64_t ld_q = 0;
  float* scale = nullptr;       // (rows, ceil(cols / 128)), contiguous
  // Optional gather (quantize_fp8_1x128 only): device (rows,) int32; each value must lie in
  // [0, src_rows), checked on the device (a bad one prints its position and traps, as the
  // permute kernels do).
  const int32_t* index = nullptr;
  int64_t src_rows = 0;         // src's rows, with index
};

// pre (rows, w) bf16 -> h = act(pre) computed in fp32 from pre and rounded to bf16 (the h the
// fused up projection writes, act_forward / fp8_act_forward), quantized as quantize_fp8_1x128
// quantizes it: q (rows, cols) e4m3 and scale (rows, ceil(cols / 128)) fp32. A gated activation
// reads pre's columns as interleaved (gate, linear) pairs, w = 2 * cols; any other w = cols.
// rows.src is pre, rows.ld_src its row stride (>= w); rows.cols is h's width.
struct ActQuantizeFp8RowsArgs {
  QuantizeFp8RowsArgs rows;
  ActivationOptions act;
};

// batches of (k, n) bf16 -> q (batches, k, n) contiguous and/or q_t (batches, n, k) with row
// pitch ld_q_t (batch stride n * ld_q_t) e4m3; scale (batches, ceil(k / 128), ceil(n / 128))
// and/or scale_t (batches, ceil(n / 128), ceil(k / 128)) fp32, contiguous. At least one of
// q, q_t. (q_t's rows are written 128 bytes of k at a time: a pitch that keeps each such piece
// in one 128-byte line writes 1.16-1.24x faster than k = 2880's, H100 / H200, session 26.)
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
  int64_t ld_q_t = 0;             // q_t's row pitch: >= k, a multiple of 16; 0: k
  float* scale_t = nullptr;       // with q_t
};

// (m, n) bf16 rows sorted by group (offs: cumulative end rows on the device) -> q_t (n, ld_q_t)
// e4m3 and scale (blocks, n) fp32, blocks = ceil(m / 128) + num_groups. Group e's rows are cut
// into ceil(rows_e / 128) blocks of 128, numbered after those of the groups before it
// (first_e = sum over g < e of ceil(rows_g / 128)); block first_e + j holds its rows
// begin_e + 128 j + i at column 128 (first_e + j) + i of q_t, zeros after the group's last
// row, with scale row first_e + j: one scale per column of x. So each group starts on a
// 128-column boundary, no block straddles two groups, and a weight-gradient GEMM reads
// group e as columns [128 first_e, 128 (first_e + ceil(rows_e / 128))) of a k-major operand.
// Columns past the last group's blocks (up to 128 * blocks) are zero with scale 1; padding
// rows (at or past offs[E-1]) are not read into them.
// Optionally (q non-null) the same pass also writes quantize_fp8_1x128's outputs for every row,
// padding rows included: one read of x for both copies (the input gradient's and the weight
// gradient's of one operand). With an index, row r of x is src's row index[r] (both copies;
// the gather of the dispatch fused in, as quantize_fp8_1x128's).
struct QuantizeFp8GroupColumnsArgs {
  int64_t rows = 0;                 // m
  int64_t cols = 0;                 // n, a multiple of 16
  int32_t num_groups = 0;
  const int32_t* offs = nullptr;    // device, num_groups cumulative end rows
  const void* src = nullptr;        // bf16 (rows, cols), row stride ld_src (a multiple of 16)
  int64_t ld_src = 0;
  void* q_t = nullptr;              // e4m3 (cols, ld_q_t), ld_q_t >= 128 * blocks, a multiple of 16
  int64_t ld_q_t = 0;
  float* scale = nullptr;           // (blocks, cols), contiguous; with tile_scales (blocks, ceil(cols / 128))
  // One scale per 128 x 128 block (a 128-row block of one group and 128 columns) instead of one
  // per column: the block's amax over all its columns, q_t laid out as above.
  bool tile_scales = false;
  void* q = nullptr;                // optional: e4m3 (rows, cols), row stride ld_q (a multiple of 16)
  int64_t ld_q = 0;
  float* q_scale = nullptr;         // with q: (rows, ceil(cols / 128)), contiguous
  // Optional gather: device (rows,) int32, each value in [0, src_rows), checked on the device
  // (a bad one prints its position and traps) where its row is read.
  const int32_t* index = nullptr;
  int64_t src_rows = 0;             // src's rows, with index
};

// quantize_fp8_1x128 of rows sorted by group (rows.index must be null) with, from the same read
// of each row, each group's column sums in fp32: sums[g, :] = the sum of rows offs[g - 1] ..
// offs[g] - 1 (offs[-1] = 0), each column's rows added in row order, the chunks of 128 rows in
// chunk order (group_column_sum's scheme: deterministic, the same bits). In the FP8 block the
// up projection's bias gradient and its input-gradient operand both come from dpre, read once.
// Rows at or past offs[num_groups - 1] are quantized, not summed; an empty group's sums are 0.
struct QuantizeFp8RowsColumnSumsArgs {
  QuantizeFp8RowsArgs rows;
  int32_t num_groups = 0;
  const int32_t* offs = nullptr;  // device, num_groups cumulative end rows
  float* sums = nullptr;          // fp32 (num_groups, rows.cols), contiguous
};

// The blocks of quantize_fp8_128x1 for m rows in num_groups groups (an upper bound, known
// without the routing).
inline int64_t fp8_group_row_blocks(int64_t rows, int32_t num_groups) { return (rows + 127) / 128 + num_groups; }

// Argument checks alone (also run by the calls).
Result validate(const QuantizeFp8RowsArgs& args);
Result validate(const QuantizeFp8TilesArgs& args);
Result validate(const QuantizeFp8GroupColumnsArgs& args);
Result validate(const ActQuantizeFp8RowsArgs& args);
Result validate(const QuantizeFp8RowsColumnSumsArgs& args);

// fp32 scratch of quantize_fp8_1x128_column_sums (its column sums' partials), in bytes.
Result workspace_size(const QuantizeFp8RowsColumnSumsArgs& args, size_t* bytes);

Result quantize_fp8_1x128(const QuantizeFp8RowsArgs& args, cudaStream_t stream);
Result quantize_fp8_128x128(const QuantizeFp8TilesArgs& args, cudaStream_t stream);
Result quantize_fp8_128x1(const QuantizeFp8GroupColumnsArgs& args, cudaStream_t stream);
Result act_quantize_fp8_1x128(const ActQuantizeFp8RowsArgs& args, cudaStream_t stream);
// workspace: 16-byte aligned device memory of workspace_size() bytes, free again once the
// stream has passed this call.
Result quantize_fp8_1x128_column_sums(const QuantizeFp8RowsColumnSumsArgs& args, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream);

}  // namespace cute_moe

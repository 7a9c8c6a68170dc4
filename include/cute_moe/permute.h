// Public C++ API of the token permute / unpermute of an MoE layer (no PyTorch).
//
// Routing of T tokens to their top-k experts gives M = T*k routed rows sorted by expert,
// described by two int32 index arrays that the router builds on the device:
//   row_token  (M,):   the token of routed row r;
//   token_rows (T, k): the routed row of (token t, choice j), the inverse permutation.
// Dispatch (permute) and combine (unpermute) and their gradients are three gathers:
//   gather_rows:      out[r, :] = scale[r] * src[index[r], :]
//   gather_sum_rows:  out[t, :] = sum_{j = 0..k-1, in order} weight[t, j] * src[index[t, j], :]
//   gather_rows_dot:  out[t, j] = sum_n a[t, n] * src[index[t, j], n]
// The combine is written as a gather over token_rows rather than a scatter-add over
// row_token, so every output element has one writer and a fixed summation order: no
// atomics, the same input gives the same bits.
//
// bf16 rows, fp32 arithmetic, each output rounded once (an unscaled gather is a plain
// copy). Rows are read with 16-byte vectors, so the row length `cols` must be a multiple
// of 8 and every row 16-byte aligned (row strides multiples of 8 elements, 16-byte
// aligned base pointers); there is no scalar tail. index, scale and weight are
// contiguous. Every call validates its arguments on the host and returns a Result whose
// message names the argument and its value; the index values themselves are checked on
// the device (0 <= index < src_rows): a violation prints the offending position and value
// and stops the kernel with a trap, never an out-of-bounds read. Calls only enqueue work
// on the stream: no host synchronisation, no workspace, CUDA-graph safe.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cute_moe/status.h"

namespace cute_moe {

// out[r, :] = scale[r] * src[index[r], :] (the dispatch x_sorted = x[row_token], or with a
// scale the unpermute's input gradient).
struct GatherRowsArgs {
  int64_t rows = 0;      // rows of out = entries of index (M)
  int64_t cols = 0;      // row length (H), a multiple of 8
  int64_t src_rows = 0;  // rows of src (T); every index must lie in [0, src_rows)
  const void* src = nullptr;  // bf16 (src_rows, cols), row stride ld_src
  int64_t ld_src = 0;
  const int32_t* index = nullptr;  // device (rows,)
  const float* scale = nullptr;    // optional device fp32 (rows,); null: a plain copy
  void* out = nullptr;             // bf16 (rows, cols), row stride ld_out
  int64_t ld_out = 0;
};

// out[t, :] = sum over j = 0..k-1, in that order, of weight[t, j] * src[index[t, j], :]
// (the combine, and with no weight the permute's input gradient). k = 0 gives zeros.
struct GatherSumRowsArgs {
  int64_t rows = 0;      // rows of out (T)
  int64_t k = 0;         // source rows summed per output row
  int64_t cols = 0;      // row length (H), a multiple of 8
  int64_t src_rows = 0;  // rows of src (M); every index must lie in [0, src_rows)
  const void* src = nullptr;  // bf16 (src_rows, cols), row stride ld_src
  int64_t ld_src = 0;
  const int32_t* index = nullptr;  // device (rows, k), contiguous
  const float* weight = nullptr;   // optional device fp32 (rows, k), contiguous; null: all ones
  void* out = nullptr;             // bf16 (rows, cols), row stride ld_out
  int64_t ld_out = 0;
};

// out[t, j] = sum over n of a[t, n] * src[index[t, j], n] (the gradient of the combine's
// weight). cols = 0 gives zeros.
struct GatherRowsDotArgs {
  int64_t rows = 0;      // rows of a and out (T)
  int64_t k = 0;         // columns of out
  int64_t cols = 0;      // row length (H), a multiple of 8
  int64_t src_rows = 0;  // rows of src (M); every index must lie in [0, src_rows)
  const void* a = nullptr;  // bf16 (rows, cols), row stride ld_a
  int64_t ld_a = 0;
  const void* src = nullptr;  // bf16 (src_rows, cols), row stride ld_src
  int64_t ld_src = 0;
  const int32_t* index = nullptr;  // device (rows, k), contiguous
  float* out = nullptr;            // fp32 (rows, k), contiguous
};

// Argument checks alone (also run by the calls below).
Result validate(const GatherRowsArgs& args);
Result validate(const GatherSumRowsArgs& args);
Result validate(const GatherRowsDotArgs& args);

// Enqueue the computation on `stream`.
Result gather_rows(const GatherRowsArgs& args, cudaStream_t stream);
Result gather_sum_rows(const GatherSumRowsArgs& args, cudaStream_t stream);
Result gather_rows_dot(const GatherRowsDotArgs& args, cudaStream_t stream);

}  // namespace cute_moe

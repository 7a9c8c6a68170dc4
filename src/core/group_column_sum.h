// Per-group column sums of a row-sorted matrix (the bias gradient db[e] = sum of dy over
// the rows of group e), sync-free and deterministic.
//
// Pass 1 cuts the rows into fixed chunks of kColumnSumChunkRows and writes one fp32
// partial sum per (chunk c, group g) pair that shares rows. Because rows are sorted by
// group, those pairs form a staircase in which c + g strictly increases, so c + g is a
// collision-free slot: the partial buffer needs only (chunks + groups) rows.
// Pass 2 adds, for each group, its chunks' partials in chunk order. No atomics: the same
// input gives the same bits.
// Pass 1 can also read its rows through an index (writing the gathered rows out: the
// combine's output gradient taken back to sorted rows) and take each row's dot product with
// its group's bias (the bias term of a row-scale gradient), so one read of dy serves all
// three; the row dots are added per row in a fixed order too.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cute_moe/grouped_gemm.h"
#include "host_device.h"

namespace cute_moe::detail {

constexpr int64_t kColumnSumChunkRows = 128;

CUTE_MOE_HOST_DEVICE int64_t column_sum_chunks(int64_t m) { return (m + kColumnSumChunkRows - 1) / kColumnSumChunkRows; }

// The slot of the partial sum of chunk c restricted to group g.
CUTE_MOE_HOST_DEVICE int64_t column_sum_slot(int64_t chunk, int64_t group) { return chunk + group; }

// Row-dot partials: each warp of pass 1 covers 32 lanes x 8 columns of a row and writes its
// part of the row's dot product with the bias; pass 2 adds a row's parts in order.
constexpr int64_t kRowDotSliceColumns = 256;
CUTE_MOE_HOST_DEVICE int64_t row_dot_slices(int64_t n) { return (n + kRowDotSliceColumns - 1) / kRowDotSliceColumns; }

// fp32 scratch the two passes need (with_row_dot: also the row-dot partials, slices x m).
inline size_t column_sum_workspace_bytes(int64_t m, int64_t n, int32_t num_groups, bool with_row_dot = false) {
  size_t bytes = static_cast<size_t>(column_sum_chunks(m) + num_groups) * static_cast<size_t>(n) * sizeof(float);
  if (with_row_dot) bytes += static_cast<size_t>(row_dot_slices(n)) * static_cast<size_t>(m) * sizeof(float);
  return bytes;
}

// GroupColumnSumArgs (grouped_gemm.h), validated: out[g, :] = sum over rows r of group g of
// row_scale[r] * row_r (bf16 rows: src[r] or, with an index, src[index[r]], also copied to
// gathered), and row_dot[r] = row_r . bias[group(r)] when given.
cudaError_t launch_group_column_sum(const GroupColumnSumArgs& args, float* workspace, cudaStream_t stream);

}  // namespace cute_moe::detail

// Per-group column sums of a row-sorted matrix (the bias gradient db[e] = sum of dy over
// the rows of group e), sync-free and deterministic.
//
// Pass 1 cuts the rows into fixed chunks of kColumnSumChunkRows and writes one fp32
// partial sum per (chunk c, group g) pair that shares rows. Because rows are sorted by
// group, those pairs form a staircase in which c + g strictly increases, so c + g is a
// collision-free slot: the partial buffer needs only (chunks + groups) rows.
// Pass 2 adds, for each group, its chunks' partials in chunk order. No atomics: the same
// input gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "host_device.h"

namespace cute_moe::detail {

constexpr int64_t kColumnSumChunkRows = 128;

CUTE_MOE_HOST_DEVICE int64_t column_sum_chunks(int64_t m) { return (m + kColumnSumChunkRows - 1) / kColumnSumChunkRows; }

// The slot of the partial sum of chunk c restricted to group g.
CUTE_MOE_HOST_DEVICE int64_t column_sum_slot(int64_t chunk, int64_t group) { return chunk + group; }

// fp32 scratch the two passes need.
inline size_t column_sum_workspace_bytes(int64_t m, int64_t n, int32_t num_groups) {
  return static_cast<size_t>(column_sum_chunks(m) + num_groups) * static_cast<size_t>(n) * sizeof(float);
}

// out[g, :] = sum over rows r of group g of row_scale[r] * src[r, :] (bf16 src with row
// pitch ld, n % 8 == 0; row_scale optional, 1).
cudaError_t launch_group_column_sum(const void* src, int64_t m, int64_t n, int64_t ld, const float* row_scale,
                                   const int32_t* offs, int32_t num_groups, float* out, float* workspace,
                                   cudaStream_t stream);

}  // namespace cute_moe::detail

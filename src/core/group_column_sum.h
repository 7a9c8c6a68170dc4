// Per-group column sums of a row-sorted matrix (the bias gradient db[e] = sum of dy over
// the rows of group e), sync-free and deterministic.
//
// Pass 1 cuts the rows into fixed chunks of kColumnSumChunkRows and writes one fp32
// partial sum per (chunk c, group g) pair that shares rows. Because rows are sorted by
// group, those pairs form a staircase in which c + g strictly increases, so c + g is a
// collision-free slot: the partial buffer needs only (chunks + groups) rows.
// Pass 2 adds, for each group, its chunks' partials in a fixed order (eight warps each take
// every eighth chunk, in order, then the warps' sums are added in warp order). No atomics: the
// same input gives the same bits.
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

// Partial rows per slot of the fused epilogues' column sums (sm90/tile_column_sums.cuh): one
// per warp of the two consumer warpgroups; and the partial rows of m rows in `groups` groups.
constexpr int32_t kTileColumnSumWarps = 8;
CUTE_MOE_HOST_DEVICE int64_t tile_column_sum_rows(int64_t m, int32_t groups) {
  return (column_sum_chunks(m) + groups) * kTileColumnSumWarps;
}
// The slot of tile t (rows begin + 128 t ..) of the group starting at row `begin`: unique,
// as column_sum_slot, since the tile's first row lies in chunk (begin + 128 t) / 128.
CUTE_MOE_HOST_DEVICE int64_t tile_column_sum_slot(int64_t begin, int64_t tile, int32_t group) {
  return column_sum_slot((begin + tile * kColumnSumChunkRows) / kColumnSumChunkRows, group);
}

// Pass 2 alone, over partials a fused epilogue wrote by tile (sm90/tile_column_sums.cuh):
// group g's tiles t < ceil(rows_g / 128) hold rows_per_slot partial rows each at slot
// floor(begin_g / 128) + g + t; out[g, :] = their sum in a fixed order, pass 2's (0 for an
// empty group).
struct TileColumnSumArgs {
  const float* partial = nullptr;  // (slots * rows_per_slot, width), rows ld floats apart
  int64_t ld = 0;
  int32_t rows_per_slot = 0;
  int64_t width = 0;
  int64_t m = 0;                   // rows of the GEMM the tiles cover
  const int32_t* offs = nullptr;   // device: cumulative end rows per group
  int32_t num_groups = 0;
  float* out = nullptr;            // fp32 (num_groups, width) contiguous
};
cudaError_t launch_tile_column_sum(const TileColumnSumArgs& args, cudaStream_t stream);

}  // namespace cute_moe::detail

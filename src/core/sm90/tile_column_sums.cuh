// Per-group column sums of an epilogue's output taken from the registers that hold it (the
// up projection's bias gradient, db_up[e] = the sum of dpre over expert e's rows, from the
// fused backward's epilogue instead of a pass that reads dpre back).
//
// One tile's share, per warp and epilogue subtile. In the WGMMA accumulator layout a
// thread holds, of a 32-column subtile, the columns 2q + b + 8j (q = lane % 4, b = 0, 1,
// j = 0..3), each in two rows of each 64-row half it covers; the thread adds its rows,
// the warp adds over its 8 row groups (lane / 4) by a reduce-scatter (each of three
// shuffle steps halves what a lane holds: 7 shuffles per value a column carries, where a
// plain tree takes 24), and every lane then holds one column of the subtile and stores it
// into the warp's partial row of the tile's slot. One row per warp, not per tile: the
// cross-warp sum would need shared memory, and the fused backward's is full (226 of 227
// KB at 128x192). group_column_sum.cu adds a group's partial rows in a fixed order
// (deterministic, no atomics).
//
// Slots: a ragged-M tile is 128 rows of one group, starting at the group's first row
// `begin` + 128 t, so slot = floor((begin + 128 t) / 128) + group is unique (rows are
// sorted by group and c + g grows along the staircase, as in group_column_sum.h) and below
// ceil(m / 128) + groups.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include "group_column_sum.h"  // kColumnSumChunkRows, kTileColumnSumWarps

namespace cute_moe::detail {

// One thread's sums; kValues: sums per column (2: a gated dpre's dgate and dlinear).
template <int kValues>
struct TileColumnSums {
  static constexpr int kColumns = 8;  // of a 32-column subtile: 2q + b + 8j
  float sum[kColumns][kValues];

  CUTLASS_DEVICE void clear() {
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kColumns; ++k) {
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kValues; ++g) sum[k][g] = 0.0f;
    }
  }

  // dn: the value's column less the thread's first column of the subtile (8j + b; a
  // compile-time constant after unrolling, so the sums stay in registers).
  CUTLASS_DEVICE void add(int dn, int g, float v) { sum[(dn / 8) * 2 + (dn % 2)][g] += v; }

  // Sums the warp's lanes of equal lane % 4, then stores: lane L ends with column
  // first + 8 j + b, (j, b) = ((L >> 3) & 3, (L >> 2) & 1), of which value g goes to
  // row[column * col_stride + g * value_stride]; columns at or past `cols` are not stored.
  // Every lane of the warp must call it (shuffles).
  CUTLASS_DEVICE void store(float* row, int32_t first, int32_t cols, int64_t col_stride, int64_t value_stride) const {
    constexpr unsigned kAll = 0xffffffffu;
    const int lane = threadIdx.x % 32;
    float x[kColumns][kValues];
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kColumns; ++k) {
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kValues; ++g) x[k][g] = sum[k][g];
    }
    // Three steps: lanes with the step's bit set keep the upper half of their k range and
    // send the lower half to their partner, which keeps the lower half. After them,
    // x[0] holds k = (lane >> 2) & 7 summed over the 8 lanes.
    CUTLASS_PRAGMA_UNROLL
    for (int half = kColumns / 2, bit = 16; half >= 1; half /= 2, bit /= 2) {
      const bool upper = lane & bit;
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < half; ++k) {
        CUTLASS_PRAGMA_UNROLL
        for (int g = 0; g < kValues; ++g) {
          const float keep = upper ? x[k + half][g] : x[k][g];
          const float send = upper ? x[k][g] : x[k + half][g];
          x[k][g] = keep + __shfl_xor_sync(kAll, send, bit);
        }
      }
    }
    const int k = (lane >> 2) & 7;
    const int32_t column = first + 8 * (k / 2) + (k % 2);
    if (column >= cols) return;
    float* dst = row + column * col_stride;
    if constexpr (kValues == 2) {
      if (value_stride == 1) {  // interleaved pairs: one 8-byte store
        *reinterpret_cast<float2*>(dst) = make_float2(x[0][0], x[0][1]);
        return;
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < kValues; ++g) dst[g * value_stride] = x[0][g];
  }
};

}  // namespace cute_moe::detail

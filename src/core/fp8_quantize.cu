// The FP8 quantizers of the training recipe (fp8_quantize.h): block amax, scale and e4m3
// cast in one pass over the bf16 input, bit for bit cute_moe.reference.fp8.
#include <cstdint>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "cute_moe/fp8_quantize.h"
#include "launch_result.h"
#include "act_functors.h"  // generated: ActFunctor<Act> -> functor of activations.h
#include "checked_row.cuh"
#include "column_sum_quantize.h"
#include "fp8_block_math.cuh"
#include "fp8_rows_math.cuh"
#include "group_column_sum.h"  // column_sum_workspace_bytes

namespace cute_moe {

namespace {

using namespace fp8_math;  // kBlock, nan_max, block_scale, ScaleDivisor, e4m3x2, e4m3x8, to_float,
                           // bf16_abs_max, quantize_rows_1x128

// The activation pass's input, eight values of one row: the h of an activation computed from
// pre as the fused up projection computes and rounds it (to bf16), in fp32.
template <class Activation>
struct ActSource {
  __device__ static void load(const __nv_bfloat16* row, int64_t col, const detail::ActParams& p, float (&x)[8]) {
    if constexpr (Activation::kGated) {  // columns 2 col .. 2 col + 15 of pre: eight (gate, linear) pairs
      float pre[16];
      float(&lo)[8] = *reinterpret_cast<float(*)[8]>(pre);
      float(&hi)[8] = *reinterpret_cast<float(*)[8]>(pre + 8);
      to_float(*reinterpret_cast<const uint4*>(row + 2 * col), lo);
      to_float(*reinterpret_cast<const uint4*>(row + 2 * col + 8), hi);
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = __bfloat162float(__float2bfloat16_rn(Activation::forward(pre[2 * j], pre[2 * j + 1], p)));
    } else {
      float pre[8];
      to_float(*reinterpret_cast<const uint4*>(row + col), pre);
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = __bfloat162float(__float2bfloat16_rn(Activation::forward(pre[j], p)));
    }
  }
};

constexpr int kRowsThreads = 256;  // the 1x128 passes' CTA

// The 1x128 pass over a bf16 matrix: one warp per (8 rows, 256-column span), lane l holding
// columns 8l .. 8l + 7 of the span of each of the 8 rows, lanes 0-15 the span's first 128-column
// block and 16-31 its second. (cols is a multiple of 16, so a lane's eight are all inside or all
// outside.) With an index, lanes 0-7 read and check the 8 rows' source rows and the warp shares
// them. 1.35x the row-a-warp scheme of quantize_act_rows_kernel below, whose 16 lanes of a
// block each divide its scale (H200, session 41).
__global__ void quantize_rows_kernel(QuantizeFp8RowsArgs a, int64_t spans_per_row, int64_t blocks_per_row) {
  const int lane = threadIdx.x & 31;
  const int64_t item = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (item >= (a.rows + 7) / 8 * spans_per_row) return;
  const int64_t row0 = item / spans_per_row * 8, span = item % spans_per_row;
  const int rows = static_cast<int>(min(int64_t(8), a.rows - row0));
  const int64_t col = span * 2 * kBlock + 8 * lane;
  const bool inside = col < a.cols;
  int64_t src_row = row0 + (lane & 7);
  if (a.index != nullptr) {
    int32_t v = 0;
    if (lane < rows) v = detail::checked_row(a.index, row0 + lane, 1, a.src_rows, "quantize_fp8_1x128");
    src_row = v;
  }
  const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(a.src);
  uint4 raw[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t r = __shfl_sync(0xffffffffu, src_row, i);
    raw[i] = make_uint4(0, 0, 0, 0);
    if (i < rows && inside) raw[i] = *reinterpret_cast<const uint4*>(src + r * a.ld_src + col);
  }
  const int64_t blk = 2 * span + (lane >> 4);
  quantize_rows_1x128(raw, rows, inside, static_cast<uint8_t*>(a.q) + row0 * a.ld_q + col, a.ld_q,
                      blk < blocks_per_row, a.scale + row0 * blocks_per_row + blk, blocks_per_row);
}

// The activation's 1x128 pass: one warp per (row, 256-column span), the lanes' columns as in
// quantize_rows_kernel, each half warp reducing its block's amax and every lane dividing its
// scale. The activation computes more per value and reads twice the bytes of a gated pre:
// holding 8 rows of it (75 registers) cost the pass occupancy, 3-18% slower (H200, session 41).
template <class Source>
__global__ void quantize_act_rows_kernel(QuantizeFp8RowsArgs a, detail::ActParams p, int64_t spans_per_row,
                                        int64_t blocks_per_row) {
  const int lane = threadIdx.x & 31;
  const int64_t item = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (item >= a.rows * spans_per_row) return;
  const int64_t row = item / spans_per_row, span = item % spans_per_row;
  const int64_t col = span * 2 * kBlock + 8 * lane;
  const bool inside = col < a.cols;
  int64_t src_row = row;
  if (a.index != nullptr) {  // the gather: lane 0 reads and checks the row, the warp shares it
    int32_t v = 0;
    if (lane == 0) v = detail::checked_row(a.index, row, 1, a.src_rows, "quantize_fp8_1x128");
    src_row = __shfl_sync(0xffffffffu, v, 0);
  }
  float x[8] = {};
  if (inside) Source::load(static_cast<const __nv_bfloat16*>(a.src) + src_row * a.ld_src, col, p, x);
  const float scale = quantize_half_warp_block(x, inside, static_cast<uint8_t*>(a.q) + row * a.ld_q + col);
  const int64_t blk = 2 * span + (lane >> 4);
  if ((lane & 15) == 0 && blk < blocks_per_row) a.scale[row * blocks_per_row + blk] = scale;
}

constexpr int kTileThreads = 256;
constexpr int kTilePad = 16;  // bytes of padding per smem row

// Column t / 2 of a 128 x 128 e4m3 tile in shared memory, as one row of a transposed output: the
// two threads of a row store its 128 bytes in four rounds of 32 (thread t the 16 at 16 (t % 2)),
// so that each store instruction writes whole 32-byte sectors; the rows from `valid` on left
// unwritten.
__device__ __forceinline__ void store_transposed(const uint8_t (&tile)[kBlock][kBlock + kTilePad], int t, uint8_t* dst,
                                                 int64_t valid) {
  const int j = t / 2, half = t % 2;
#pragma unroll
  for (int c = 0; c < 4; ++c) {  // 16 rows per 16-byte store
    const int k0 = 32 * c + 16 * half;
    if (k0 >= valid) break;
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      w[q] = uint32_t(tile[k0 + 4 * q][j]) | (uint32_t(tile[k0 + 4 * q + 1][j]) << 8) |
             (uint32_t(tile[k0 + 4 * q + 2][j]) << 16) | (uint32_t(tile[k0 + 4 * q + 3][j]) << 24);
    }
    *reinterpret_cast<uint4*>(dst + k0) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// One CTA of 256 threads per 128 x 128 tile: thread t holds the 8 columns 8 (t % 16) .. +7
// of rows t / 16 + 16 i (i < 8), as loaded (bf16; each value goes to fp32 where it is
// divided). q is stored as read; q_t through a shared-memory tile, each thread writing 64
// consecutive k of one output row. Four CTAs per SM (64 registers): more loads in flight
// (session 14: three CTAs 16-21% faster than two; session 41: the values held as bf16 instead
// of 64 fp32 registers, which spilled at 80 once the division lost its copysign).

__global__ void __launch_bounds__(kTileThreads, 4) quantize_tiles_kernel(QuantizeFp8TilesArgs a) {
  __shared__ float warp_amax[kTileThreads / 32];
  __shared__ ScaleDivisor tile_div;
  __shared__ __align__(16) uint8_t tile[kBlock][kBlock + kTilePad];
  const int t = threadIdx.x;
  const int64_t nb = blockIdx.x, kb = blockIdx.y, e = blockIdx.z;
  const int64_t k_blocks = gridDim.y, n_blocks = gridDim.x;
  const int cc = t % 16, r0 = t / 16;
  const int64_t col = nb * kBlock + 8 * cc;
  const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(a.src) + e * a.batch_stride_src;

  uint4 raw[8];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = kb * kBlock + r0 + 16 * i;
    raw[i] = make_uint4(0, 0, 0, 0);
    if (row < a.k && col < a.n) raw[i] = *reinterpret_cast<const uint4*>(src + row * a.ld_src + col);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = nan_max(amax, bf16_abs_max(raw[i]));
  amax = warp_nan_max(amax);
  if ((t & 31) == 0) warp_amax[t >> 5] = amax;
  __syncthreads();
  if (t == 0) {
    float m = 0.0f;
    for (int w = 0; w < kTileThreads / 32; ++w) m = nan_max(m, warp_amax[w]);
    const float scale = block_scale(m);
    tile_div = ScaleDivisor{scale, 1.0f / scale};
    if (a.q != nullptr) a.scale[(e * k_blocks + kb) * n_blocks + nb] = scale;
    if (a.q_t != nullptr) a.scale_t[(e * n_blocks + nb) * k_blocks + kb] = scale;
  }
  __syncthreads();
  const ScaleDivisor div = tile_div;
  const bool fast = ScaleDivisor::fast_for(div.s);
  uint2 q[8];  // the rows' bytes
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float x[8];
    to_float(raw[i], x);
    q[i] = e4m3x8(x, div, fast);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = r0 + 16 * i;
    const int64_t row = kb * kBlock + r;
    if (a.q != nullptr && row < a.k && col < a.n) {
      *reinterpret_cast<uint2*>(static_cast<uint8_t*>(a.q) + (e * a.k + row) * a.n + col) = q[i];
    }
    if (a.q_t != nullptr) *reinterpret_cast<uint2*>(&tile[r][8 * cc]) = q[i];
  }
  if (a.q_t == nullptr) return;
  __syncthreads();
  const int j = t / 2;  // output row (an n of the tile)
  const int64_t out_row = nb * kBlock + j;
  if (out_row >= a.n) return;
  const int64_t pitch = a.ld_q_t != 0 ? a.ld_q_t : a.k;
  store_transposed(tile, t, static_cast<uint8_t*>(a.q_t) + (e * a.n + out_row) * pitch + kb * kBlock, a.k - kb * kBlock);
}

// Which rows a CTA of quantize_group_columns_kernel quantizes: 128-row block `b` of the groups'
// blocks (ceil(rows_g / 128) for group g, numbered group after group), found by warp 0 with a
// scan of the groups' block counts (offs clamped to [0, rows], so a bad offs reads nothing out
// of bounds). A block past the last group's quantizes no group rows: with the 1x128 copy it
// takes padding rows for that copy, 128 each (there are enough: ceil(rows / 128) + E blocks,
// the groups use at most ceil(used / 128) + E - 1, so at least ceil(padding / 128) remain).
struct ColumnBlockRows {
  int64_t first_row;
  int rows;
  bool padding;  // the rows feed the 1x128 copy only (the 128x1 block is zeros, scale 1)
};

__device__ ColumnBlockRows find_column_block(const QuantizeFp8GroupColumnsArgs& a, int64_t b) {
  __shared__ int64_t block_row0, pad_row0;
  __shared__ int block_rows, pad_rows;
  const int t = threadIdx.x;
  if (t < 32) {
    constexpr unsigned kAll = 0xffffffffu;
    int64_t row0 = 0, before = 0;
    int rows = 0;
    bool found = false;
    for (int g0 = 0; g0 < a.num_groups; g0 += 32) {
      const int g = g0 + t;
      int64_t begin = 0, end = 0;
      if (g < a.num_groups) {
        end = min(max(int64_t(a.offs[g]), int64_t(0)), a.rows);
        begin = g == 0 ? 0 : min(max(int64_t(a.offs[g - 1]), int64_t(0)), a.rows);
      }
      const int64_t nb = end > begin ? (end - begin + kBlock - 1) / kBlock : 0;
      int64_t inc = nb;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int64_t v = __shfl_up_sync(kAll, inc, o);
        if (t >= o) inc += v;
      }
      const int64_t first = before + inc - nb;
      const bool mine = b >= first && b < first + nb;
      if (mine) {
        row0 = begin + (b - first) * kBlock;
        rows = static_cast<int>(min(int64_t(kBlock), end - row0));
      }
      const unsigned hit = __ballot_sync(kAll, mine);
      if (hit != 0) {
        const int lane = __ffs(hit) - 1;
        row0 = __shfl_sync(kAll, row0, lane);
        rows = __shfl_sync(kAll, rows, lane);
        found = true;
        break;
      }
      before += __shfl_sync(kAll, inc, 31);
    }
    if (t == 0) {
      block_row0 = row0;
      block_rows = rows;
      // past the groups' blocks (`before` is then all of them): padding rows, 1x128 only
      const int64_t used = min(max(int64_t(a.offs[a.num_groups - 1]), int64_t(0)), a.rows);
      pad_row0 = used + (b - before) * kBlock;
      pad_rows = a.q != nullptr && !found ? static_cast<int>(max(min(int64_t(kBlock), a.rows - pad_row0), int64_t(0)))
                                          : 0;
    }
  }
  __syncthreads();
  const bool padding = pad_rows > 0;
  return {padding ? pad_row0 : block_row0, padding ? pad_rows : block_rows, padding};
}

// Column j (0..7) of eight bf16 loaded as one uint4, in fp32 (exact: a bf16 is the top half).
__device__ __forceinline__ float bf16_column(const uint4& v, int j) {
  const uint32_t w = j / 2 == 0 ? v.x : j / 2 == 1 ? v.y : j / 2 == 2 ? v.z : v.w;
  return __uint_as_float(j % 2 == 0 ? w << 16 : w & 0xffff0000u);
}

// One CTA of 256 threads per (128-column tile, 128-row block of one group); thread t holds the
// 8 columns 8 (t % 16) .. +7 of the 8 consecutive rows 8 (t / 16) .. +7 as loaded (bf16: the
// amaxes are maxima of bf16 values, the same numbers in fp32, and each value goes to fp32 only
// where it is divided; 64 fp32 values spilled). Four CTAs per SM.
// - 1x128 copy (with a.q): a row's amax over the tile's 128 columns (one 1x128 block) is
//   spread over the 16 lanes that hold the row; a reduce-scatter leaves lanes 2i, 2i + 1 of
//   each half warp with row i's amax, so the block's scale and its reciprocal are computed
//   twice per row, not 16 times, and shuffled to the row's lanes when its values are divided.
// - 128x1 copy: each column's amax over its 8 rows, across the two lanes of a warp that hold
//   the column (rows 8 (t / 16) and the next 8), then across the 8 warps through shared memory
//   (with a.tile_scales, one scale for the whole 128 x 128 block: the maximum of the column
//   maxima). A column's 8 quotients convert in row order, so they come out as 8 consecutive
//   bytes of the transposed output's row (no byte transpose): into a shared tile, one 128-byte
//   row per column (8-byte pieces XOR-swizzled by (column / 8) % 8: the 32 lanes' stores and
//   the readers' 16-byte loads are conflict-free), stored out by whole rows.
// Session 41: the kernel this replaces (each lane holding rows 16 apart, every lane dividing
// every row's scale, a byte-by-byte transpose through shared memory) issued ~2000
// instructions per thread and ran at 2.4 TB/s on an H200, issue-bound at ncu's clock.
// kGather: the rows through a.index (a kernel of its own: the index's reads and checks cost the
// in-place rows 3-4% as a runtime branch, session 42).
template <bool kGather>
__global__ void __launch_bounds__(kTileThreads, 4) quantize_group_columns_kernel(QuantizeFp8GroupColumnsArgs a) {
  constexpr unsigned kAll = 0xffffffffu;
  __shared__ uint32_t col_max[kTileThreads / 32][kBlock / 2];  // per warp, bf16 pairs of column amaxes
  __shared__ float tile_max[kBlock / 32];                        // tile_scales: the four column warps' maxima
  __shared__ __align__(16) ScaleDivisor col_div[kBlock];
  __shared__ __align__(16) uint8_t tile[kBlock][kBlock];        // [column][row], 8-byte pieces swizzled
  const int t = threadIdx.x, lane = t & 31;
  const int64_t cb = blockIdx.x, b = blockIdx.y;
  const ColumnBlockRows blk = find_column_block(a, b);
  const int cc = t % 16, rg = t / 16;
  const int64_t col = cb * kBlock + 8 * cc;
  const bool col_inside = col < a.cols;
  const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(a.src) + col;
  // the thread's 8 rows in src: in place, or through the index, all 8 read (and checked) before
  // the rows' loads (every lane its own: 8% faster than lanes 0-7 of a half warp reading them
  // for the others' shuffles, session 42)
  int64_t src_row[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    src_row[i] = blk.first_row + 8 * rg + i;
    if (kGather && 8 * rg + i < blk.rows) {
      src_row[i] = detail::checked_row(a.index, src_row[i], 1, a.src_rows,
                                        a.q != nullptr ? "quantize_fp8_1x128_128x1" : "quantize_fp8_128x1");
    }
  }
  uint4 raw[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    raw[i] = make_uint4(0, 0, 0, 0);
    if (8 * rg + i < blk.rows && col_inside) raw[i] = *reinterpret_cast<const uint4*>(src + src_row[i] * a.ld_src);
  }
  if (a.q != nullptr) {  // the 1x128 copy, the bits quantize_rows_kernel writes
    const int rows = max(0, min(8, blk.rows - 8 * rg));
    const int64_t row = blk.first_row + 8 * rg, blocks_per_row = (a.cols + kBlock - 1) / kBlock;
    quantize_rows_1x128(raw, rows, col_inside, static_cast<uint8_t*>(a.q) + row * a.ld_q + col, a.ld_q, true,
                        a.q_scale + row * blocks_per_row + cb, blocks_per_row);
    if (blk.padding) {  // no group's rows: the 128x1 copy's block is zeros, scale 1
#pragma unroll
      for (int i = 0; i < 8; ++i) raw[i] = make_uint4(0, 0, 0, 0);
    }
  }
  // the 8 columns' amaxes over the thread's 8 rows, then over the warp's 16 rows (lanes l, l ^ 16)
  uint32_t pairs[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    __nv_bfloat162 v = __habs2(bf16_pair(raw[0], p));
#pragma unroll
    for (int i = 1; i < 8; ++i) v = __hmax2_nan(v, __habs2(bf16_pair(raw[i], p)));
    const uint32_t u = *reinterpret_cast<const uint32_t*>(&v);
    const uint32_t o = __shfl_xor_sync(kAll, u, 16);
    v = __hmax2_nan(v, *reinterpret_cast<const __nv_bfloat162*>(&o));
    pairs[p] = *reinterpret_cast<const uint32_t*>(&v);
  }
  if ((lane & 16) == 0) {
#pragma unroll
    for (int p = 0; p < 4; ++p) col_max[t >> 5][4 * cc + p] = pairs[p];
  }
  __syncthreads();
  float col_amax = 0.0f;  // thread t < 128: column t's amax over the block's 128 rows
  if (t < kBlock) {
    __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&col_max[0][t / 2]);
#pragma unroll
    for (int w = 1; w < kTileThreads / 32; ++w) v = __hmax2_nan(v, *reinterpret_cast<const __nv_bfloat162*>(&col_max[w][t / 2]));
    col_amax = t % 2 == 0 ? __low2float(v) : __high2float(v);
  }
  ScaleDivisor tile_div{1.0f, 1.0f};
  bool fast;
  if (a.tile_scales) {  // one scale: the maximum over the four column warps (t < 128)
    if (t < kBlock) {
      const float m = warp_nan_max(col_amax);
      if (lane == 0) tile_max[t >> 5] = m;
    }
    __syncthreads();
    const float scale = block_scale(nan_max(nan_max(tile_max[0], tile_max[1]), nan_max(tile_max[2], tile_max[3])));
    tile_div = ScaleDivisor{scale, 1.0f / scale};
    if (t == 0) a.scale[b * ((a.cols + kBlock - 1) / kBlock) + cb] = scale;
    fast = ScaleDivisor::fast_for(scale);
  } else {
    bool col_fast = true;
    if (t < kBlock) {
      const float scale = block_scale(col_amax);
      col_div[t] = ScaleDivisor{scale, 1.0f / scale};
      if (cb * kBlock + t < a.cols) a.scale[b * a.cols + cb * kBlock + t] = scale;
      col_fast = ScaleDivisor::fast_for(scale);
    }
    fast = __syncthreads_and(col_fast);  // one path for the whole tile
  }
  // column by column: its 8 rows' bytes, lowest row first, into the tile's row 8 cc + j
  const int swizzle = (cc % 8) * 2;  // of the 8-byte piece index; even, so 16-byte pairs stay whole
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const ScaleDivisor div = a.tile_scales ? tile_div : col_div[8 * cc + j];
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = bf16_column(raw[i], j);
    // rg again from the thread index: cheaper than the register it would hold (ptxas spilled it)
    *reinterpret_cast<uint2*>(&tile[8 * cc + j][8 * ((threadIdx.x >> 4) ^ swizzle)]) = e4m3x8(x, div, fast);
  }
  __syncthreads();
  // row R of the tile (a column of the source) is 128 bytes of q_t's row cb * 128 + R at
  // column b * 128: eight lanes a row, four rows a warp store
  uint8_t* q_t = static_cast<uint8_t*>(a.q_t) + b * kBlock;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = t / 8 + 32 * k, piece = t % 8;
    const int64_t out_row = cb * kBlock + r;
    if (out_row < a.cols) {
      const uint4 v = *reinterpret_cast<const uint4*>(&tile[r][16 * (piece ^ ((r / 8) % 8))]);
      *reinterpret_cast<uint4*>(q_t + out_row * a.ld_q_t + 16 * piece) = v;
    }
  }
}

// The grid of a 1x128 pass over a (validated) a's rows with `rows_per_warp` rows a warp (256
// threads a CTA), or an error when it has too many CTAs.
Result rows_grid(const QuantizeFp8RowsArgs& a, int rows_per_warp, const char* op, unsigned* grid) {
  const int64_t spans_per_row = ((a.cols + kBlock - 1) / kBlock + 1) / 2;
  const int64_t warps = (a.rows + rows_per_warp - 1) / rows_per_warp * spans_per_row;
  const int64_t ctas = (warps * 32 + kRowsThreads - 1) / kRowsThreads;
  if (ctas > 2147483647) return Result::error(Status::kInvalidArgument, std::string(op) + ": too many rows");
  *grid = static_cast<unsigned>(ctas);
  return Result::success();
}

template <detail::Act A>
Result launch_act_rows(const ActQuantizeFp8RowsArgs& a, cudaStream_t stream) {
  detail::ActParams p;
  p.alpha = a.act.alpha;
  p.limit = a.act.limit;
  p.has_limit = a.act.has_limit;
  const char* op = "act_quantize_fp8_1x128 launch";
  unsigned grid = 0;
  Result r = rows_grid(a.rows, 1, op, &grid);
  if (!r.ok()) return r;
  const int64_t blocks_per_row = (a.rows.cols + kBlock - 1) / kBlock;
  quantize_act_rows_kernel<ActSource<typename detail::ActFunctor<A>::type>>
      <<<grid, kRowsThreads, 0, stream>>>(a.rows, p, (blocks_per_row + 1) / 2, blocks_per_row);
  return detail::launched(op);
}

}  // namespace

Result quantize_fp8_1x128(const QuantizeFp8RowsArgs& a, cudaStream_t stream) {
  Result r = validate(a);
  if (!r.ok() || a.rows == 0 || a.cols == 0) return r;
  const char* op = "quantize_fp8_1x128 launch";
  unsigned grid = 0;
  r = rows_grid(a, 8, op, &grid);
  if (!r.ok()) return r;
  const int64_t blocks_per_row = (a.cols + kBlock - 1) / kBlock;
  quantize_rows_kernel<<<grid, kRowsThreads, 0, stream>>>(a, (blocks_per_row + 1) / 2, blocks_per_row);
  return detail::launched(op);
}

Result act_quantize_fp8_1x128(const ActQuantizeFp8RowsArgs& a, cudaStream_t stream) {
  Result r = validate(a);
  if (!r.ok() || a.rows.rows == 0 || a.rows.cols == 0) return r;
  switch (a.act.activation) {
    case Activation::kSwigluOai: return launch_act_rows<detail::Act::SwigluOai>(a, stream);
    case Activation::kSwiglu: return launch_act_rows<detail::Act::Swiglu>(a, stream);
    case Activation::kGeglu: return launch_act_rows<detail::Act::Geglu>(a, stream);
    case Activation::kSrelu: return launch_act_rows<detail::Act::Srelu>(a, stream);
    case Activation::kIdentity: return launch_act_rows<detail::Act::Identity>(a, stream);
  }
  return Result::error(Status::kInvalidArgument, "act_quantize_fp8_1x128: unknown activation");
}

Result workspace_size(const QuantizeFp8RowsColumnSumsArgs& a, size_t* bytes) {
  Result r = validate(a);
  if (r.ok()) *bytes = detail::column_sum_workspace_bytes(a.rows.rows, a.rows.cols, a.num_groups);
  return r;
}

Result quantize_fp8_1x128_column_sums(const QuantizeFp8RowsColumnSumsArgs& a, void* workspace, size_t workspace_bytes,
                                      cudaStream_t stream) {
  Result r = validate(a);
  if (!r.ok() || a.rows.cols == 0) return r;
  const size_t need = detail::column_sum_workspace_bytes(a.rows.rows, a.rows.cols, a.num_groups);
  if (workspace_bytes < need || workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return Result::error(Status::kInvalidArgument, "quantize_fp8_1x128_column_sums: workspace must be a 16-byte aligned "
                                                   "device pointer to at least " + std::to_string(need) + " bytes, got " +
                                                   std::to_string(workspace_bytes));
  }
  GroupColumnSumArgs sums;
  sums.m = a.rows.rows;
  sums.n = a.rows.cols;
  sums.num_groups = a.num_groups;
  sums.offs = a.offs;
  sums.src = a.rows.src;
  sums.ld = a.rows.ld_src;
  sums.out = a.sums;
  const detail::RowsFp8Copy copy{a.rows.q, a.rows.ld_q, a.rows.scale};
  const cudaError_t err = detail::launch_group_column_sum_quantize(sums, copy, static_cast<float*>(workspace), stream);
  return err == cudaSuccess ? Result::success() : detail::cuda_error("quantize_fp8_1x128_column_sums launch", err);
}

Result quantize_fp8_128x128(const QuantizeFp8TilesArgs& a, cudaStream_t stream) {
  Result r = validate(a);
  if (!r.ok() || a.batches == 0 || a.k == 0 || a.n == 0) return r;
  const int64_t kb = (a.k + kBlock - 1) / kBlock, nb = (a.n + kBlock - 1) / kBlock;
  if (kb > 65535 || a.batches > 65535 || nb > 2147483647) {
    return Result::error(Status::kInvalidArgument, "quantize_fp8_128x128: at most 65535 batches and 65535 row tiles, got batches=" +
                                                       std::to_string(a.batches) + " k=" + std::to_string(a.k));
  }
  quantize_tiles_kernel<<<dim3(unsigned(nb), unsigned(kb), unsigned(a.batches)), kTileThreads, 0, stream>>>(a);
  return detail::launched("quantize_fp8_128x128 launch");
}

Result quantize_fp8_128x1(const QuantizeFp8GroupColumnsArgs& a, cudaStream_t stream) {
  Result r = validate(a);
  if (!r.ok() || a.cols == 0) return r;
  const int64_t blocks = fp8_group_row_blocks(a.rows, a.num_groups), nb = (a.cols + kBlock - 1) / kBlock;
  if (blocks > 65535 || nb > 2147483647) {
    return Result::error(Status::kInvalidArgument, "quantize_fp8_128x1: at most 65535 row blocks (ceil(rows / 128) + "
                                                   "num_groups), got " + std::to_string(blocks));
  }
  const dim3 grid{unsigned(nb), unsigned(blocks)};
  if (a.index != nullptr) {
    quantize_group_columns_kernel<true><<<grid, kTileThreads, 0, stream>>>(a);
  } else {
    quantize_group_columns_kernel<false><<<grid, kTileThreads, 0, stream>>>(a);
  }
  return detail::launched("quantize_fp8_128x1 launch");
}

}  // namespace cute_moe

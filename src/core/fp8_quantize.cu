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

using namespace fp8_math;  // kBlock, nan_max, block_scale, ScaleDivisor, e4m3x2, e4m3x8, to_float

// The largest magnitude of eight bf16 (a NaN among them: NaN), in fp32.
__device__ __forceinline__ float bf16_abs_max(const uint4& v) {
  __nv_bfloat162 m = __hmax2_nan(__hmax2_nan(__habs2(bf16_pair(v, 0)), __habs2(bf16_pair(v, 1))),
                                 __hmax2_nan(__habs2(bf16_pair(v, 2)), __habs2(bf16_pair(v, 3))));
  return nan_max(__low2float(m), __high2float(m));
}

// The 1x128 quantizer's input, eight values of one row: the bf16 matrix itself, or the h of an
// activation computed from pre as the fused up projection computes and rounds it.
struct Bf16Source {
  __device__ static void load(const __nv_bfloat16* row, int64_t col, const detail::ActParams&, float (&x)[8]) {
    to_float(*reinterpret_cast<const uint4*>(row + col), x);
  }
};

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

// One warp per (row, 256-column span): lane l holds columns 8l .. 8l + 7 of the span (one
// 16-byte load of a bf16 source, two of a gated activation's pre), lanes 0-15 the span's first
// 128-column block and 16-31 its second; each half warp reduces its block's amax. (cols is a
// multiple of 16, so a lane's eight are all inside or all outside.) Twice the bytes per load
// of a warp per block: the pass runs at a larger share of the memory bandwidth.
template <class Source>
__global__ void quantize_rows_kernel(QuantizeFp8RowsArgs a, detail::ActParams p, int64_t spans_per_row,
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
// of rows t / 16 + 16 i (i < 8). q is stored as read; q_t through a shared-memory tile,
// each thread writing 64 consecutive k of one output row. Three CTAs per SM (80 registers,
// not 86): 16-21% faster than two, as more loads are in flight (session 14).

__global__ void __launch_bounds__(kTileThreads, 3) quantize_tiles_kernel(QuantizeFp8TilesArgs a) {
  __shared__ float warp_amax[kTileThreads / 32];
  __shared__ ScaleDivisor tile_div;
  __shared__ __align__(16) uint8_t tile[kBlock][kBlock + kTilePad];
  const int t = threadIdx.x;
  const int64_t nb = blockIdx.x, kb = blockIdx.y, e = blockIdx.z;
  const int64_t k_blocks = gridDim.y, n_blocks = gridDim.x;
  const int cc = t % 16, r0 = t / 16;
  const int64_t col = nb * kBlock + 8 * cc;
  const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(a.src) + e * a.batch_stride_src;

  float x[8][8];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = kb * kBlock + r0 + 16 * i;
    const bool inside = row < a.k && col < a.n;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (inside) raw = *reinterpret_cast<const uint4*>(src + row * a.ld_src + col);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x[i][2 * j] = __low2float(pairs[j]);
      x[i][2 * j + 1] = __high2float(pairs[j]);
      amax = nan_max(amax, nan_max(fabsf(x[i][2 * j]), fabsf(x[i][2 * j + 1])));
    }
  }
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
  uint2 q[8];  // the rows' bytes; the test on the scale outside the element loops
  if (ScaleDivisor::fast_for(div.s)) {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = e4m3x8(x[i], [&](float v, int) { return div.fast(v); });
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = e4m3x8(x[i], [&](float v, int) { return div.exact(v); });
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

// One CTA of 256 threads per (128-column tile, 128-row block of one group), the threads laid
// out as in quantize_tiles_kernel. Warp 0 finds the block's group with a scan of the groups'
// block counts (offs clamped to [0, rows], so a bad offs reads nothing out of bounds); a block
// past the last group's quantizes no rows (zeros, scale 1). Each column's amax over the
// block's rows: across the two threads of a warp that share the column, then across the 8
// warps through shared memory. Four CTAs per SM (64 registers, the values held as bf16, no
// spills): 9-11% faster than three CTAs holding fp32 values, which spilled at 80 registers
// (H100, session 26; three was 11-18% faster than two, session 14).
// With a.q (the 1x128 copy too), each row's amax over the tile's 128 columns (one 1x128 block)
// across the 16 lanes that hold the row; the blocks past the last group's take the padding
// rows for that copy, 128 rows each (there are enough: ceil(rows / 128) + E blocks, the groups
// use at most ceil(used / 128) + E - 1, so at least ceil(padding / 128) remain). With
// a.tile_scales, one scale for the whole 128 x 128 block: the maximum of the column maxima.
__global__ void __launch_bounds__(kTileThreads, 4) quantize_group_columns_kernel(QuantizeFp8GroupColumnsArgs a) {
  __shared__ float col_max[kTileThreads / 32][kBlock];
  __shared__ float tile_max[kBlock / 32];  // tile_scales: the four column warps' maxima
  __shared__ ScaleDivisor col_div[kBlock];
  __shared__ int64_t block_row0, pad_row0;
  __shared__ int block_rows, pad_rows;
  __shared__ __align__(16) uint8_t tile[kBlock][kBlock + kTilePad];
  const int t = threadIdx.x;
  const int64_t cb = blockIdx.x, b = blockIdx.y;
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
      // a block past the groups' (`before` is then all their blocks): padding rows, 1x128 only
      const int64_t used = min(max(int64_t(a.offs[a.num_groups - 1]), int64_t(0)), a.rows);
      pad_row0 = used + (b - before) * kBlock;
      pad_rows = a.q != nullptr && !found ? static_cast<int>(max(min(int64_t(kBlock), a.rows - pad_row0), int64_t(0)))
                                          : 0;
    }
  }
  __syncthreads();
  const int cc = t % 16, r0 = t / 16;
  const int64_t col = cb * kBlock + 8 * cc;
  const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(a.src);
  const bool padding = pad_rows > 0;  // the CTA's rows feed the 1x128 copy only
  const int64_t first_row = padding ? pad_row0 : block_row0;
  const int n_rows = padding ? pad_rows : block_rows;
  // The rows as loaded, 8 bf16 each: the amaxes are taken on the bf16 pairs (a maximum of
  // bf16 values is one of them, so it is the same number in fp32), and each value goes to fp32
  // only where it is divided. Holding 64 fp32 values instead spilled (80 registers).
  uint4 raw[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = r0 + 16 * i;
    raw[i] = make_uint4(0, 0, 0, 0);
    if (r < n_rows && col < a.cols) raw[i] = *reinterpret_cast<const uint4*>(src + (first_row + r) * a.ld_src + col);
  }
  if (a.q != nullptr) {  // the 1x128 copy, as quantize_rows_kernel writes it
    const int64_t blocks_per_row = (a.cols + kBlock - 1) / kBlock;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = r0 + 16 * i;
      float m = bf16_abs_max(raw[i]);
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));  // the row's 16 lanes
      const float scale = block_scale(m);
      if (r >= n_rows) continue;
      const int64_t row = first_row + r;
      if (col < a.cols) {
        float x[8];
        to_float(raw[i], x);
        const ScaleDivisor div{scale, 1.0f / scale};
        *reinterpret_cast<uint2*>(static_cast<uint8_t*>(a.q) + row * a.ld_q + col) =
            e4m3x8(x, div, ScaleDivisor::fast_for(scale));
      }
      if (cc == 0) a.q_scale[row * blocks_per_row + cb] = scale;
    }
    if (padding) {  // no group's rows: the 128x1 copy's block is zeros, scale 1
#pragma unroll
      for (int i = 0; i < 8; ++i) raw[i] = make_uint4(0, 0, 0, 0);
    }
  }
  // each of the thread's 8 columns' amax over its 8 rows, as 4 bf16 pairs
  __nv_bfloat162 col_pairs[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    col_pairs[p] = __habs2(bf16_pair(raw[0], p));
#pragma unroll
    for (int i = 1; i < 8; ++i) col_pairs[p] = __hmax2_nan(col_pairs[p], __habs2(bf16_pair(raw[i], p)));
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float v = j % 2 == 0 ? __low2float(col_pairs[j / 2]) : __high2float(col_pairs[j / 2]);
    const float m = nan_max(v, __shfl_xor_sync(0xffffffffu, v, 16));  // lanes l, l ^ 16: rows r0, r0 + 1
    if ((t & 16) == 0) col_max[t >> 5][8 * cc + j] = m;
  }
  __syncthreads();
  if (t < kBlock) {
    float m = 0.0f;
#pragma unroll
    for (int w = 0; w < kTileThreads / 32; ++w) m = nan_max(m, col_max[w][t]);
    if (a.tile_scales) {  // the block's amax over its 128 columns (the four warps of t < 128)
      m = warp_nan_max(m);
      if ((t & 31) == 0) tile_max[t >> 5] = m;
    } else {
      const float scale = block_scale(m);
      col_div[t] = ScaleDivisor{scale, 1.0f / scale};
      if (cb * kBlock + t < a.cols) a.scale[b * a.cols + cb * kBlock + t] = scale;
    }
  }
  if (a.tile_scales) {
    __syncthreads();
    if (t < kBlock) {
      const float m = nan_max(nan_max(tile_max[0], tile_max[1]), nan_max(tile_max[2], tile_max[3]));
      const float scale = block_scale(m);
      col_div[t] = ScaleDivisor{scale, 1.0f / scale};
      if (t == 0) a.scale[b * ((a.cols + kBlock - 1) / kBlock) + cb] = scale;
    }
  }
  __syncthreads();
  // Column pair by column pair (each pair's two divisors read once), the eight rows' words
  // filled 16 bits at a time.
  uint32_t w[8][2];
#pragma unroll
  for (int jp = 0; jp < 4; ++jp) {
    const ScaleDivisor d0 = col_div[8 * cc + 2 * jp], d1 = col_div[8 * cc + 2 * jp + 1];
    const int shift = 16 * (jp % 2);
    if (ScaleDivisor::fast_for(d0.s) && ScaleDivisor::fast_for(d1.s)) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float2 v = __bfloat1622float2(bf16_pair(raw[i], jp));
        const uint32_t pair = e4m3x2(d0.fast(v.x), d1.fast(v.y)) << shift;
        w[i][jp / 2] = shift == 0 ? pair : w[i][jp / 2] | pair;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float2 v = __bfloat1622float2(bf16_pair(raw[i], jp));
        const uint32_t pair = e4m3x2(d0.exact(v.x), d1.exact(v.y)) << shift;
        w[i][jp / 2] = shift == 0 ? pair : w[i][jp / 2] | pair;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) *reinterpret_cast<uint2*>(&tile[r0 + 16 * i][8 * cc]) = make_uint2(w[i][0], w[i][1]);
  __syncthreads();
  const int64_t out_row = cb * kBlock + t / 2;  // a column of x
  if (out_row >= a.cols) return;
  store_transposed(tile, t, static_cast<uint8_t*>(a.q_t) + out_row * a.ld_q_t + b * kBlock, kBlock);
}

// quantize_rows_kernel<Source> over a (validated) a's rows.
template <class Source>
Result launch_rows(const QuantizeFp8RowsArgs& a, const detail::ActParams& p, const char* op, cudaStream_t stream) {
  const int64_t blocks_per_row = (a.cols + kBlock - 1) / kBlock;
  const int64_t spans_per_row = (blocks_per_row + 1) / 2;
  const int64_t warps = a.rows * spans_per_row;
  constexpr int kThreads = 256;
  const int64_t grid = (warps * 32 + kThreads - 1) / kThreads;
  if (grid > 2147483647) return Result::error(Status::kInvalidArgument, std::string(op) + ": too many rows");
  quantize_rows_kernel<Source><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a, p, spans_per_row, blocks_per_row);
  return detail::launched(op);
}

template <detail::Act A>
Result launch_act_rows(const ActQuantizeFp8RowsArgs& a, cudaStream_t stream) {
  detail::ActParams p;
  p.alpha = a.act.alpha;
  p.limit = a.act.limit;
  p.has_limit = a.act.has_limit;
  return launch_rows<ActSource<typename detail::ActFunctor<A>::type>>(a.rows, p, "act_quantize_fp8_1x128 launch", stream);
}

}  // namespace

Result quantize_fp8_1x128(const QuantizeFp8RowsArgs& a, cudaStream_t stream) {
  Result r = validate(a);
  if (!r.ok() || a.rows == 0 || a.cols == 0) return r;
  return launch_rows<Bf16Source>(a, detail::ActParams{}, "quantize_fp8_1x128 launch", stream);
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
  quantize_group_columns_kernel<<<dim3(unsigned(nb), unsigned(blocks)), kTileThreads, 0, stream>>>(a);
  return detail::launched("quantize_fp8_128x1 launch");
}

}  // namespace cute_moe

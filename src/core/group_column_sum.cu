// Deterministic per-group column sums (see group_column_sum.h for the slot scheme); pass 1 can
// also write the rows' 1x128 e4m3 copy from the same read (column_sum_quantize.h).
#include <cuda_bf16.h>

#include "bf16x8.cuh"
#include "column_sum_quantize.h"
#include "fp8_rows_math.cuh"
#include "group_column_sum.h"
#include "group_setup.h"

namespace cute_moe::detail {

namespace {

constexpr int kThreads = 128;  // pass 1: each thread owns 8 consecutive columns
// Pass 2: a block's warps share a group's partials; a lane owns 8 columns in
// column_sum_reduce_kernel, 4 in tile_column_sum_kernel.
constexpr int kReduceWarps = 8;
constexpr int kReduceThreads = 32 * kReduceWarps;
constexpr int64_t kReduceColumns = 8 * 32;
constexpr int64_t kTileColumns = 4 * 32;
constexpr int kReduceUnroll = 4;  // chunks a warp loads together
constexpr int kTileUnroll = 2;    // tiles (of kTileColumnSumWarps rows) a warp loads together

__device__ __forceinline__ int64_t rows_in_use(const int32_t* offs, int32_t num_groups, int64_t m) {
  const int64_t used = offs[num_groups - 1];
  return used < 0 ? 0 : (used > m ? m : used);
}

__device__ __forceinline__ void add_bf16x8(float acc[8], uint4 v, float scale) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += scale * f.x;  // scale 1 without row scales: exact
    acc[2 * i + 1] += scale * f.y;
  }
}

__device__ __forceinline__ void store_f32x8(float* dst, const float acc[8]) {
  reinterpret_cast<float4*>(dst)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  reinterpret_cast<float4*>(dst)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
}

// The kernels' view of GroupColumnSumArgs.
struct Pass {
  const __nv_bfloat16* src;
  int64_t ld;
  int64_t src_rows;
  const int32_t* index;       // kGather
  __nv_bfloat16* gathered;    // kGather
  int64_t ld_gathered;
  const float* row_scale;
  const __nv_bfloat16* bias;  // kRowDot
  int64_t ld_bias;
  float* dot_partial;         // kRowDot: (row_dot_slices(n), m)
  int64_t m;
  int64_t n;
  const int32_t* offs;
  int32_t num_groups;
  float* partial;
  uint8_t* q;                 // kQuantize: the rows' 1 x 128 e4m3 copy, row stride ld_q
  int64_t ld_q;
  float* q_scale;             // kQuantize: (m, ceil(n / 128))
};

// A gathered row's index checked against src's rows: a bad one would be an out-of-bounds read,
// so report it and stop the kernel. Kept out of line: the hot loop only tests and branches.
__device__ __noinline__ void report_bad_index(const Pass& p, int64_t r, int32_t v) {
  if (threadIdx.x == 0) {
    printf("cute_moe group_column_sum: invalid index at row %lld: %d is not a row of src, which has %lld rows\n",
           static_cast<long long>(r), v, static_cast<long long>(p.src_rows));
  }
  __trap();
}
__device__ __forceinline__ void check_index(const Pass& p, int64_t r, int32_t v) {
  if (v < 0 || v >= p.src_rows) report_bad_index(p, r, v);
}

// Row r's 8 columns at col (zeros for a thread past n): src[r], or src[s] for a gathered row
// (s = index[r], already checked). The load only: a gathered row's copy is stored by
// store_gathered after all of a step's loads are issued, since a store between two loads keeps
// the second from starting before the first arrives. A thread past n loads the row's first
// columns and keeps zeros: no branch around the load.
template <bool kGather>
__device__ __forceinline__ uint4 load_row(const Pass& p, int64_t r, int64_t col, bool active, int32_t s) {
  const int64_t row = kGather ? static_cast<int64_t>(s) : r;
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p.src + row * p.ld + (active ? col : 0)));
  return active ? v : make_uint4(0, 0, 0, 0);
}
template <bool kGather>
__device__ __forceinline__ void store_gathered(const Pass& p, int64_t r, int64_t col, bool active, uint4 v) {
  if constexpr (kGather) {
    if (active) *reinterpret_cast<uint4*>(p.gathered + r * p.ld_gathered + col) = v;
  }
}
// One row: its index read and checked, loaded, and (gathering) its copy stored.
template <bool kGather>
__device__ __forceinline__ uint4 load_row(const Pass& p, int64_t r, int64_t col, bool active) {
  int32_t s = 0;
  if constexpr (kGather) {
    s = p.index[r];
    check_index(p, r, s);
  }
  const uint4 v = load_row<kGather>(p, r, col, active, s);
  store_gathered<kGather>(p, r, col, active, v);
  return v;
}

// Four rows' sums over the warp in 6 shuffles instead of 20: the first two steps halve the
// values each lane holds while adding (lanes with bit 4 keep rows 2, 3; then bit 3 picks one
// of the two), the last three add the rest. Lane L ends with the sum of row
// 2 * bit4(L) + bit3(L); the same steps every time, so the result is reproducible.
__device__ __forceinline__ float warp_sum4(const float v[4], int lane) {
  constexpr unsigned kAll = 0xffffffffu;
  const bool hi16 = lane & 16, hi8 = lane & 8;
  float a = hi16 ? v[2] : v[0], b = hi16 ? v[3] : v[1];
  a += __shfl_xor_sync(kAll, hi16 ? v[0] : v[2], 16);
  b += __shfl_xor_sync(kAll, hi16 ? v[1] : v[3], 16);
  float s = hi8 ? b : a;
  s += __shfl_xor_sync(kAll, hi8 ? a : b, 8);
  s += __shfl_xor_sync(kAll, s, 4);
  s += __shfl_xor_sync(kAll, s, 2);
  s += __shfl_xor_sync(kAll, s, 1);
  return s;
}

// kQuantize: rows r .. r + 3's 1 x 128 e4m3 copy and scales, as quantize_fp8_1x128 writes them
// (each half warp holds one 128-column block of the rows; each block's scale divided by 4 of
// its 16 lanes: fp8_math::quantize_rows_1x128).
template <bool kQuantize>
__device__ __forceinline__ void quantize_4_rows(const Pass& p, int64_t r, int64_t col, bool active, const uint4 (&v)[4]) {
  if constexpr (kQuantize) {
    const int64_t blocks = (p.n + fp8_math::kBlock - 1) / fp8_math::kBlock, blk = col / fp8_math::kBlock;
    fp8_math::quantize_rows_1x128(v, 4, active, p.q + r * p.ld_q + col, p.ld_q, blk < blocks,
                                  p.q_scale + r * blocks + blk, blocks);
  }
}

// kQuantize: row r's 1 x 128 e4m3 copy and scales, as quantize_fp8_1x128 writes them (each half
// warp holds one 128-column block of the row).
template <bool kQuantize>
__device__ __forceinline__ void quantize_row(const Pass& p, int64_t r, int64_t col, bool active, uint4 v) {
  if constexpr (kQuantize) {
    float x[8];
    fp8_math::to_float(v, x);  // zeros past n
    const float scale = fp8_math::quantize_half_warp_block(x, active, p.q + r * p.ld_q + col);
    const int64_t blocks = (p.n + fp8_math::kBlock - 1) / fp8_math::kBlock, blk = col / fp8_math::kBlock;
    if ((threadIdx.x & 15) == 0 && blk < blocks) p.q_scale[r * blocks + blk] = scale;
  }
}

// Pass 1: one block per (row chunk, 8*kThreads columns). Every lane of a warp takes part in the
// row's reductions (kRowDot, kQuantize) and the warp's barriers, so threads past n stay (with
// zeros) unless their whole warp is.
template <bool kGather, bool kRowDot, bool kQuantize = false>
__global__ void __launch_bounds__(kThreads) column_sum_partials_kernel(Pass p) {
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * 8;
  const bool active = col < p.n;
  const int64_t slice = col / kRowDotSliceColumns;  // the same in the whole warp
  if (slice * kRowDotSliceColumns >= p.n) return;   // warp-uniform
  const bool dot_writer = kRowDot && (threadIdx.x % 32) == 0;
  const int64_t chunk = blockIdx.x;
  const int64_t chunk_begin = chunk * kColumnSumChunkRows;
  const int64_t chunk_rows_end = min(chunk_begin + kColumnSumChunkRows, p.m);
  const int64_t used = rows_in_use(p.offs, p.num_groups, p.m);
  const int64_t chunk_end = min(chunk_rows_end, used);
  int64_t r = chunk_begin;
  for (int32_t g = group_of_row(p.offs, p.num_groups, r); r < chunk_end && g < p.num_groups; ++g) {
    const int64_t seg_end = min(static_cast<int64_t>(p.offs[g]), chunk_end);
    if (seg_end <= r) continue;  // empty group: no slot
    uint4 b = make_uint4(0, 0, 0, 0);
    if constexpr (kRowDot) {
      if (active) b = __ldg(reinterpret_cast<const uint4*>(p.bias + g * p.ld_bias + col));
    }
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    // Rows four at a time (their loads in flight together), then one at a time; either
    // way each column adds its rows in row order. Gathering, the next four rows' indices are
    // loaded while these four rows load (0 past the segment, never used), so a row's load
    // waits on one access, not two (1.12x on the H200); the four rows' loads are issued
    // together (1.10x more; docs/perf-notes.md, sessions 31-32).
    int4 index = make_int4(0, 0, 0, 0);
    auto indices = [&](int64_t first) {
      auto at = [&](int64_t i) { return i < seg_end ? __ldg(p.index + i) : 0; };
      return make_int4(at(first), at(first + 1), at(first + 2), at(first + 3));
    };
    if constexpr (kGather) index = indices(r);
    for (; r + 4 <= seg_end; r += 4) {
      int4 next = make_int4(0, 0, 0, 0);
      if constexpr (kGather) next = indices(r + 4);
      if constexpr (kGather) {  // all four before the loads, none between them
        check_index(p, r, index.x);
        check_index(p, r + 1, index.y);
        check_index(p, r + 2, index.z);
        check_index(p, r + 3, index.w);
      }
      uint4 v[4];
      v[0] = load_row<kGather>(p, r, col, active, index.x);
      v[1] = load_row<kGather>(p, r + 1, col, active, index.y);
      v[2] = load_row<kGather>(p, r + 2, col, active, index.z);
      v[3] = load_row<kGather>(p, r + 3, col, active, index.w);
      index = next;
      float scale[4] = {1.0f, 1.0f, 1.0f, 1.0f};
      if (p.row_scale != nullptr) {
#pragma unroll
        for (int u = 0; u < 4; ++u) scale[u] = __ldg(p.row_scale + r + u);
      }
      // Without this barrier ptxas issues two of the loads, waits for them and uses them, and
      // only then issues the other two (and, gathering, stores copies between): half the
      // bytes in flight. Loads may not move across it, so all four (and the scales) go first.
      __syncwarp();
      float d[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        add_bf16x8(acc, v[u], scale[u]);
        if constexpr (kRowDot) d[u] = dot_bf16x8(v[u], b, 0.0f);
      }
      quantize_4_rows<kQuantize>(p, r, col, active, v);
      if constexpr (kRowDot) {
        const int lane = threadIdx.x % 32;
        const float sum = warp_sum4(d, lane);
        if ((lane & 7) == 0) p.dot_partial[slice * p.m + r + 2 * ((lane >> 4) & 1) + ((lane >> 3) & 1)] = sum;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) store_gathered<kGather>(p, r + u, col, active, v[u]);
    }
    for (; r < seg_end; ++r) {
      const uint4 v = load_row<kGather>(p, r, col, active);
      add_bf16x8(acc, v, p.row_scale != nullptr ? p.row_scale[r] : 1.0f);
      quantize_row<kQuantize>(p, r, col, active, v);
      if constexpr (kRowDot) {
        const float d = warp_sum(dot_bf16x8(v, b, 0.0f));
        if (dot_writer) p.dot_partial[slice * p.m + r] = d;
      }
    }
    if (active) store_f32x8(p.partial + column_sum_slot(chunk, g) * p.n + col, acc);
  }
  // Padding rows (past offs[num_groups - 1]): gathered and quantized, not summed; their row
  // dot is 0.
  for (r = max(chunk_begin, chunk_end); r < chunk_rows_end; ++r) {
    if constexpr (kGather || kQuantize) {
      const uint4 v = load_row<kGather>(p, r, col, active);
      quantize_row<kQuantize>(p, r, col, active, v);
    }
    if (dot_writer) p.dot_partial[slice * p.m + r] = 0.0f;
  }
}

// A pass-2 block whose group breaks the offs contract: its first thread in the group's first
// block prints the message and traps (require_valid_rows), and every other thread leaves without
// touching the rows. Were they all to trap, as when every thread checked, another warp's trap
// could end the kernel before the message is printed.
__device__ __forceinline__ void report_bad_rows(GroupRows rows, int64_t m, int32_t g, const char* op) {
  if (threadIdx.x == 0 && blockIdx.y == 0) require_valid_rows(rows, m, g, op);
}

// Pass 2: one block per (group, kReduceColumns columns). A group's chunks are shared among the
// block's warps (warp w takes chunks first + w, first + w + kReduceWarps, ...), each adding its
// own in order, kReduceUnroll of them loaded together; the block then adds the warps' sums in warp
// order. A fixed order for given offs, so the same bits every time. One thread walking all of a
// group's chunks made a chain of dependent loads as long as the group: under skewed routing the
// deepest group's chain was the pass (GPT-OSS-20B in the peer benchmark's skewed routing: 192
// chunks against 24 balanced; docs/perf-notes.md, session 40).
__global__ void __launch_bounds__(kReduceThreads) column_sum_reduce_kernel(int64_t m, int64_t n, const int32_t* offs,
                                                                            int32_t num_groups, const float* partial,
                                                                            float* out) {
  __shared__ alignas(16) float warp_sums[kReduceWarps][kReduceColumns];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t g = blockIdx.x;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kReduceColumns, col = col0 + 8 * lane;
  const int64_t used = rows_in_use(offs, num_groups, m);
  const GroupRows rows = group_rows(offs, g);
  if (!rows.valid(m)) {  // one thread reports and traps, the rest leave (see report_bad_rows)
    report_bad_rows(rows, m, g, "group_column_sum");
    return;
  }
  const int64_t begin = rows.begin < 0 ? 0 : rows.begin;
  const int64_t end = rows.end < used ? rows.end : used;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const bool active = col < n;  // lanes past n keep zeros but stay in the loop (the warp's barrier)
  if (begin < end) {
    const int64_t last = (end - 1) / kColumnSumChunkRows;
    for (int64_t c = begin / kColumnSumChunkRows + warp; c <= last; c += kReduceWarps * kReduceUnroll) {
      float4 v[kReduceUnroll][2];
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) {
        const int64_t cu = c + u * kReduceWarps;
        const bool live = active && cu <= last;
        const float4* p = reinterpret_cast<const float4*>(partial + column_sum_slot(cu, g) * n + col);
        v[u][0] = live ? __ldg(p) : make_float4(0, 0, 0, 0);
        v[u][1] = live ? __ldg(p + 1) : make_float4(0, 0, 0, 0);
      }
      // Loads may not move across this barrier, so all of them are in flight before the first add
      // (without it ptxas issues each load after the previous one's adds, which wait for it).
      __syncwarp();
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) {  // zeros past the group's last chunk
        acc[0] += v[u][0].x; acc[1] += v[u][0].y; acc[2] += v[u][0].z; acc[3] += v[u][0].w;
        acc[4] += v[u][1].x; acc[5] += v[u][1].y; acc[6] += v[u][1].z; acc[7] += v[u][1].w;
      }
    }
  }
  store_f32x8(&warp_sums[warp][8 * lane], acc);
  __syncthreads();
  const int64_t out_col = col0 + threadIdx.x;  // one column a thread
  if (out_col >= n) return;
  float sum = warp_sums[0][threadIdx.x];
#pragma unroll
  for (int w = 1; w < kReduceWarps; ++w) sum += warp_sums[w][threadIdx.x];
  out[static_cast<int64_t>(g) * n + out_col] = sum;
}

// Pass 2 of the row dots: one thread per row, slices added in order.
__global__ void row_dot_reduce_kernel(int64_t m, int64_t slices, const float* dot_partial, float* row_dot) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= m) return;
  float acc = 0.0f;
  for (int64_t s = 0; s < slices; ++s) acc += dot_partial[s * m + r];
  row_dot[r] = acc;
}

// Pass 2 over tile partials: one block per (group, kTileColumns columns), four consecutive columns
// a lane (one 16-byte load a row: the widths are multiples of 8). As in column_sum_reduce_kernel,
// the group's tiles are shared among the warps (warp w: tiles w, w + kReduceWarps, ...; kTileUnroll
// tiles' rows loaded together), each adding its tiles' rows in order, and the block adds the
// warps' sums in warp order.
__global__ void __launch_bounds__(kReduceThreads) tile_column_sum_kernel(TileColumnSumArgs a) {
  constexpr int kMaxRows = kTileColumnSumWarps;
  __shared__ alignas(16) float warp_sums[kReduceWarps][kTileColumns];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t g = blockIdx.x;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kTileColumns, col = col0 + 4 * lane;
  const GroupRows rows = group_rows(a.offs, g);
  if (!rows.valid(a.m)) {
    report_bad_rows(rows, a.m, g, "tile_column_sum");
    return;
  }
  const int64_t tiles = rows.count() > 0 ? (rows.count() + kColumnSumChunkRows - 1) / kColumnSumChunkRows : 0;
  float4 acc = make_float4(0, 0, 0, 0);
  if (col < a.width) {
    for (int64_t t = warp; t < tiles; t += kReduceWarps * kTileUnroll) {
      float4 v[kTileUnroll][kMaxRows];
#pragma unroll
      for (int u = 0; u < kTileUnroll; ++u) {  // predicated loads, all issued before the adds
        const int64_t tu = t + u * kReduceWarps;
        const float* p = a.partial + tile_column_sum_slot(rows.begin, tu, g) * a.rows_per_slot * a.ld + col;
#pragma unroll
        for (int w = 0; w < kMaxRows; ++w) {
          const bool live = tu < tiles && w < a.rows_per_slot;
          v[u][w] = live ? __ldg(reinterpret_cast<const float4*>(p + w * a.ld)) : make_float4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kTileUnroll; ++u) {
        if (t + u * kReduceWarps >= tiles) continue;
#pragma unroll
        for (int w = 0; w < kMaxRows; ++w) {
          acc.x += v[u][w].x;
          acc.y += v[u][w].y;
          acc.z += v[u][w].z;
          acc.w += v[u][w].w;
        }
      }
    }
  }
  *reinterpret_cast<float4*>(&warp_sums[warp][4 * lane]) = acc;
  __syncthreads();
  const int64_t out_col = col0 + threadIdx.x;  // one column a thread
  if (threadIdx.x >= kTileColumns || out_col >= a.width) return;
  float sum = warp_sums[0][threadIdx.x];
#pragma unroll
  for (int w = 1; w < kReduceWarps; ++w) sum += warp_sums[w][threadIdx.x];
  a.out[static_cast<int64_t>(g) * a.width + out_col] = sum;
}

template <bool kGather, bool kRowDot, bool kQuantize = false>
void launch_partials(const Pass& p, int64_t chunks, unsigned col_blocks, cudaStream_t stream) {
  column_sum_partials_kernel<kGather, kRowDot, kQuantize>
      <<<dim3(static_cast<unsigned>(chunks), col_blocks), kThreads, 0, stream>>>(p);
}

// Both passes, pass 1 quantizing the rows too where `copy` is given.
cudaError_t launch_column_sums(const GroupColumnSumArgs& a, const RowsFp8Copy* copy, float* workspace,
                               cudaStream_t stream) {
  const unsigned col_blocks = static_cast<unsigned>((a.n / 8 + kThreads - 1) / kThreads);
  const int64_t chunks = column_sum_chunks(a.m);
  float* dot_partial = workspace + (chunks + a.num_groups) * a.n;
  const Pass p{static_cast<const __nv_bfloat16*>(a.src),
               a.ld,
               a.src_rows,
               a.index,
               static_cast<__nv_bfloat16*>(a.gathered),
               a.ld_gathered,
               a.row_scale,
               static_cast<const __nv_bfloat16*>(a.bias),
               a.ld_bias,
               dot_partial,
               a.m,
               a.n,
               a.offs,
               a.num_groups,
               workspace,
               copy != nullptr ? static_cast<uint8_t*>(copy->q) : nullptr,
               copy != nullptr ? copy->ld_q : 0,
               copy != nullptr ? copy->scale : nullptr};
  const bool gather = a.index != nullptr, row_dot = a.row_dot != nullptr && a.bias != nullptr;
  if (chunks > 0) {
    if (copy != nullptr) launch_partials<false, false, true>(p, chunks, col_blocks, stream);
    else if (gather && row_dot) launch_partials<true, true>(p, chunks, col_blocks, stream);
    else if (gather) launch_partials<true, false>(p, chunks, col_blocks, stream);
    else if (row_dot) launch_partials<false, true>(p, chunks, col_blocks, stream);
    else launch_partials<false, false>(p, chunks, col_blocks, stream);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const unsigned reduce_blocks = static_cast<unsigned>((a.n + kReduceColumns - 1) / kReduceColumns);
  column_sum_reduce_kernel<<<dim3(static_cast<unsigned>(a.num_groups), reduce_blocks), kReduceThreads, 0, stream>>>(
      a.m, a.n, a.offs, a.num_groups, workspace, a.out);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || !row_dot || a.m == 0) return err;
  constexpr int kRowThreads = 256;
  row_dot_reduce_kernel<<<static_cast<unsigned>((a.m + kRowThreads - 1) / kRowThreads), kRowThreads, 0, stream>>>(
      a.m, row_dot_slices(a.n), dot_partial, a.row_dot);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_group_column_sum(const GroupColumnSumArgs& a, float* workspace, cudaStream_t stream) {
  return launch_column_sums(a, nullptr, workspace, stream);
}

cudaError_t launch_group_column_sum_quantize(const GroupColumnSumArgs& a, const RowsFp8Copy& copy, float* workspace,
                                             cudaStream_t stream) {
  if (a.index != nullptr || a.row_dot != nullptr) return cudaErrorInvalidValue;  // not combined with these
  return launch_column_sums(a, &copy, workspace, stream);
}

cudaError_t launch_tile_column_sum(const TileColumnSumArgs& a, cudaStream_t stream) {
  if (a.num_groups == 0 || a.width == 0) return cudaSuccess;
  if (a.rows_per_slot < 1 || a.rows_per_slot > kTileColumnSumWarps) return cudaErrorInvalidValue;
  // 16-byte loads of four columns: the callers' widths (2I or I) and strides are multiples of 8
  if (a.width % 4 != 0 || a.ld % 4 != 0 || reinterpret_cast<uintptr_t>(a.partial) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(a.num_groups), static_cast<unsigned>((a.width + kTileColumns - 1) / kTileColumns));
  tile_column_sum_kernel<<<grid, kReduceThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace cute_moe::detail

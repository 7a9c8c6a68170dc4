// Deterministic per-group column sums (see group_column_sum.h for the slot scheme).
#include <cuda_bf16.h>

#include "group_column_sum.h"
#include "group_setup.h"

namespace cute_moe::detail {

namespace {

constexpr int kThreads = 128;  // each thread owns 8 consecutive columns

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

// Pass 1: one block per (row chunk, 8*kThreads columns).
__global__ void column_sum_partials_kernel(const __nv_bfloat16* src, int64_t m, int64_t n, int64_t ld,
                                           const float* row_scale, const int32_t* offs, int32_t num_groups,
                                           float* partial) {
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * 8;
  if (col >= n) return;
  const int64_t chunk = blockIdx.x;
  const int64_t chunk_end = min(chunk * kColumnSumChunkRows + kColumnSumChunkRows, rows_in_use(offs, num_groups, m));
  int64_t r = chunk * kColumnSumChunkRows;
  for (int32_t g = group_of_row(offs, num_groups, r); r < chunk_end && g < num_groups; ++g) {
    const int64_t seg_end = min(static_cast<int64_t>(offs[g]), chunk_end);
    if (seg_end <= r) continue;  // empty group: no slot
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll 4
    for (; r < seg_end; ++r) {
      add_bf16x8(acc, *reinterpret_cast<const uint4*>(src + r * ld + col), row_scale != nullptr ? row_scale[r] : 1.0f);
    }
    store_f32x8(partial + column_sum_slot(chunk, g) * n + col, acc);
  }
}

// Pass 2: one block per (group, 8*kThreads columns); chunks added in order.
__global__ void column_sum_reduce_kernel(int64_t m, int64_t n, const int32_t* offs, int32_t num_groups,
                                         const float* partial, float* out) {
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * 8;
  if (col >= n) return;
  const int32_t g = blockIdx.x;
  const int64_t used = rows_in_use(offs, num_groups, m);
  const GroupRows rows = group_rows(offs, g);
  require_valid_rows(rows, m, g, "group_column_sum", threadIdx.x == 0 && blockIdx.y == 0);
  const int64_t begin = rows.begin < 0 ? 0 : rows.begin;
  const int64_t end = rows.end < used ? rows.end : used;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (begin < end) {
    for (int64_t c = begin / kColumnSumChunkRows; c <= (end - 1) / kColumnSumChunkRows; ++c) {
      const float4* p = reinterpret_cast<const float4*>(partial + column_sum_slot(c, g) * n + col);
      const float4 lo = p[0], hi = p[1];
      acc[0] += lo.x; acc[1] += lo.y; acc[2] += lo.z; acc[3] += lo.w;
      acc[4] += hi.x; acc[5] += hi.y; acc[6] += hi.z; acc[7] += hi.w;
    }
  }
  store_f32x8(out + static_cast<int64_t>(g) * n + col, acc);
}

}  // namespace

cudaError_t launch_group_column_sum(const void* src, int64_t m, int64_t n, int64_t ld, const float* row_scale,
                                   const int32_t* offs, int32_t num_groups, float* out, float* workspace,
                                   cudaStream_t stream) {
  const unsigned col_blocks = static_cast<unsigned>((n / 8 + kThreads - 1) / kThreads);
  const int64_t chunks = column_sum_chunks(m);
  if (chunks > 0) {
    column_sum_partials_kernel<<<dim3(static_cast<unsigned>(chunks), col_blocks), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(src), m, n, ld, row_scale, offs, num_groups, workspace);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  column_sum_reduce_kernel<<<dim3(static_cast<unsigned>(num_groups), col_blocks), kThreads, 0, stream>>>(
      m, n, offs, num_groups, workspace, out);
  return cudaGetLastError();
}

}  // namespace cute_moe::detail

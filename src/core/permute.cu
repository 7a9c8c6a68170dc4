// Kernels and host entry points of the permute / unpermute gathers (permute.h).
//
// One warp per output row, rows walked grid-stride by a grid sized to the device. Lanes
// move 16-byte vectors (8 bf16) and keep several loads in flight each (the k*Unroll
// constants) so that a warp covers a long row at copy bandwidth. The source row numbers of an output
// row are loaded once, one per lane, checked there, and broadcast with shuffles.
// Sums run in a fixed order (choices j in order, per lane over its vectors, then a fixed
// shuffle tree), so results are bitwise reproducible.
#include <algorithm>
#include <string>

#include <cuda_bf16.h>

#include "bf16x8.cuh"
#include "checked_row.cuh"
#include "cute_moe/permute.h"
#include "device_info.h"
#include "launch_result.h"

namespace cute_moe {

namespace {

using detail::checked_row;
using detail::cuda_error;
using detail::launched;
using detail::current_device;
using detail::DeviceInfo;

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * kWarpSize;
// Grid-stride grids of at most this many blocks per multiprocessor (measured on an H200 at
// GPT-OSS-20B sizes: the copy gains 4% from a near one-row-per-warp grid, on which the sum
// loses 2%).
constexpr int kCopyBlocksPerSm = 64;
constexpr int kSumBlocksPerSm = 8;
constexpr int kDotBlocksPerSm = 16;
constexpr unsigned kFullMask = 0xffffffffu;

// Vectors of 8 bf16 a lane keeps in flight.
constexpr int kCopyUnroll = 4;  // gather_rows: loads then stores
constexpr int kSumUnroll = 2;   // gather_sum_rows: per choice, k choices in flight
constexpr int kDotUnroll = 2;   // gather_rows_dot: a plus kDotChoices source rows each
constexpr int kDotChoices = 4;  // choices sharing one read of a's row

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) % kWarpSize; }

__device__ __forceinline__ int64_t first_warp() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + static_cast<int64_t>(threadIdx.x) / kWarpSize;
}

__device__ __forceinline__ int64_t warp_count() { return static_cast<int64_t>(gridDim.x) * kWarpsPerBlock; }

__device__ __forceinline__ uint4 scaled(uint4 v, float s) {
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    h[i] = __floats2bfloat162_rn(f.x * s, f.y * s);
  }
  return v;
}

__device__ __forceinline__ void fma8(float acc[8], uint4 v, float w) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] = fmaf(w, f.x, acc[2 * i]);
    acc[2 * i + 1] = fmaf(w, f.y, acc[2 * i + 1]);
  }
}

__device__ __forceinline__ uint4 round8(const float acc[8]) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return v;
}

// Rows and row strides in 16-byte vectors.
struct VecMatrix {
  const uint4* p;
  int64_t ld;
  __device__ __forceinline__ const uint4* row(int64_t r) const { return p + r * ld; }
};

template <bool kScale>
__global__ void __launch_bounds__(kThreads) gather_rows_kernel(VecMatrix src, int64_t src_rows, const int32_t* index,
                                                               const float* scale, uint4* out, int64_t ld_out,
                                                               int64_t rows, int64_t nvec) {
  const int lane = lane_id();
  for (int64_t r = first_warp(); r < rows; r += warp_count()) {
    int32_t s = 0;
    if (lane == 0) s = checked_row(index, r, 1, src_rows, "gather_rows");
    s = __shfl_sync(kFullMask, s, 0);
    const float w = kScale ? scale[r] : 1.0f;
    const uint4* in = src.row(s);
    uint4* o = out + r * ld_out;
    for (int64_t v0 = 0; v0 < nvec; v0 += kWarpSize * kCopyUnroll) {
      uint4 buf[kCopyUnroll];
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int64_t v = v0 + u * kWarpSize + lane;
        if (v < nvec) buf[u] = __ldg(in + v);
      }
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int64_t v = v0 + u * kWarpSize + lane;
        if (v < nvec) o[v] = kScale ? scaled(buf[u], w) : buf[u];
      }
    }
  }
}

template <bool kWeight>
__global__ void __launch_bounds__(kThreads) gather_sum_rows_kernel(VecMatrix src, int64_t src_rows,
                                                                   const int32_t* index, const float* weight,
                                                                   uint4* out, int64_t ld_out, int64_t rows,
                                                                   int64_t k, int64_t nvec) {
  const int lane = lane_id();
  // Lane j holds choice j of the first 32 (later ones, k > 32, are reloaded per chunk).
  // Without weights a warp loads its next token's choices while it sums this token's rows, so
  // the rows' loads wait on one access, not two (with weights the extra live values spill).
  auto choices = [&](int64_t t, int32_t& row, float& w) {
    row = 0;
    w = 1.0f;
    if (t < rows && lane < k) {
      row = checked_row(index, t * k + lane, k, src_rows, "gather_sum_rows");
      if (kWeight) w = weight[t * k + lane];
    }
  };
  int32_t next_row = 0;
  float next_w = 1.0f;
  if constexpr (!kWeight) choices(first_warp(), next_row, next_w);
  for (int64_t t = first_warp(); t < rows; t += warp_count()) {
    int32_t first_row = next_row;
    float first_w = next_w;
    if constexpr (kWeight) {
      choices(t, first_row, first_w);
    } else {
      choices(t + warp_count(), next_row, next_w);
    }
    for (int64_t v0 = 0; v0 < nvec; v0 += kWarpSize * kSumUnroll) {
      float acc[kSumUnroll][8] = {};
      for (int64_t j0 = 0; j0 < k; j0 += kWarpSize) {
        int32_t my_row = first_row;
        float my_w = first_w;
        if (j0 > 0 && j0 + lane < k) {
          my_row = checked_row(index, t * k + j0 + lane, k, src_rows, "gather_sum_rows");
          if (kWeight) my_w = weight[t * k + j0 + lane];
        }
        const int n = k - j0 < kWarpSize ? static_cast<int>(k - j0) : kWarpSize;
#pragma unroll 4
        for (int jj = 0; jj < n; ++jj) {
          const uint4* in = src.row(__shfl_sync(kFullMask, my_row, jj));
          const float w = kWeight ? __shfl_sync(kFullMask, my_w, jj) : 1.0f;
          uint4 x[kSumUnroll];
#pragma unroll
          for (int u = 0; u < kSumUnroll; ++u) {
            const int64_t v = v0 + u * kWarpSize + lane;
            if (v < nvec) x[u] = __ldg(in + v);
          }
#pragma unroll
          for (int u = 0; u < kSumUnroll; ++u) {
            if (v0 + u * kWarpSize + lane < nvec) fma8(acc[u], x[u], w);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) {
        const int64_t v = v0 + u * kWarpSize + lane;
        if (v < nvec) out[t * ld_out + v] = round8(acc[u]);
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads) gather_rows_dot_kernel(VecMatrix a, VecMatrix src, int64_t src_rows,
                                                                   const int32_t* index, float* out, int64_t rows,
                                                                   int64_t k, int64_t nvec) {
  const int lane = lane_id();
  for (int64_t t = first_warp(); t < rows; t += warp_count()) {
    const uint4* a_row = a.row(t);
    for (int64_t j0 = 0; j0 < k; j0 += kWarpSize) {
      int32_t my_row = 0;
      if (j0 + lane < k) my_row = checked_row(index, t * k + j0 + lane, k, src_rows, "gather_rows_dot");
      const int n = k - j0 < kWarpSize ? static_cast<int>(k - j0) : kWarpSize;
      // kDotChoices source rows per pass over a's row; choices past n repeat the last one
      // (warp-uniform, so the shuffles stay full-warp) and are not stored.
      for (int jb = 0; jb < n; jb += kDotChoices) {
        const uint4* in[kDotChoices];
#pragma unroll
        for (int c = 0; c < kDotChoices; ++c) in[c] = src.row(__shfl_sync(kFullMask, my_row, jb + c < n ? jb + c : n - 1));
        float acc[kDotChoices] = {};
        for (int64_t v0 = 0; v0 < nvec; v0 += kWarpSize * kDotUnroll) {
          uint4 av[kDotUnroll], sv[kDotUnroll][kDotChoices];
#pragma unroll
          for (int u = 0; u < kDotUnroll; ++u) {
            const int64_t v = v0 + u * kWarpSize + lane;
            if (v < nvec) {
              av[u] = __ldg(a_row + v);
#pragma unroll
              for (int c = 0; c < kDotChoices; ++c) {
                if (jb + c < n) sv[u][c] = __ldg(in[c] + v);
              }
            }
          }
#pragma unroll
          for (int u = 0; u < kDotUnroll; ++u) {
            if (v0 + u * kWarpSize + lane < nvec) {
#pragma unroll
              for (int c = 0; c < kDotChoices; ++c) {
                if (jb + c < n) acc[c] = detail::dot_bf16x8(av[u], sv[u][c], acc[c]);
              }
            }
          }
        }
#pragma unroll
        for (int c = 0; c < kDotChoices; ++c) {
          const float sum = detail::warp_sum(acc[c]);
          if (lane == 0 && jb + c < n) out[t * k + j0 + jb + c] = sum;
        }
      }
    }
  }
}

// Grid of a grid-stride launch over `rows` warp-rows: up to blocks_per_sm blocks per
// multiprocessor, no more than the rows need.
Result grid_for(int64_t rows, int blocks_per_sm, unsigned* blocks) {
  DeviceInfo dev;
  Result r = current_device(&dev);
  if (!r.ok()) return r;
  const int64_t needed = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  *blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(needed, int64_t{dev.sm_count} * blocks_per_sm)));
  return Result::success();
}

VecMatrix vec_matrix(const void* p, int64_t ld) { return {static_cast<const uint4*>(p), ld / 8}; }

}  // namespace

Result gather_rows(const GatherRowsArgs& a, cudaStream_t stream) {
  Result r = validate(a);
  if (!r.ok() || a.rows == 0 || a.cols == 0) return r;
  unsigned blocks = 0;
  r = grid_for(a.rows, kCopyBlocksPerSm, &blocks);
  if (!r.ok()) return r;
  const VecMatrix src = vec_matrix(a.src, a.ld_src);
  uint4* out = static_cast<uint4*>(a.out);
  if (a.scale != nullptr) {
    gather_rows_kernel<true><<<blocks, kThreads, 0, stream>>>(src, a.src_rows, a.index, a.scale, out, a.ld_out / 8,
                                                              a.rows, a.cols / 8);
  } else {
    gather_rows_kernel<false><<<blocks, kThreads, 0, stream>>>(src, a.src_rows, a.index, nullptr, out, a.ld_out / 8,
                                                               a.rows, a.cols / 8);
  }
  return launched("gather_rows launch");
}

Result gather_sum_rows(const GatherSumRowsArgs& a, cudaStream_t stream) {
  Result r = validate(a);
  if (!r.ok() || a.rows == 0 || a.cols == 0) return r;
  unsigned blocks = 0;
  r = grid_for(a.rows, kSumBlocksPerSm, &blocks);
  if (!r.ok()) return r;
  const VecMatrix src = vec_matrix(a.src, a.ld_src);
  uint4* out = static_cast<uint4*>(a.out);
  if (a.weight != nullptr) {
    gather_sum_rows_kernel<true><<<blocks, kThreads, 0, stream>>>(src, a.src_rows, a.index, a.weight, out,
                                                                  a.ld_out / 8, a.rows, a.k, a.cols / 8);
  } else {
    gather_sum_rows_kernel<false><<<blocks, kThreads, 0, stream>>>(src, a.src_rows, a.index, nullptr, out,
                                                                   a.ld_out / 8, a.rows, a.k, a.cols / 8);
  }
  return launched("gather_sum_rows launch");
}

Result gather_rows_dot(const GatherRowsDotArgs& a, cudaStream_t stream) {
  Result r = validate(a);
  if (!r.ok() || a.rows == 0 || a.k == 0) return r;
  unsigned blocks = 0;
  r = grid_for(a.rows, kDotBlocksPerSm, &blocks);
  if (!r.ok()) return r;
  gather_rows_dot_kernel<<<blocks, kThreads, 0, stream>>>(vec_matrix(a.a, a.ld_a), vec_matrix(a.src, a.ld_src),
                                                         a.src_rows, a.index, a.out, a.rows, a.k, a.cols / 8);
  return launched("gather_rows_dot launch");
}

}  // namespace cute_moe

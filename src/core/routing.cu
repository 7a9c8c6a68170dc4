// The router's top-k and the counting sort of routed rows by expert (routing.h).
#include <cstdint>

#include "cute_moe/routing.h"
#include "launch_result.h"
#include "expert_sort_slices.h"

namespace cute_moe {

namespace {

using detail::launched;

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// --- top-k -------------------------------------------------------------------------------

constexpr int kTopKWarpsPerBlock = 8;

// An unsigned key in the order of a descending sort: larger floats larger, NaN above every
// number, -0 equal to +0. Never 0 (that marks a taken or missing column).
__device__ __forceinline__ uint32_t order_key(float x) {
  if (x != x) return 0xffffffffu;
  const uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One warp per row: column c lives in lane c % 32, slot c / 32. Each round the warp takes
// the largest (key, lower column) left, by a 64-bit max over the warp; lane j keeps choice j.
template <int kPerLane>
__global__ void __launch_bounds__(kTopKWarpsPerBlock * kWarpSize) top_k_kernel(TopKArgs a) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kTopKWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= a.rows) return;  // the whole warp
  const float* in = a.logits + row * a.ld_logits;
  float v[kPerLane];
  uint64_t key[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int col = i * kWarpSize + lane;
    v[i] = col < a.cols ? in[col] : 0.0f;
    key[i] = col < a.cols ? (static_cast<uint64_t>(order_key(v[i])) << 32) | (0xffffffffu - static_cast<uint32_t>(col))
                          : 0;
  }
  float my_value = 0.0f;
  int64_t my_index = 0;
  for (int j = 0; j < a.k; ++j) {
    uint64_t best = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) best = key[i] > best ? key[i] : best;
#pragma unroll
    for (int off = kWarpSize / 2; off > 0; off /= 2) {
      const uint64_t other = __shfl_xor_sync(kFullMask, best, off);
      best = other > best ? other : best;
    }
    const int col = static_cast<int>(0xffffffffu - static_cast<uint32_t>(best));
    const int owner = col % kWarpSize, slot = col / kWarpSize;
    float mine = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (i == slot) {
        mine = v[i];
        if (lane == owner) key[i] = 0;
      }
    }
    const float value = __shfl_sync(kFullMask, mine, owner);
    if (lane == j) {
      my_value = value;
      my_index = col;
    }
  }
  if (lane < a.k) {
    a.values[row * a.k + lane] = my_value;
    a.indices[row * a.k + lane] = my_index;
  }
}

template <int kPerLane>
void launch_top_k(const TopKArgs& a, cudaStream_t stream) {
  const int64_t blocks = (a.rows + kTopKWarpsPerBlock - 1) / kTopKWarpsPerBlock;
  top_k_kernel<kPerLane><<<static_cast<unsigned>(blocks), kTopKWarpsPerBlock * kWarpSize, 0, stream>>>(a);
}

// --- sort by expert ----------------------------------------------------------------------
// Three launches: counts per (bucket, slice); one block's exclusive scan of them in
// bucket-major order (each slice's first row per bucket) and offs; each slice's warp
// walking its entries in order, 32 at a time, ranking equal buckets with __match_any_sync.

constexpr int kSortWarpsPerBlock = 4;
constexpr int kScanThreads = 1024;

struct SortPlan {
  int64_t entries;
  int64_t k;
  int64_t num_experts;
  int64_t slice;   // entries per slice
  int64_t slices;
  int32_t* table;  // (buckets, slices): counts, then each slice's first row per bucket
};

template <class Id>
__device__ __forceinline__ int32_t bucket_of(const Id* ids, int64_t i, int64_t num_experts) {
  const Id e = ids[i];
  return (e >= 0 && e < num_experts) ? static_cast<int32_t>(e) : static_cast<int32_t>(num_experts);
}

template <class Id>
__global__ void __launch_bounds__(kSortWarpsPerBlock * kWarpSize) sort_count_kernel(SortPlan p, const Id* ids) {
  extern __shared__ int32_t counters[];  // kSortWarpsPerBlock x buckets
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kSortWarpsPerBlock + warp;
  if (s >= p.slices) return;  // the whole warp; no block barrier below
  const int64_t buckets = detail::sort_buckets(p.num_experts);
  int32_t* cnt = counters + warp * buckets;
  for (int64_t b = lane; b < buckets; b += kWarpSize) cnt[b] = 0;
  __syncwarp();
  const int64_t begin = s * p.slice, end = min(begin + p.slice, p.entries);
  for (int64_t i = begin + lane; i < end; i += kWarpSize) atomicAdd(&cnt[bucket_of(ids, i, p.num_experts)], 1);
  __syncwarp();
  for (int64_t b = lane; b < buckets; b += kWarpSize) p.table[b * p.slices + s] = cnt[b];
}

// Exclusive scan of the (buckets, slices) table in place, then offs[e] = the first row of
// bucket e + 1 (the end of expert e).
__global__ void __launch_bounds__(kScanThreads) sort_scan_kernel(SortPlan p, int32_t* offs) {
  __shared__ int32_t warp_total[kScanThreads / kWarpSize];
  const int t = static_cast<int>(threadIdx.x), lane = t % kWarpSize, warp = t / kWarpSize;
  const int64_t cells = detail::sort_buckets(p.num_experts) * p.slices;
  const int64_t per = (cells + kScanThreads - 1) / kScanThreads;
  const int64_t begin = min(t * per, cells), end = min(begin + per, cells);
  int32_t sum = 0;
  for (int64_t i = begin; i < end; ++i) sum += p.table[i];
  int32_t incl = sum;
#pragma unroll
  for (int off = 1; off < kWarpSize; off *= 2) {
    const int32_t up = __shfl_up_sync(kFullMask, incl, off);
    if (lane >= off) incl += up;
  }
  if (lane == kWarpSize - 1) warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int32_t total = warp_total[lane];
    int32_t w_incl = total;
#pragma unroll
    for (int off = 1; off < kWarpSize; off *= 2) {
      const int32_t up = __shfl_up_sync(kFullMask, w_incl, off);
      if (lane >= off) w_incl += up;
    }
    warp_total[lane] = w_incl - total;  // exclusive
  }
  __syncthreads();
  int32_t run = warp_total[warp] + incl - sum;
  for (int64_t i = begin; i < end; ++i) {
    const int32_t c = p.table[i];
    p.table[i] = run;
    run += c;
  }
  __syncthreads();  // the block's global writes, visible to the block
  for (int64_t e = t; e < p.num_experts; e += kScanThreads) offs[e] = p.slices > 0 ? p.table[(e + 1) * p.slices] : 0;
}

template <class Id, bool kWeights>
__global__ void __launch_bounds__(kSortWarpsPerBlock * kWarpSize)
    sort_scatter_kernel(SortPlan p, const Id* ids, const float* weights, int32_t* row_token, int32_t* token_rows,
                        float* prob) {
  extern __shared__ int32_t next_row[];  // kSortWarpsPerBlock x buckets
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kSortWarpsPerBlock + warp;
  if (s >= p.slices) return;
  const int64_t buckets = detail::sort_buckets(p.num_experts);
  int32_t* next = next_row + warp * buckets;
  for (int64_t b = lane; b < buckets; b += kWarpSize) next[b] = p.table[b * p.slices + s];
  __syncwarp();
  const int64_t begin = s * p.slice, end = min(begin + p.slice, p.entries);
  const unsigned below = (1u << lane) - 1;
  for (int64_t i0 = begin; i0 < end; i0 += kWarpSize) {
    const int64_t i = i0 + lane;
    const bool valid = i < end;
    const int32_t b = valid ? bucket_of(ids, i, p.num_experts) : -1;  // -1: past the slice
    const unsigned peers = __match_any_sync(kFullMask, b);
    const int rank = __popc(peers & below);
    const int32_t pos = valid ? next[b] + rank : 0;
    __syncwarp();  // every peer has read next[b]
    if (valid && rank == 0) next[b] += __popc(peers);
    __syncwarp();
    if (valid) {
      const int32_t entry = static_cast<int32_t>(i);
      row_token[pos] = entry / static_cast<int32_t>(p.k);
      token_rows[i] = pos;
      if constexpr (kWeights) prob[pos] = weights[i];
    }
  }
}

template <class Id>
Result launch_sort(const SortByExpertArgs& a, const SortPlan& p, cudaStream_t stream) {
  const Id* ids = static_cast<const Id*>(a.experts);
  const size_t smem = kSortWarpsPerBlock * detail::sort_buckets(a.num_experts) * sizeof(int32_t);
  const unsigned blocks = static_cast<unsigned>((p.slices + kSortWarpsPerBlock - 1) / kSortWarpsPerBlock);
  if (p.slices > 0) {
    sort_count_kernel<Id><<<blocks, kSortWarpsPerBlock * kWarpSize, smem, stream>>>(p, ids);
    Result r = launched("sort_by_expert count launch");
    if (!r.ok()) return r;
  }
  sort_scan_kernel<<<1, kScanThreads, 0, stream>>>(p, a.offs);
  Result r = launched("sort_by_expert scan launch");
  if (!r.ok() || p.slices == 0) return r;
  if (a.weights != nullptr) {
    sort_scatter_kernel<Id, true><<<blocks, kSortWarpsPerBlock * kWarpSize, smem, stream>>>(
        p, ids, a.weights, a.row_token, a.token_rows, a.prob);
  } else {
    sort_scatter_kernel<Id, false><<<blocks, kSortWarpsPerBlock * kWarpSize, smem, stream>>>(
        p, ids, nullptr, a.row_token, a.token_rows, nullptr);
  }
  return launched("sort_by_expert scatter launch");
}

}  // namespace

Result top_k(const TopKArgs& a, cudaStream_t stream) {
  Result r = validate(a);
  if (!r.ok() || a.rows == 0) return r;
  const int64_t per_lane = (a.cols + kWarpSize - 1) / kWarpSize;
  if (per_lane <= 1) launch_top_k<1>(a, stream);
  else if (per_lane <= 2) launch_top_k<2>(a, stream);
  else if (per_lane <= 4) launch_top_k<4>(a, stream);
  else if (per_lane <= 8) launch_top_k<8>(a, stream);
  else launch_top_k<16>(a, stream);
  return launched("top_k launch");
}

Result sort_by_expert(const SortByExpertArgs& a, cudaStream_t stream) {
  Result r = validate(a);
  if (!r.ok()) return r;
  const int64_t entries = a.rows * a.k;
  const SortPlan p{entries,
                   a.k,
                   a.num_experts,
                   detail::sort_slice_entries(entries, a.num_experts),
                   detail::sort_slices(entries, a.num_experts),
                   static_cast<int32_t*>(a.workspace)};
  return a.experts_int32 ? launch_sort<int32_t>(a, p, stream) : launch_sort<int64_t>(a, p, stream);
}

}  // namespace cute_moe

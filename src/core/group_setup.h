// Building a grouped launch from the device-resident group offsets.
//
// The per-group math (rows of a group, its GEMM problem shape) is written once as
// host/device functions so the C++ tests check on the host exactly what the setup
// kernels compute on the device. The launcher enqueues one small kernel that fills the
// GroupArrays (kernel_registry.h) of a GemmProblem (gemm_problem.h) and writes the zeros
// the GEMM itself does not write (padding rows in ragged M, the gradients of empty groups
// in ragged K).
#pragma once

#include <cstdint>
#include <cstdio>

#include <cuda_runtime_api.h>

#include "gemm_problem.h"
#include "host_device.h"
#include "kernel_registry.h"

namespace cute_moe::detail {

// Rows [begin, end) of group e: offs holds cumulative end offsets, offs[-1] := 0.
struct GroupRows {
  int64_t begin;
  int64_t end;
  CUTE_MOE_HOST_DEVICE int64_t count() const { return end - begin; }
  // The contract the kernels rely on: 0 <= begin <= end <= m.
  CUTE_MOE_HOST_DEVICE bool valid(int64_t m) const { return 0 <= begin && begin <= end && end <= m; }
};

CUTE_MOE_HOST_DEVICE GroupRows group_rows(const int32_t* offs, int32_t e) {
  return {e == 0 ? 0 : static_cast<int64_t>(offs[e - 1]), static_cast<int64_t>(offs[e])};
}

#if defined(__CUDACC__)
// The device-side check of offs: a group whose rows break the contract stops the kernel
// with a printed message and a trap (the CUDA context is then unusable), so nothing is
// computed from, or written through, bad offsets. Every thread checks before it uses the
// rows; `report` says whether this one prints (one thread per group is enough).
__device__ __forceinline__ void require_valid_rows(GroupRows r, int64_t m, int32_t e, const char* op,
                                                   bool report = true) {
  if (!r.valid(m)) {
    if (report) {
      printf("cute_moe %s: invalid offs at group %d: rows [%lld, %lld) of m=%lld; offs must be non-decreasing "
             "cumulative end offsets in [0, m]\n",
             op, e, static_cast<long long>(r.begin), static_cast<long long>(r.end), static_cast<long long>(m));
    }
    __trap();
  }
}
#endif

// The group owning `row`: the smallest e with offs[e] > row, or num_groups for a padding row.
CUTE_MOE_HOST_DEVICE int32_t group_of_row(const int32_t* offs, int32_t num_groups, int64_t row) {
  int32_t lo = 0, hi = num_groups;
  while (lo < hi) {
    const int32_t mid = (lo + hi) / 2;
    if (offs[mid] > row) hi = mid; else lo = mid + 1;
  }
  return lo;
}

// (M, N, K) of group e in ragged M: its rows times the shared (k x n) weight shape.
CUTE_MOE_HOST_DEVICE void ragged_m_problem(GroupRows r, int64_t n, int64_t k, int32_t out[3]) {
  out[0] = static_cast<int32_t>(r.count());
  out[1] = static_cast<int32_t>(n);
  out[2] = static_cast<int32_t>(k);
}

// (M, N, K) of group e in ragged K: (k x n) output reduced over the group's rows, rounded up
// to whole blocks of `row_block` rows (FP8: 128, its operands zero-filled past the group's
// last row; else 1). An empty group keeps its whole output, K = 0: its tiles run with no
// k-blocks and store zeros (ragged_k_variants.cuh clears their accumulators).
CUTE_MOE_HOST_DEVICE void ragged_k_problem(GroupRows r, int64_t n, int64_t k, int32_t out[3], int32_t row_block = 1) {
  const int32_t rows = static_cast<int32_t>(r.count());
  out[0] = static_cast<int32_t>(k);
  out[1] = static_cast<int32_t>(n);
  out[2] = rows > 0 ? (rows + row_block - 1) / row_block * row_block : 0;
}

// 128-row blocks of a group's rows in the FP8 weight gradients' operands.
constexpr int32_t kRowBlock = 128;
CUTE_MOE_HOST_DEVICE int64_t row_blocks(GroupRows r) { return r.count() > 0 ? (r.count() + kRowBlock - 1) / kRowBlock : 0; }

// The per-group arrays `p` needs (those of absent operands stay null), laid out one after
// another, each 128-byte aligned: their bytes, and the arrays carved from `base`.
size_t group_arrays_bytes(const GemmProblem& p);
GroupArrays carve_group_arrays(void* base, const GemmProblem& p);

// Enqueues the setup kernel of `p`: fills `groups` (carved for p) from the device offsets,
// checks them, and writes the zeros the GEMM does not (ragged M: padding rows of D and aux;
// ragged K has none). row_partial: p.row_scale_grad's (tiles, m) scratch.
cudaError_t launch_group_setup(const GemmProblem& p, const GroupArrays& groups, float* row_partial, int sm_count,
                               cudaStream_t stream);

}  // namespace cute_moe::detail

// Building a grouped launch from the device-resident group offsets.
//
// The per-group math (rows of a group, its GEMM problem shape) is written once as
// host/device functions so the C++ tests check on the host exactly what the setup
// kernels compute on the device. The launchers enqueue one small kernel that fills the
// GroupArrays (kernel_registry.h) and writes the zeros the GEMM itself does not write
// (padding rows in ragged M, the gradients of empty groups in ragged K).
#pragma once

#include <cstdint>
#include <cstdio>

#include <cuda_runtime_api.h>

#include "cute_moe/grouped_gemm.h"
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

// (M, N, K) of group e in ragged K: (k x n) output reduced over the group's rows. An
// empty group gets M = 0 so the scheduler gives it no tile (CUTLASS would leave a K = 0
// accumulator unset); its output is zero-filled by the setup kernel instead.
CUTE_MOE_HOST_DEVICE void ragged_k_problem(GroupRows r, int64_t n, int64_t k, int32_t out[3]) {
  const int32_t rows = static_cast<int32_t>(r.count());
  out[0] = rows > 0 ? static_cast<int32_t>(k) : 0;
  out[1] = static_cast<int32_t>(n);
  out[2] = rows > 0 ? rows : 0;
}

// Extra row-aligned operands of the fused epilogues (rows follow y's groups).
struct RaggedMExtras {
  int64_t y_elem_bytes = 2;  // bf16 y; 4 where y holds packed bf16 pairs
  const void* c = nullptr;  // source operand C
  int64_t ldc = 0;          // in C elements
  int64_t c_elem_bytes = 0;
  void* aux = nullptr;      // bf16 second output
  int64_t ldaux = 0;
  int64_t aux_cols = 0;     // its width, for zeroing padding rows
  float* row_partial = nullptr;  // GLU backward: row-scale-gradient partials, (tiles, m) fp32
};

// Bytes of the per-group arrays for `num_groups` groups (each array 128-byte aligned).
size_t group_arrays_bytes(int32_t num_groups);
// Carves the arrays out of `base` (which must hold group_arrays_bytes()).
GroupArrays carve_group_arrays(void* base, int32_t num_groups);

cudaError_t launch_ragged_m_setup(const RaggedMGemmArgs& args, const RaggedMExtras& extras,
                                  const GroupArrays& groups, int sm_count, cudaStream_t stream);
cudaError_t launch_ragged_k_setup(const RaggedKGemmArgs& args, const GroupArrays& groups, int sm_count,
                                  cudaStream_t stream);

}  // namespace cute_moe::detail

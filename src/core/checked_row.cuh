// A row number read from a device index array, checked against the rows of the source it
// selects from: a bad value would be an out-of-bounds read, so the kernel prints where it is
// and stops with a trap (the permute kernels' and the gathering quantizer's contract).
#pragma once

#include <cstdint>
#include <cstdio>

namespace cute_moe::detail {

// index[pos], with pos = row * k + choice for an index of k choices per row (k = 1: one per row).
__device__ __forceinline__ int32_t checked_row(const int32_t* index, int64_t pos, int64_t k, int64_t src_rows,
                                               const char* op) {
  const int32_t v = index[pos];
  if (v < 0 || v >= src_rows) {
    printf("cute_moe %s: invalid index at position %lld (row %lld, choice %lld): %d is not a row of src, which has "
           "%lld rows\n",
           op, static_cast<long long>(pos), static_cast<long long>(pos / k), static_cast<long long>(pos % k), v,
           static_cast<long long>(src_rows));
    __trap();
  }
  return v;
}

}  // namespace cute_moe::detail

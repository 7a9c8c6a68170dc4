// How sort_by_expert (routing.h) cuts its M entries into slices, one warp each: a count
// per (bucket, slice) is scanned in bucket-major order by a single block, so the slices are
// made long enough to keep that table at most kSortScanCells cells (buckets = experts + 1,
// the last one the padding rows). Shared by the kernels and the host's workspace size.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace cute_moe::detail {

constexpr int64_t kSortMinSlice = 256;       // entries per slice at least (8 steps of a warp)
constexpr int64_t kSortScanCells = 32768;    // (buckets x slices) cells at most, about

CUTE_MOE_HOST_DEVICE int64_t sort_buckets(int64_t num_experts) { return num_experts + 1; }

CUTE_MOE_HOST_DEVICE int64_t sort_slice_entries(int64_t entries, int64_t num_experts) {
  const int64_t buckets = sort_buckets(num_experts);
  int64_t slice = (entries * buckets + kSortScanCells - 1) / kSortScanCells;
  slice = (slice + 31) / 32 * 32;  // whole warp steps
  return slice < kSortMinSlice ? kSortMinSlice : slice;
}

CUTE_MOE_HOST_DEVICE int64_t sort_slices(int64_t entries, int64_t num_experts) {
  const int64_t slice = sort_slice_entries(entries, num_experts);
  return (entries + slice - 1) / slice;
}

}  // namespace cute_moe::detail

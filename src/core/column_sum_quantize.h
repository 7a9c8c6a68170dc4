// The per-group column sums of group_column_sum.h that also write, from the same read of each
// row, the rows' 1 x 128 e4m3 copy (quantize_fp8_1x128's bits): in the FP8 block the up
// projection's bias gradient and the input-gradient GEMM's operand both come from dpre, read
// once (fp8_quantize.h, quantize_fp8_1x128_column_sums).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cute_moe/grouped_gemm.h"  // GroupColumnSumArgs

namespace cute_moe::detail {

struct RowsFp8Copy {
  void* q = nullptr;       // e4m3 (m, n), row stride ld_q
  int64_t ld_q = 0;
  float* scale = nullptr;  // (m, ceil(n / 128)), contiguous
};

// args without index or row dots (validated), workspace as launch_group_column_sum's.
cudaError_t launch_group_column_sum_quantize(const GroupColumnSumArgs& args, const RowsFp8Copy& copy,
                                             float* workspace, cudaStream_t stream);

}  // namespace cute_moe::detail

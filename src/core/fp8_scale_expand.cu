// B's 128 x 128 block scales copied with each 128-column block's scale twice (fp8_scale_expand.h).
#include "fp8_scale_expand.h"

#include <algorithm>

namespace cute_moe::detail {

namespace {

// out[(g * blocks64 + j) * kb + kk] = in[g * sg + (j / 2) * sn + kk * sk]
__global__ void expand_b_scales_kernel(const float* __restrict__ in, int64_t sg, int64_t sn, int64_t sk,
                                       int64_t total, int64_t blocks64, int64_t kb, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t kk = i % kb;
    const int64_t rest = i / kb;
    const int64_t j = rest % blocks64;
    const int64_t g = rest / blocks64;
    out[i] = in[g * sg + (j / 2) * sn + kk * sk];
  }
}

}  // namespace

cudaError_t launch_expand_b_scales(const BlockScales& s, int32_t groups, int64_t n, int64_t k, float* out,
                                   cudaStream_t stream, BlockScales* expanded) {
  const int64_t blocks64 = 2 * ((n + 127) / 128), kb = (k + 127) / 128;
  const int64_t total = int64_t(groups) * blocks64 * kb;
  *expanded = {out, blocks64 * kb, kb, 1};
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 1024));
  expand_b_scales_kernel<<<blocks, kThreads, 0, stream>>>(s.ptr, s.stride_group, s.stride_mn, s.stride_k, total,
                                                          blocks64, kb, out);
  return cudaGetLastError();
}

}  // namespace cute_moe::detail

// Setup kernels of the grouped launches: per-group pointers, strides and problem shapes
// from the device-resident offsets, plus the zeros the GEMM does not write.
//
// Block 0 fills the arrays (one thread per group, striding over groups) and checks the
// offsets; every block then helps with the zero fill. A bad `offs` stops the kernel with
// a printed message and a trap, so the GEMM queued behind it never runs on it.
#include <algorithm>
#include <cstdio>

#include "group_setup.h"

namespace cute_moe::detail {

namespace {

constexpr int kThreads = 256;
constexpr size_t kArrayAlign = 128;

__device__ __forceinline__ void require_valid_gather(int32_t source, int64_t row, int64_t x_rows) {
  if (source < 0 || source >= x_rows) {
    printf("cute_moe glu_forward: invalid gather_rows[%lld] = %d; row indices must be in [0, x_rows=%lld)\n",
           static_cast<long long>(row), source, static_cast<long long>(x_rows));
    __trap();
  }
}

// Zeroes `rows` rows of `row_bytes` bytes (a multiple of 16) at `base` with row pitch
// `pitch_bytes`, spreading the 16-byte words over the threads in [first, first + count).
__device__ __forceinline__ void zero_rows(char* base, int64_t rows, int64_t row_bytes, int64_t pitch_bytes,
                                          int64_t first, int64_t count) {
  const int64_t words_per_row = row_bytes / 16;
  const int64_t words = rows * words_per_row;
  for (int64_t i = first; i < words; i += count) {
    const int64_t r = i / words_per_row;
    const int64_t w = i - r * words_per_row;
    reinterpret_cast<uint4*>(base + r * pitch_bytes)[w] = make_uint4(0, 0, 0, 0);
  }
}

__global__ void ragged_m_setup_kernel(RaggedMGemmArgs a, RaggedMExtras x, GroupArrays g) {
  constexpr int64_t kElem = 2;  // bf16
  const bool b_n_contiguous = a.w_stride_n == 1;
  if (blockIdx.x == 0) {
    for (int32_t e = threadIdx.x; e < a.num_groups; e += blockDim.x) {
      const GroupRows r = group_rows(a.offs, e);
      require_valid_rows(r, a.m, e, "ragged_m_gemm");
      ragged_m_problem(r, a.n, a.k, g.problem_shapes + 3 * e);
      // gathered: the GEMM reads x through the group's row indices
      g.a[e] = static_cast<const char*>(a.x) + (a.gather_rows != nullptr ? 0 : r.begin * a.ldx * kElem);
      if (a.gather_rows != nullptr) g.gather_rows[e] = a.gather_rows + r.begin;
      g.b[e] = static_cast<const char*>(a.w) + e * a.w_stride_group * kElem;
      g.d[e] = static_cast<char*>(a.y) + r.begin * a.ldy * x.y_elem_bytes;
      if (g.bias != nullptr) g.bias[e] = static_cast<const char*>(a.bias) + e * a.bias_stride_group * kElem;
      g.lda[e] = a.ldx;
      g.ldb[e] = b_n_contiguous ? a.w_stride_k : a.w_stride_n;
      g.ldd[e] = a.ldy;
      if (x.c != nullptr) {
        g.c[e] = static_cast<const char*>(x.c) + r.begin * x.ldc * x.c_elem_bytes;
        g.ldc[e] = x.ldc;
      }
      if (x.aux != nullptr) {
        g.aux[e] = static_cast<char*>(x.aux) + r.begin * x.ldaux * kElem;
        g.ldaux[e] = x.ldaux;
      }
      if (g.row_scale != nullptr) g.row_scale[e] = a.row_scale + r.begin;
      if (g.row_partial != nullptr) g.row_partial[e] = x.row_partial + r.begin;
    }
  }
  // Padding rows [offs[E-1], m) belong to no group: the GEMM skips them, we zero them.
  int64_t used = a.offs[a.num_groups - 1];
  used = used < 0 ? 0 : (used > a.m ? a.m : used);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (a.gather_rows != nullptr) {
    for (int64_t row = thread; row < used; row += threads) require_valid_gather(a.gather_rows[row], row, a.x_rows);
  }
  zero_rows(static_cast<char*>(a.y) + used * a.ldy * x.y_elem_bytes, a.m - used, a.n * x.y_elem_bytes,
            a.ldy * x.y_elem_bytes, thread, threads);
  if (x.aux != nullptr) {
    zero_rows(static_cast<char*>(x.aux) + used * x.ldaux * kElem, a.m - used, x.aux_cols * kElem, x.ldaux * kElem,
              thread, threads);
  }
}

__global__ void ragged_k_setup_kernel(RaggedKGemmArgs a, GroupArrays g) {
  constexpr int64_t kElem = 2;  // bf16 inputs
  const int64_t out_elem = a.dw_dtype == DType::kF32 ? 4 : 2;
  if (blockIdx.x == 0 && blockIdx.y == 0) {
    for (int32_t e = threadIdx.x; e < a.num_groups; e += blockDim.x) {
      const GroupRows r = group_rows(a.offs, e);
      require_valid_rows(r, a.m, e, "ragged_k_gemm");
      ragged_k_problem(r, a.n, a.k, g.problem_shapes + 3 * e);
      g.a[e] = static_cast<const char*>(a.x) + r.begin * a.ldx * kElem;
      g.b[e] = static_cast<const char*>(a.dy) + r.begin * a.lddy * kElem;
      g.d[e] = static_cast<char*>(a.dw) + e * a.k * a.n * out_elem;
      g.lda[e] = a.ldx;
      g.ldb[e] = a.lddy;
      g.ldd[e] = a.n;
    }
  }
  // The gradient of an empty group is exactly zero; its tiles are never scheduled.
  for (int32_t e = blockIdx.y; e < a.num_groups; e += gridDim.y) {
    const GroupRows r = group_rows(a.offs, e);
    if (r.count() != 0) continue;
    zero_rows(static_cast<char*>(a.dw) + e * a.k * a.n * out_elem, a.k, a.n * out_elem, a.n * out_elem,
              static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, static_cast<int64_t>(gridDim.x) * blockDim.x);
  }
}

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

size_t group_arrays_bytes(int32_t num_groups) {
  const size_t e = static_cast<size_t>(num_groups);
  return align_up(3 * sizeof(int32_t) * e, kArrayAlign) + 14 * align_up(8 * e, kArrayAlign);
}

GroupArrays carve_group_arrays(void* base, int32_t num_groups) {
  const size_t e = static_cast<size_t>(num_groups);
  char* p = static_cast<char*>(base);
  auto take = [&](size_t bytes) {
    char* out = p;
    p += align_up(bytes, kArrayAlign);
    return out;
  };
  GroupArrays g;
  g.num_groups = num_groups;
  g.problem_shapes = reinterpret_cast<int32_t*>(take(3 * sizeof(int32_t) * e));
  g.a = reinterpret_cast<const void**>(take(8 * e));
  g.b = reinterpret_cast<const void**>(take(8 * e));
  g.d = reinterpret_cast<void**>(take(8 * e));
  g.bias = reinterpret_cast<const void**>(take(8 * e));
  g.lda = reinterpret_cast<int64_t*>(take(8 * e));
  g.ldb = reinterpret_cast<int64_t*>(take(8 * e));
  g.ldd = reinterpret_cast<int64_t*>(take(8 * e));
  g.c = reinterpret_cast<const void**>(take(8 * e));
  g.ldc = reinterpret_cast<int64_t*>(take(8 * e));
  g.aux = reinterpret_cast<void**>(take(8 * e));
  g.ldaux = reinterpret_cast<int64_t*>(take(8 * e));
  g.row_scale = reinterpret_cast<const float**>(take(8 * e));
  g.row_partial = reinterpret_cast<float**>(take(8 * e));
  g.gather_rows = reinterpret_cast<const int32_t**>(take(8 * e));
  return g;
}

cudaError_t launch_ragged_m_setup(const RaggedMGemmArgs& args, const RaggedMExtras& extras,
                                  const GroupArrays& groups, int sm_count, cudaStream_t stream) {
  // Enough blocks to zero a large padding region quickly; most calls have none.
  const int64_t words = args.m * (args.n / 8);
  const int64_t blocks = std::min<int64_t>(std::max<int64_t>(1, (words + kThreads * 8 - 1) / (kThreads * 8)),
                                           2 * static_cast<int64_t>(sm_count));
  ragged_m_setup_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args, extras, groups);
  return cudaGetLastError();
}

cudaError_t launch_ragged_k_setup(const RaggedKGemmArgs& args, const GroupArrays& groups, int sm_count,
                                  cudaStream_t stream) {
  const int64_t words = args.k * args.n * (args.dw_dtype == DType::kF32 ? 4 : 2) / 16;
  // Blocks per group for zeroing an empty group's gradient: enough to stream it at full
  // bandwidth when there are few groups, few when there are many (most blocks only find
  // their group non-empty and exit).
  const int64_t y_blocks = std::min<int64_t>(args.num_groups, 1024);
  const int64_t x_blocks = std::clamp<int64_t>(std::min<int64_t>(words / (kThreads * 4), 4096 / y_blocks), 1, 128);
  ragged_k_setup_kernel<<<dim3(static_cast<unsigned>(x_blocks), static_cast<unsigned>(y_blocks)), kThreads, 0,
                          stream>>>(args, groups);
  return cudaGetLastError();
}

}  // namespace cute_moe::detail

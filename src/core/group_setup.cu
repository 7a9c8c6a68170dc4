// Setup kernels of the grouped launches: per-group pointers, strides and problem shapes
// from the device-resident offsets, plus the zeros the GEMM does not write (ragged M).
//
// Block 0 fills the arrays (one thread per group, striding over groups) and checks the
// offsets; in ragged M every block then helps with the zero fill (ragged K launches one
// block). A bad `offs` stops the kernel with a printed message and a trap, so the GEMM
// queued behind it never runs on it.
#include <algorithm>
#include <cstdio>
#include <type_traits>

#include <cub/block/block_scan.cuh>

#include "device_info.h"
#include "group_setup.h"
#include "ragged_k_order.h"

namespace cute_moe::detail {

namespace {

constexpr int kThreads = 256;
constexpr size_t kArrayAlign = 128;

__device__ __forceinline__ void require_valid_gather(int32_t source, int64_t row, int64_t a_rows) {
  if (source < 0 || source >= a_rows) {
    printf("cute_moe act_forward: invalid gather_rows[%lld] = %d; row indices must be in [0, x_rows=%lld)\n",
           static_cast<long long>(row), source, static_cast<long long>(a_rows));
    __trap();
  }
}

__device__ __forceinline__ const char* at(const void* base, int64_t elements, Elem e) {
  return static_cast<const char*>(base) + elements * elem_bytes(e);
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

__global__ void ragged_m_setup_kernel(GemmProblem p, GroupArrays g, float* row_partial) {
  if (blockIdx.x == 0) {
    for (int32_t e = threadIdx.x; e < p.num_groups; e += blockDim.x) {
      const GroupRows r = group_rows(p.offs, e);
      require_valid_rows(r, p.m, e, "ragged_m_gemm");
      ragged_m_problem(r, p.n, p.k, g.problem_shapes + 3 * e);
      // gathered: the GEMM reads A through the group's row indices
      g.a[e] = at(p.a.ptr, p.gather_rows != nullptr ? 0 : r.begin * p.a.ld, p.a.elem);
      if (g.gather_rows != nullptr) g.gather_rows[e] = p.gather_rows + r.begin;
      g.b[e] = at(p.b.ptr, e * p.b_group_stride, p.b.elem);
      g.d[e] = const_cast<char*>(at(p.d.ptr, r.begin * p.d.ld, p.d.elem));
      if (g.bias != nullptr) g.bias[e] = at(p.bias, e * p.bias_group_stride, Elem::kBF16);
      g.lda[e] = p.a.ld;
      g.ldb[e] = p.b.ld;
      g.ldd[e] = p.d.ld;
      if (g.c != nullptr) {
        g.c[e] = at(p.c.ptr, r.begin * p.c.ld, p.c.elem);
        g.ldc[e] = p.c.ld;
      }
      if (g.row_scale != nullptr) g.row_scale[e] = p.row_scale + r.begin;
      if (g.row_partial != nullptr) g.row_partial[e] = row_partial + r.begin;
      if (g.a_scales != nullptr) g.a_scales[e] = p.a_scales.ptr + r.begin * p.a_scales.stride_mn;
      if (g.b_scales != nullptr) g.b_scales[e] = p.b_scales.ptr + e * p.b_scales.stride_group;
    }
  }
  // Padding rows [offs[E-1], m) belong to no group: the GEMM skips them, we zero them.
  int64_t used = p.offs[p.num_groups - 1];
  used = used < 0 ? 0 : (used > p.m ? p.m : used);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (p.gather_rows != nullptr) {
    for (int64_t row = thread; row < used; row += threads) require_valid_gather(p.gather_rows[row], row, p.a_rows);
  }
  const int64_t d_row = elem_bytes(p.d.elem);
  zero_rows(const_cast<char*>(at(p.d.ptr, used * p.d.ld, p.d.elem)), p.m - used, p.n * d_row, p.d.ld * d_row, thread,
            threads);
  const Operand auxes[] = {p.aux, p.aux2};
  for (const Operand& aux : auxes) {
    if (!aux.present()) continue;
    const int64_t aux_row = elem_bytes(aux.elem);
    zero_rows(const_cast<char*>(at(aux.ptr, used * aux.ld, aux.elem)), p.m - used, p.aux_cols * aux_row,
              aux.ld * aux_row, thread, threads);
  }
}

// The walking order of the groups (ragged_k_order.h), after the problem shapes: ranked by
// rows through shared memory (each thread counts the groups ahead of its own), or the ids'
// own above kMaxOrderedGroups.
__device__ void write_ragged_k_order(const GemmProblem& p, int32_t* order) {
  __shared__ int32_t rows[kMaxOrderedGroups];
  const int32_t e_count = p.num_groups;
  const bool ranked = e_count <= kMaxOrderedGroups;
  if (ranked) {
    for (int32_t e = threadIdx.x; e < e_count; e += blockDim.x) {
      rows[e] = static_cast<int32_t>(group_rows(p.offs, e).count());
    }
  }
  __syncthreads();
  for (int32_t e = threadIdx.x; e < e_count; e += blockDim.x) {
    order[ranked ? ragged_k_rank(rows, e_count, e) : e] = e;
  }
  if (threadIdx.x == 0) {
    order[e_count] = e_count;
    order[e_count + 1] = static_cast<int32_t>(p.k);
    order[e_count + 2] = static_cast<int32_t>(p.n);
    order[e_count + 3] = 0;  // the ticket counter
  }
}

// FP8 ragged K: group e reduces over whole 128-row blocks of the transposed operands
// (gemm_problem.h), its first after those of the groups before it: a prefix sum over the
// groups' block counts, each thread taking a run of consecutive groups.
__device__ void write_row_block_starts(const GemmProblem& p, const GroupArrays& g) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int32_t per_thread = (p.num_groups + kThreads - 1) / kThreads;
  const int32_t first = static_cast<int32_t>(threadIdx.x) * per_thread;
  const int32_t last = min(first + per_thread, p.num_groups);
  int64_t mine = 0;
  for (int32_t e = first; e < last; ++e) mine += row_blocks(group_rows(p.offs, e));
  int64_t block = 0;
  Scan(scan).ExclusiveSum(mine, block);
  for (int32_t e = first; e < last; ++e) {
    g.a[e] = at(p.a.ptr, block * kRowBlock, p.a.elem);
    g.b[e] = at(p.b.ptr, block * kRowBlock, p.b.elem);
    g.a_scales[e] = p.a_scales.ptr + block * p.a_scales.stride_k;
    g.b_scales[e] = p.b_scales.ptr + block * p.b_scales.stride_k;
    block += row_blocks(group_rows(p.offs, e));
  }
}

// One block: the GEMM writes every group's gradient, an empty group's as zeros (its tiles
// run with no k-blocks, ragged_k_variants.cuh).
__global__ void ragged_k_setup_kernel(GemmProblem p, GroupArrays g) {
  // Before the offsets are checked: the ranks are a permutation whatever the rows hold,
  // so the writes stay in bounds, and a bad offs traps just below (the pointers written
  // from it are then never read).
  write_ragged_k_order(p, g.problem_shapes + 3 * p.num_groups);
  const bool blocked = has_row_blocks(p);
  if (blocked) write_row_block_starts(p, g);
  for (int32_t e = threadIdx.x; e < p.num_groups; e += blockDim.x) {
    const GroupRows r = group_rows(p.offs, e);
    require_valid_rows(r, p.m, e, blocked ? "fp8_ragged_k_gemm" : "ragged_k_gemm");
    ragged_k_problem(r, p.n, p.k, g.problem_shapes + 3 * e, blocked ? kRowBlock : 1);
    if (!blocked) {
      g.a[e] = at(p.a.ptr, r.begin * p.a.ld, p.a.elem);
      g.b[e] = at(p.b.ptr, r.begin * p.b.ld, p.b.elem);
    }
    g.d[e] = const_cast<char*>(at(p.d.ptr, e * p.k * p.n, p.d.elem));
    g.lda[e] = p.a.ld;
    g.ldb[e] = p.b.ld;
    g.ldd[e] = p.d.ld;
  }
}

}  // namespace

namespace {

// Lays out from `base` the arrays `p` uses, in order, each 128-byte aligned, and returns
// the bytes they take; with a null base it only counts. One list, so size and layout
// cannot disagree; the arrays of absent operands stay null (the kernels read a null array
// as "absent": no bias, a scale of 1, ...).
size_t lay_out_group_arrays(char* base, const GemmProblem& p, GroupArrays* g) {
  const size_t e = static_cast<size_t>(p.num_groups);
  size_t used = 0;
  auto take = [&](auto& field, size_t count, bool wanted = true) {
    using Pointer = std::remove_reference_t<decltype(field)>;
    field = base != nullptr && wanted ? reinterpret_cast<Pointer>(base + used) : nullptr;
    if (wanted) used += align_up(sizeof(*field) * count, kArrayAlign);
  };
  g->num_groups = p.num_groups;
  // ragged K: the groups' walking order follows the shapes (ragged_k_order.h)
  take(g->problem_shapes, 3 * e + (is_ragged_m(p) ? 0 : static_cast<size_t>(ragged_k_order_words(p.num_groups))));
  for (auto* inputs : {&g->a, &g->b}) take(*inputs, e);
  take(g->d, e);
  for (auto* ld : {&g->lda, &g->ldb, &g->ldd}) take(*ld, e);
  take(g->bias, e, p.bias != nullptr);
  take(g->c, e, p.c.present());
  take(g->ldc, e, p.c.present());
  take(g->row_scale, e, p.row_scale != nullptr);
  take(g->row_partial, e, p.row_scale_grad);
  take(g->gather_rows, e, p.gather_rows != nullptr);
  take(g->a_scales, e, p.a_scales.ptr != nullptr);
  take(g->b_scales, e, p.b_scales.ptr != nullptr);
  return used;
}

}  // namespace

size_t group_arrays_bytes(const GemmProblem& p) {
  GroupArrays g;
  return lay_out_group_arrays(nullptr, p, &g);
}

GroupArrays carve_group_arrays(void* base, const GemmProblem& p) {
  GroupArrays g;
  lay_out_group_arrays(static_cast<char*>(base), p, &g);
  g.group_scale = p.group_scale;
  g.row_partial_stride = p.m;
  return g;
}

cudaError_t launch_group_setup(const GemmProblem& p, const GroupArrays& groups, float* row_partial, int sm_count,
                               cudaStream_t stream) {
  if (is_ragged_m(p)) {
    // Enough blocks to zero a large padding region quickly; most calls have none.
    const int64_t words = p.m * (p.n / 8);
    const int64_t blocks = std::min<int64_t>(std::max<int64_t>(1, (words + kThreads * 8 - 1) / (kThreads * 8)),
                                             2 * static_cast<int64_t>(sm_count));
    ragged_m_setup_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, groups, row_partial);
    return cudaGetLastError();
  }
  ragged_k_setup_kernel<<<1, kThreads, 0, stream>>>(p, groups);
  return cudaGetLastError();
}

}  // namespace cute_moe::detail

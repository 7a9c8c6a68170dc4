// Internal interface between the host API (grouped_gemm.cpp) and the kernel
// instantiations (sm90/kernel_instance.cuh; one generated .cu per row of the dispatch
// table, which codegen/generate.py derives from codegen/kernel_space.py).
//
// The host API builds the per-group arrays on the device (group_setup.cu), picks a row
// of the table and calls its launch function; nothing here includes CUTLASS, so the
// host side compiles quickly and the C++ tests can link it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "activations.h"
#include "cute_moe/status.h"
#include "device_info.h"
#include "kernel_types.h"

namespace cute_moe::detail {

// Per-group arguments of one ptr-array launch; every pointer is device memory inside the
// caller's workspace. Entry e describes group e. `problem_shapes` holds (M, N, K) int32
// triples, the leading dimensions are in elements.
struct GroupArrays {
  int32_t num_groups = 0;
  int32_t* problem_shapes = nullptr;
  const void** a = nullptr;
  const void** b = nullptr;
  void** d = nullptr;
  const void** bias = nullptr;  // null: no bias
  int64_t* lda = nullptr;
  int64_t* ldb = nullptr;
  int64_t* ldd = nullptr;
  // Fused backward only: the source operand C (the forward's pre).
  const void** c = nullptr;
  int64_t* ldc = nullptr;
  // Scales of ragged M (null: 1): one per group on the GEMM result, and one per row (the
  // router probability) on the biased result; per group, a pointer to its first row's.
  const float* group_scale = nullptr;
  const float** row_scale = nullptr;
  // GLU backward with a row scale: per group, where its rows' row-scale-gradient partials
  // go (one per row and tile column, tile columns row_partial_stride floats apart).
  float** row_partial = nullptr;
  int64_t row_partial_stride = 0;
  // Gathered A (ActFwdGather_*): per group, a pointer to its first row's index into x (a
  // then points at x itself).
  const int32_t** gather_rows = nullptr;
  // FP8 operands: per group, where its block scales of A (its first row's) and B start.
  const float** a_scales = nullptr;
  const float** b_scales = nullptr;
};

// The strides of an FP8 GEMM's block scales within a group (gemm_problem.h, BlockScales),
// the same for every group: A's (row, k-block), B's (n-block, k-block), in floats.
struct BlockScaleStrides {
  int64_t a_mn = 0;
  int64_t a_k = 0;
  int64_t b_mn = 0;
  int64_t b_k = 0;
};

// What the host knows about the whole operands of a problem with TMA-loaded operands
// (sm90/fixed_tma_mainloop.cuh loads through two fixed descriptors made from these instead
// of rewriting per-group descriptors). Ragged M: every group's A rows are rows of one
// (a_rows, k) matrix, every group's B one matrix of a stack, b_batch elements apart.
// Ragged K: A = x (a_rows, k) and B = dy (a_rows, n), each group a range of their rows.
struct WholeOperands {
  const void* a = nullptr;  // rows lda elements apart
  int64_t a_rows = 0;
  int64_t lda = 0;
  const void* b = nullptr;  // leading dimension ldb
  int64_t ldb = 0;
  int64_t b_batch = 0;      // ragged M only
  // Fused gated forward over a k-contiguous weight: the distances in elements between a
  // (gate, linear) pair's members and between consecutive features. Interleaved
  // (ldb, 2 ldb); [gate | linear] halves (n/2 ldb, ldb); the halves as two tensors
  // (linear - gate, ldb).
  int64_t b_pair_stride = 0;
  int64_t b_feature_stride = 0;
  // Ragged M, B's k rows in two tensors (the input gradient through torchtitan's w1, w3):
  // k < b_k_split from b, the rest from b_hi (k - b_k_split), both with b's strides.
  // 0: B whole in b. A multiple of the tile's k (host-checked).
  const void* b_hi = nullptr;
  int64_t b_k_split = 0;
  int32_t groups = 0;
  int64_t n = 0;
  int64_t k = 0;
  const int32_t* offs = nullptr;  // device: cumulative end rows per group
};

// An output that the kernel's epilogue writes through a TMA descriptor made once over the
// whole of it (sm90/fixed_tma_store.cuh) rather than through per-group pointers: ragged M,
// the groups' rows of one (a_rows, cols) matrix; ragged K, one (rows, cols) block per group.
struct OutputMatrix {
  void* ptr = nullptr;       // null: absent
  int64_t ld = 0;            // elements between rows
  int64_t cols = 0;
  int64_t rows = 0;          // ragged K: of each group's block
  int64_t batch_stride = 0;  // ragged K: elements between the groups' blocks
  int32_t batches = 0;       // ragged K: the groups
};

// An e4m3 copy of an output by 1 x 128 blocks along its rows, with one fp32 scale per block,
// written by the epilogue that computes the output (sm90/fp8_rows_epilogue.cuh).
struct Fp8RowsOutput {
  void* q = nullptr;        // null: absent; e4m3, the output's rows and columns
  int64_t ld_q = 0;         // bytes between rows
  float* scale = nullptr;   // (rows, ceil(columns / 128))
  int64_t ld_scale = 0;     // floats between rows
};

struct LaunchContext {
  int device = 0;
  int sm_count = 0;
  void* workspace = nullptr;  // CUTLASS's own workspace (tensor maps)
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  bool raster_along_n = false;  // tile order of the persistent scheduler
  int swizzle = 1;              // 1, 2, 4 or 8
  bool dynamic_schedule = false; // variants with a dynamic scheduler: use it (else its static order)
  int schedule_lookahead = 2;   // dynamic: tiles a CTA may take before it starts the one before
  ActParams act;                // activation epilogues only
  bool swap_pairs = false;      // act forward: B's pairs load as (linear, gate); the epilogue swaps them
  WholeOperands whole;          // variants whose operands TMA loads (not the gathered A)
  OutputMatrix d;               // the GEMM's output (D; act forward: pre)
  OutputMatrix aux;             // act forward: h; act backward: p * h
  OutputMatrix aux2;            // act backward, dpre in halves: the dlinear half
  Fp8RowsOutput d_fp8;          // FP8 act backward: dpre's 1 x 128 copy (the up dgrad's operand)
  float* col_partial = nullptr; // act backward: dpre's column-sum partials (sm90/tile_column_sums.cuh),
  int64_t col_partial_ld = 0;   //   rows col_partial_ld floats apart; null: none
  BlockScaleStrides scales;     // FP8 variants only
  uint32_t d_smem_offset = 0;   // set by GroupedGemmTypes::arguments: the collective epilogue's D buffer,
                                //   in bytes from the kernel's shared memory (Sm90StoreD stages D there)
};

// Defined per arch (sm90/kernel_instance.cuh) and instantiated by the generated units.
template <Arch AR, KernelVariant V, int TM, int TN, int TK, int CM, int CN, Schedule S, Act A>
struct KernelInstance {
  static Result launch(const GroupArrays& groups, const LaunchContext& ctx);
  static size_t workspace_size(int32_t num_groups, int sm_count);
};

struct KernelEntry {
  TileConfig config;
  std::string name;  // tile_config_name(config), e.g. "128x256x64_2x1_coop"
  Result (*launch)(const GroupArrays&, const LaunchContext&);
  size_t (*workspace_size)(int32_t num_groups, int sm_count);
};

// Every row of the dispatch table (generated kernel_table.inc), in table order.
const std::vector<KernelEntry>& kernel_registry();

// The kernel that runs a call of registry[index]'s variant and tile without a clamp limit:
// its limit-free twin (the same variant, tile, cluster, schedule and arch; the clamps compiled
// out, kernel_space.py's LIMIT_FREE) where one is compiled, else index itself.
int limit_free_kernel(const std::vector<KernelEntry>& registry, int index);

// The compiled arch whose kernels run on this device, or kNotSupported saying in one
// sentence which devices are supported (the first registry row compiled for the device's
// compute capability decides).
Result kernel_arch_for(const DeviceInfo& device, Arch* arch);

}  // namespace cute_moe::detail

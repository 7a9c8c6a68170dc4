// Public C++ API of the cute-moe grouped GEMMs (no PyTorch).
//
// Two kernel families cover the GEMMs of an MoE expert layer in training:
//   * ragged M (forward and input gradient): rows of x are sorted by group and each
//     group multiplies its own weight matrix;
//   * ragged K (weight gradient): each group reduces over its own rows.
// Group boundaries `offs` live in device memory and are never read on the host, so
// every call is free of host synchronisation and can be captured in a CUDA graph and
// replayed with different routing.
//
// Conventions:
//   offs[e] is the cumulative END row of group e; group e owns rows [offs[e-1], offs[e])
//   with offs[-1] := 0. Groups may be empty. Rows at or past offs[E-1] are padding.
//   bf16 inputs, fp32 accumulation, each output rounded once.
//
// Every call validates its arguments on the host (shapes, strides, 16-byte alignment,
// group count) and returns a Result whose message names the argument and its value.
// offs itself is checked on the device (non-decreasing, within [0, m]); a violation
// stops the kernel with a device-side trap and a printed message, never a wrong or
// out-of-bounds write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cute_moe/status.h"

namespace cute_moe {

enum class DType { kBF16, kF32 };

const char* dtype_name(DType t);

// Largest group count a call accepts.
constexpr int32_t kMaxGroups = 1 << 16;

// y[r, :] = row_scale[r] * (group_scale[e] * (x[r, :] @ W_e) + bias[e, :]) for every row
// r of group e; each of row_scale, group_scale and bias is optional (1, 1, 0). The group
// scale is a per-expert alpha, the row scale the router probability of a routed
// row (the down projection of an expert FFN). Computed in fp32, rounded once.
//
// W_e is the (k x n) matrix at w + e * w_stride_group whose element (i, j) sits at
// i * w_stride_k + j * w_stride_n: exactly one of w_stride_k, w_stride_n must be 1.
// (E, k, n) row-major weights have w_stride_n == 1; a (E, n, k) tensor used as
// x @ W[e].T has w_stride_k == 1. The same call computes the input gradient
// dx = dy @ W_e^T by passing W's strides swapped.
// Rows r >= offs[E-1] of y are written with zeros.
struct RaggedMGemmArgs {
  int64_t m = 0;  // rows of x and y (an upper bound of offs[E-1])
  int64_t n = 0;  // columns of y
  int64_t k = 0;  // columns of x
  int32_t num_groups = 0;
  const int32_t* offs = nullptr;  // device, num_groups cumulative end offsets

  const void* x = nullptr;  // bf16 (m, k), row stride ldx, unit column stride
  int64_t ldx = 0;
  const void* w = nullptr;  // bf16, see above
  int64_t w_stride_group = 0, w_stride_k = 0, w_stride_n = 0;
  const void* bias = nullptr;  // optional bf16 (num_groups, n), row stride bias_stride_group
  int64_t bias_stride_group = 0;
  const float* group_scale = nullptr;  // optional fp32 (num_groups,)
  const float* row_scale = nullptr;    // optional fp32 (m,)
  void* y = nullptr;  // bf16 (m, n), row stride ldy
  int64_t ldy = 0;
  // Optional row gather, fused into the load of x (an MoE dispatch's permutation: x holds
  // the tokens, gather_rows the token of each routed row). Row r of the GEMM reads row
  // gather_rows[r] of x, which then has x_rows rows. gather_rows: device int32, one per
  // row below offs[E-1], each in [0, x_rows) (checked on the device, like offs).
  // act_forward with a weight of unit stride along n only; null: row r reads x row r.
  const int32_t* gather_rows = nullptr;
  int64_t x_rows = 0;
  // Optional, ragged_m_gemm only: W's k rows in two tensors with the same strides (the input
  // gradient dx = dpre @ [W_gate; W_linear] through an up projection kept as two
  // parameters, torchtitan's w1 and w3). Rows i < k_split of W_e at w, rows i >= k_split at
  // w_hi + e * w_stride_group + (i - k_split) * w_stride_k. k_split: a positive multiple of
  // kSplitKMultiple below k; 0 (and w_hi null): W whole at w.
  const void* w_hi = nullptr;
  int64_t k_split = 0;
};

// k_split's granularity: a k-tile of every ragged-M kernel lies within one of the tensors.
constexpr int64_t kSplitKMultiple = 128;

// dw[e] = x[rows_e]^T @ dy[rows_e] for every group e, a (k x n) matrix reduced over the
// group's rows (the ragged dimension). Empty groups give exact zeros.
// Optionally dbias[e, :] = sum over rows_e of dy[r, :], accumulated in fp32 (the bias
// gradient), deterministic.
struct RaggedKGemmArgs {
  int64_t m = 0;  // rows of x and dy
  int64_t k = 0;  // columns of x = rows of each dw[e]
  int64_t n = 0;  // columns of dy = columns of each dw[e]
  int32_t num_groups = 0;
  const int32_t* offs = nullptr;  // device, num_groups cumulative end offsets

  const void* x = nullptr;  // bf16 (m, k), row stride ldx
  int64_t ldx = 0;
  const void* dy = nullptr;  // bf16 (m, n), row stride lddy
  int64_t lddy = 0;
  void* dw = nullptr;  // (num_groups, k, n) contiguous, dtype dw_dtype
  DType dw_dtype = DType::kBF16;
  float* dbias = nullptr;  // optional fp32 (num_groups, n) contiguous
};

// out[e, :] = sum over the rows r of group e of row_scale[r] * src[r, :] (row_scale
// optional, 1), accumulated in fp32, with a fixed summation order (the same input gives
// the same bits); optionally over gathered rows, and with each row's dot product with its
// group's bias (below). This is the bias gradient of a grouped GEMM (row_scale: of one whose
// output rows were scaled by it); ragged_k_gemm computes it alongside dw when given dbias.
struct GroupColumnSumArgs {
  int64_t m = 0;  // rows of src
  int64_t n = 0;  // columns of src and out
  int32_t num_groups = 0;
  const int32_t* offs = nullptr;  // device, num_groups cumulative end offsets
  const void* src = nullptr;      // bf16 (m, n), row stride ld
  int64_t ld = 0;
  const float* row_scale = nullptr;  // optional fp32 (m,)
  float* out = nullptr;  // fp32 (num_groups, n) contiguous
  // Optional gather: row r of the summed matrix is src[index[r]] (index: device int32
  // (m,), each in [0, src_rows); src then has src_rows rows), and the gathered rows are
  // also written to `gathered` (bf16 (m, n), row stride ld_gathered). In an MoE layer:
  // the output gradient of the combine taken back to the expert-sorted rows, with its
  // bias gradient, in one pass over it.
  const int32_t* index = nullptr;
  int64_t src_rows = 0;
  void* gathered = nullptr;
  int64_t ld_gathered = 0;
  // Optional, with row_dot: row_dot[r] = (row r) . bias[group(r), :] in fp32, 0 for rows
  // past offs[num_groups - 1]; bias bf16 (num_groups, n), row stride ld_bias. The bias
  // term of the row-scale gradient of y = row_scale * (h @ W + bias), from the same pass.
  const void* bias = nullptr;
  int64_t ld_bias = 0;
  float* row_dot = nullptr;  // fp32 (m,)
};

// Per-call choices that do not change the result. The core reads no environment
// variables; options_from_environment() makes these from them (the torch ops do, per call).
struct GemmOptions {
  // Name of a tile configuration (see list_tile_configs), or nullptr to let the
  // heuristic choose. Environment: CUTE_MOE_CONFIG.
  const char* config = nullptr;
  // Multiprocessors the persistent kernels may use; 0 means all of the device's.
  int sm_count = 0;
  // Order in which the persistent CTAs walk a group's output tiles: 'm' (down a column
  // of tiles first), 'n' (along a row first) or 0 for the heuristic; and the size of the
  // swizzled blocks of tiles (1, 2, 4 or 8; 0 for the heuristic). Environment:
  // CUTE_MOE_RASTER, CUTE_MOE_SWIZZLE.
  char raster = 0;
  int swizzle = 0;
  // How the weight-gradient (ragged-K) kernels hand out their tiles, walking the groups
  // deepest first: 'd' dynamically (each CTA takes the next tile from an atomic counter
  // when it is free), 's' statically (cluster c takes tiles c, 2 * clusters - 1 - c,
  // 2 * clusters + c, ...: a snake), or 0 for the heuristic's choice (dynamic over deep
  // groups, >= 2048 rows per group on average; with a forced config, static). The
  // ragged-M kernels are static. Environment: CUTE_MOE_SCHEDULE.
  char schedule = 0;
  // Under the dynamic schedule, how many tiles past the one it has started a CTA may
  // already hold (1 to 8; 0 for the default, 2). Environment: CUTE_MOE_SCHEDULE_LOOKAHEAD.
  int lookahead = 0;
  // Print every choice to stderr. Environment: CUTE_MOE_LOG_CONFIG=1.
  bool log = false;
};

// The options the environment variables above ask for (unset ones: the defaults). `config`
// points into the environment: valid until it changes.
GemmOptions options_from_environment();

// Returns `bytes` of 128-byte aligned device memory that stays valid until the stream has
// passed the call, or nullptr. The allocator forms of the calls below ask for exactly the
// planned workspace, so they plan once (workspace_size + the call plan twice).
using WorkspaceAllocator = std::function<void*(size_t bytes)>;

// Argument checks alone (also run by the calls below).
Result validate(const RaggedMGemmArgs& args);
Result validate(const RaggedKGemmArgs& args);
Result validate(const GroupColumnSumArgs& args);

// Device workspace the calls need, in bytes (an upper bound over all configurations,
// so it depends only on the group count, the shapes and the device).
Result workspace_size(const RaggedMGemmArgs& args, size_t* bytes, const GemmOptions& opts = {});
Result workspace_size(const RaggedKGemmArgs& args, size_t* bytes, const GemmOptions& opts = {});
Result workspace_size(const GroupColumnSumArgs& args, size_t* bytes);

// Enqueue the computation on `stream`. `workspace` must hold workspace_size() bytes,
// 128-byte aligned (it holds TMA descriptors); it may be reused as soon as the stream has passed this call.
Result ragged_m_gemm(const RaggedMGemmArgs& args, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream, const GemmOptions& opts = {});
Result ragged_k_gemm(const RaggedKGemmArgs& args, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream, const GemmOptions& opts = {});
Result ragged_m_gemm(const RaggedMGemmArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                     const GemmOptions& opts = {});
Result ragged_k_gemm(const RaggedKGemmArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                     const GemmOptions& opts = {});
Result group_column_sum(const GroupColumnSumArgs& args, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream);

// Names of the tile configurations compiled into this build for each family (the bf16
// ragged-M GEMMs, the bf16 ragged-K ones, the FP8 ragged-M and ragged-K ones of fp8_gemm.h).
enum class GemmFamily { kRaggedM, kRaggedK, kFp8RaggedM, kFp8RaggedK };
std::vector<std::string> list_tile_configs(GemmFamily family);

// Every compiled kernel (the rows codegen/kernel_space.py declares): the call it serves
// ("ragged_m", "ragged_m_bcol", "ragged_k_bf16", "ragged_k_f32", "act_forward",
// "act_forward_bcol", "act_forward_gather", "act_backward", "act_backward_bcol",
// "act_backward_halves", "fp8_ragged_m", "fp8_act_forward", "fp8_act_backward",
// "fp8_ragged_k"), the
// activation of its epilogue ("" for the plain GEMMs, else a name of activation.h:
// "swiglu_oai", ..., "none") and its tile configuration's name (what GemmOptions::config /
// CUTE_MOE_CONFIG take).
struct KernelInfo {
  std::string call;
  std::string activation;
  std::string config;
};
std::vector<KernelInfo> list_kernels();

// The configuration the heuristic picks for these arguments (what ragged_*_gemm runs
// when GemmOptions::config is null and CUTE_MOE_CONFIG is unset).
Result chosen_tile_config(const RaggedMGemmArgs& args, std::string* name, const GemmOptions& opts = {});
Result chosen_tile_config(const RaggedKGemmArgs& args, std::string* name, const GemmOptions& opts = {});

}  // namespace cute_moe

// One grouped GEMM as the kernels see it, named by GEMM role. Every public *Args
// (grouped_gemm.h, fused_activation.h) lowers to it (lower() in gemm_problem.cpp); the
// plan, the workspace layout and the setup kernels read only this.
//
//   for every group g:  D[g] = epilogue(A[g] @ B[g], C[g], bias[g], scales)  (+ aux[g])
//
// Ragged M (forward, input gradient): A[g] = rows offs[g-1]..offs[g] of an (m, k) matrix
// (or those rows gathered through gather_rows), B[g] the group's (k, n) weight, D[g] the
// same rows of an (m, n) output. Ragged K (weight gradient): A[g]^T and B[g] are those rows
// of (m, k) and (m, n) matrices, D[g] the group's (k, n) block of a (groups, k, n) output.
#pragma once

#include <cstdint>

#include "activations.h"  // ActParams
#include "host_device.h"
#include "cute_moe/fp8_gemm.h"
#include "cute_moe/fused_activation.h"
#include "heuristics.h"  // GroupedProblem
#include "kernel_registry.h"  // Fp8RowsOutput
#include "kernel_types.h"

namespace cute_moe::detail {

// Element of an operand as the kernel reads it. kBF16Pair: a (gate, linear) pair of bf16
// read as one 32-bit word (the fused backward's view of a gated pre / dpre). kE4M3: FP8.
enum class Elem { kBF16, kF32, kBF16Pair, kE4M3 };
constexpr int64_t elem_bytes(Elem e) { return e == Elem::kE4M3 ? 1 : e == Elem::kBF16 ? 2 : 4; }

// The fp32 block scales of an FP8 operand (docs/fp8.md): a (groups,) mn-blocks x k-blocks
// array, block (g, i, j) at ptr + g * stride_group + i * stride_mn + j * stride_k. Ragged M's
// A has one per row (i is the row, no group stride: a group's rows start at its first row's).
struct BlockScales {
  const float* ptr = nullptr;  // null: an operand without scales (bf16)
  int64_t stride_group = 0;
  int64_t stride_mn = 0;
  int64_t stride_k = 0;
};

// A matrix operand: rows ld elements apart (ld in units of elem). Null ptr: absent.
struct Operand {
  const void* ptr = nullptr;
  int64_t ld = 0;
  Elem elem = Elem::kBF16;
  CUTE_MOE_HOST_DEVICE bool present() const { return ptr != nullptr; }
};

struct GemmProblem {
  KernelVariant variant = KernelVariant::RaggedM_BRow;
  Act act = Act::Unfused;
  ActParams act_params;  // activation variants only
  int64_t m = 0;         // rows (ragged M: of A and D; ragged K: reduced over)
  int64_t n = 0;         // columns of D
  int64_t k = 0;         // ragged M: the reduction; ragged K: rows of each D[g]
  int32_t num_groups = 0;
  const int32_t* offs = nullptr;  // device, cumulative end rows

  Operand a;                             // ragged M: x (m, k); ragged K: x (m, k), read as x^T
  const int32_t* gather_rows = nullptr;  // ragged M: A row r is row gather_rows[r] of a
  int64_t a_rows = 0;                    //   (which then has a_rows rows)
  BlockScales a_scales;                  // FP8: A's 1 x 128 block scales, (m, ceil(k / 128));
                                         //   ragged K: (blocks, k) of a_t (below)
  Operand b;                             // ragged M: W[g] at b.ptr + g * b_group_stride;
  int64_t b_group_stride = 0;            //   ragged K: dy (m, n)
  const void* b_hi = nullptr;            // ragged M: W's k rows from b_k_split on, in a second
  int64_t b_k_split = 0;                 //   tensor with b's strides (0: none)
  bool b_k_major = false;                // ragged M: W[g]'s unit stride is along k (BCol)
  bool b_halves = false;                 // act forward: W's gate / linear columns as [gate | linear]
  const void* b_linear = nullptr;        //   with the linear half here (null: after the gate half in b)
  bool b_pairs_swapped = false;          //   b holds the linear half and b_linear the gate half (the
                                         //   two tensors the other way round): pairs load as (linear, gate)
  BlockScales b_scales;                  // FP8: B's 128 x 128 block scales, (groups, ceil(n / 128),
                                         //   ceil(k / 128))
  Operand c;                             // epilogue source (act backward: pre)
  Operand d;                             // output
  Operand aux;                           // second output (act forward: h; backward: p * h)
  int64_t aux_cols = 0;
  Operand aux2;                          // third output, aux_cols wide (act backward with dpre
                                         //   in halves: D is dgate, aux2 dlinear)
  Fp8RowsOutput d_fp8;                   // FP8 act backward: D's 1 x 128 e4m3 copy, or none
  const void* bias = nullptr;  // bf16 row added per group: bias + g * bias_group_stride
  int64_t bias_group_stride = 0;
  const float* group_scale = nullptr;  // one per group (null: 1)
  const float* row_scale = nullptr;    // one per row of D (null: 1)
  bool row_scale_grad = false;         // act backward: per-row, per-tile-column partial sums
  float* bias_grad = nullptr;          // act backward: dpre's column sums per group (fp32)
  // FP8 ragged K (Fp8RaggedK): A and B are the transposed, group-blocked operands a_t (k, 128
  // blocks; 128 x 1 scales) and b_t (n, 128 blocks; 128 x 128 scales), blocks =
  // fp8_group_row_blocks(m, groups); group g reduces over its ceil(rows_g / 128) whole blocks,
  // after those of the groups before it.
};

// Whether a ragged-K problem reads the 128 x 1 blocked FP8 operands (group = whole blocks).
constexpr bool has_row_blocks(const GemmProblem& p) { return p.variant == KernelVariant::Fp8RaggedK; }

constexpr bool is_ragged_m(const GemmProblem& p) { return is_ragged_m(p.variant); }

// The public calls' arguments (validated) as problems.
GemmProblem lower(const RaggedMGemmArgs& a);
GemmProblem lower(const RaggedKGemmArgs& a);
GemmProblem lower(const ActForwardArgs& a);
GemmProblem lower(const ActBackwardArgs& a);
GemmProblem lower(const Fp8RaggedMGemmArgs& a);
GemmProblem lower(const Fp8ActForwardArgs& a);
GemmProblem lower(const Fp8ActBackwardArgs& a);
GemmProblem lower(const Fp8RaggedKGemmArgs& a);

// What the heuristic sees of a problem.
GroupedProblem heuristic_view(const GemmProblem& p);

}  // namespace cute_moe::detail

// Public C++ API of an MoE layer's routing on the device (no PyTorch): the router's top-k
// choice per token, and the sort of the routed rows by expert that permute.h's gathers
// take as their metadata.
//
//   top_k:          values[t, j], indices[t, j] = the j-th largest of row t of the logits
//                   (descending; equal values: the lower column first; NaN above every
//                   number), the order of a stable descending sort of the row.
//   sort_by_expert: the M = T*k routed rows (token t's choice j is entry i = t*k + j)
//                   sorted by expert with a stable counting sort: rows of expert e keep
//                   token order. Expert ids outside [0, num_experts) are padding rows:
//                   sorted after every expert, in entry order, past offs[num_experts - 1].
//
// Both are deterministic (integer counts; no floating-point sums), take no host
// synchronisation and have fixed launch shapes for fixed sizes: CUDA-graph safe. Every
// call validates its arguments on the host and returns a Result naming the argument and
// its value. Device arrays are contiguous.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cute_moe/status.h"

namespace cute_moe {

// The widest row top_k serves, and the most choices.
constexpr int64_t kTopKMaxColumns = 512;
constexpr int64_t kTopKMaxChoices = 32;

struct TopKArgs {
  int64_t rows = 0;               // T
  int64_t cols = 0;               // E, 1..kTopKMaxColumns
  int64_t k = 0;                  // 1..min(cols, kTopKMaxChoices)
  const float* logits = nullptr;  // (rows, cols), row stride ld_logits
  int64_t ld_logits = 0;
  float* values = nullptr;        // (rows, k)
  int64_t* indices = nullptr;     // (rows, k)
};

// The most experts sort_by_expert serves (its per-warp counters live in shared memory).
constexpr int64_t kSortMaxExperts = 1024;

struct SortByExpertArgs {
  int64_t rows = 0;         // T
  int64_t k = 0;            // choices per token; M = rows * k < 2^31
  int64_t num_experts = 0;  // E, 1..kSortMaxExperts
  const void* experts = nullptr;  // (rows, k) expert ids, int64 (experts_int32 false) or int32
  bool experts_int32 = false;
  const float* weights = nullptr;  // optional (rows, k): the router weight of each choice
  int32_t* row_token = nullptr;    // (M,): the token of sorted row r
  int32_t* token_rows = nullptr;   // (rows, k): the sorted row of (token t, choice j)
  int32_t* offs = nullptr;         // (E,): end row of each expert (rows with expert <= e)
  float* prob = nullptr;           // (M,), needed with weights: weights in sorted order
  void* workspace = nullptr;       // sort_by_expert_workspace_bytes(rows * k, E) bytes, 4-byte aligned
};

// Bytes of device workspace sort_by_expert needs (counts per expert and slice of entries).
size_t sort_by_expert_workspace_bytes(int64_t entries, int64_t num_experts);

// Argument checks alone (also run by the calls below).
Result validate(const TopKArgs& args);
Result validate(const SortByExpertArgs& args);

// Enqueue the computation on `stream`.
Result top_k(const TopKArgs& args, cudaStream_t stream);
Result sort_by_expert(const SortByExpertArgs& args, cudaStream_t stream);

}  // namespace cute_moe

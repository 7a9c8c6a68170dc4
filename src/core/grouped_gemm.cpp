// The public grouped-GEMM entry points: validate, lower the arguments to a GemmProblem
// (gemm_problem.h), plan (kernel choice and workspace layout), then enqueue the setup
// kernel + GEMM (+ bias-gradient column sums or the row-scale-gradient reduction).
//
// Workspace layout of one call:  [group arrays | CUTLASS workspace | the call's scratch]
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cute_moe/fp8_gemm.h"
#include "cute_moe/fused_activation.h"
#include "device_info.h"
#include "gemm_problem.h"
#include "group_column_sum.h"
#include "group_setup.h"
#include "heuristics.h"
#include "kernel_registry.h"
#include "row_scale_grad.h"

namespace cute_moe {

namespace {

using detail::GroupedProblem;
using detail::KernelEntry;
using detail::KernelVariant;

constexpr size_t kWorkspaceAlign = 128;
// The dynamic tile schedule's lookahead: the default (docs/perf-notes.md, session 10) and the
// most the SM90 kernels allow (their scheduler pipeline's 8 stages).
constexpr int kDefaultLookahead = 2;
constexpr int kMaxLookahead = 8;

size_t align_up(size_t v) { return detail::align_up(v, kWorkspaceAlign); }

using detail::cuda_error;

// Everything a call needs decided on the host before enqueueing.
struct Plan {
  const KernelEntry* kernel = nullptr;
  int device = 0;
  int sm_count = 0;
  size_t arrays_bytes = 0;   // per-group arrays
  size_t cutlass_bytes = 0;  // CUTLASS workspace (upper bound over the variant's kernels)
  size_t scratch_bytes = 0;  // the call's own: column-sum or row-scale-gradient partials
  bool raster_along_n = false;
  int swizzle = 1;
  bool dynamic_schedule = false;  // weight gradients: tiles from the atomic counter
  int lookahead = kDefaultLookahead;
  size_t total() const { return align_up(arrays_bytes) + align_up(cutlass_bytes) + align_up(scratch_bytes); }
  void* cutlass_workspace(void* base) const { return static_cast<char*>(base) + align_up(arrays_bytes); }
  float* scratch(void* base) const {
    return reinterpret_cast<float*>(static_cast<char*>(base) + align_up(arrays_bytes) + align_up(cutlass_bytes));
  }
};

Result make_plan(const detail::GemmProblem& gemm, const GemmOptions& opts, Plan* plan) {
  GroupedProblem problem = detail::heuristic_view(gemm);
  detail::DeviceInfo dev;
  Result r = detail::current_device(&dev);
  if (r.ok()) r = detail::kernel_arch_for(dev, &problem.arch);
  if (!r.ok()) return r;
  plan->device = dev.device;
  plan->sm_count = opts.sm_count > 0 ? std::min(dev.sm_count, opts.sm_count) : dev.sm_count;

  const auto& registry = detail::kernel_registry();
  const char* forced = opts.config;
  int index = -1;
  detail::LaunchChoice choice;  // a forced config without a forced order gets CUTLASS's default order
  if (forced != nullptr && forced[0] != '\0') {
    std::string available;
    for (size_t i = 0; i < registry.size(); ++i) {
      if (!detail::serves(registry[i].config, problem)) continue;
      if (registry[i].name == forced) index = static_cast<int>(i);
      available += (available.empty() ? "" : ", ") + registry[i].name;
    }
    if (index < 0) {
      return Result::error(Status::kInvalidArgument, std::string("tile config '") + forced +
                                                         "' is not compiled for " + detail::variant_what(problem.variant) +
                                                         "; available: " + available);
    }
  } else {
    static const std::vector<detail::TileConfig> configs = [&registry] {  // the registry's, in its order
      std::vector<detail::TileConfig> c;
      c.reserve(registry.size());
      for (const auto& e : registry) c.push_back(e.config);
      return c;
    }();
    choice = detail::choose_launch(problem, configs, plan->sm_count);
    index = choice.index;
    if (index < 0) {
      return Result::error(Status::kNotSupported,
                           std::string("no kernel compiled for ") + detail::variant_what(problem.variant));
    }
  }
  // A call without a clamp limit runs the tile's limit-free twin where one is compiled.
  if (!gemm.act_params.has_limit) index = detail::limit_free_kernel(registry, index);
  plan->kernel = &registry[index];

  // Tile order: the heuristic's unless the options say otherwise.
  const char raster = opts.raster;
  if (raster != 0 && raster != 'm' && raster != 'n') {
    return Result::error(Status::kInvalidArgument,
                         std::string("raster must be 'm' or 'n' (GemmOptions::raster, CUTE_MOE_RASTER), got '") +
                             raster + "'");
  }
  plan->raster_along_n = raster == 0 ? choice.raster_along_n : raster == 'n';
  const int swizzle = opts.swizzle;
  if (swizzle != 0 && swizzle != 1 && swizzle != 2 && swizzle != 4 && swizzle != 8) {
    return Result::error(Status::kInvalidArgument, "swizzle must be 1, 2, 4 or 8 (GemmOptions::swizzle, "
                                                   "CUTE_MOE_SWIZZLE), got " + std::to_string(swizzle));
  }
  plan->swizzle = swizzle == 0 ? (raster == 0 ? choice.swizzle : 1) : swizzle;
  if (opts.schedule != 0 && opts.schedule != 'd' && opts.schedule != 's') {
    return Result::error(Status::kInvalidArgument,
                         std::string("schedule must be 'd' or 's' (GemmOptions::schedule, CUTE_MOE_SCHEDULE), got '") +
                             opts.schedule + "'");
  }
  plan->dynamic_schedule = opts.schedule == 0 ? choice.dynamic_schedule : opts.schedule == 'd';
  if (opts.lookahead < 0 || opts.lookahead > kMaxLookahead) {
    return Result::error(Status::kInvalidArgument, "lookahead must be 1 to " + std::to_string(kMaxLookahead) +
                                                       ", or 0 for the default (GemmOptions::lookahead, "
                                                       "CUTE_MOE_SCHEDULE_LOOKAHEAD), got " + std::to_string(opts.lookahead));
  }
  plan->lookahead = opts.lookahead == 0 ? kDefaultLookahead : opts.lookahead;
  for (const auto& e : registry) {
    if (detail::serves(e.config, problem)) {
      plan->cutlass_bytes = std::max(plan->cutlass_bytes, e.workspace_size(problem.num_groups, plan->sm_count));
    }
  }
  plan->cutlass_bytes = std::max(plan->cutlass_bytes, plan->kernel->workspace_size(problem.num_groups, plan->sm_count));
  plan->arrays_bytes = detail::group_arrays_bytes(gemm);

  if (opts.log) {
    const bool twin = plan->kernel->config.act != problem.act;
    std::fprintf(stderr, "cute_moe: %s m=%lld n=%lld k=%lld groups=%d sms=%d -> %s%s%s%s raster=%c swizzle=%d%s\n",
                 detail::variant_what(problem.variant), static_cast<long long>(problem.m), static_cast<long long>(problem.n),
                 static_cast<long long>(problem.k), problem.num_groups, plan->sm_count, plan->kernel->name.c_str(),
                 forced != nullptr && forced[0] != '\0' ? " (forced)" : "", twin ? " " : "",
                 twin ? detail::act_name(plan->kernel->config.act) : "", plan->raster_along_n ? 'n' : 'm',
                 plan->swizzle, detail::is_ragged_m(problem.variant) ? "" : (plan->dynamic_schedule ? " dynamic" : " static"));
  }
  return Result::success();
}

// Tile columns of the activation backward's row-scale-gradient partials: at most n / (the
// narrowest compiled tile), so the workspace does not depend on the choice.
int64_t row_partial_tiles(int64_t n, int tile_n) { return (n + tile_n - 1) / tile_n; }

int narrowest_tile_n(const GroupedProblem& p) {
  int narrowest = 1 << 30;
  for (const auto& e : detail::kernel_registry()) {
    if (detail::serves(e.config, p)) narrowest = std::min(narrowest, e.config.tile_n);
  }
  return narrowest;
}

// Scratch beyond the GEMM's own: the bias-gradient column sums of ragged K, the
// row-scale-gradient partials of the activation backward.
size_t scratch_bytes(const RaggedKGemmArgs& a, const detail::GemmProblem&) {
  return a.dbias != nullptr ? detail::column_sum_workspace_bytes(a.m, a.n, a.num_groups) : 0;
}
size_t row_partial_bytes(const detail::GemmProblem& p) {
  if (!p.row_scale_grad) return 0;
  const int64_t tiles = row_partial_tiles(p.n, narrowest_tile_n(detail::heuristic_view(p)));
  return static_cast<size_t>(tiles) * static_cast<size_t>(p.m) * sizeof(float);
}
// The activation backward's dpre column-sum partials (sm90/tile_column_sums.cuh), after the
// row-scale-gradient partials: dpre's width (gated: 2n) floats per partial row.
int64_t dpre_width(const detail::GemmProblem& p) { return p.c.elem == detail::Elem::kBF16Pair ? 2 * p.n : p.n; }
size_t col_partial_bytes(const detail::GemmProblem& p) {
  if (p.bias_grad == nullptr) return 0;
  return static_cast<size_t>(detail::tile_column_sum_rows(p.m, p.num_groups)) * static_cast<size_t>(dpre_width(p)) *
         sizeof(float);
}
float* col_partial(const Plan& plan, void* ws, const detail::GemmProblem& p) {
  return p.bias_grad == nullptr ? nullptr : plan.scratch(ws) + align_up(row_partial_bytes(p)) / sizeof(float);
}
size_t act_backward_scratch_bytes(const detail::GemmProblem& p) {
  return align_up(row_partial_bytes(p)) + col_partial_bytes(p);
}
size_t scratch_bytes(const ActBackwardArgs&, const detail::GemmProblem& p) { return act_backward_scratch_bytes(p); }
size_t scratch_bytes(const Fp8ActBackwardArgs&, const detail::GemmProblem& p) { return act_backward_scratch_bytes(p); }
template <typename Args>
size_t scratch_bytes(const Args&, const detail::GemmProblem&) {
  return 0;
}

// Validates, lowers and plans one call.
template <typename Args>
Result plan_call(const Args& args, const GemmOptions& opts, detail::GemmProblem* problem, Plan* plan) {
  Result r = validate(args);
  if (!r.ok()) return r;
  *problem = detail::lower(args);
  r = make_plan(*problem, opts, plan);
  if (r.ok()) plan->scratch_bytes = scratch_bytes(args, *problem);
  return r;
}

template <typename Args>
Result planned_workspace_size(const Args& args, size_t* bytes, const GemmOptions& opts) {
  detail::GemmProblem problem;
  Plan plan;
  Result r = plan_call(args, opts, &problem, &plan);
  if (r.ok()) *bytes = plan.total();
  return r;
}

template <typename Args>
Result planned_config_name(const Args& args, std::string* name, const GemmOptions& opts) {
  detail::GemmProblem problem;
  Plan plan;
  Result r = plan_call(args, opts, &problem, &plan);
  if (r.ok()) *name = plan.kernel->name;
  return r;
}

Result check_workspace(const char* op, const Plan& plan, void* workspace, size_t bytes) {
  if (bytes < plan.total()) {
    return Result::error(Status::kInvalidArgument, std::string(op) + ": workspace too small: need " +
                                                       std::to_string(plan.total()) + " bytes, got " +
                                                       std::to_string(bytes));
  }
  if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlign != 0) {
    return Result::error(Status::kInvalidArgument,
                         std::string(op) + ": workspace must be a 128-byte aligned device pointer");
  }
  return Result::success();
}

// The setup kernel (per-group arrays from offs, zeros the GEMM does not write), then the
// planned kernel. A ragged-K problem without rows has only empty groups: a memset writes
// their zeros and no GEMM runs (it would read no operand).
Result enqueue_gemm(const detail::GemmProblem& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  const detail::GroupArrays groups = detail::carve_group_arrays(workspace, p);
  float* partial = p.row_scale_grad ? plan.scratch(workspace) : nullptr;
  cudaError_t err = detail::launch_group_setup(p, groups, partial, plan.sm_count, stream);
  if (err != cudaSuccess) return cuda_error("grouped GEMM setup kernel", err);
  if (p.m == 0) {
    if (is_ragged_m(p)) return Result::success();
    const size_t elem = static_cast<size_t>(detail::elem_bytes(p.d.elem));
    err = cudaMemset2DAsync(const_cast<void*>(p.d.ptr), static_cast<size_t>(p.d.ld) * elem, 0,
                            static_cast<size_t>(p.n) * elem, static_cast<size_t>(p.num_groups * p.k), stream);
    return err == cudaSuccess ? Result::success() : cuda_error("ragged-K zero fill (no rows)", err);
  }
  detail::LaunchContext ctx;
  ctx.device = plan.device;
  ctx.sm_count = plan.sm_count;
  ctx.workspace = plan.cutlass_workspace(workspace);
  ctx.workspace_bytes = plan.cutlass_bytes;
  ctx.stream = stream;
  ctx.raster_along_n = plan.raster_along_n;
  ctx.swizzle = plan.swizzle;
  ctx.dynamic_schedule = plan.dynamic_schedule;
  ctx.schedule_lookahead = plan.lookahead;
  ctx.act = p.act_params;
  ctx.swap_pairs = p.b_pairs_swapped;
  ctx.scales = {p.a_scales.stride_mn, p.a_scales.stride_k, p.b_scales.stride_mn, p.b_scales.stride_k};
  ctx.d = {const_cast<void*>(p.d.ptr), p.d.ld, p.n};
  if (!is_ragged_m(p)) {  // (groups, k, n): one block per group
    ctx.d.rows = p.k;
    ctx.d.batch_stride = p.k * p.d.ld;
    ctx.d.batches = p.num_groups;
  }
  ctx.aux = {const_cast<void*>(p.aux.ptr), p.aux.ld, p.aux_cols};
  ctx.aux2 = {const_cast<void*>(p.aux2.ptr), p.aux2.ld, p.aux_cols};
  ctx.d_fp8 = p.d_fp8;
  ctx.col_partial = col_partial(plan, workspace, p);
  ctx.col_partial_ld = dpre_width(p);
  ctx.whole.offs = p.offs;  // the epilogues' TMA-stored outputs need it too
  if (p.gather_rows == nullptr) {  // every TMA-loaded variant reads its operands whole
    detail::WholeOperands& w = ctx.whole;
    w.a = p.a.ptr;
    w.a_rows = p.m;
    w.lda = p.a.ld;
    w.b = p.b.ptr;
    w.ldb = p.b.ld;
    w.b_batch = p.b_group_stride;
    w.b_hi = p.b_hi;
    w.b_k_split = p.b_k_split;
    // The paired B's (member, feature) strides in elements: (gate j, linear j) at columns
    // (2j, 2j + 1), or (j, n/2 + j), or column j of two tensors b_linear - b elements apart.
    w.b_pair_stride = p.b.ld;
    w.b_feature_stride = 2 * p.b.ld;
    if (p.b_halves) {
      w.b_pair_stride = p.b_linear != nullptr
                            ? (static_cast<const char*>(p.b_linear) - static_cast<const char*>(p.b.ptr)) / 2
                            : p.n / 2 * p.b.ld;
      w.b_feature_stride = p.b.ld;
    }
    w.groups = p.num_groups;
    w.n = p.n;
    w.k = p.k;
    if (detail::has_row_blocks(p)) {  // a_t (k, 128 blocks), b_t (n, 128 blocks)
      w.a_rows = p.k;
      w.k = detail::kRowBlock * fp8_group_row_blocks(p.m, p.num_groups);
    }
  }
  return plan.kernel->launch(groups, ctx);
}

// What each call enqueues once planned: the GEMM, then its own reductions.
Result run(const RaggedMGemmArgs&, const detail::GemmProblem& p, const Plan& plan, void* ws, cudaStream_t stream) {
  return enqueue_gemm(p, plan, ws, stream);
}

Result run(const ActForwardArgs&, const detail::GemmProblem& p, const Plan& plan, void* ws, cudaStream_t stream) {
  return enqueue_gemm(p, plan, ws, stream);
}

Result run(const Fp8RaggedMGemmArgs&, const detail::GemmProblem& p, const Plan& plan, void* ws, cudaStream_t stream) {
  return enqueue_gemm(p, plan, ws, stream);
}

Result run(const Fp8ActForwardArgs&, const detail::GemmProblem& p, const Plan& plan, void* ws, cudaStream_t stream) {
  return enqueue_gemm(p, plan, ws, stream);
}

Result run(const Fp8RaggedKGemmArgs&, const detail::GemmProblem& p, const Plan& plan, void* ws, cudaStream_t stream) {
  return enqueue_gemm(p, plan, ws, stream);
}

// The activation backward's GEMM, then its reductions of the epilogue's per-tile partials:
// the bias gradient (dpre's column sums per group) and the row-scale gradient (+ dy .
// out_bias; dy bf16 (m, n)).
Result run_act_backward(const char* op, const detail::GemmProblem& p, const Plan& plan, void* ws, cudaStream_t stream,
                        float* row_scale_grad, const void* dy, int64_t lddy, int64_t n, const void* out_bias,
                        int64_t out_bias_stride) {
  Result r = enqueue_gemm(p, plan, ws, stream);
  if (r.ok() && p.bias_grad != nullptr && !detail::fuses_column_sums(plan.kernel->config)) {
    // a kernel without the epilogue's column sums (a forced pingpong one): a pass over dpre,
    // a bf16 matrix dpre_width wide, with the partials' scratch (more than the pass needs)
    GroupColumnSumArgs sum;
    sum.m = p.m;
    sum.n = dpre_width(p);
    sum.num_groups = p.num_groups;
    sum.offs = p.offs;
    sum.src = p.d.ptr;
    sum.ld = p.d.elem == detail::Elem::kBF16Pair ? 2 * p.d.ld : p.d.ld;
    sum.out = p.bias_grad;
    cudaError_t err = detail::launch_group_column_sum(sum, col_partial(plan, ws, p), stream);
    if (err != cudaSuccess) return cuda_error((std::string(op) + " bias-gradient kernel").c_str(), err);
  } else if (r.ok() && p.bias_grad != nullptr) {
    detail::TileColumnSumArgs s;
    s.partial = col_partial(plan, ws, p);
    s.ld = dpre_width(p);
    s.rows_per_slot = detail::kTileColumnSumWarps;
    s.width = dpre_width(p);
    s.m = p.m;
    s.offs = p.offs;
    s.num_groups = p.num_groups;
    s.out = p.bias_grad;
    cudaError_t err = detail::launch_tile_column_sum(s, stream);
    if (err != cudaSuccess) return cuda_error((std::string(op) + " bias-gradient kernel").c_str(), err);
  }
  if (!r.ok() || row_scale_grad == nullptr) return r;
  detail::RowScaleGradArgs g;
  g.partial = plan.scratch(ws);
  g.tiles = row_partial_tiles(p.n, plan.kernel->config.tile_n);
  g.m = p.m;
  g.dy = dy;
  g.lddy = lddy;
  g.n = n;
  g.bias = out_bias;
  g.bias_stride = out_bias_stride;
  g.offs = p.offs;
  g.num_groups = p.num_groups;
  g.out = row_scale_grad;
  cudaError_t err = detail::launch_row_scale_grad(g, stream);
  return err == cudaSuccess ? Result::success() : cuda_error((std::string(op) + " row-scale-gradient kernel").c_str(), err);
}

Result run(const ActBackwardArgs& a, const detail::GemmProblem& p, const Plan& plan, void* ws, cudaStream_t stream) {
  return run_act_backward("act_backward", p, plan, ws, stream, a.row_scale_grad, a.gemm.x, a.gemm.ldx, a.gemm.k,
                          a.out_bias, a.out_bias_stride);
}

Result run(const Fp8ActBackwardArgs& a, const detail::GemmProblem& p, const Plan& plan, void* ws, cudaStream_t stream) {
  return run_act_backward("fp8_act_backward", p, plan, ws, stream, a.row_scale_grad, a.dy, a.lddy, a.gemm.k,
                          a.out_bias, a.out_bias_stride);
}

Result run(const RaggedKGemmArgs& args, const detail::GemmProblem& p, const Plan& plan, void* ws, cudaStream_t stream) {
  Result r = enqueue_gemm(p, plan, ws, stream);
  if (!r.ok() || args.dbias == nullptr) return r;
  GroupColumnSumArgs sum;
  sum.m = args.m;
  sum.n = args.n;
  sum.num_groups = args.num_groups;
  sum.offs = args.offs;
  sum.src = args.dy;
  sum.ld = args.lddy;
  sum.out = args.dbias;
  cudaError_t err = detail::launch_group_column_sum(sum, plan.scratch(ws), stream);
  return err == cudaSuccess ? Result::success() : cuda_error("ragged_k_gemm bias-gradient kernel", err);
}

// A ragged-M call without rows enqueues nothing (ragged K still zeroes every group).
bool nothing_to_do(const RaggedMGemmArgs& a) { return a.m == 0; }
bool nothing_to_do(const ActForwardArgs& a) { return a.gemm.m == 0; }
bool nothing_to_do(const ActBackwardArgs& a) { return a.gemm.m == 0; }
bool nothing_to_do(const Fp8RaggedMGemmArgs& a) { return a.m == 0; }
bool nothing_to_do(const Fp8ActForwardArgs& a) { return a.gemm.m == 0; }
bool nothing_to_do(const Fp8ActBackwardArgs& a) { return a.gemm.m == 0; }
bool nothing_to_do(const RaggedKGemmArgs&) { return false; }
bool nothing_to_do(const Fp8RaggedKGemmArgs&) { return false; }

// A call with the caller's workspace.
template <typename Args>
Result call(const char* op, const Args& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
            const GemmOptions& opts) {
  detail::GemmProblem problem;
  Plan plan;
  Result r = plan_call(args, opts, &problem, &plan);
  if (!r.ok() || nothing_to_do(args)) return r;
  r = check_workspace(op, plan, workspace, workspace_bytes);
  return r.ok() ? run(args, problem, plan, workspace, stream) : r;
}

// A call that asks the allocator for exactly the planned workspace: planned once.
template <typename Args>
Result call(const char* op, const Args& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
            const GemmOptions& opts) {
  detail::GemmProblem problem;
  Plan plan;
  Result r = plan_call(args, opts, &problem, &plan);
  if (!r.ok() || nothing_to_do(args)) return r;
  void* workspace = allocate(plan.total());
  r = check_workspace(op, plan, workspace, plan.total());
  return r.ok() ? run(args, problem, plan, workspace, stream) : r;
}

}  // namespace

GemmOptions options_from_environment() {
  GemmOptions o;
  const char* config = std::getenv("CUTE_MOE_CONFIG");
  o.config = config != nullptr && config[0] != '\0' ? config : nullptr;
  const char* raster = std::getenv("CUTE_MOE_RASTER");
  o.raster = raster != nullptr ? raster[0] : 0;
  const char* swizzle = std::getenv("CUTE_MOE_SWIZZLE");
  o.swizzle = swizzle != nullptr ? std::atoi(swizzle) : 0;
  const char* schedule = std::getenv("CUTE_MOE_SCHEDULE");
  o.schedule = schedule != nullptr ? schedule[0] : 0;
  const char* lookahead = std::getenv("CUTE_MOE_SCHEDULE_LOOKAHEAD");
  o.lookahead = lookahead != nullptr ? std::atoi(lookahead) : 0;
  const char* log = std::getenv("CUTE_MOE_LOG_CONFIG");
  o.log = log != nullptr && log[0] != '\0' && std::strcmp(log, "0") != 0;
  return o;
}

Result ragged_m_gemm(const RaggedMGemmArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                     const GemmOptions& opts) {
  return call("ragged_m_gemm", args, workspace, workspace_bytes, stream, opts);
}
Result ragged_m_gemm(const RaggedMGemmArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                     const GemmOptions& opts) {
  return call("ragged_m_gemm", args, allocate, stream, opts);
}
Result ragged_k_gemm(const RaggedKGemmArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                     const GemmOptions& opts) {
  return call("ragged_k_gemm", args, workspace, workspace_bytes, stream, opts);
}
Result ragged_k_gemm(const RaggedKGemmArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                     const GemmOptions& opts) {
  return call("ragged_k_gemm", args, allocate, stream, opts);
}
Result act_forward(const ActForwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                   const GemmOptions& opts) {
  return call("act_forward", args, workspace, workspace_bytes, stream, opts);
}
Result act_forward(const ActForwardArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                   const GemmOptions& opts) {
  return call("act_forward", args, allocate, stream, opts);
}
Result act_backward(const ActBackwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                    const GemmOptions& opts) {
  return call("act_backward", args, workspace, workspace_bytes, stream, opts);
}
Result act_backward(const ActBackwardArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                    const GemmOptions& opts) {
  return call("act_backward", args, allocate, stream, opts);
}

Result fp8_ragged_m_gemm(const Fp8RaggedMGemmArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                         const GemmOptions& opts) {
  return call("fp8_ragged_m_gemm", args, workspace, workspace_bytes, stream, opts);
}
Result fp8_ragged_m_gemm(const Fp8RaggedMGemmArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                         const GemmOptions& opts) {
  return call("fp8_ragged_m_gemm", args, allocate, stream, opts);
}

Result fp8_act_forward(const Fp8ActForwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                       const GemmOptions& opts) {
  return call("fp8_act_forward", args, workspace, workspace_bytes, stream, opts);
}
Result fp8_act_forward(const Fp8ActForwardArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                       const GemmOptions& opts) {
  return call("fp8_act_forward", args, allocate, stream, opts);
}
Result fp8_act_backward(const Fp8ActBackwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                        const GemmOptions& opts) {
  return call("fp8_act_backward", args, workspace, workspace_bytes, stream, opts);
}
Result fp8_act_backward(const Fp8ActBackwardArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                        const GemmOptions& opts) {
  return call("fp8_act_backward", args, allocate, stream, opts);
}

Result fp8_ragged_k_gemm(const Fp8RaggedKGemmArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                         const GemmOptions& opts) {
  return call("fp8_ragged_k_gemm", args, workspace, workspace_bytes, stream, opts);
}
Result fp8_ragged_k_gemm(const Fp8RaggedKGemmArgs& args, const WorkspaceAllocator& allocate, cudaStream_t stream,
                         const GemmOptions& opts) {
  return call("fp8_ragged_k_gemm", args, allocate, stream, opts);
}

Result workspace_size(const RaggedMGemmArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result workspace_size(const Fp8RaggedMGemmArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result workspace_size(const Fp8ActForwardArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result workspace_size(const Fp8ActBackwardArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result workspace_size(const Fp8RaggedKGemmArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result workspace_size(const RaggedKGemmArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result workspace_size(const ActForwardArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result workspace_size(const ActBackwardArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result workspace_size(const GroupColumnSumArgs& args, size_t* bytes) {
  Result r = validate(args);
  if (r.ok()) *bytes = detail::column_sum_workspace_bytes(args.m, args.n, args.num_groups, args.row_dot != nullptr);
  return r;
}

Result group_column_sum(const GroupColumnSumArgs& args, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  Result r = validate(args);
  if (!r.ok()) return r;
  const size_t need = detail::column_sum_workspace_bytes(args.m, args.n, args.num_groups, args.row_dot != nullptr);
  if (workspace_bytes < need || workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return Result::error(Status::kInvalidArgument, "group_column_sum: workspace must be a 16-byte aligned device "
                                                   "pointer to at least " + std::to_string(need) + " bytes, got " +
                                                   std::to_string(workspace_bytes));
  }
  cudaError_t err = detail::launch_group_column_sum(args, static_cast<float*>(workspace), stream);
  return err == cudaSuccess ? Result::success() : cuda_error("group_column_sum kernel", err);
}

namespace {

// list_tile_configs's family of a variant.
GemmFamily family_of(KernelVariant v) {
  if (v == KernelVariant::Fp8RaggedK) return GemmFamily::kFp8RaggedK;
  if (v == KernelVariant::Fp8RaggedM || v == KernelVariant::Fp8ActFwd || v == KernelVariant::Fp8ActBwd) {
    return GemmFamily::kFp8RaggedM;
  }
  return detail::is_ragged_m(v) ? GemmFamily::kRaggedM : GemmFamily::kRaggedK;
}

}  // namespace

std::vector<std::string> list_tile_configs(GemmFamily family) {
  std::vector<std::string> names;
  for (const auto& e : detail::kernel_registry()) {
    if (family_of(e.config.variant) != family) continue;
    bool seen = false;
    for (const auto& n : names) seen = seen || n == e.name;
    if (!seen) names.push_back(e.name);
  }
  return names;
}

std::vector<KernelInfo> list_kernels() {
  std::vector<KernelInfo> out;
  for (const auto& e : detail::kernel_registry()) {
    out.push_back({detail::variant_call(e.config.variant), detail::act_name(e.config.act), e.name});
  }
  return out;
}

Result chosen_tile_config(const RaggedMGemmArgs& args, std::string* name, const GemmOptions& opts) {
  return planned_config_name(args, name, opts);
}

Result chosen_tile_config(const RaggedKGemmArgs& args, std::string* name, const GemmOptions& opts) {
  return planned_config_name(args, name, opts);
}

Result chosen_tile_config(const Fp8RaggedMGemmArgs& args, std::string* name, const GemmOptions& opts) {
  return planned_config_name(args, name, opts);
}

Result chosen_tile_config(const Fp8RaggedKGemmArgs& args, std::string* name, const GemmOptions& opts) {
  return planned_config_name(args, name, opts);
}

}  // namespace cute_moe

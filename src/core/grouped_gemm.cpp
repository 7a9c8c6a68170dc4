// The public grouped-GEMM entry points: validate, plan (kernel choice and workspace
// layout), then enqueue setup kernel + GEMM (+ bias-gradient column sums).
//
// Workspace layout of one call:  [group arrays | CUTLASS workspace | column-sum scratch]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cute_moe/fused_glu.h"
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

size_t align_up(size_t v) { return (v + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

Result cuda_error(const char* what, cudaError_t err) {
  return Result::error(Status::kCudaError, std::string(what) + ": " + cudaGetErrorString(err));
}

// Multiprocessor count of the current device, cached per device.
Result current_device(int* device, int* sm_count) {
  cudaError_t err = cudaGetDevice(device);
  if (err != cudaSuccess) return cuda_error("cudaGetDevice", err);
  static std::mutex mu;
  static int cached[64] = {0};
  std::lock_guard<std::mutex> lock(mu);
  if (*device < 64 && cached[*device] > 0) {
    *sm_count = cached[*device];
    return Result::success();
  }
  err = cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, *device);
  if (err != cudaSuccess) return cuda_error("cudaDeviceGetAttribute", err);
  if (*device < 64) cached[*device] = *sm_count;
  return Result::success();
}

const char* variant_name(KernelVariant v) {
  switch (v) {
    case KernelVariant::RaggedM_BRow: return "ragged_m (weight n-contiguous)";
    case KernelVariant::RaggedM_BCol: return "ragged_m (weight k-contiguous)";
    case KernelVariant::RaggedK_OutBF16: return "ragged_k (bf16 output)";
    case KernelVariant::RaggedK_OutF32: return "ragged_k (fp32 output)";
    case KernelVariant::GluFwd_BRow: return "glu_forward (weight n-contiguous)";
    case KernelVariant::GluFwd_BCol: return "glu_forward (weight k-contiguous)";
    case KernelVariant::GluFwdGather_BRow: return "glu_forward (gathered rows, weight n-contiguous)";
    case KernelVariant::GluBwd_BRow: return "glu_backward (weight n-contiguous)";
    case KernelVariant::GluBwd_BCol: return "glu_backward (weight k-contiguous)";
  }
  return "?";
}

// The names list_kernels() reports.
const char* kernel_call_name(KernelVariant v) {
  switch (v) {
    case KernelVariant::RaggedM_BRow: return "ragged_m";
    case KernelVariant::RaggedM_BCol: return "ragged_m_bcol";
    case KernelVariant::RaggedK_OutBF16: return "ragged_k_bf16";
    case KernelVariant::RaggedK_OutF32: return "ragged_k_f32";
    case KernelVariant::GluFwd_BRow: return "glu_forward";
    case KernelVariant::GluFwd_BCol: return "glu_forward_bcol";
    case KernelVariant::GluFwdGather_BRow: return "glu_forward_gather";
    case KernelVariant::GluBwd_BRow: return "glu_backward";
    case KernelVariant::GluBwd_BCol: return "glu_backward_bcol";
  }
  return "?";
}

const char* kernel_act_name(detail::Act a) {
  switch (a) {
    case detail::Act::None: return "";
    case detail::Act::SwigluOai: return "swiglu_oai";
    case detail::Act::Swiglu: return "swiglu";
    case detail::Act::Geglu: return "geglu";
    case detail::Act::Srelu: return "srelu";
    case detail::Act::Identity: return "none";
  }
  return "?";
}

// Everything a call needs decided on the host before enqueueing.
struct Plan {
  const KernelEntry* kernel = nullptr;
  int device = 0;
  int sm_count = 0;
  size_t arrays_bytes = 0;   // per-group arrays
  size_t cutlass_bytes = 0;  // CUTLASS workspace (upper bound over the variant's kernels)
  size_t scratch_bytes = 0;  // column-sum partials
  bool raster_along_n = false;
  int swizzle = 1;
  size_t total() const { return align_up(arrays_bytes) + align_up(cutlass_bytes) + align_up(scratch_bytes); }
};

Result make_plan(const GroupedProblem& problem, const GemmOptions& opts, Plan* plan) {
  Result r = current_device(&plan->device, &plan->sm_count);
  if (!r.ok()) return r;
  if (opts.sm_count > 0) plan->sm_count = std::min(plan->sm_count, opts.sm_count);

  const auto& registry = detail::kernel_registry();
  const char* forced = opts.config != nullptr ? opts.config : std::getenv("CUTE_MOE_CONFIG");
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
                                                         "' is not compiled for " + variant_name(problem.variant) +
                                                         "; available: " + available);
    }
  } else {
    std::vector<detail::TileConfig> configs;
    for (const auto& e : registry) configs.push_back(e.config);
    choice = detail::choose_launch(problem, configs, plan->sm_count);
    index = choice.index;
    if (index < 0) {
      return Result::error(Status::kNotSupported,
                           std::string("no kernel compiled for ") + variant_name(problem.variant));
    }
  }
  plan->kernel = &registry[index];

  // Tile order: the heuristic's unless an option or the environment overrides it.
  const char* raster_env = std::getenv("CUTE_MOE_RASTER");
  const char raster = opts.raster != 0 ? opts.raster : (raster_env != nullptr ? raster_env[0] : 0);
  if (raster != 0 && raster != 'm' && raster != 'n') {
    return Result::error(Status::kInvalidArgument,
                         std::string("raster must be 'm' or 'n' (CUTE_MOE_RASTER), got '") + raster + "'");
  }
  plan->raster_along_n = raster == 0 ? choice.raster_along_n : raster == 'n';
  const char* swizzle_env = std::getenv("CUTE_MOE_SWIZZLE");
  const int swizzle = opts.swizzle != 0 ? opts.swizzle : (swizzle_env != nullptr ? std::atoi(swizzle_env) : 0);
  if (swizzle != 0 && swizzle != 1 && swizzle != 2 && swizzle != 4 && swizzle != 8) {
    return Result::error(Status::kInvalidArgument,
                         "swizzle must be 1, 2, 4 or 8 (CUTE_MOE_SWIZZLE), got " + std::to_string(swizzle));
  }
  plan->swizzle = swizzle == 0 ? (raster == 0 ? choice.swizzle : 1) : swizzle;
  for (const auto& e : registry) {
    if (detail::serves(e.config, problem)) {
      plan->cutlass_bytes = std::max(plan->cutlass_bytes, e.workspace_size(problem.num_groups, plan->sm_count));
    }
  }
  plan->arrays_bytes = detail::group_arrays_bytes(problem.num_groups);

  const char* log = std::getenv("CUTE_MOE_LOG_CONFIG");
  if (log != nullptr && std::strcmp(log, "0") != 0 && log[0] != '\0') {
    std::fprintf(stderr, "cute_moe: %s m=%lld n=%lld k=%lld groups=%d sms=%d -> %s%s raster=%c swizzle=%d\n",
                 variant_name(problem.variant), static_cast<long long>(problem.m), static_cast<long long>(problem.n),
                 static_cast<long long>(problem.k), problem.num_groups, plan->sm_count, plan->kernel->name.c_str(),
                 forced != nullptr && forced[0] != '\0' ? " (forced)" : "", plan->raster_along_n ? 'n' : 'm',
                 plan->swizzle);
  }
  return Result::success();
}

GroupedProblem problem_of(const RaggedMGemmArgs& a) {
  return {a.w_stride_n == 1 ? KernelVariant::RaggedM_BRow : KernelVariant::RaggedM_BCol, a.m, a.n, a.k,
          a.num_groups};
}

GroupedProblem problem_of(const RaggedKGemmArgs& a) {
  return {a.dw_dtype == DType::kF32 ? KernelVariant::RaggedK_OutF32 : KernelVariant::RaggedK_OutBF16, a.m, a.n, a.k,
          a.num_groups};
}

KernelVariant glu_variant(const RaggedMGemmArgs& g, bool forward) {
  const bool row = g.w_stride_n == 1;
  if (forward && g.gather_rows != nullptr) return KernelVariant::GluFwdGather_BRow;  // validated: row
  if (forward) return row ? KernelVariant::GluFwd_BRow : KernelVariant::GluFwd_BCol;
  return row ? KernelVariant::GluBwd_BRow : KernelVariant::GluBwd_BCol;
}

detail::Act act_of(GluActivation a) {
  switch (a) {
    case GluActivation::kSwigluOai: return detail::Act::SwigluOai;
    case GluActivation::kSwiglu: return detail::Act::Swiglu;
    case GluActivation::kGeglu: return detail::Act::Geglu;
    case GluActivation::kSrelu: return detail::Act::Srelu;
    case GluActivation::kNone: return detail::Act::Identity;
  }
  return detail::Act::None;
}

GroupedProblem problem_of(const GluForwardArgs& a) {
  GroupedProblem p = problem_of(a.gemm);
  p.variant = glu_variant(a.gemm, true);
  p.act = act_of(a.glu.activation);
  return p;
}

GroupedProblem problem_of(const GluBackwardArgs& a) {
  GroupedProblem p = problem_of(a.gemm);
  p.variant = glu_variant(a.gemm, false);
  p.act = act_of(a.glu.activation);
  return p;
}

// Tile columns of the GLU backward's row-scale-gradient partials: at most n / (the
// narrowest compiled tile), so the workspace does not depend on the choice.
int64_t row_partial_tiles(const GroupedProblem& p, int tile_n) { return (p.n + tile_n - 1) / tile_n; }

int narrowest_tile_n(const GroupedProblem& p) {
  int narrowest = 1 << 30;
  for (const auto& e : detail::kernel_registry()) {
    if (detail::serves(e.config, p)) narrowest = std::min(narrowest, e.config.tile_n);
  }
  return narrowest;
}

detail::GluParams glu_params(const GluOptions& o) {
  detail::GluParams p;
  p.alpha = o.alpha;
  p.limit = o.limit;
  p.has_limit = o.has_limit;
  return p;
}

// Extra scratch beyond the GEMM's own: the bias-gradient column sums of ragged K.
size_t scratch_bytes(const RaggedKGemmArgs& a) {
  return a.dbias != nullptr ? detail::column_sum_workspace_bytes(a.m, a.n, a.num_groups) : 0;
}
size_t scratch_bytes(const GluBackwardArgs& a) {
  if (a.row_scale_grad == nullptr) return 0;
  const GroupedProblem p = problem_of(a);
  return static_cast<size_t>(row_partial_tiles(p, narrowest_tile_n(p))) * static_cast<size_t>(a.gemm.m) * sizeof(float);
}
template <typename Args>
size_t scratch_bytes(const Args&) {
  return 0;
}

template <typename Args>
Result plan_call(const Args& args, const GemmOptions& opts, Plan* plan) {
  Result r = validate(args);
  if (!r.ok()) return r;
  r = make_plan(problem_of(args), opts, plan);
  plan->scratch_bytes = scratch_bytes(args);
  return r;
}

template <typename Args>
Result planned_workspace_size(const Args& args, size_t* bytes, const GemmOptions& opts) {
  Plan plan;
  Result r = plan_call(args, opts, &plan);
  if (r.ok()) *bytes = plan.total();
  return r;
}

detail::LaunchContext launch_context(const Plan& plan, void* workspace, cudaStream_t stream);

// Setup kernel (per-group arrays from offs, zeros of padding rows) then the plan's kernel.
Result run_ragged_m(const RaggedMGemmArgs& args, const detail::RaggedMExtras& extras, const detail::GluParams& glu,
                    const Plan& plan, void* workspace, cudaStream_t stream) {
  detail::GroupArrays groups = detail::carve_group_arrays(workspace, args.num_groups);
  if (args.bias == nullptr) groups.bias = nullptr;  // the epilogue adds zero
  if (args.row_scale == nullptr) groups.row_scale = nullptr;  // the epilogue scales by 1
  if (extras.row_partial == nullptr) groups.row_partial = nullptr;
  if (args.gather_rows == nullptr) groups.gather_rows = nullptr;
  groups.group_scale = args.group_scale;
  groups.row_partial_stride = args.m;
  cudaError_t err = detail::launch_ragged_m_setup(args, extras, groups, plan.sm_count, stream);
  if (err != cudaSuccess) return cuda_error("ragged_m setup kernel", err);
  detail::LaunchContext ctx = launch_context(plan, workspace, stream);
  ctx.glu = glu;
  return plan.kernel->launch(groups, ctx);
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

detail::LaunchContext launch_context(const Plan& plan, void* workspace, cudaStream_t stream) {
  detail::LaunchContext ctx;
  ctx.device = plan.device;
  ctx.sm_count = plan.sm_count;
  ctx.workspace = static_cast<char*>(workspace) + align_up(plan.arrays_bytes);
  ctx.workspace_bytes = plan.cutlass_bytes;
  ctx.stream = stream;
  ctx.raster_along_n = plan.raster_along_n;
  ctx.swizzle = plan.swizzle;
  return ctx;
}

}  // namespace

Result workspace_size(const RaggedMGemmArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result workspace_size(const RaggedKGemmArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result ragged_m_gemm(const RaggedMGemmArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                     const GemmOptions& opts) {
  Plan plan;
  Result r = plan_call(args, opts, &plan);
  if (!r.ok()) return r;
  if (args.m == 0) return Result::success();  // no rows: nothing to compute or zero
  r = check_workspace("ragged_m_gemm", plan, workspace, workspace_bytes);
  if (!r.ok()) return r;

  return run_ragged_m(args, {}, {}, plan, workspace, stream);
}

Result glu_forward(const GluForwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                   const GemmOptions& opts) {
  Plan plan;
  Result r = plan_call(args, opts, &plan);
  if (!r.ok() || args.gemm.m == 0) return r;
  r = check_workspace("glu_forward", plan, workspace, workspace_bytes);
  if (!r.ok()) return r;
  detail::RaggedMExtras extras;
  extras.aux = args.h;
  extras.ldaux = args.ldh;
  extras.aux_cols = is_gated(args.glu.activation) ? args.gemm.n / 2 : args.gemm.n;
  return run_ragged_m(args.gemm, extras, glu_params(args.glu), plan, workspace, stream);
}

Result glu_backward(const GluBackwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                    const GemmOptions& opts) {
  Plan plan;
  Result r = plan_call(args, opts, &plan);
  if (!r.ok() || args.gemm.m == 0) return r;
  r = check_workspace("glu_backward", plan, workspace, workspace_bytes);
  if (!r.ok()) return r;
  // The kernel reads pre and writes dpre through its TMA pipelines (C and D): gated, as
  // (m, n) 32-bit (gate, linear) words; else as bf16. It writes h as the aux output.
  const int64_t words = is_gated(args.glu.activation) ? 2 : 1;
  RaggedMGemmArgs gemm = args.gemm;
  gemm.y = args.dpre;
  gemm.ldy = args.lddpre / words;
  detail::RaggedMExtras extras;
  extras.y_elem_bytes = 2 * words;
  extras.c = args.pre;
  extras.ldc = args.ldpre / words;
  extras.c_elem_bytes = 2 * words;
  extras.aux = args.gemm.y;
  extras.ldaux = args.gemm.ldy;
  extras.aux_cols = args.gemm.n;
  float* partial = nullptr;
  if (args.row_scale_grad != nullptr) {
    partial = reinterpret_cast<float*>(static_cast<char*>(workspace) + align_up(plan.arrays_bytes) +
                                       align_up(plan.cutlass_bytes));
    extras.row_partial = partial;
  }
  r = run_ragged_m(gemm, extras, glu_params(args.glu), plan, workspace, stream);
  if (!r.ok() || args.row_scale_grad == nullptr) return r;
  detail::RowScaleGradArgs g;
  g.partial = partial;
  g.tiles = row_partial_tiles(problem_of(args), plan.kernel->config.tile_n);
  g.m = args.gemm.m;
  g.dy = args.gemm.x;
  g.lddy = args.gemm.ldx;
  g.n = args.gemm.k;
  g.bias = args.out_bias;
  g.bias_stride = args.out_bias_stride;
  g.offs = args.gemm.offs;
  g.num_groups = args.gemm.num_groups;
  g.out = args.row_scale_grad;
  cudaError_t err = detail::launch_row_scale_grad(g, stream);
  return err == cudaSuccess ? Result::success() : cuda_error("glu_backward row-scale-gradient kernel", err);
}

Result ragged_k_gemm(const RaggedKGemmArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                     const GemmOptions& opts) {
  Plan plan;
  Result r = plan_call(args, opts, &plan);
  if (!r.ok()) return r;
  r = check_workspace("ragged_k_gemm", plan, workspace, workspace_bytes);
  if (!r.ok()) return r;

  detail::GroupArrays groups = detail::carve_group_arrays(workspace, args.num_groups);
  groups.bias = nullptr;
  cudaError_t err = detail::launch_ragged_k_setup(args, groups, plan.sm_count, stream);
  if (err != cudaSuccess) return cuda_error("ragged_k_gemm setup kernel", err);
  if (args.m > 0) {  // with no rows every group is empty: the setup kernel wrote the zeros
    r = plan.kernel->launch(groups, launch_context(plan, workspace, stream));
    if (!r.ok()) return r;
  }
  if (args.dbias != nullptr) {
    float* scratch = reinterpret_cast<float*>(static_cast<char*>(workspace) + align_up(plan.arrays_bytes) +
                                              align_up(plan.cutlass_bytes));
    err = detail::launch_group_column_sum(args.dy, args.m, args.n, args.lddy, nullptr, args.offs, args.num_groups,
                                          args.dbias, scratch, stream);
    if (err != cudaSuccess) return cuda_error("ragged_k_gemm bias-gradient kernel", err);
  }
  return Result::success();
}

Result workspace_size(const GluForwardArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result workspace_size(const GluBackwardArgs& args, size_t* bytes, const GemmOptions& opts) {
  return planned_workspace_size(args, bytes, opts);
}

Result workspace_size(const GroupColumnSumArgs& args, size_t* bytes) {
  Result r = validate(args);
  if (r.ok()) *bytes = detail::column_sum_workspace_bytes(args.m, args.n, args.num_groups);
  return r;
}

Result group_column_sum(const GroupColumnSumArgs& args, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  Result r = validate(args);
  if (!r.ok()) return r;
  const size_t need = detail::column_sum_workspace_bytes(args.m, args.n, args.num_groups);
  if (workspace_bytes < need || workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return Result::error(Status::kInvalidArgument, "group_column_sum: workspace must be a 16-byte aligned device "
                                                   "pointer to at least " + std::to_string(need) + " bytes, got " +
                                                   std::to_string(workspace_bytes));
  }
  cudaError_t err = detail::launch_group_column_sum(args.src, args.m, args.n, args.ld, args.row_scale, args.offs,
                                                    args.num_groups, args.out, static_cast<float*>(workspace), stream);
  return err == cudaSuccess ? Result::success() : cuda_error("group_column_sum kernel", err);
}

std::vector<std::string> list_tile_configs(GemmFamily family) {
  std::vector<std::string> names;
  for (const auto& e : detail::kernel_registry()) {
    const bool ragged_m =
        e.config.variant != KernelVariant::RaggedK_OutBF16 && e.config.variant != KernelVariant::RaggedK_OutF32;
    if (ragged_m != (family == GemmFamily::kRaggedM)) continue;
    bool seen = false;
    for (const auto& n : names) seen = seen || n == e.name;
    if (!seen) names.push_back(e.name);
  }
  return names;
}

std::vector<KernelInfo> list_kernels() {
  std::vector<KernelInfo> out;
  for (const auto& e : detail::kernel_registry()) {
    out.push_back({kernel_call_name(e.config.variant), kernel_act_name(e.config.act), e.name});
  }
  return out;
}

Result chosen_tile_config(const RaggedMGemmArgs& args, std::string* name, const GemmOptions& opts) {
  Plan plan;
  Result r = plan_call(args, opts, &plan);
  if (r.ok()) *name = plan.kernel->name;
  return r;
}

Result chosen_tile_config(const RaggedKGemmArgs& args, std::string* name, const GemmOptions& opts) {
  Plan plan;
  Result r = plan_call(args, opts, &plan);
  if (r.ok()) *name = plan.kernel->name;
  return r;
}

}  // namespace cute_moe

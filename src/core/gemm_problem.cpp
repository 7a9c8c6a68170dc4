// Lowering of the public arguments to GemmProblem (gemm_problem.h): which operand plays
// which GEMM role, in which element type, for each call.
#include "gemm_problem.h"

namespace cute_moe::detail {

namespace {

ActParams act_params(const ActivationOptions& o) {
  ActParams p;
  p.alpha = o.alpha;
  p.limit = o.limit;
  p.has_limit = o.has_limit;
  return p;
}

// The activation forward on top of its GEMM: D is pre, aux is h = act(pre).
void add_act_forward(GemmProblem& p, const ActivationOptions& act, void* h, int64_t ldh) {
  p.act = act_of(act.activation);
  p.act_params = act_params(act);
  p.aux = {h, ldh};
  p.aux_cols = is_gated(act.activation) ? p.n / 2 : p.n;
}

// The activation backward on top of its GEMM (A = dy, B = the down projection's weight, n = I):
// the kernel reads pre (C) and writes dpre (D) through its TMA pipelines, gated as n-wide rows
// of (gate, linear) pairs; aux is p * act(pre), n wide, in the GEMM's y. dpre in halves (the
// bf16 kernels only) is set by the caller.
void add_act_backward(GemmProblem& p, const ActivationOptions& act, const void* pre, int64_t ldpre, void* dpre,
                      int64_t lddpre, bool row_scale_grad) {
  p.act = act_of(act.activation);
  p.act_params = act_params(act);
  const bool gated = is_gated(act.activation);
  const Elem pair = gated ? Elem::kBF16Pair : Elem::kBF16;
  const int64_t per_word = gated ? 2 : 1;  // bf16 values per element of `pair`
  p.c = {pre, ldpre / per_word, pair};
  p.aux = {p.d.ptr, p.d.ld};  // the GEMM's y: p * act(pre), I wide
  p.aux_cols = p.n;
  p.d = {dpre, lddpre / per_word, pair};
  p.row_scale_grad = row_scale_grad;
}

}  // namespace

GemmProblem lower(const RaggedMGemmArgs& a) {
  GemmProblem p;
  p.b_k_major = a.w_stride_n != 1;  // validated: exactly one of the two strides is 1
  p.variant = p.b_k_major ? KernelVariant::RaggedM_BCol : KernelVariant::RaggedM_BRow;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.num_groups = a.num_groups;
  p.offs = a.offs;
  p.a = {a.x, a.ldx};
  p.gather_rows = a.gather_rows;
  p.a_rows = a.x_rows;
  p.b = {a.w, p.b_k_major ? a.w_stride_n : a.w_stride_k};
  p.b_group_stride = a.w_stride_group;
  p.b_hi = a.w_hi;
  p.b_k_split = a.k_split;
  p.d = {a.y, a.ldy};
  p.bias = a.bias;
  p.bias_group_stride = a.bias_stride_group;
  p.group_scale = a.group_scale;
  p.row_scale = a.row_scale;
  return p;
}

GemmProblem lower(const RaggedKGemmArgs& a) {
  GemmProblem p;
  const bool f32 = a.dw_dtype == DType::kF32;
  p.variant = f32 ? KernelVariant::RaggedK_OutF32 : KernelVariant::RaggedK_OutBF16;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.num_groups = a.num_groups;
  p.offs = a.offs;
  p.a = {a.x, a.ldx};
  p.b = {a.dy, a.lddy};
  p.d = {a.dw, a.n, f32 ? Elem::kF32 : Elem::kBF16};  // (groups, k, n) contiguous
  return p;
}

GemmProblem lower(const ActForwardArgs& a) {
  GemmProblem p = lower(a.gemm);
  p.variant = a.gemm.gather_rows != nullptr ? KernelVariant::ActFwdGather_BRow  // validated: n-contiguous W
              : p.b_k_major                 ? KernelVariant::ActFwd_BCol
                                            : KernelVariant::ActFwd_BRow;
  add_act_forward(p, a.act, a.h, a.ldh);
  p.b_halves = a.gate_linear == GateLinear::kHalves;
  p.b_linear = a.w_linear;
  if (a.w_linear != nullptr && reinterpret_cast<uintptr_t>(a.w_linear) < reinterpret_cast<uintptr_t>(a.gemm.w)) {
    // A TMA stride is positive: the paired B is based at the lower tensor, the linear half,
    // and the epilogue swaps each loaded (linear, gate) pair back (validated: no bias).
    p.b.ptr = a.w_linear;
    p.b_linear = a.gemm.w;
    p.b_pairs_swapped = true;
  }
  return p;
}

GemmProblem lower(const ActBackwardArgs& a) {
  // gemm.x = dy (A), gemm.w = W_down^T (B), gemm.n = I. dpre in [dgate | dlinear] halves
  // (validated: gated, n-contiguous W): D is dgate (n wide, bf16) and aux2 dlinear, n
  // columns further on.
  GemmProblem p = lower(a.gemm);
  const bool halves = a.dpre_layout == GateLinear::kHalves;
  p.variant = halves ? KernelVariant::ActBwdHalves_BRow
              : p.b_k_major ? KernelVariant::ActBwd_BCol : KernelVariant::ActBwd_BRow;
  add_act_backward(p, a.act, a.pre, a.ldpre, a.dpre, a.lddpre, a.row_scale_grad != nullptr);
  p.bias_grad = a.bias_grad;
  if (halves) {
    p.d = {a.dpre, a.lddpre, Elem::kBF16};
    p.aux2 = {static_cast<const char*>(a.dpre) + a.gemm.n * elem_bytes(Elem::kBF16), a.lddpre, Elem::kBF16};
  }
  return p;
}

GemmProblem lower(const Fp8RaggedMGemmArgs& a) {
  GemmProblem p;
  p.variant = KernelVariant::Fp8RaggedM;
  p.b_k_major = true;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.num_groups = a.num_groups;
  p.offs = a.offs;
  p.a = {a.x, a.ldx, Elem::kE4M3};
  p.a_scales = {a.x_scale, 0, a.x_scale_stride_row, a.x_scale_stride_block};
  p.b = {a.w, a.w_stride_n, Elem::kE4M3};
  p.b_group_stride = a.w_stride_group;
  p.b_scales = {a.w_scale, a.w_scale_stride_group, a.w_scale_stride_n, a.w_scale_stride_k};
  p.d = {a.y, a.ldy};
  p.bias = a.bias;
  p.bias_group_stride = a.bias_stride_group;
  p.group_scale = a.group_scale;
  p.row_scale = a.row_scale;
  return p;
}

GemmProblem lower(const Fp8ActForwardArgs& a) {
  GemmProblem p = lower(a.gemm);
  p.variant = KernelVariant::Fp8ActFwd;
  add_act_forward(p, a.act, a.h, a.ldh);
  p.d_fp8 = {a.h_q, a.ld_h_q, a.h_scale, a.ld_h_scale};  // or none: the bf16 h
  return p;
}

GemmProblem lower(const Fp8ActBackwardArgs& a) {
  GemmProblem p = lower(a.gemm);
  p.variant = KernelVariant::Fp8ActBwd;
  add_act_backward(p, a.act, a.pre, a.ldpre, a.dpre, a.lddpre, a.row_scale_grad != nullptr);
  p.d_fp8 = {a.dpre_q, a.ld_dpre_q, a.dpre_scale, a.ld_dpre_scale};
  return p;
}

GemmProblem lower(const Fp8RaggedKGemmArgs& a) {
  GemmProblem p;
  p.variant = KernelVariant::Fp8RaggedK;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.num_groups = a.num_groups;
  p.offs = a.offs;
  p.a = {a.a_t, a.lda_t, Elem::kE4M3};
  p.a_scales = {a.a_scale, 0, 1, a.a_scale_stride_block};
  p.b = {a.b_t, a.ldb_t, Elem::kE4M3};
  p.b_scales = {a.b_scale, 0, 1, a.b_scale_stride_block};
  p.d = {a.dw, a.n};  // (groups, k, n) contiguous
  return p;
}

GroupedProblem heuristic_view(const GemmProblem& p) {
  GroupedProblem g{p.variant, p.m, p.n, p.k, p.num_groups};
  g.act = p.act;
  g.limit_free = p.act != Act::Unfused && !p.act_params.has_limit;
  g.column_sums = p.bias_grad != nullptr;
  return g;
}

}  // namespace cute_moe::detail

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
  p.act = act_of(a.act.activation);
  p.act_params = act_params(a.act);
  p.b_halves = a.gate_linear == GateLinear::kHalves;
  p.aux = {a.h, a.ldh};  // h = act(pre); D is pre
  p.aux_cols = is_gated(a.act.activation) ? a.gemm.n / 2 : a.gemm.n;
  return p;
}

GemmProblem lower(const ActBackwardArgs& a) {
  // gemm.x = dy (A), gemm.w = W_down^T (B), gemm.n = I. The kernel reads pre (C) and writes
  // dpre (D) through its TMA pipelines: gated, as n-wide rows of (gate, linear) pairs.
  // dpre in [dgate | dlinear] halves (validated: gated, n-contiguous W): D is dgate (n
  // wide, bf16) and aux2 dlinear, n columns further on.
  GemmProblem p = lower(a.gemm);
  const bool halves = a.dpre_layout == GateLinear::kHalves;
  p.variant = halves ? KernelVariant::ActBwdHalves_BRow
              : p.b_k_major ? KernelVariant::ActBwd_BCol : KernelVariant::ActBwd_BRow;
  p.act = act_of(a.act.activation);
  p.act_params = act_params(a.act);
  const bool gated = is_gated(a.act.activation);
  const Elem pair = gated ? Elem::kBF16Pair : Elem::kBF16;
  const int64_t per_word = gated ? 2 : 1;  // bf16 values per element of `pair`
  p.c = {a.pre, a.ldpre / per_word, pair};
  p.aux = {a.gemm.y, a.gemm.ldy};  // p * act(pre), I wide
  p.aux_cols = a.gemm.n;
  if (halves) {
    p.d = {a.dpre, a.lddpre, Elem::kBF16};
    p.aux2 = {static_cast<const char*>(a.dpre) + a.gemm.n * elem_bytes(Elem::kBF16), a.lddpre, Elem::kBF16};
  } else {
    p.d = {a.dpre, a.lddpre / per_word, pair};
  }
  p.row_scale_grad = a.row_scale_grad != nullptr;
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

GroupedProblem heuristic_view(const GemmProblem& p) {
  GroupedProblem g{p.variant, p.m, p.n, p.k, p.num_groups};
  g.act = p.act;
  return g;
}

}  // namespace cute_moe::detail

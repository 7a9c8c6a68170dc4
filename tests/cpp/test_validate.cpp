// Argument validation of the core API: each rule rejects with a message naming the
// argument and its value; valid arguments pass.
#include <gtest/gtest.h>

#include "cute_moe/fused_activation.h"
#include "gemm_problem.h"
#include "validate_test_util.h"

namespace {

using cute_moe::RaggedKGemmArgs;
using cute_moe::RaggedMGemmArgs;
using cute_moe::Status;
using cute_moe::test::expect_rejected;
using cute_moe::test::fake;

RaggedMGemmArgs valid_m() {
  RaggedMGemmArgs a;
  a.m = 1000; a.n = 2880; a.k = 1440; a.num_groups = 32;
  a.offs = fake<const int32_t>(0x10000);
  a.x = fake(0x20000); a.ldx = a.k;
  a.w = fake(0x30000); a.w_stride_group = a.k * a.n; a.w_stride_k = a.n; a.w_stride_n = 1;
  a.y = fake(0x40000); a.ldy = a.n;
  return a;
}

// A gated act_backward over `gemm` (n = I): pre and dpre 2I wide.
cute_moe::ActBackwardArgs gated_backward(const RaggedMGemmArgs& gemm) {
  cute_moe::ActBackwardArgs b;
  b.gemm = gemm;
  b.pre = fake(0x80000);
  b.ldpre = 2 * gemm.n;
  b.dpre = fake(0x90000);
  b.lddpre = 2 * gemm.n;
  return b;
}

RaggedKGemmArgs valid_k() {
  RaggedKGemmArgs a;
  a.m = 1000; a.k = 2880; a.n = 1440; a.num_groups = 8;
  a.offs = fake<const int32_t>(0x10000);
  a.x = fake(0x20000); a.ldx = a.k;
  a.dy = fake(0x30000); a.lddy = a.n;
  a.dw = fake(0x40000);
  return a;
}


TEST(ValidateRaggedM, AcceptsBothWeightLayoutsAndBias) {
  RaggedMGemmArgs a = valid_m();
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  a.w_stride_k = 1; a.w_stride_n = a.k;  // transposed view of (E, n, k)
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  a.bias = fake(0x50000); a.bias_stride_group = a.n;
  EXPECT_TRUE(cute_moe::validate(a).ok());
}

TEST(ValidateRaggedM, AcceptsEmptyInputWithNullRows) {
  RaggedMGemmArgs a = valid_m();
  a.m = 0; a.x = nullptr; a.y = nullptr;
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
}

TEST(ValidateRaggedM, RejectsEachBrokenRule) {
  RaggedMGemmArgs a;
  a = valid_m(); a.num_groups = 0;                       expect_rejected(a, "num_groups must be in [1, 65536], got 0");
  a = valid_m(); a.num_groups = cute_moe::kMaxGroups + 1; expect_rejected(a, "got 65537");
  a = valid_m(); a.n = 2881;                             expect_rejected(a, "n=2881");
  a = valid_m(); a.k = 12;                               expect_rejected(a, "k=12");
  a = valid_m(); a.m = -1;                               expect_rejected(a, "m=-1");
  a = valid_m(); a.m = int64_t(1) << 31;                 expect_rejected(a, "m (rows) must be in [0, 2^31)");
  a = valid_m(); a.offs = nullptr;                       expect_rejected(a, "offs must not be null");
  a = valid_m(); a.x = fake(0x20008);                    expect_rejected(a, "x must be 16-byte aligned");
  a = valid_m(); a.y = nullptr;                          expect_rejected(a, "y must not be null");
  a = valid_m(); a.bias = fake(0x50004);                 expect_rejected(a, "bias must be 16-byte aligned");
  a = valid_m(); a.ldx = a.k - 8;                        expect_rejected(a, "ldx must be a multiple of 8");
  a = valid_m(); a.ldy = a.n + 4;                        expect_rejected(a, "ldy=2884");
  a = valid_m(); a.w_stride_n = 2;                       expect_rejected(a, "unit stride along k or along n");
  a = valid_m(); a.w_stride_k = 100;                     expect_rejected(a, "w_stride_k=100");
  a = valid_m(); a.w_stride_group = 4;                   expect_rejected(a, "w_stride_group");
  a = valid_m(); a.bias = fake(0x50000); a.bias_stride_group = 3; expect_rejected(a, "bias_stride_group");
}

TEST(ValidateRaggedM, MessageNamesTheOp) {
  RaggedMGemmArgs a = valid_m();
  a.n = 7;
  EXPECT_EQ(cute_moe::validate(a).message.rfind("ragged_m_gemm: ", 0), 0u);
}

TEST(ValidateRaggedK, AcceptsValidAndRejectsBroken) {
  RaggedKGemmArgs a = valid_k();
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  a.dw_dtype = cute_moe::DType::kF32;
  a.dbias = fake<float>(0x60000);
  EXPECT_TRUE(cute_moe::validate(a).ok());
  a = valid_k(); a.lddy = 10;                   expect_rejected(a, "lddy=10");
  a = valid_k(); a.dw = nullptr;                expect_rejected(a, "dw must not be null");
  a = valid_k(); a.dbias = reinterpret_cast<float*>(0x60004); expect_rejected(a, "dbias must be 16-byte aligned");
  a = valid_k(); a.k = 0;                       expect_rejected(a, "k=0");
  a = valid_k(); a.dw_dtype = static_cast<cute_moe::DType>(7); expect_rejected(a, "dw_dtype");
}

cute_moe::GroupColumnSumArgs valid_sum() {
  cute_moe::GroupColumnSumArgs a;
  a.m = 1000; a.n = 2880; a.num_groups = 32;
  a.offs = fake<const int32_t>(0x10000);
  a.src = fake(0x20000); a.ld = a.n;
  a.out = fake<float>(0x30000);
  return a;
}

TEST(ValidateGroupColumnSum, GatherAndRowDotRules) {
  cute_moe::GroupColumnSumArgs a = valid_sum();
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  a.index = fake<const int32_t>(0x40000); a.src_rows = 250;
  a.gathered = fake(0x50000); a.ld_gathered = a.n;
  a.bias = fake(0x60000); a.ld_bias = a.n; a.row_dot = fake<float>(0x70000);
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  cute_moe::GroupColumnSumArgs b = a;
  b = a; b.gathered = nullptr;              expect_rejected(b, "gathered must not be null");
  b = a; b.src_rows = 0;                    expect_rejected(b, "src_rows must be >= 1");
  b = a; b.ld_gathered = 100;               expect_rejected(b, "ld_gathered=100");
  b = a; b.index = fake<const int32_t>(0x40002); expect_rejected(b, "index must be 4-byte aligned");
  b = a; b.row_dot = nullptr;               expect_rejected(b, "bias and row_dot go together");
  b = a; b.ld_bias = 2000;                  expect_rejected(b, "ld_bias=2000");
  b = valid_sum(); b.gathered = fake(0x50000); expect_rejected(b, "gathered is written only with an index");
  b = valid_sum(); b.m = 0; b.bias = fake(0x60000); b.ld_bias = b.n;  // no rows: no row_dot to write
  EXPECT_TRUE(cute_moe::validate(b).ok()) << cute_moe::validate(b).message;
}

TEST(ValidateActivation, ForwardAndBackwardRules) {
  cute_moe::ActForwardArgs f;
  f.gemm = valid_m();  // n = 2880 = 2I
  f.h = fake(0x70000);
  f.ldh = f.gemm.n / 2;
  EXPECT_TRUE(cute_moe::validate(f).ok()) << cute_moe::validate(f).message;
  f.ldh = f.gemm.n / 2 - 8;
  expect_rejected(f, "ldh=1432");
  f.ldh = f.gemm.n / 2;
  f.act.limit = -1.0f;
  expect_rejected(f, "limit must be finite and >= 0");
  f.act.has_limit = false;  // limit=None: the value is ignored
  EXPECT_TRUE(cute_moe::validate(f).ok());
  f.gemm.n = f.gemm.ldy = f.gemm.w_stride_k = 2888;  // I = 1444, not a multiple of 8
  f.ldh = 1448;
  expect_rejected(f, "multiple of 16 (I a multiple of 8), got n=2888");
  f.act.activation = cute_moe::Activation::kIdentity;  // h = pre: no fused forward
  f.ldh = f.gemm.n;
  expect_rejected(f, "activation none has no fused forward");

  cute_moe::ActBackwardArgs b = gated_backward(valid_m());
  EXPECT_TRUE(cute_moe::validate(b).ok()) << cute_moe::validate(b).message;
  b.gemm.bias = fake(0x50000);
  b.gemm.bias_stride_group = b.gemm.n;
  expect_rejected(b, "bias must be null");
  b.gemm.bias = nullptr;
  b.bias_grad = reinterpret_cast<float*>(0xA0002);
  expect_rejected(b, "bias_grad must be 4-byte aligned");
  b.bias_grad = reinterpret_cast<float*>(0xA0000);
  EXPECT_TRUE(cute_moe::validate(b).ok()) << cute_moe::validate(b).message;
  b.bias_grad = nullptr;
  b.ldpre = b.gemm.n;
  expect_rejected(b, "ldpre=2880");
  b.ldpre = 2 * b.gemm.n;
  b.dpre = nullptr;
  expect_rejected(b, "dpre must not be null");
  b.dpre = fake(0x90000);
  b.act.activation = cute_moe::Activation::kIdentity;  // not gated: pre is n wide
  b.act.has_limit = false;
  b.ldpre = b.lddpre = b.gemm.n;
  EXPECT_TRUE(cute_moe::validate(b).ok()) << cute_moe::validate(b).message;
  b.act.has_limit = true;
  expect_rejected(b, "none takes no clamp limit");
}

TEST(ValidateActivation, GatheredRowsOnlyInTheForwardWithRowMajorWeights) {
  const auto* rows = fake<const int32_t>(0xa0000);
  cute_moe::ActForwardArgs f;
  f.gemm = valid_m();
  f.gemm.gather_rows = rows;
  f.gemm.x_rows = 250;  // fewer tokens than routed rows (top-4)
  f.h = fake(0x70000);
  f.ldh = f.gemm.n / 2;
  EXPECT_TRUE(cute_moe::validate(f).ok()) << cute_moe::validate(f).message;
  f.gemm.x_rows = 0;
  expect_rejected(f, "x_rows (rows of the gathered x) must be in [1, 2^31), got x_rows=0");
  f.gemm.x_rows = 250;
  f.gemm.gather_rows = fake<const int32_t>(0xa0002);
  expect_rejected(f, "gather_rows must be 4-byte aligned");
  f.gemm.gather_rows = rows;
  f.gemm.w_stride_k = 1;  // an (E, n, k) weight
  f.gemm.w_stride_n = f.gemm.k;
  expect_rejected(f, "gather_rows needs a weight with unit stride along n");

  RaggedMGemmArgs m = valid_m();
  m.gather_rows = rows;
  m.x_rows = 250;
  expect_rejected(m, "ragged_m_gemm: gather_rows is fused into act_forward only");

  cute_moe::ActBackwardArgs b = gated_backward(m);
  expect_rejected(b, "act_backward: gather_rows is fused into act_forward only");
}

TEST(ValidateActivation, HalvesLayoutRules) {
  using cute_moe::GateLinear;
  cute_moe::ActForwardArgs f;
  f.gemm = valid_m();  // n = 2880 = 2I
  f.h = fake(0x70000);
  f.ldh = f.gemm.n / 2;
  f.gate_linear = GateLinear::kHalves;
  expect_rejected(f, "gate_linear kHalves needs W k-contiguous (w_stride_k == 1");
  f.gemm.w_stride_k = 1;  // the transposed view of an (E, 2I, H) tensor: read in place
  f.gemm.w_stride_n = f.gemm.k;
  EXPECT_TRUE(cute_moe::validate(f).ok()) << cute_moe::validate(f).message;
  f.act.activation = cute_moe::Activation::kSrelu;
  f.act.has_limit = false;
  f.ldh = f.gemm.n;
  expect_rejected(f, "gate_linear kHalves needs a gated activation, got srelu");

  // W_down^T (E, H, I) n-contiguous, n = I
  cute_moe::ActBackwardArgs b = gated_backward(valid_m());
  b.dpre_layout = GateLinear::kHalves;
  EXPECT_TRUE(cute_moe::validate(b).ok()) << cute_moe::validate(b).message;
  b.gemm.w_stride_k = 1;
  b.gemm.w_stride_n = b.gemm.k;
  expect_rejected(b, "dpre_layout kHalves needs W n-contiguous (w_stride_n == 1), got w_stride_n=1440");
  b.gemm.w_stride_k = b.gemm.n;
  b.gemm.w_stride_n = 1;
  b.act.activation = cute_moe::Activation::kIdentity;
  b.act.has_limit = false;
  b.ldpre = b.lddpre = b.gemm.n;
  expect_rejected(b, "dpre_layout kHalves needs a gated activation, got none");
}

TEST(ValidateRaggedM, SplitWeightRules) {
  // W's k rows in two tensors (ragged_m_gemm only): k_split a positive multiple of 128 below k
  RaggedMGemmArgs a = valid_m();  // k = 1440
  a.w_hi = fake(0x60000);
  a.k_split = 768;
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  a.k_split = 720;  expect_rejected(a, "k_split (W's rows from w, the rest from w_hi) must be a positive multiple "
                                       "of 128 below k=1440, got k_split=720");
  a.k_split = 1536; expect_rejected(a, "got k_split=1536");
  a.k_split = 0;    expect_rejected(a, "got k_split=0");
  a.k_split = 768;
  a.w_hi = fake(0x60008); expect_rejected(a, "w_hi must be 16-byte aligned");
  a.w_hi = nullptr;       expect_rejected(a, "w_hi must not be null");
  // k-contiguous W: each tensor's rows span only its own k rows
  a = valid_m();
  a.w_hi = fake(0x60000);
  a.k_split = 1024;
  a.w_stride_k = 1; a.w_stride_n = 1024;
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  a.w_stride_n = 1016; expect_rejected(a, "w_stride_n=1016");

  RaggedMGemmArgs split = valid_m();
  split.w_hi = fake(0x60000);
  split.k_split = 768;
  cute_moe::ActBackwardArgs b = gated_backward(split);
  expect_rejected(b, "act_backward: w_hi / k_split (W's k rows in two tensors) are taken by ragged_m_gemm only");
}

TEST(ValidateActivation, HalvesAsTwoTensorsRules) {
  using cute_moe::GateLinear;
  cute_moe::ActForwardArgs f;
  f.gemm = valid_m();  // n = 2880 = 2I, the gate half at w
  f.gemm.w_stride_k = 1;
  f.gemm.w_stride_n = f.gemm.k;
  f.gemm.w_stride_group = f.gemm.k * f.gemm.n / 2;
  f.h = fake(0x70000);
  f.ldh = f.gemm.n / 2;
  f.w_linear = fake(0x30000 + 0x1000);  // 4096 bytes after the gate half
  expect_rejected(f, "w_linear (the linear half as its own tensor) needs gate_linear kHalves");
  f.gate_linear = GateLinear::kHalves;
  EXPECT_TRUE(cute_moe::validate(f).ok()) << cute_moe::validate(f).message;
  f.w_linear = fake(0x30000 - 0x1000);  // before the gate half: served without a bias
  EXPECT_TRUE(cute_moe::validate(f).ok()) << cute_moe::validate(f).message;
  f.gemm.bias = fake<const void>(0x80000);
  f.gemm.bias_stride_group = f.gemm.n;
  expect_rejected(f, "w_linear before w (the gate half) is served without a bias only");
  expect_rejected(f, "got a bias and w_linear 4096 bytes before w");
  f.w_linear = fake(0x30000 + 0x1000);
  EXPECT_TRUE(cute_moe::validate(f).ok()) << cute_moe::validate(f).message;  // after it, with a bias
  f.w_linear = fake(0x30000 - 0x1008);
  expect_rejected(f, "w_linear must lie a multiple of 16 bytes and less than 2^40 bytes from w (the gate half), "
                     "not on it (one TMA stride spans the two tensors), got -4104 bytes");
  f.w_linear = fake(0x30000 + (uintptr_t(1) << 40));
  expect_rejected(f, "got 1099511627776 bytes");
  f.w_linear = fake(0x30000);
  expect_rejected(f, "got 0 bytes");
}

TEST(LowerActForward, HalvesBeforeTheGateHalfLoadSwappedPairs) {
  using cute_moe::GateLinear;
  cute_moe::ActForwardArgs f;
  f.gemm = valid_m();
  f.gemm.w_stride_k = 1;
  f.gemm.w_stride_n = f.gemm.k;
  f.gemm.w_stride_group = f.gemm.k * f.gemm.n / 2;
  f.h = fake(0x70000);
  f.ldh = f.gemm.n / 2;
  f.gate_linear = GateLinear::kHalves;
  f.w_linear = fake(0x30000 + 0x1000);
  cute_moe::detail::GemmProblem p = cute_moe::detail::lower(f);
  EXPECT_EQ(p.b.ptr, f.gemm.w);
  EXPECT_EQ(p.b_linear, f.w_linear);
  EXPECT_FALSE(p.b_pairs_swapped);
  f.w_linear = fake(0x30000 - 0x1000);
  p = cute_moe::detail::lower(f);
  EXPECT_EQ(p.b.ptr, f.w_linear);  // based at the lower tensor, the linear half
  EXPECT_EQ(p.b_linear, f.gemm.w);
  EXPECT_TRUE(p.b_pairs_swapped);
}

TEST(StatusNames, AreReadable) {
  EXPECT_STREQ(cute_moe::status_name(Status::kInvalidArgument), "invalid argument");
  EXPECT_STREQ(cute_moe::dtype_name(cute_moe::DType::kF32), "float32");
}

}  // namespace

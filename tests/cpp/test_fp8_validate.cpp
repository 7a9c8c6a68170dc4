// Argument validation of the FP8 quantizers and the FP8 grouped GEMM: each rule rejects with a message naming the
// argument and its value; valid and empty arguments pass.
#include <gtest/gtest.h>

#include "cute_moe/fp8_gemm.h"
#include "cute_moe/fp8_quantize.h"
#include "validate_test_util.h"

namespace {

using cute_moe::QuantizeFp8RowsArgs;
using cute_moe::QuantizeFp8TilesArgs;
using cute_moe::test::expect_rejected;
using cute_moe::test::fake;

QuantizeFp8RowsArgs valid_rows() {
  QuantizeFp8RowsArgs a;
  a.rows = 4096; a.cols = 2880;
  a.src = fake(0x10000); a.ld_src = a.cols;
  a.q = fake(0x20000); a.ld_q = a.cols;
  a.scale = fake<float>(0x30000);
  return a;
}

QuantizeFp8TilesArgs valid_tiles() {
  QuantizeFp8TilesArgs a;
  a.batches = 32; a.k = 2880; a.n = 5760;
  a.src = fake(0x10000); a.ld_src = a.n; a.batch_stride_src = a.k * a.n;
  a.q = fake(0x20000); a.scale = fake<float>(0x30000);
  a.q_t = fake(0x40000); a.scale_t = fake<float>(0x50000);
  return a;
}

TEST(Fp8QuantizeValidate, ValidArgumentsPass) {
  EXPECT_TRUE(cute_moe::validate(valid_rows()).ok()) << cute_moe::validate(valid_rows()).message;
  EXPECT_TRUE(cute_moe::validate(valid_tiles()).ok()) << cute_moe::validate(valid_tiles()).message;
  QuantizeFp8TilesArgs only_t = valid_tiles();
  only_t.q = nullptr; only_t.scale = nullptr;
  EXPECT_TRUE(cute_moe::validate(only_t).ok()) << cute_moe::validate(only_t).message;
  QuantizeFp8RowsArgs empty;
  EXPECT_TRUE(cute_moe::validate(empty).ok()) << cute_moe::validate(empty).message;
}

TEST(Fp8QuantizeValidate, RejectsBadShapesAndLayouts) {
  QuantizeFp8RowsArgs r = valid_rows();
  r.cols = 2888; r.ld_src = r.ld_q = 2896;
  expect_rejected(r, "cols must be a non-negative multiple of 16, got cols=2888");
  r = valid_rows();
  r.ld_src = 2872;
  expect_rejected(r, "ld_src must be a multiple of 16 elements and >= 2880, got ld_src=2872");
  r = valid_rows();
  r.q = fake(0x20008);
  expect_rejected(r, "q must be 16-byte aligned");
  r = valid_rows();
  r.scale = nullptr;
  expect_rejected(r, "scale must not be null");
  r = valid_rows();  // the gather: an aligned index and the rows it selects from
  r.index = fake<const int32_t>(0x40000);
  r.src_rows = 1024;
  EXPECT_TRUE(cute_moe::validate(r).ok()) << cute_moe::validate(r).message;
  r.src_rows = 0;
  expect_rejected(r, "src_rows must be >= 1 with an index (the rows index selects from), got src_rows=0");
  r.src_rows = 1024;
  r.index = fake<const int32_t>(0x40002);
  expect_rejected(r, "index must be 4-byte aligned");
  QuantizeFp8TilesArgs t = valid_tiles();
  t.ld_q_t = 2872;  // q_t's row pitch below k
  expect_rejected(t, "ld_q_t must be a multiple of 16 elements and >= 2880, got ld_q_t=2872");
  t.ld_q_t = 2944;
  EXPECT_TRUE(cute_moe::validate(t).ok()) << cute_moe::validate(t).message;
  t = valid_tiles();
  t.q = nullptr; t.q_t = nullptr;
  expect_rejected(t, "q and q_t are both null");
  t = valid_tiles();
  t.k = 2884;
  expect_rejected(t, "k must be a non-negative multiple of 16, got k=2884");
  t = valid_tiles();
  t.batch_stride_src = 16;
  expect_rejected(t, "batch_stride_src must be a multiple of 16 elements and >= k * ld_src=16588800");
  t = valid_tiles();
  t.scale_t = nullptr;
  expect_rejected(t, "scale_t must not be null");
}

cute_moe::QuantizeFp8GroupColumnsArgs valid_group_columns() {
  cute_moe::QuantizeFp8GroupColumnsArgs a;
  a.rows = 4096; a.cols = 2880; a.num_groups = 32;
  a.offs = fake<const int32_t>(0x1000);
  a.src = fake(0x10000); a.ld_src = a.cols;
  a.ld_q_t = 128 * cute_moe::fp8_group_row_blocks(a.rows, a.num_groups);  // 128 * (32 + 32)
  a.q_t = fake(0x20000); a.scale = fake<float>(0x30000);
  return a;
}

TEST(Fp8QuantizeValidate, GroupColumns) {
  EXPECT_EQ(cute_moe::fp8_group_row_blocks(4096, 32), 64);
  EXPECT_EQ(cute_moe::fp8_group_row_blocks(1, 1), 2);
  EXPECT_TRUE(cute_moe::validate(valid_group_columns()).ok()) << cute_moe::validate(valid_group_columns()).message;
  cute_moe::QuantizeFp8GroupColumnsArgs a = valid_group_columns();
  a.rows = 0; a.src = nullptr;  // no rows: q_t and scale still written (zeros, ones)
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  a = valid_group_columns();
  a.ld_q_t = 8176;
  expect_rejected(a, "ld_q_t must be a multiple of 16 elements and >= 8192, got ld_q_t=8176");
  a = valid_group_columns();
  a.cols = 2888;
  expect_rejected(a, "cols must be a non-negative multiple of 16, got cols=2888");
  a = valid_group_columns();
  a.num_groups = 0;
  expect_rejected(a, "num_groups must be in [1, 65536], got 0");
  a = valid_group_columns();
  a.scale = nullptr;
  expect_rejected(a, "scale must not be null");
}

// dpre of the GPT-OSS-20B up projection: (m, 5760) rows in 32 groups, with b_up's gradient.
cute_moe::QuantizeFp8RowsColumnSumsArgs valid_rows_column_sums() {
  cute_moe::QuantizeFp8RowsColumnSumsArgs a;
  a.rows = valid_rows();
  a.rows.cols = a.rows.ld_src = a.rows.ld_q = 5760;
  a.num_groups = 32;
  a.offs = fake<const int32_t>(0x1000);
  a.sums = fake<float>(0x60000);
  return a;
}

TEST(Fp8QuantizeValidate, RowsColumnSums) {
  cute_moe::QuantizeFp8RowsColumnSumsArgs a = valid_rows_column_sums();
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  size_t bytes = 0;
  ASSERT_TRUE(cute_moe::workspace_size(a, &bytes).ok());
  EXPECT_EQ(bytes, size_t((4096 / 128 + 32) * 5760 * 4));  // one fp32 row per (chunk, group) slot
  a.rows.rows = 0; a.rows.src = nullptr;  // no rows: the sums are zeros
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  a = valid_rows_column_sums();
  a.rows.ld_src = 5752;  // the 1x128 rules, named as this call's
  expect_rejected(a, "quantize_fp8_1x128_column_sums: quantize_fp8_1x128: ld_src must be a multiple of 16 elements and >= 5760");
  a = valid_rows_column_sums();
  a.rows.index = fake<const int32_t>(0x40000);
  a.rows.src_rows = 1024;
  expect_rejected(a, "rows.index must be null");
  a = valid_rows_column_sums();
  a.num_groups = 0;
  expect_rejected(a, "num_groups must be in [1, 65536], got 0");
  a = valid_rows_column_sums();
  a.offs = nullptr;
  expect_rejected(a, "offs must not be null");
  a = valid_rows_column_sums();
  a.sums = fake<float>(0x60004);
  expect_rejected(a, "sums must be 16-byte aligned");
}

// The GPT-OSS-20B up projection: x (m, 2880) by 1 x 128 blocks, W^T (32, 5760, 2880).
cute_moe::Fp8RaggedMGemmArgs valid_gemm() {
  cute_moe::Fp8RaggedMGemmArgs a;
  a.m = 4096; a.n = 5760; a.k = 2880; a.num_groups = 32;
  a.offs = fake<const int32_t>(0x1000);
  a.x = fake(0x10000); a.ldx = a.k;
  a.x_scale = fake<const float>(0x20000); a.x_scale_stride_row = 23; a.x_scale_stride_block = 1;
  a.w = fake(0x30000); a.w_stride_n = a.k; a.w_stride_group = a.n * a.k;
  a.w_scale = fake<const float>(0x40000);
  a.w_scale_stride_group = 23 * 45; a.w_scale_stride_k = 1; a.w_scale_stride_n = 23;
  a.y = fake(0x50000); a.ldy = a.n;
  return a;
}

TEST(Fp8QuantizeValidate, ActQuantize) {
  cute_moe::ActQuantizeFp8RowsArgs a;
  a.rows = valid_rows();  // h 2880 wide: a gated activation reads pre 5760 wide
  a.rows.ld_src = 5760;
  a.act.activation = cute_moe::Activation::kSwigluOai;
  a.act.has_limit = true;
  a.act.limit = 7.0f;
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  cute_moe::ActQuantizeFp8RowsArgs b = a;
  b.rows.ld_src = 2880;  // pre's pairs need twice h's width
  expect_rejected(b, "ld_src must be a multiple of 16 elements and >= 5760, got ld_src=2880");
  b = a;
  b.act.activation = cute_moe::Activation::kSrelu;  // not gated: pre as wide as h, no limit
  expect_rejected(b, "srelu takes no clamp limit");
  b.act.has_limit = false;
  b.rows.ld_src = 2880;
  EXPECT_TRUE(cute_moe::validate(b).ok()) << cute_moe::validate(b).message;
  b = a;
  b.act.limit = -1.0f;
  expect_rejected(b, "the activation's limit must be finite and >= 0, got -1");
  b = a;
  b.rows.index = fake<const int32_t>(0x40000);
  b.rows.src_rows = 4096;
  expect_rejected(b, "rows.index must be null: the activation's pass reads pre's rows in place");
  b = a;
  b.act.activation = static_cast<cute_moe::Activation>(99);
  expect_rejected(b, "unknown activation 99");
  b = a;
  b.rows.cols = 2888;
  expect_rejected(b, "cols must be a non-negative multiple of 16, got cols=2888");
}

TEST(Fp8GemmValidate, ValidArgumentsPass) {
  EXPECT_TRUE(cute_moe::validate(valid_gemm()).ok()) << cute_moe::validate(valid_gemm()).message;
  cute_moe::Fp8RaggedMGemmArgs a = valid_gemm();
  a.m = 0; a.x = nullptr; a.y = nullptr; a.x_scale = nullptr;  // no rows: nothing read or written
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  a = valid_gemm();
  a.x_scale_stride_row = 1; a.x_scale_stride_block = 4096;  // a transposed view of the scales
  a.bias = fake(0x60000); a.bias_stride_group = a.n;
  a.row_scale = fake<const float>(0x70004);  // fp32 vectors need 4-byte alignment only
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
}

TEST(Fp8GemmValidate, RejectsBadShapesLayoutsAndScales) {
  cute_moe::Fp8RaggedMGemmArgs a = valid_gemm();
  a.k = 2888; a.ldx = a.w_stride_n = 2896;
  expect_rejected(a, "k must be a positive multiple of 16 (e4m3 rows of 16 bytes for TMA) below 2^31, got k=2888");
  a = valid_gemm();
  a.ldx = 2888;
  expect_rejected(a, "ldx must be a multiple of 16 elements (16 bytes) and >= k=2880, got ldx=2888");
  a = valid_gemm();
  a.w_stride_n = 1;  // an n-contiguous weight: FP8 tensor cores read k-major operands only
  expect_rejected(a, "w_stride_n must be a multiple of 16 elements (16 bytes) and >= k=2880");
  a = valid_gemm();
  a.w_stride_group = 8;
  expect_rejected(a, "w_stride_group must be a non-negative multiple of 16 elements");
  a = valid_gemm();
  a.n = 5764; a.ldy = 5768;
  expect_rejected(a, "n must be a positive multiple of 8");
  a = valid_gemm();
  a.x_scale = nullptr;
  expect_rejected(a, "x_scale must not be null");
  a = valid_gemm();
  a.w_scale = fake<const float>(0x40002);
  expect_rejected(a, "w_scale must be 4-byte aligned");
  a = valid_gemm();
  a.x_scale_stride_row = -23;
  expect_rejected(a, "x_scale's strides must be non-negative, got -23, 1");
  a = valid_gemm();
  a.w_scale_stride_n = -1;
  expect_rejected(a, "w_scale's strides must be non-negative");
  a = valid_gemm();
  a.num_groups = 0;
  expect_rejected(a, "num_groups must be in [1, 65536], got 0");
  a = valid_gemm();
  a.x = fake(0x10008);
  expect_rejected(a, "x must be 16-byte aligned");
}

// The fused activation forms: the GPT-OSS up projection with swiglu_oai (h 2880 wide), and the
// down projection's input gradient (dy (m, 2880) times W_down (32, 2880, 2880) read k-contiguous).
cute_moe::Fp8ActForwardArgs valid_act_forward() {
  cute_moe::Fp8ActForwardArgs a;
  a.gemm = valid_gemm();
  a.h = fake(0x80000); a.ldh = a.gemm.n / 2;
  return a;
}

cute_moe::Fp8ActBackwardArgs valid_act_backward() {
  cute_moe::Fp8ActBackwardArgs a;
  a.gemm = valid_gemm();
  a.gemm.n = 2880; a.gemm.ldy = 2880; a.gemm.w_stride_group = 2880 * 2880;
  a.gemm.row_scale = fake<const float>(0x70000);
  a.pre = fake(0x90000); a.ldpre = 5760;
  a.dpre = fake(0xa0000); a.lddpre = 5760;
  a.row_scale_grad = fake<float>(0xb0000);
  a.out_bias = fake(0xc0000); a.out_bias_stride = 2880;
  a.dy = fake(0xd0000); a.lddy = 2880;
  return a;
}

TEST(Fp8ActValidate, ValidArgumentsPass) {
  EXPECT_TRUE(cute_moe::validate(valid_act_forward()).ok()) << cute_moe::validate(valid_act_forward()).message;
  EXPECT_TRUE(cute_moe::validate(valid_act_backward()).ok()) << cute_moe::validate(valid_act_backward()).message;
  cute_moe::Fp8ActBackwardArgs b = valid_act_backward();
  b.out_bias = nullptr; b.dy = nullptr;  // dy is read for out_bias's term only
  EXPECT_TRUE(cute_moe::validate(b).ok()) << cute_moe::validate(b).message;
  b = valid_act_backward();  // with dpre's 1 x 128 e4m3 copy: 45 blocks of the 5760 columns
  b.dpre_q = fake(0xe0000); b.ld_dpre_q = 5760;
  b.dpre_scale = fake<float>(0xf0000); b.ld_dpre_scale = 45;
  EXPECT_TRUE(cute_moe::validate(b).ok()) << cute_moe::validate(b).message;
  cute_moe::Fp8ActForwardArgs f = valid_act_forward();  // h as its e4m3 copy: 23 blocks of 2880
  f.h = nullptr; f.ldh = 0;
  f.h_q = fake(0xe0000); f.ld_h_q = 2880;
  f.h_scale = fake<float>(0xf0000); f.ld_h_scale = 23;
  EXPECT_TRUE(cute_moe::validate(f).ok()) << cute_moe::validate(f).message;
}

TEST(Fp8ActValidate, RejectsBadHCopy) {
  auto with_copy = [] {
    cute_moe::Fp8ActForwardArgs f = valid_act_forward();
    f.h = nullptr; f.ldh = 0;
    f.h_q = fake(0xe0000); f.ld_h_q = 2880;
    f.h_scale = fake<float>(0xf0000); f.ld_h_scale = 23;
    return f;
  };
  cute_moe::Fp8ActForwardArgs f = with_copy();
  f.h = fake(0xd0000); f.ldh = 2880;
  expect_rejected(f, "fp8_act_forward: h must be null when h_q is given");
  f = with_copy();
  f.h_scale = nullptr;
  expect_rejected(f, "h_q and h_scale come together");
  f = with_copy();
  f.act.activation = cute_moe::Activation::kSrelu;
  f.act.has_limit = false;
  expect_rejected(f, "h_q is written for the gated activations only");
  f = with_copy();
  f.gemm.n = 5744;  // 2I a multiple of 16, not of 32
  expect_rejected(f, "with h_q, n (the up-projection width 2I) must be a multiple of 32");
  f = with_copy();
  f.h_q = fake(0xe0008);
  expect_rejected(f, "h_q must be 16-byte aligned");
  f = with_copy();
  f.ld_h_q = 2872;
  expect_rejected(f, "ld_h_q must be a multiple of 16 bytes and >= h's width n/2=2880, got ld_h_q=2872");
  f = with_copy();
  f.ld_h_scale = 22;
  expect_rejected(f, "ld_h_scale must be >= ceil(n / 256)=23, got ld_h_scale=22");
}

TEST(Fp8ActValidate, RejectsBadArguments) {
  cute_moe::Fp8ActForwardArgs f = valid_act_forward();
  f.gemm.k = 2888;  // the GEMM's rules, named by the fused call
  expect_rejected(f, "fp8_act_forward: k must be a positive multiple of 16");
  f = valid_act_forward();
  f.ldh = 2872;
  expect_rejected(f, "fp8_act_forward: ldh must be a multiple of 8 elements (16 bytes) and >= n/2=2880");
  f = valid_act_forward();
  f.gemm.row_scale = fake<const float>(0x70000);
  expect_rejected(f, "row_scale must be null (it scales the down projection)");
  f = valid_act_forward();
  f.act.activation = cute_moe::Activation::kIdentity;
  f.act.has_limit = false;
  expect_rejected(f, "has no fused forward (h = pre: run fp8_ragged_m_gemm)");
  cute_moe::Fp8ActBackwardArgs b = valid_act_backward();
  b.dy = nullptr;
  expect_rejected(b, "fp8_act_backward: dy must not be null");
  b = valid_act_backward();
  b.ldpre = 2880;
  expect_rejected(b, "ldpre must be a multiple of 8 elements (16 bytes) and >= 2n=5760");
  b = valid_act_backward();
  b.gemm.bias = fake(0x60000); b.gemm.bias_stride_group = 2880;
  expect_rejected(b, "bias must be null (the input gradient has no bias)");
  b = valid_act_backward();
  b.gemm.row_scale = nullptr;
  expect_rejected(b, "row_scale_grad needs row_scale");
  b = valid_act_backward();
  b.dpre_q = fake(0xe0000); b.ld_dpre_q = 5760;
  expect_rejected(b, "dpre_q and dpre_scale come together");
  b.dpre_scale = fake<float>(0xf0000); b.ld_dpre_scale = 44;
  expect_rejected(b, "ld_dpre_scale must be >= ceil(width / 128)=45, got ld_dpre_scale=44");
  b.ld_dpre_scale = 45; b.ld_dpre_q = 5768;
  expect_rejected(b, "ld_dpre_q must be a multiple of 16 bytes and >= dpre's width=5760, got ld_dpre_q=5768");
  b.ld_dpre_q = 5760; b.dpre_q = fake(0xe0008);
  expect_rejected(b, "dpre_q must be 16-byte aligned");
  b.dpre_q = fake(0xe0000); b.act.activation = cute_moe::Activation::kSrelu; b.act.has_limit = false;
  b.ldpre = b.lddpre = 2880; b.ld_dpre_q = 2880; b.ld_dpre_scale = 23;
  expect_rejected(b, "dpre_q is written for the gated activations only");
}

// GPT-OSS-20B's up-projection weight gradient: x (4096, 2880) by 128 x 1 blocks and dpre (4096,
// 5760) by 128 x 128, 32 experts: 64 blocks, a_t (2880, 8192), b_t (5760, 8192).
cute_moe::Fp8RaggedKGemmArgs valid_wgrad() {
  cute_moe::Fp8RaggedKGemmArgs a;
  a.m = 4096; a.k = 2880; a.n = 5760; a.num_groups = 32;
  a.offs = fake<const int32_t>(0x1000);
  a.a_t = fake(0x10000); a.lda_t = 8192;
  a.a_scale = fake<const float>(0x20000); a.a_scale_stride_block = a.k;
  a.b_t = fake(0x30000); a.ldb_t = 8192;
  a.b_scale = fake<const float>(0x40000); a.b_scale_stride_block = 45;  // ceil(n / 128)
  a.dw = fake(0x50000);
  return a;
}

TEST(Fp8WgradValidate, ValidArgumentsPass) {
  EXPECT_TRUE(cute_moe::validate(valid_wgrad()).ok()) << cute_moe::validate(valid_wgrad()).message;
  cute_moe::Fp8RaggedKGemmArgs a = valid_wgrad();
  a.m = 0; a.a_t = a.b_t = nullptr; a.a_scale = a.b_scale = nullptr;  // no rows: dw is zeros
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
}

TEST(Fp8WgradValidate, RejectsBadArguments) {
  cute_moe::Fp8RaggedKGemmArgs a = valid_wgrad();
  a.k = 2888;
  expect_rejected(a, "fp8_ragged_k_gemm: k (rows of each dw[e]) must be a positive multiple of 16 below 2^31, got k=2888");
  a = valid_wgrad();
  a.n = 5768;
  expect_rejected(a, "n (columns of each dw[e]) must be a positive multiple of 16");
  a = valid_wgrad();
  a.lda_t = 8176;  // fewer columns than the 64 blocks
  expect_rejected(a, "lda_t must be a multiple of 16 elements (16 bytes) and >= 128 * (ceil(m / 128) + num_groups)=8192, got lda_t=8176");
  a = valid_wgrad();
  a.ldb_t = 8200;
  expect_rejected(a, "ldb_t must be a multiple of 16 elements");
  a = valid_wgrad();
  a.a_scale_stride_block = 2879;
  expect_rejected(a, "a_scale_stride_block must be >= k=2880, got 2879");
  a = valid_wgrad();
  a.b_scale_stride_block = 44;
  expect_rejected(a, "b_scale_stride_block must be >= ceil(n / 128)=45, got 44");
  a = valid_wgrad();
  a.b_scale = nullptr;
  expect_rejected(a, "b_scale must not be null");
  a = valid_wgrad();
  a.dw = nullptr;
  expect_rejected(a, "dw must not be null");
  a = valid_wgrad();
  a.num_groups = 0;
  expect_rejected(a, "num_groups must be in [1, 65536], got 0");
}

}  // namespace

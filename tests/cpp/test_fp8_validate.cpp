// Argument validation of the FP8 quantizers: each rule rejects with a message naming the
// argument and its value; valid and empty arguments pass.
#include <gtest/gtest.h>

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
  QuantizeFp8TilesArgs t = valid_tiles();
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

}  // namespace

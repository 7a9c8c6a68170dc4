// Argument validation of the permute / unpermute gathers: each rule rejects with a
// message naming the argument and its value; valid and empty arguments pass.
#include <gtest/gtest.h>

#include "cute_moe/permute.h"
#include "validate_test_util.h"

namespace {

using cute_moe::GatherRowsArgs;
using cute_moe::GatherRowsDotArgs;
using cute_moe::GatherSumRowsArgs;
using cute_moe::test::expect_rejected;
using cute_moe::test::fake;

GatherRowsArgs valid_rows() {
  GatherRowsArgs a;
  a.rows = 4096; a.cols = 2880; a.src_rows = 1024;
  a.src = fake(0x10000); a.ld_src = a.cols;
  a.index = fake<const int32_t>(0x20000);
  a.out = fake(0x30000); a.ld_out = a.cols;
  return a;
}

GatherSumRowsArgs valid_sum() {
  GatherSumRowsArgs a;
  a.rows = 1024; a.k = 4; a.cols = 2880; a.src_rows = 4096;
  a.src = fake(0x10000); a.ld_src = a.cols;
  a.index = fake<const int32_t>(0x20000);
  a.weight = fake<const float>(0x28000);
  a.out = fake(0x30000); a.ld_out = a.cols;
  return a;
}

GatherRowsDotArgs valid_dot() {
  GatherRowsDotArgs a;
  a.rows = 1024; a.k = 4; a.cols = 2880; a.src_rows = 4096;
  a.a = fake(0x10000); a.ld_a = a.cols;
  a.src = fake(0x18000); a.ld_src = a.cols;
  a.index = fake<const int32_t>(0x20000);
  a.out = fake<float>(0x30000);
  return a;
}

TEST(PermuteValidate, ValidArgumentsPass) {
  EXPECT_TRUE(cute_moe::validate(valid_rows()).ok()) << cute_moe::validate(valid_rows()).message;
  EXPECT_TRUE(cute_moe::validate(valid_sum()).ok()) << cute_moe::validate(valid_sum()).message;
  EXPECT_TRUE(cute_moe::validate(valid_dot()).ok()) << cute_moe::validate(valid_dot()).message;
  GatherRowsArgs strided = valid_rows();
  strided.ld_src = 4096;  // a view into wider rows
  EXPECT_TRUE(cute_moe::validate(strided).ok());
}

TEST(PermuteValidate, EmptyOperandsNeedNoPointers) {
  GatherRowsArgs r;  // all zero: nothing to read or write
  EXPECT_TRUE(cute_moe::validate(r).ok()) << cute_moe::validate(r).message;
  GatherSumRowsArgs s = valid_sum();
  s.k = 0; s.index = nullptr; s.weight = nullptr; s.src = nullptr; s.src_rows = 0;
  EXPECT_TRUE(cute_moe::validate(s).ok()) << cute_moe::validate(s).message;  // zeros out
  GatherRowsDotArgs d = valid_dot();
  d.cols = 0; d.a = nullptr; d.src = nullptr; d.ld_a = d.ld_src = 1;
  EXPECT_TRUE(cute_moe::validate(d).ok()) << cute_moe::validate(d).message;  // zeros out
}

TEST(PermuteValidate, RejectsBadShapes) {
  GatherRowsArgs a = valid_rows();
  a.cols = 2884;
  a.ld_src = a.ld_out = 2888;
  expect_rejected(a, "cols must be a non-negative multiple of 8");
  expect_rejected(a, "cols=2884");
  a = valid_rows();
  a.rows = -1;
  expect_rejected(a, "rows must be >= 0, got rows=-1");
  GatherSumRowsArgs s = valid_sum();
  s.k = -2;
  expect_rejected(s, "k must be >= 0, got k=-2");
  GatherRowsDotArgs d = valid_dot();
  d.src_rows = -5;
  expect_rejected(d, "src_rows must be >= 0, got src_rows=-5");
}

TEST(PermuteValidate, RejectsBadStridesAndPointers) {
  GatherRowsArgs a = valid_rows();
  a.ld_src = 2884;
  expect_rejected(a, "ld_src must be a multiple of 8 elements (16 bytes) and >= cols=2880, got ld_src=2884");
  a = valid_rows();
  a.ld_out = 1440;
  expect_rejected(a, "got ld_out=1440");
  a = valid_rows();
  a.src = fake(0x10008);
  expect_rejected(a, "src must be 16-byte aligned");
  a = valid_rows();
  a.index = nullptr;
  expect_rejected(a, "index must not be null");
  a = valid_rows();
  a.scale = fake<const float>(0x20002);
  expect_rejected(a, "scale must be 4-byte aligned");
  GatherSumRowsArgs s = valid_sum();
  s.out = nullptr;
  expect_rejected(s, "out must not be null");
  GatherRowsDotArgs d = valid_dot();
  d.a = fake(0x10004);
  expect_rejected(d, "a must be 16-byte aligned");
  d = valid_dot();
  d.out = nullptr;
  expect_rejected(d, "out must not be null");
}

TEST(PermuteValidate, MessagesNameTheOp) {
  GatherRowsArgs a = valid_rows();
  a.index = nullptr;
  EXPECT_EQ(cute_moe::validate(a).message.rfind("gather_rows: ", 0), 0u);
  GatherSumRowsArgs s = valid_sum();
  s.index = nullptr;
  EXPECT_EQ(cute_moe::validate(s).message.rfind("gather_sum_rows: ", 0), 0u);
  GatherRowsDotArgs d = valid_dot();
  d.index = nullptr;
  EXPECT_EQ(cute_moe::validate(d).message.rfind("gather_rows_dot: ", 0), 0u);
}

}  // namespace

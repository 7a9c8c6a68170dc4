// Argument validation of the routing kernels (top_k, sort_by_expert) and sort_by_expert's
// workspace size: each rule rejects with a message naming the argument and its value.
#include <gtest/gtest.h>

#include "cute_moe/routing.h"
#include "expert_sort_slices.h"
#include "validate_test_util.h"

namespace {

using cute_moe::SortByExpertArgs;
using cute_moe::TopKArgs;
using cute_moe::test::expect_rejected;
using cute_moe::test::fake;

TopKArgs valid_top_k() {
  TopKArgs a;
  a.rows = 24576; a.cols = 128; a.k = 8;
  a.logits = fake<const float>(0x10000); a.ld_logits = a.cols;
  a.values = fake<float>(0x20000);
  a.indices = fake<int64_t>(0x30000);
  return a;
}

SortByExpertArgs valid_sort() {
  SortByExpertArgs a;
  a.rows = 24576; a.k = 4; a.num_experts = 32;
  a.experts = fake(0x10000);
  a.weights = fake<const float>(0x20000);
  a.row_token = fake<int32_t>(0x30000);
  a.token_rows = fake<int32_t>(0x40000);
  a.offs = fake<int32_t>(0x50000);
  a.prob = fake<float>(0x60000);
  a.workspace = fake(0x70000);
  return a;
}

TEST(RoutingValidate, ValidArgumentsPass) {
  EXPECT_TRUE(cute_moe::validate(valid_top_k()).ok()) << cute_moe::validate(valid_top_k()).message;
  EXPECT_TRUE(cute_moe::validate(valid_sort()).ok()) << cute_moe::validate(valid_sort()).message;
  SortByExpertArgs s = valid_sort();
  s.weights = nullptr; s.prob = nullptr;  // no router weights to sort
  EXPECT_TRUE(cute_moe::validate(s).ok()) << cute_moe::validate(s).message;
  s.experts_int32 = true;
  EXPECT_TRUE(cute_moe::validate(s).ok()) << cute_moe::validate(s).message;
}

TEST(RoutingValidate, NoEntriesNeedOnlyOffs) {
  TopKArgs t = valid_top_k();
  t.rows = 0; t.logits = nullptr; t.values = nullptr; t.indices = nullptr;
  EXPECT_TRUE(cute_moe::validate(t).ok()) << cute_moe::validate(t).message;
  SortByExpertArgs s;
  s.rows = 0; s.k = 4; s.num_experts = 8; s.offs = fake<int32_t>(0x50000);
  EXPECT_TRUE(cute_moe::validate(s).ok()) << cute_moe::validate(s).message;  // offs all zero
  s.offs = nullptr;
  expect_rejected(s, "offs must not be null");
}

TEST(RoutingValidate, TopKRejectsBadSizes) {
  TopKArgs a = valid_top_k();
  a.cols = 513; a.ld_logits = 513;
  expect_rejected(a, "cols must be in [1, 512], got cols=513");
  a = valid_top_k();
  a.k = 9; a.cols = 8; a.ld_logits = 8;
  expect_rejected(a, "k must be in [1, min(cols, 32)], got k=9 with cols=8");
  a = valid_top_k();
  a.k = 33; a.cols = 64; a.ld_logits = 64;
  expect_rejected(a, "got k=33");
  a = valid_top_k();
  a.k = 0;
  expect_rejected(a, "got k=0");
  a = valid_top_k();
  a.ld_logits = 100;
  expect_rejected(a, "ld_logits must be >= cols=128, got ld_logits=100");
  a = valid_top_k();
  a.indices = fake<int64_t>(0x30004);
  expect_rejected(a, "indices must be 8-byte aligned");
  a = valid_top_k();
  a.values = nullptr;
  expect_rejected(a, "values must not be null");
  EXPECT_EQ(cute_moe::validate(a).message.rfind("top_k: ", 0), 0u);
}

TEST(RoutingValidate, SortRejectsBadSizesAndPointers) {
  SortByExpertArgs a = valid_sort();
  a.num_experts = 0;
  expect_rejected(a, "num_experts must be in [1, 1024], got num_experts=0");
  a.num_experts = 1025;
  expect_rejected(a, "got num_experts=1025");
  a = valid_sort();
  a.rows = int64_t{1} << 30; a.k = 2;
  expect_rejected(a, "rows * k must be below 2^31");
  a = valid_sort();
  a.k = -1;
  expect_rejected(a, "k must be >= 0, got k=-1");
  a = valid_sort();
  a.experts = fake(0x10004);  // int64 ids
  expect_rejected(a, "experts must be 8-byte aligned");
  a.experts_int32 = true;
  EXPECT_TRUE(cute_moe::validate(a).ok()) << cute_moe::validate(a).message;
  a = valid_sort();
  a.prob = nullptr;
  expect_rejected(a, "prob must not be null");
  a = valid_sort();
  a.weights = nullptr;
  expect_rejected(a, "prob is written only with weights");
  a = valid_sort();
  a.workspace = nullptr;
  expect_rejected(a, "workspace must not be null");
  EXPECT_EQ(cute_moe::validate(a).message.rfind("sort_by_expert: ", 0), 0u);
}

TEST(RoutingValidate, SortSlicesKeepTheScanTableSmall) {
  namespace d = cute_moe::detail;
  // GPT-OSS-20B (24576 tokens x 4 of 32), Qwen3-30B-A3B (16384 x 8 of 128), and a large call
  for (auto [entries, experts] : {std::pair<int64_t, int64_t>{98304, 32}, {131072, 128}, {int64_t{1} << 24, 1024}}) {
    const int64_t slice = d::sort_slice_entries(entries, experts), slices = d::sort_slices(entries, experts);
    EXPECT_EQ(slice % 32, 0);
    EXPECT_GE(slice, d::kSortMinSlice);
    EXPECT_GE(slice * slices, entries);
    EXPECT_LT((slices - 1) * slice, entries);
    EXPECT_LE(d::sort_buckets(experts) * slices, d::kSortScanCells + d::sort_buckets(experts));
    EXPECT_EQ(cute_moe::sort_by_expert_workspace_bytes(entries, experts),
              static_cast<size_t>(d::sort_buckets(experts) * slices) * sizeof(int32_t));
  }
  EXPECT_EQ(d::sort_slices(98304, 32), 384);  // slices of 256 entries
  EXPECT_EQ(d::sort_slices(0, 32), 0);
  EXPECT_EQ(cute_moe::sort_by_expert_workspace_bytes(0, 32), 0u);
}

}  // namespace

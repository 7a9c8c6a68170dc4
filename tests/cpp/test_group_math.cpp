// Per-group math shared by the host and the setup kernels, and the slot scheme of the
// deterministic column sums, checked on random routings.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "group_column_sum.h"
#include "group_setup.h"
#include "ragged_k_order.h"

namespace {

using namespace cute_moe::detail;

std::vector<int32_t> random_offsets(std::mt19937& rng, int groups, int max_rows, double empty_fraction) {
  std::vector<int32_t> offs(groups);
  std::uniform_int_distribution<int> rows(0, max_rows);
  std::bernoulli_distribution empty(empty_fraction);
  int32_t total = 0;
  for (int e = 0; e < groups; ++e) {
    total += empty(rng) ? 0 : rows(rng);
    offs[e] = total;
  }
  return offs;
}

TEST(GroupRows, CumulativeEndOffsets) {
  const std::vector<int32_t> offs = {128, 192, 192, 448};
  EXPECT_EQ(group_rows(offs.data(), 0).begin, 0);
  EXPECT_EQ(group_rows(offs.data(), 0).end, 128);
  EXPECT_EQ(group_rows(offs.data(), 2).count(), 0);
  EXPECT_EQ(group_rows(offs.data(), 3).begin, 192);
  EXPECT_TRUE(group_rows(offs.data(), 3).valid(448));
  EXPECT_FALSE(group_rows(offs.data(), 3).valid(447));  // past m
  const std::vector<int32_t> decreasing = {10, 5};
  EXPECT_FALSE(group_rows(decreasing.data(), 1).valid(100));
  const std::vector<int32_t> negative = {-1};
  EXPECT_FALSE(group_rows(negative.data(), 0).valid(100));
}

TEST(ProblemShapes, RaggedMAndRaggedK) {
  int32_t s[3];
  ragged_m_problem({100, 164}, 5760, 2880, s);
  EXPECT_EQ(s[0], 64); EXPECT_EQ(s[1], 5760); EXPECT_EQ(s[2], 2880);
  ragged_m_problem({164, 164}, 5760, 2880, s);
  EXPECT_EQ(s[0], 0);  // an empty group has no tile
  ragged_k_problem({100, 164}, 2880, 5760, s);
  EXPECT_EQ(s[0], 5760); EXPECT_EQ(s[1], 2880); EXPECT_EQ(s[2], 64);
  ragged_k_problem({164, 164}, 2880, 5760, s);
  EXPECT_EQ(s[0], 5760);  // whole output tiles, no k-blocks: the GEMM stores zeros
  EXPECT_EQ(s[1], 2880);
  EXPECT_EQ(s[2], 0);
  // FP8: the reduction in whole 128-row blocks (zero-filled past the group's last row)
  ragged_k_problem({100, 164}, 2880, 5760, s, kRowBlock);
  EXPECT_EQ(s[2], 128);
  ragged_k_problem({0, 257}, 2880, 5760, s, kRowBlock);
  EXPECT_EQ(s[2], 384);
  ragged_k_problem({164, 164}, 2880, 5760, s, kRowBlock);
  EXPECT_EQ(s[2], 0);
  EXPECT_EQ(row_blocks({100, 164}), 1);
  EXPECT_EQ(row_blocks({0, 256}), 2);
  EXPECT_EQ(row_blocks({0, 257}), 3);
  EXPECT_EQ(row_blocks({7, 7}), 0);
}

// A problem with every optional operand present (fake pointers: only carved, never read).
GemmProblem full_problem(int32_t groups) {
  GemmProblem p;
  p.num_groups = groups;
  auto fake = [](uintptr_t v) { return reinterpret_cast<const void*>(v); };
  p.bias = fake(0x100);
  p.c = {fake(0x200), 8};
  p.aux = {fake(0x300), 8};
  p.row_scale = static_cast<const float*>(fake(0x400));
  p.row_scale_grad = true;
  p.gather_rows = static_cast<const int32_t*>(fake(0x500));
  return p;
}

TEST(GroupArrays, CarvedArraysAreAlignedAndDisjoint) {
  for (int32_t groups : {1, 3, 32, 1000, 65536}) {
    const GemmProblem p = full_problem(groups);
    const size_t bytes = group_arrays_bytes(p);
    std::vector<char> buf(bytes + 128);
    char* base = buf.data() + (128 - reinterpret_cast<uintptr_t>(buf.data()) % 128) % 128;
    GroupArrays g = carve_group_arrays(base, p);
    auto at = [](const auto* q) { return reinterpret_cast<const char*>(q); };
    const size_t e = static_cast<size_t>(groups);
    std::vector<std::pair<const char*, size_t>> arrays = {
        {at(g.problem_shapes), 12 * e}, {at(g.a), 8 * e},     {at(g.b), 8 * e},        {at(g.d), 8 * e},
        {at(g.bias), 8 * e},            {at(g.lda), 8 * e},   {at(g.ldb), 8 * e},      {at(g.ldd), 8 * e},
        {at(g.c), 8 * e},               {at(g.ldc), 8 * e},   {at(g.row_scale), 8 * e},
        {at(g.row_partial), 8 * e},     {at(g.gather_rows), 8 * e}};
    std::sort(arrays.begin(), arrays.end());
    for (size_t i = 0; i < arrays.size(); ++i) {
      ASSERT_NE(arrays[i].first, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(arrays[i].first) % 128, 0u);
      EXPECT_GE(arrays[i].first, base);
      EXPECT_LE(arrays[i].first + arrays[i].second, base + bytes);
      if (i > 0) EXPECT_GE(arrays[i].first, arrays[i - 1].first + arrays[i - 1].second);
    }
  }
}

// The arrays of absent operands are not carved: null (what the kernels read as "absent")
// and no bytes.
TEST(GroupArrays, AProblemCarvesOnlyWhatItUses) {
  GemmProblem plain;
  plain.num_groups = 32;
  std::vector<char> buf(group_arrays_bytes(full_problem(32)) + 128);
  char* base = buf.data() + (128 - reinterpret_cast<uintptr_t>(buf.data()) % 128) % 128;
  const GroupArrays g = carve_group_arrays(base, plain);
  for (const void* absent : {static_cast<const void*>(g.bias), static_cast<const void*>(g.c),
                             static_cast<const void*>(g.ldc), static_cast<const void*>(g.row_scale),
                             static_cast<const void*>(g.row_partial), static_cast<const void*>(g.gather_rows)}) {
    EXPECT_EQ(absent, nullptr);
  }
  EXPECT_NE(g.a, nullptr);
  EXPECT_NE(g.ldd, nullptr);
  EXPECT_EQ(group_arrays_bytes(plain), 384u + 6 * 256u);  // shapes (32 x 12 bytes) + a, b, d, lda, ldb, ldd (32 x 8)
  EXPECT_LT(group_arrays_bytes(plain), group_arrays_bytes(full_problem(32)));
}

// A weight-gradient launch carves its groups' walking order (E ids, then the count of
// non-empty groups, M, N and the dynamic schedule's ticket counter) right after the problem
// shapes, in the same array.
TEST(GroupArrays, RaggedKCarvesItsOrderAfterTheShapes) {
  for (int32_t groups : {1, 128, 1024, 1025}) {
    GemmProblem p;
    p.variant = KernelVariant::RaggedK_OutBF16;
    p.num_groups = groups;
    std::vector<char> buf(group_arrays_bytes(p) + 128);
    char* base = buf.data() + (128 - reinterpret_cast<uintptr_t>(buf.data()) % 128) % 128;
    const GroupArrays g = carve_group_arrays(base, p);
    const size_t shapes_and_order = 4 * (3 * size_t(groups) + size_t(ragged_k_order_words(groups)));
    EXPECT_GE(reinterpret_cast<const char*>(g.a), reinterpret_cast<const char*>(g.problem_shapes) + shapes_and_order);
    GemmProblem ragged_m = p;
    ragged_m.variant = KernelVariant::RaggedM_BRow;
    EXPECT_LE(group_arrays_bytes(ragged_m), group_arrays_bytes(p));  // equal where alignment absorbs it
    if (groups >= 128) EXPECT_LT(group_arrays_bytes(ragged_m), group_arrays_bytes(p));
  }
}

// The walking order of a weight-gradient launch: ragged_k_rank gives every group a distinct
// place, deepest first, ties by id, empty groups last (what the setup kernel writes).
TEST(RaggedKOrder, RanksArePermutationDeepestFirst) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 100; ++trial) {
    const int32_t groups = 1 + static_cast<int32_t>(rng() % 200);
    std::vector<int32_t> rows(groups);
    for (auto& r : rows) r = (rng() % 4 == 0) ? 0 : static_cast<int32_t>(rng() % 40);  // ties and empties
    std::vector<int32_t> order(groups, -1);
    for (int32_t e = 0; e < groups; ++e) {
      const int32_t rank = ragged_k_rank(rows.data(), groups, e);
      ASSERT_GE(rank, 0);
      ASSERT_LT(rank, groups);
      ASSERT_EQ(order[rank], -1) << "two groups ranked " << rank;
      order[rank] = e;
    }
    for (int32_t i = 1; i < groups; ++i) {
      const int32_t a = order[i - 1], b = order[i];
      EXPECT_TRUE(rows[a] > rows[b] || (rows[a] == rows[b] && a < b)) << "place " << i;
    }
  }
}

// Host model of pass 1 of the column sums: the (chunk, group) pairs that share rows.
std::vector<std::pair<int64_t, int64_t>> chunk_group_pairs(const std::vector<int32_t>& offs) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  const int64_t used = offs.back();
  for (int64_t c = 0; c < column_sum_chunks(used); ++c) {
    const int64_t lo = c * kColumnSumChunkRows, hi = std::min(lo + kColumnSumChunkRows, used);
    for (int64_t g = 0; g < static_cast<int64_t>(offs.size()); ++g) {
      const GroupRows r = group_rows(offs.data(), static_cast<int32_t>(g));
      if (std::max(r.begin, lo) < std::min(r.end, hi)) pairs.emplace_back(c, g);
    }
  }
  return pairs;
}

TEST(ColumnSumSlots, AreUniqueAndInBoundsOnRandomRoutings) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    const int groups = 1 + static_cast<int>(rng() % 300);
    const auto offs = random_offsets(rng, groups, static_cast<int>(1 + rng() % 700), 0.3);
    const int64_t m = offs.back() + static_cast<int64_t>(rng() % 50);  // padding rows too
    std::set<int64_t> slots;
    for (auto [c, g] : chunk_group_pairs(offs)) {
      const int64_t slot = column_sum_slot(c, g);
      EXPECT_TRUE(slots.insert(slot).second) << "slot collision at chunk " << c << " group " << g;
      EXPECT_LT(slot, column_sum_chunks(m) + groups);
    }
  }
}

// The fused epilogues' slots (sm90/tile_column_sums.cuh): one per 128-row tile of a group,
// the tiles starting at the group's first row, so they straddle the chunks.
TEST(ColumnSumSlots, TileSlotsAreUniqueAndInBoundsOnRandomRoutings) {
  std::mt19937 rng(4321);
  for (int trial = 0; trial < 200; ++trial) {
    const int groups = 1 + static_cast<int>(rng() % 300);
    const auto offs = random_offsets(rng, groups, static_cast<int>(1 + rng() % 700), 0.3);
    const int64_t m = offs.back() + static_cast<int64_t>(rng() % 50);
    std::set<int64_t> slots;
    for (int32_t g = 0; g < groups; ++g) {
      const GroupRows r = group_rows(offs.data(), g);
      for (int64_t t = 0; t * kColumnSumChunkRows < r.count(); ++t) {
        const int64_t slot = tile_column_sum_slot(r.begin, t, g);
        EXPECT_TRUE(slots.insert(slot).second) << "slot collision at group " << g << " tile " << t;
        EXPECT_LT(slot * kTileColumnSumWarps, tile_column_sum_rows(m, groups));
      }
    }
  }
}

TEST(ColumnSumSlots, WorkspaceCoversEverySlot) {
  EXPECT_EQ(column_sum_workspace_bytes(98304, 2880, 32), size_t(768 + 32) * 2880 * 4);
  EXPECT_EQ(column_sum_workspace_bytes(0, 64, 4), size_t(4) * 64 * 4);
  // with the row dots: one fp32 partial per 256-column slice (ceil(2880 / 256) = 12) and row
  EXPECT_EQ(column_sum_workspace_bytes(98304, 2880, 32, true), size_t(768 + 32) * 2880 * 4 + size_t(12) * 98304 * 4);
}

}  // namespace

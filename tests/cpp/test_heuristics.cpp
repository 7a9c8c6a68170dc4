// The tile-configuration heuristic: names, tile counts and the choice on known shapes.
#include <gtest/gtest.h>

#include "heuristics.h"

namespace {

using namespace cute_moe::detail;

const TileConfig kCoop{KernelVariant::RaggedM_BRow, 128, 256, 64, 2, 1, Schedule::Cooperative};
const TileConfig kPong{KernelVariant::RaggedM_BRow, 128, 128, 64, 2, 1, Schedule::Pingpong};
const TileConfig kSmall{KernelVariant::RaggedM_BRow, 64, 128, 128, 1, 1, Schedule::Pingpong};

TEST(TileConfigName, Format) {
  EXPECT_EQ(tile_config_name(kCoop), "128x256x64_2x1_coop");
  EXPECT_EQ(tile_config_name(kSmall), "64x128x128_1x1_pong");
}

TEST(OutputTiles, RaggedMPadsEachGroupToWholeTiles) {
  // GPT-OSS-20B up projection: 98304 rows over 32 experts, n = 2*2880.
  GroupedProblem p{KernelVariant::RaggedM_BRow, 98304, 5760, 2880, 32};
  EXPECT_EQ(output_tiles(p, kCoop), 32 * 24 * 23);
  // Fewer rows than groups: still one row tile per group.
  GroupedProblem tiny{KernelVariant::RaggedM_BRow, 10, 256, 256, 64};
  EXPECT_EQ(output_tiles(tiny, kCoop), 64);
}

TEST(OutputTiles, RaggedKCountsTheWeightShapedOutput) {
  GroupedProblem p{KernelVariant::RaggedK_OutF32, 98304, 5760, 2880, 32};
  TileConfig c = kCoop;
  c.variant = KernelVariant::RaggedK_OutF32;
  EXPECT_EQ(output_tiles(p, c), 32 * (2880 / 128 + 1) * (5760 / 256 + 1));
}

TEST(Choose, OnlyConsidersTheProblemsVariant) {
  TileConfig other = kCoop;
  other.variant = KernelVariant::RaggedM_BCol;
  GroupedProblem p{KernelVariant::RaggedM_BRow, 98304, 5760, 2880, 32};
  EXPECT_EQ(choose_tile_config(p, {other, kPong}, 132), 1);
  EXPECT_EQ(choose_tile_config(p, {other}, 132), -1);
}

TEST(Choose, LargeTilesForLargeGroupsSmallTilesForTinyGroups) {
  const std::vector<TileConfig> all = {kCoop, kPong, kSmall};
  GroupedProblem big{KernelVariant::RaggedM_BRow, 98304, 5760, 2880, 32};
  EXPECT_EQ(choose_tile_config(big, all, 132), 0);
  // 128 experts with ~32 rows each: a 128-row tile would be three quarters padding.
  GroupedProblem tiny{KernelVariant::RaggedM_BRow, 4096, 2048, 768, 128};
  EXPECT_EQ(choose_tile_config(tiny, all, 132), 2);
}

TEST(Choose, CostFollowsWaves) {
  GroupedProblem p{KernelVariant::RaggedM_BRow, 98304, 5760, 2880, 32};
  EXPECT_GT(estimated_cost(p, kCoop, 66), estimated_cost(p, kCoop, 132));
  EXPECT_DOUBLE_EQ(estimated_cost(p, kCoop, 0), estimated_cost(p, kCoop, 1));  // never divides by zero
}

}  // namespace

// The tile-configuration heuristic: names, tile counts and the choice on known shapes.
#include <gtest/gtest.h>

#include "heuristics.h"

namespace {

using namespace cute_moe::detail;

const TileConfig kCoop{KernelVariant::RaggedM_BRow, 128, 256, 64, 2, 1, Schedule::Cooperative, Act::Unfused,
                      TileRole::Wide};
const TileConfig kPong{KernelVariant::RaggedM_BRow, 128, 128, 64, 2, 1, Schedule::Pingpong, Act::Unfused,
                      TileRole::Narrow};
const TileConfig kSmall{KernelVariant::RaggedM_BRow, 64, 128, 128, 1, 1, Schedule::Pingpong, Act::Unfused,
                       TileRole::Small};

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

// The measured rules (docs/perf-notes.md v2) on the shapes they were measured on.
TEST(ChooseLaunch, ShortReductionsPingpongLongOnesCooperative) {
  std::vector<TileConfig> all = {kCoop, kPong, kSmall};
  for (auto v : {KernelVariant::RaggedK_OutF32}) {
    for (TileConfig c : {kCoop, kPong}) {
      c.variant = v;
      all.push_back(c);
    }
  }
  // GPT-OSS-20B down projection: k = n = 2880, 3072 rows per expert (tall) -> pingpong along n.
  LaunchChoice down = choose_launch({KernelVariant::RaggedM_BRow, 98304, 2880, 2880, 32}, all, 132);
  EXPECT_EQ(down.index, 1);
  EXPECT_TRUE(down.raster_along_n);
  EXPECT_EQ(down.swizzle, 2);
  // Up projection: n = 5760 -> cooperative 128x256, along m.
  LaunchChoice up = choose_launch({KernelVariant::RaggedM_BRow, 98304, 5760, 2880, 32}, all, 132);
  EXPECT_EQ(up.index, 0);
  EXPECT_FALSE(up.raster_along_n);
  // Weight gradient (no mid tile here), 3072 rows per expert deep, n = 5760: cooperative
  // along m; Qwen3's 1024: pingpong.
  LaunchChoice wg = choose_launch({KernelVariant::RaggedK_OutF32, 98304, 5760, 2880, 32}, all, 132);
  EXPECT_EQ(wg.index, 3);
  EXPECT_FALSE(wg.raster_along_n);
  LaunchChoice qwen = choose_launch({KernelVariant::RaggedK_OutF32, 131072, 2048, 768, 128}, all, 132);
  EXPECT_EQ(qwen.index, 4);
}

TEST(ChooseLaunch, TinyGroupsGetTheCostModelsSmallTiles) {
  // 128 experts with 32 rows each on average.
  LaunchChoice c = choose_launch({KernelVariant::RaggedM_BRow, 4096, 2048, 768, 128}, {kCoop, kPong, kSmall}, 132);
  EXPECT_EQ(c.index, 2);
}

// The rules name roles, not tile literals: a retuned "narrow" tile is still the one chosen
// (the cost model alone would take the cooperative one here).
TEST(ChooseLaunch, PicksTheWantedRoleWhateverItsTile) {
  TileConfig narrow = kPong;
  narrow.tile_n = 96;
  const GroupedProblem down{KernelVariant::RaggedM_BRow, 98304, 2880, 2880, 32};
  ASSERT_EQ(choose_tile_config(down, {kCoop, narrow}, 132), 0);
  EXPECT_EQ(choose_launch(down, {kCoop, narrow}, 132).index, 1);
}

// Every ragged-M kernel, fused or plain, short or long reduction, takes its "mid" tile
// where compiled; without one, the rule's tile.
TEST(ChooseLaunch, RaggedMKernelsTakeTheirMidTile) {
  std::vector<TileConfig> candidates;
  for (KernelVariant v : {KernelVariant::RaggedM_BRow, KernelVariant::ActFwd_BRow, KernelVariant::ActBwd_BCol}) {
    for (TileConfig c : {kCoop, kPong}) {
      c.variant = v;
      c.act = v == KernelVariant::RaggedM_BRow ? Act::Unfused : Act::Swiglu;
      candidates.push_back(c);
    }
    TileConfig mid{v, 128, 192, 64, 2, 1, Schedule::Pingpong, candidates.back().act, TileRole::Mid};
    candidates.push_back(mid);
  }
  auto chosen = [&](KernelVariant v, Act act) {
    const LaunchChoice c = choose_launch({v, 98304, 2880, 2880, 32, act}, candidates, 132);
    return candidates[c.index];
  };
  EXPECT_EQ(chosen(KernelVariant::ActFwd_BRow, Act::Swiglu).role, TileRole::Mid);
  EXPECT_EQ(chosen(KernelVariant::ActBwd_BCol, Act::Swiglu).role, TileRole::Mid);
  EXPECT_EQ(chosen(KernelVariant::RaggedM_BRow, Act::Unfused).role, TileRole::Mid);
  // the GPT-OSS up dgrad, a long reduction (k = 5760), too
  const LaunchChoice up_dgrad = choose_launch({KernelVariant::RaggedM_BRow, 98304, 2880, 5760, 32}, candidates, 132);
  EXPECT_EQ(candidates[up_dgrad.index].role, TileRole::Mid);
  EXPECT_TRUE(up_dgrad.raster_along_n);
  candidates.pop_back();  // no mid tile for the backward: the rule's wide one
  EXPECT_EQ(chosen(KernelVariant::ActBwd_BCol, Act::Swiglu).role, TileRole::Wide);
}

// Weight gradients take the mid tile where compiled, along n, swizzle 4.
TEST(ChooseLaunch, WeightGradientsTakeTheMidTileAlongN) {
  TileConfig wide = kCoop, mid{KernelVariant::RaggedK_OutBF16, 128, 192, 64, 2, 1, Schedule::Pingpong, Act::Unfused, TileRole::Mid};
  wide.variant = KernelVariant::RaggedK_OutBF16;
  const LaunchChoice c = choose_launch({KernelVariant::RaggedK_OutBF16, 131072, 1536, 2048, 128}, {wide, mid}, 132);
  EXPECT_EQ(c.index, 1);
  EXPECT_TRUE(c.raster_along_n);
  EXPECT_EQ(c.swizzle, 4);
  EXPECT_EQ(choose_launch({KernelVariant::RaggedK_OutBF16, 131072, 1536, 2048, 128}, {wide}, 132).index, 0);
}

// The 128x128 pingpong tile for a weight gradient only where it needs clearly fewer waves'
// worth of work: the seed example's down projection (8 experts, 1024 x 2048 outputs), not
// GPT-OSS-20B's or Qwen3-30B-A3B's.
TEST(ChooseLaunch, WeightGradientsTakeTheNarrowTileWhereItFitsTheWavesBetter) {
  const KernelVariant v = KernelVariant::RaggedK_OutBF16;
  TileConfig wide = kCoop, narrow = kPong;
  wide.variant = narrow.variant = v;
  const TileConfig mid{v, 128, 192, 64, 2, 1, Schedule::Pingpong, Act::Unfused, TileRole::Mid};
  const std::vector<TileConfig> all = {wide, narrow, mid};
  const LaunchChoice seed_down = choose_launch({v, 32768, 2048, 1024, 8}, all, 132);
  EXPECT_EQ(seed_down.index, 1);
  EXPECT_TRUE(seed_down.raster_along_n);
  EXPECT_TRUE(seed_down.dynamic_schedule);  // 4096 rows per expert
  EXPECT_EQ(choose_launch({v, 32768, 2048, 2048, 8}, all, 132).index, 2);      // seed up: 3% only
  EXPECT_EQ(choose_launch({v, 98304, 5760, 2880, 32}, all, 132).index, 2);     // GPT-OSS-20B up
  EXPECT_EQ(choose_launch({v, 98304, 2880, 2880, 32}, all, 132).index, 2);     // GPT-OSS-20B down
  EXPECT_EQ(choose_launch({v, 131072, 1536, 2048, 128}, all, 132).index, 2);   // Qwen3 up
  EXPECT_EQ(choose_launch({v, 131072, 2048, 768, 128}, all, 132).index, 2);    // Qwen3 down
  EXPECT_EQ(choose_launch({v, 32768, 2048, 1024, 8}, {wide, mid}, 132).index, 1);  // no narrow tile
}

// A weight gradient whose row tiles would leave the 2x1 cluster a spare CTA in every group
// takes the mid tile on the cluster with clearly fewer CTA tiles, walked along m: GPT-OSS-20B's
// up projection (2880 = 22.5 row tiles: 24 x 30 against 23 x 30) on 1x2 (1x1 ties, later in
// the table), its down projection (2880 x 2880: 24 x 15, 1x2 23 x 16, 1x1 23 x 15) on 1x1;
// Qwen3-30B-A3B's and the seed's keep 2x1.
TEST(ChooseLaunch, WeightGradientsLeaveNoSpareCtaWhereAnotherClusterAvoidsIt) {
  const KernelVariant v = KernelVariant::RaggedK_OutBF16;
  TileConfig wide = kCoop, narrow = kPong;
  wide.variant = narrow.variant = v;
  const TileConfig mid{v, 128, 192, 64, 2, 1, Schedule::Pingpong, Act::Unfused, TileRole::Mid};
  TileConfig mid_1x2 = mid, mid_1x1 = mid;
  mid_1x2.cluster_m = mid_1x1.cluster_m = mid_1x1.cluster_n = 1;
  mid_1x2.cluster_n = 2;
  const std::vector<TileConfig> all = {wide, narrow, mid, mid_1x2, mid_1x1};
  const GroupedProblem up{v, 98304, 5760, 2880, 32}, down{v, 98304, 2880, 2880, 32};
  EXPECT_EQ(cluster_padded_tiles(up, mid), 32 * 24 * 30);
  EXPECT_EQ(cluster_padded_tiles(up, mid_1x2), 32 * 23 * 30);
  EXPECT_EQ(cluster_padded_tiles(down, mid_1x2), 32 * 23 * 16);
  EXPECT_EQ(cluster_padded_tiles(down, mid_1x1), 32 * 23 * 15);
  const LaunchChoice c = choose_launch(up, all, 132);
  EXPECT_EQ(c.index, 3);
  EXPECT_FALSE(c.raster_along_n);
  EXPECT_TRUE(c.dynamic_schedule);
  const LaunchChoice d = choose_launch(down, all, 132);
  EXPECT_EQ(d.index, 4);
  EXPECT_FALSE(d.raster_along_n);
  EXPECT_EQ(choose_launch(down, {wide, narrow, mid, mid_1x2}, 132).index, 2);  // no 1x1: 2x1 along n
  EXPECT_TRUE(choose_launch(down, {wide, narrow, mid, mid_1x2}, 132).raster_along_n);
  EXPECT_EQ(choose_launch({v, 131072, 1536, 2048, 128}, all, 132).index, 2);  // Qwen3 up
  EXPECT_EQ(choose_launch({v, 131072, 2048, 768, 128}, all, 132).index, 2);   // Qwen3 down
  EXPECT_EQ(choose_launch({v, 32768, 2048, 1024, 8}, all, 132).index, 1);     // seed down: narrow
  EXPECT_EQ(choose_launch({v, 32768, 2048, 2048, 8}, all, 132).index, 2);     // seed up
  EXPECT_EQ(choose_launch(up, {wide, narrow, mid}, 132).index, 2);            // neither compiled
  // a plain ragged-M GEMM never takes them (its groups' rows are not known on the host)
  TileConfig plain = mid, plain_1x1 = mid_1x1;
  plain.variant = plain_1x1.variant = KernelVariant::RaggedM_BRow;
  EXPECT_EQ(choose_launch({KernelVariant::RaggedM_BRow, 98304, 5760, 2880, 32}, {kCoop, plain, plain_1x1}, 132).index, 1);
}

// The FP8 weight gradient's tile (128x128x128 cooperative) the same way: GPT-OSS-20B's
// 2880-row outputs leave its 2x1 clusters a spare CTA (24 x 45 CTA tiles against 23 x 45 on
// 1x1, the up projection; 24 x 23 against 23 x 23, the down), Qwen3-30B-A3B's do not.
TEST(ChooseLaunch, Fp8WeightGradientsLeaveNoSpareCtaEither) {
  const KernelVariant v = KernelVariant::Fp8RaggedK;
  const TileConfig two{v, 128, 128, 128, 2, 1, Schedule::Cooperative, Act::Unfused, TileRole::Wide};
  TileConfig one = two;
  one.cluster_m = 1;
  const LaunchChoice up = choose_launch({v, 98304, 5760, 2880, 32}, {two, one}, 132);
  EXPECT_EQ(up.index, 1);
  EXPECT_FALSE(up.raster_along_n);
  EXPECT_EQ(choose_launch({v, 98304, 2880, 2880, 32}, {two, one}, 132).index, 1);
  EXPECT_EQ(choose_launch({v, 131072, 1536, 2048, 128}, {two, one}, 132).index, 0);
  EXPECT_EQ(choose_launch({v, 131072, 2048, 768, 128}, {two, one}, 132).index, 0);
  EXPECT_EQ(choose_launch({v, 98304, 5760, 2880, 32}, {two}, 132).index, 0);
}

// The plain FP8 GEMM's store-warp tile (narrow) for short reductions, its cooperative tile
// (wide) for long ones or wide outputs: the store warp won 1.12x at K = 768 and lost 4% at
// K = 5760 (session 36).
TEST(ChooseLaunch, Fp8PlainGemmTakesTheStoreWarpTileForShortReductions) {
  const KernelVariant v = KernelVariant::Fp8RaggedM;
  const TileConfig coop{v, 128, 128, 128, 2, 1, Schedule::Cooperative, Act::Unfused, TileRole::Wide};
  TileConfig store = coop;
  store.schedule = Schedule::StoreWarp;
  store.role = TileRole::Narrow;
  EXPECT_EQ(choose_launch({v, 131072, 2048, 768, 128}, {coop, store}, 132).index, 1);   // Qwen3 down
  EXPECT_EQ(choose_launch({v, 131072, 1536, 2048, 128}, {coop, store}, 132).index, 1);  // Qwen3 up
  EXPECT_EQ(choose_launch({v, 98304, 2880, 2880, 32}, {coop, store}, 132).index, 1);    // GPT-OSS down
  EXPECT_EQ(choose_launch({v, 98304, 5760, 2880, 32}, {coop, store}, 132).index, 0);    // GPT-OSS up
  EXPECT_EQ(choose_launch({v, 98304, 2880, 5760, 32}, {coop, store}, 132).index, 0);    // its dgrad
  EXPECT_EQ(choose_launch({v, 131072, 2048, 768, 128}, {coop}, 132).index, 0);          // not compiled
}

// The FP8 fused backward: the table lists its 64x128x128 pingpong tile first in the wide role
// (1.17x the cooperative 128x128x128 at GPT-OSS-20B, session 26), so the heuristic takes it at
// both models' shapes; tiny groups still go by the cost model.
TEST(ChooseLaunch, Fp8FusedBackwardTakesTheTablesFirstWideTile) {
  const KernelVariant v = KernelVariant::Fp8ActBwd;
  const TileConfig pong{v, 64, 128, 128, 2, 1, Schedule::Pingpong, Act::SwigluOai, TileRole::Wide};
  TileConfig coop = pong;
  coop.tile_m = 128;
  coop.schedule = Schedule::Cooperative;
  GroupedProblem gpt{v, 98304, 2880, 2880, 32};
  gpt.act = Act::SwigluOai;
  EXPECT_EQ(choose_launch(gpt, {pong, coop}, 132).index, 0);
  GroupedProblem qwen{v, 131072, 768, 2048, 128};
  qwen.act = Act::SwigluOai;
  EXPECT_EQ(choose_launch(qwen, {pong, coop}, 132).index, 0);
}

// Plain GEMMs on the mid tile: along n; deep groups swizzle 2, shallow ones unswizzled (the
// scheduler would pad each group's tile grid to whole swizzle strips).
TEST(ChooseLaunch, PlainMidTileOrder) {
  const TileConfig mid{KernelVariant::RaggedM_BRow, 128, 192, 64, 2, 1, Schedule::Pingpong, Act::Unfused, TileRole::Mid};
  const LaunchChoice gpt = choose_launch({KernelVariant::RaggedM_BRow, 98304, 2880, 2880, 32}, {kCoop, kPong, mid}, 132);
  EXPECT_EQ(gpt.index, 2);
  EXPECT_TRUE(gpt.raster_along_n);
  EXPECT_EQ(gpt.swizzle, 2);  // 3072 rows per expert
  const LaunchChoice qwen = choose_launch({KernelVariant::RaggedM_BRow, 131072, 2048, 768, 128}, {kCoop, kPong, mid}, 132);
  EXPECT_EQ(qwen.index, 2);
  EXPECT_TRUE(qwen.raster_along_n);  // session 14: along n at 1024 rows per expert too
  EXPECT_EQ(qwen.swizzle, 1);
}

TEST(ChooseLaunch, OnlyKernelsOfTheDevicesArchServe) {
  GroupedProblem p{KernelVariant::RaggedM_BRow, 98304, 5760, 2880, 32};
  TileConfig c = kCoop;
  EXPECT_TRUE(serves(c, p));
  p.arch = static_cast<Arch>(static_cast<int>(Arch::Sm90) + 1);  // an arch with no kernels
  EXPECT_FALSE(serves(c, p));
  EXPECT_EQ(choose_launch(p, {kCoop, kPong}, 132).index, -1);
}

TEST(ChooseLaunch, FallsBackToTheCostModelWhenThePreferredKernelIsMissing) {
  LaunchChoice c = choose_launch({KernelVariant::RaggedM_BRow, 98304, 2880, 2880, 32}, {kCoop, kSmall}, 132);
  EXPECT_EQ(c.index, 0);
}

}  // namespace

namespace {

// The fused activation kernels are one per activation: a problem only sees its own.
TEST(ChooseActivation, OnlyTheProblemsActivationServesAndTheBackwardGetsTheBigTile) {
  std::vector<TileConfig> candidates;
  for (Act act : {Act::SwigluOai, Act::Geglu}) {
    for (const TileConfig& base : {kCoop, kPong}) {
      TileConfig c = base;
      c.variant = KernelVariant::ActBwd_BCol;
      c.act = act;
      candidates.push_back(c);
    }
  }
  // GPT-OSS-20B down-projection input gradient: a short reduction (k = 2880), which plain
  // GEMMs run on the 128x128 pingpong kernel; the fused backward takes 128x256.
  GroupedProblem p{KernelVariant::ActBwd_BCol, 98304, 2880, 2880, 32, Act::Geglu};
  const LaunchChoice choice = choose_launch(p, candidates, 132);
  ASSERT_GE(choice.index, 0);
  EXPECT_EQ(candidates[choice.index].act, Act::Geglu);
  EXPECT_EQ(candidates[choice.index].schedule, Schedule::Cooperative);
  p.act = Act::Srelu;  // not compiled here
  EXPECT_EQ(choose_launch(p, candidates, 132).index, -1);
}

}  // namespace

// ... the weight gradients too, a wide output over deep groups (GPT-OSS-20B's up projection)
// included: the mid tile along n (session 14: 5.6-5.9% faster than 128x256 cooperative
// under the dynamic schedule).
TEST(ChooseLaunch, WideWeightGradientsTakeTheMidTileToo) {
  TileConfig wide = kCoop, mid{KernelVariant::RaggedK_OutBF16, 128, 192, 64, 2, 1, Schedule::Pingpong, Act::Unfused, TileRole::Mid};
  wide.variant = KernelVariant::RaggedK_OutBF16;
  for (int64_t n : {5760, 2880}) {
    const LaunchChoice c = choose_launch({KernelVariant::RaggedK_OutBF16, 98304, n, 2880, 32}, {wide, mid}, 132);
    EXPECT_EQ(c.index, 1);
    EXPECT_TRUE(c.raster_along_n);
  }
  // shallow groups (Qwen3-30B-A3B, 1024 rows per expert) likewise
  EXPECT_EQ(choose_launch({KernelVariant::RaggedK_OutBF16, 131072, 4096, 2048, 128}, {wide, mid}, 132).index, 1);
  // without a mid tile (the fp32-output weight gradient) the wide one
  EXPECT_EQ(choose_launch({KernelVariant::RaggedK_OutBF16, 98304, 5760, 2880, 32}, {wide}, 132).index, 0);
}

// The dynamic tile schedule for the weight gradients over groups of 1024 rows or more
// (GPT-OSS-20B: 3072 rows per expert, Qwen3-30B-A3B: 1024), the static one over shallower
// groups and for every ragged-M GEMM, deep or not.
TEST(ChooseLaunch, DynamicScheduleForDeepWeightGradients) {
  TileConfig wide = kCoop, mid{KernelVariant::RaggedK_OutBF16, 128, 192, 64, 2, 1, Schedule::Pingpong, Act::Unfused, TileRole::Mid};
  wide.variant = KernelVariant::RaggedK_OutBF16;
  EXPECT_TRUE(choose_launch({KernelVariant::RaggedK_OutBF16, 98304, 5760, 2880, 32}, {wide, mid}, 132).dynamic_schedule);
  EXPECT_TRUE(choose_launch({KernelVariant::RaggedK_OutBF16, 98304, 2880, 2880, 32}, {wide, mid}, 132).dynamic_schedule);
  EXPECT_TRUE(choose_launch({KernelVariant::RaggedK_OutBF16, 131072, 1536, 2048, 128}, {wide, mid}, 132).dynamic_schedule);
  EXPECT_FALSE(choose_launch({KernelVariant::RaggedK_OutBF16, 65536, 1536, 2048, 128}, {wide, mid}, 132).dynamic_schedule);
  const TileConfig plain{KernelVariant::RaggedM_BRow, 128, 192, 64, 2, 1, Schedule::Pingpong, Act::Unfused, TileRole::Mid};
  EXPECT_FALSE(choose_launch({KernelVariant::RaggedM_BRow, 98304, 2880, 2880, 32}, {plain}, 132).dynamic_schedule);
}

// The fused kernels on the mid tile walk along n: the backward with swizzle 4 always, the
// forward with swizzle 4 over deep groups (GPT-OSS-20B) and 2 over shallow ones (Qwen3).
TEST(ChooseLaunch, FusedMidTileOrder) {
  const TileConfig fwd{KernelVariant::ActFwd_BRow, 128, 192, 64, 2, 1, Schedule::Pingpong, Act::Swiglu, TileRole::Mid};
  const TileConfig bwd{KernelVariant::ActBwd_BCol, 128, 192, 64, 2, 1, Schedule::Cooperative, Act::Swiglu, TileRole::Mid};
  const std::vector<TileConfig> both = {fwd, bwd};
  for (int64_t rows : {98304, 131072}) {
    const int groups = rows == 98304 ? 32 : 128;  // 3072 and 1024 rows per expert
    const LaunchChoice f = choose_launch({KernelVariant::ActFwd_BRow, rows, 5760, 2880, groups, Act::Swiglu}, both, 132);
    EXPECT_EQ(f.index, 0);
    EXPECT_TRUE(f.raster_along_n);
    EXPECT_EQ(f.swizzle, groups == 32 ? 4 : 2);
    const LaunchChoice b = choose_launch({KernelVariant::ActBwd_BCol, rows, 2880, 2880, groups, Act::Swiglu}, both, 132);
    EXPECT_EQ(b.index, 1);
    EXPECT_TRUE(b.raster_along_n);
    EXPECT_EQ(b.swizzle, 4);
  }
}

// The fused backward of a call without a limit and without a bias gradient runs the mid
// tile's pingpong kernel, which exists only as the limit-free twin (no column sums in its
// epilogue); a call with either keeps the cooperative kernel, the twin or the clamping one.
TEST(ChooseLaunch, FusedBackwardWithoutColumnSumsTakesThePingpongTwin) {
  const KernelVariant v = KernelVariant::ActBwd_BCol;
  const TileConfig wide{v, 128, 256, 64, 2, 1, Schedule::Cooperative, Act::Swiglu, TileRole::Wide};
  const TileConfig coop{v, 128, 192, 64, 2, 1, Schedule::Cooperative, Act::Swiglu, TileRole::Mid};
  TileConfig coop_twin = coop, pong_twin = coop;
  coop_twin.act = pong_twin.act = Act::SwigluNoLimit;
  pong_twin.schedule = Schedule::Pingpong;
  const std::vector<TileConfig> all = {wide, coop, coop_twin, pong_twin};
  GroupedProblem qwen{v, 131072, 768, 2048, 128, Act::Swiglu};
  EXPECT_EQ(choose_launch(qwen, all, 132).index, 1);  // with a limit: the twins do not serve it
  EXPECT_FALSE(serves(pong_twin, qwen));
  qwen.limit_free = true;
  EXPECT_TRUE(serves(pong_twin, qwen));
  const LaunchChoice c = choose_launch(qwen, all, 132);
  EXPECT_EQ(c.index, 3);
  EXPECT_TRUE(c.raster_along_n);
  EXPECT_EQ(choose_launch(qwen, {wide, coop, coop_twin}, 132).index, 1);  // not compiled
  qwen.column_sums = true;
  EXPECT_EQ(choose_launch(qwen, all, 132).index, 1);
  // the column sums are the cooperative 128-row kernels' only
  EXPECT_TRUE(fuses_column_sums(coop));
  EXPECT_TRUE(fuses_column_sums(wide));
  EXPECT_FALSE(fuses_column_sums(pong_twin));
  // no twin of another activation serves it
  GroupedProblem oai{v, 98304, 2880, 2880, 32, Act::SwigluOai};
  oai.limit_free = true;
  EXPECT_FALSE(serves(pong_twin, oai));
}

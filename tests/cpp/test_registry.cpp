// The compiled kernel table and the API's behaviour where no GPU is needed: config
// listing, forced configs, and clean errors (never a crash) without a device.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <tuple>
#include <vector>

#include "cute_moe/grouped_gemm.h"
#include "kernel_registry.h"

namespace {

using namespace cute_moe;

TEST(Registry, HoldsEveryTableRowWithUniqueNamesPerVariant) {
  const auto& reg = detail::kernel_registry();
  ASSERT_FALSE(reg.empty());
  std::set<std::tuple<int, int, std::string>> seen;
  for (const auto& e : reg) {
    EXPECT_TRUE(seen.insert({static_cast<int>(e.config.variant), static_cast<int>(e.config.act), e.name}).second)
        << e.name;
    EXPECT_NE(e.launch, nullptr);
    EXPECT_NE(e.workspace_size, nullptr);
  }
  // Every variant has a "wide" kernel (the heuristic's default) for every activation it
  // serves: the plain ones none, the forwards every fused-forward activation, the
  // backwards all.
  for (auto v : {detail::KernelVariant::RaggedM_BRow, detail::KernelVariant::RaggedM_BCol,
                 detail::KernelVariant::RaggedK_OutBF16, detail::KernelVariant::RaggedK_OutF32,
                 detail::KernelVariant::ActFwd_BRow, detail::KernelVariant::ActFwd_BCol,
                 detail::KernelVariant::ActFwdGather_BRow, detail::KernelVariant::ActBwd_BRow,
                 detail::KernelVariant::ActBwd_BCol, detail::KernelVariant::ActBwdHalves_BRow,
                 detail::KernelVariant::Fp8RaggedM, detail::KernelVariant::Fp8RaggedK}) {
    std::vector<detail::Act> acts;
    const bool fused = std::string(detail::variant_call(v)).rfind("act_", 0) == 0;
    const bool gated_only = v == detail::KernelVariant::ActBwdHalves_BRow;  // halves of (gate, linear) pairs
    if (!fused) acts.push_back(detail::Act::Unfused);
    for (const auto& a : kActivations) {
      if (fused && (detail::is_act_backward(v) || a.fused_forward) && (!gated_only || a.gated)) {
        acts.push_back(detail::act_of(a.id));
      }
    }
    for (detail::Act act : acts) {
      bool found = false;
      for (const auto& e : reg) {
        found = found || (e.config.variant == v && e.config.act == act && e.config.role == detail::TileRole::Wide);
      }
      EXPECT_TRUE(found) << detail::variant_call(v) << " " << detail::act_name(act);
    }
  }
}

// Calls without a clamp limit run the limit-free twin of the chosen tile where one is compiled
// (kernel_space.py's LIMIT_FREE_TILES): the same variant, tile, cluster and schedule; every
// other kernel is its own.
TEST(Registry, LimitFreeTwinsShareTheTileOfTheKernelTheyReplace) {
  const auto& reg = detail::kernel_registry();
  int twinned = 0;
  for (size_t i = 0; i < reg.size(); ++i) {
    const detail::TileConfig& c = reg[i].config;
    const int j = detail::limit_free_kernel(reg, static_cast<int>(i));
    ASSERT_GE(j, 0);
    if (j == static_cast<int>(i)) continue;
    ++twinned;
    const detail::TileConfig& t = reg[j].config;
    EXPECT_EQ(c.act, detail::Act::Swiglu);
    EXPECT_EQ(t.act, detail::Act::SwigluNoLimit);
    EXPECT_EQ(reg[j].name, reg[i].name);
    EXPECT_TRUE(t.variant == c.variant && t.schedule == c.schedule && t.role == c.role && t.arch == c.arch);
    EXPECT_EQ(detail::limit_free_kernel(reg, j), j);  // a twin has no twin
  }
  // the mid tiles of the fused forward (both weight layouts) and backward (three), the
  // gathered forward's two
  EXPECT_EQ(twinned, 7);
}

TEST(Registry, ListsConfigsPerFamily) {
  auto m = list_tile_configs(GemmFamily::kRaggedM);
  auto k = list_tile_configs(GemmFamily::kRaggedK);
  auto f = list_tile_configs(GemmFamily::kFp8RaggedM);
  auto fk = list_tile_configs(GemmFamily::kFp8RaggedK);
  EXPECT_FALSE(m.empty());
  EXPECT_FALSE(k.empty());
  // FP8 tiles are not the bf16 family's; the store-warp one is the plain GEMM's narrow tile, the
  // 1x2 one the fused forward's (its CTA pairs share h's 1 x 128 blocks), the pingpong one the
  // fused backward's (first in its table)
  EXPECT_EQ(f, (std::vector<std::string>{"128x128x128_2x1_coop", "128x128x128_2x1_store", "128x128x128_1x2_coop",
                                         "64x128x128_2x1_pong"}));
  // the weight gradient's also on a 1x1 cluster (heuristics.cpp: no spare CTA per group)
  EXPECT_EQ(fk, (std::vector<std::string>{"128x128x128_2x1_coop", "128x128x128_1x1_coop"}));
  for (const auto& name : m) EXPECT_NE(name, "128x128x128_2x1_coop");
  for (const auto& name : k) EXPECT_NE(name, "128x128x128_2x1_coop");
  EXPECT_EQ(std::set<std::string>(m.begin(), m.end()).size(), m.size());
}

TEST(Registry, ListKernelsReportsEveryRowByCallActivationAndConfig) {
  const auto kernels = list_kernels();
  const auto& reg = detail::kernel_registry();
  ASSERT_EQ(kernels.size(), reg.size());
  for (size_t i = 0; i < reg.size(); ++i) {
    EXPECT_EQ(kernels[i].config, reg[i].name);
    EXPECT_NE(kernels[i].call, "?");
    // Plain GEMMs have no activation, the fused ones always one.
    const bool fused = kernels[i].call.rfind("act_", 0) == 0 || kernels[i].call.rfind("fp8_act_", 0) == 0;
    EXPECT_EQ(kernels[i].activation.empty(), !fused) << kernels[i].call << " " << kernels[i].activation;
  }
}

TEST(Registry, KernelsRunOnlyOnTheirArch) {
  detail::DeviceInfo hopper;
  hopper.cc_major = 9;
  detail::Arch arch = static_cast<detail::Arch>(-1);
  ASSERT_TRUE(detail::kernel_arch_for(hopper, &arch).ok());
  EXPECT_EQ(arch, detail::Arch::Sm90);
  detail::DeviceInfo ampere;
  ampere.device = 1;
  ampere.cc_major = 8;
  Result r = detail::kernel_arch_for(ampere, &arch);
  EXPECT_EQ(r.status, Status::kNotSupported);
  EXPECT_NE(r.message.find("compute capability 9.0 (Hopper (H100, H200))"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("device 1 has compute capability 8.0"), std::string::npos) << r.message;
}

// The core reads no environment variables itself; options_from_environment turns them into
// options (what the torch ops pass on every call).
TEST(Options, FromTheEnvironment) {
  setenv("CUTE_MOE_CONFIG", "128x128x64_2x1_pong", 1);
  setenv("CUTE_MOE_RASTER", "n", 1);
  setenv("CUTE_MOE_SWIZZLE", "4", 1);
  setenv("CUTE_MOE_LOG_CONFIG", "1", 1);
  GemmOptions o = options_from_environment();
  EXPECT_STREQ(o.config, "128x128x64_2x1_pong");
  EXPECT_EQ(o.raster, 'n');
  EXPECT_EQ(o.swizzle, 4);
  EXPECT_TRUE(o.log);
  setenv("CUTE_MOE_LOG_CONFIG", "0", 1);
  for (const char* name : {"CUTE_MOE_CONFIG", "CUTE_MOE_RASTER", "CUTE_MOE_SWIZZLE"}) unsetenv(name);
  o = options_from_environment();
  EXPECT_EQ(o.config, nullptr);
  EXPECT_EQ(o.raster, 0);
  EXPECT_EQ(o.swizzle, 0);
  EXPECT_FALSE(o.log);
  unsetenv("CUTE_MOE_LOG_CONFIG");
}

TEST(Registry, CutlassWorkspaceGrowsWithTheSmCountNotTheProblem) {
  for (const auto& e : detail::kernel_registry()) {
    EXPECT_LE(e.workspace_size(32, 66), e.workspace_size(32, 132)) << e.name;
  }
}

// CI has no GPU: the API must answer with an error, and argument errors come first.
TEST(NoDevice, ArgumentErrorsComeBeforeDeviceQueries) {
  RaggedMGemmArgs a;  // everything zero: invalid
  size_t bytes = 0;
  Result r = workspace_size(a, &bytes);
  EXPECT_EQ(r.status, Status::kInvalidArgument) << r.message;
}

TEST(NoDevice, ValidArgumentsGiveACleanResult) {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) GTEST_SKIP() << "a GPU is present";
  RaggedMGemmArgs a;
  a.m = 64; a.n = 64; a.k = 64; a.num_groups = 2;
  a.offs = reinterpret_cast<const int32_t*>(0x1000);
  a.x = reinterpret_cast<const void*>(0x2000); a.ldx = 64;
  a.w = reinterpret_cast<const void*>(0x3000); a.w_stride_group = 64 * 64; a.w_stride_k = 64; a.w_stride_n = 1;
  a.y = reinterpret_cast<void*>(0x4000); a.ldy = 64;
  size_t bytes = 0;
  Result r = workspace_size(a, &bytes);
  EXPECT_EQ(r.status, Status::kCudaError);
  EXPECT_FALSE(r.message.empty());
}

}  // namespace

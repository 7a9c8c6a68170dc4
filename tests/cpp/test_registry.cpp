// The compiled kernel table and the API's behaviour where no GPU is needed: config
// listing, forced configs, and clean errors (never a crash) without a device.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

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
  // Every variant has at least one kernel.
  for (auto v : {detail::KernelVariant::RaggedM_BRow, detail::KernelVariant::RaggedM_BCol,
                 detail::KernelVariant::RaggedK_OutBF16, detail::KernelVariant::RaggedK_OutF32,
                 detail::KernelVariant::GluFwdGather_BRow}) {
    bool found = false;
    for (const auto& e : reg) found = found || e.config.variant == v;
    EXPECT_TRUE(found) << static_cast<int>(v);
  }
}

TEST(Registry, ListsConfigsPerFamily) {
  auto m = list_tile_configs(GemmFamily::kRaggedM);
  auto k = list_tile_configs(GemmFamily::kRaggedK);
  EXPECT_FALSE(m.empty());
  EXPECT_FALSE(k.empty());
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
    const bool fused = kernels[i].call.rfind("glu_", 0) == 0;
    EXPECT_EQ(kernels[i].activation.empty(), !fused) << kernels[i].call << " " << kernels[i].activation;
  }
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

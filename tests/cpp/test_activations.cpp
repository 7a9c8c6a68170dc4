// The gated-activation functors the fused epilogues run, checked on the host: values
// against the GPT-OSS formula, derivatives against central differences, clamp masks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "activations.h"

namespace {

using cute_moe::detail::ActParams;
using cute_moe::detail::Identity;
using cute_moe::detail::SquaredRelu;
using cute_moe::detail::Swiglu;
using cute_moe::detail::SwigluNoLimit;
using cute_moe::detail::SwigluOai;

double reference(double a, double b, double alpha, double limit, bool has_limit) {
  const double g = has_limit ? std::min(a, limit) : a;
  const double u = has_limit ? std::min(std::max(b, -limit), limit) : b;
  return g / (1.0 + std::exp(-alpha * g)) * (u + 1.0);
}

TEST(SwigluOai, ForwardMatchesTheFormula) {
  for (bool has_limit : {true, false}) {
    ActParams p;
    p.has_limit = has_limit;
    for (double a : {-30.0, -7.5, -1.0, 0.0, 0.3, 6.9, 7.0, 12.0})
      for (double b : {-9.0, -7.0, -0.5, 0.0, 2.0, 7.0, 40.0}) {
        const double want = reference(a, b, p.alpha, p.limit, has_limit);
        EXPECT_NEAR(SwigluOai::forward(float(a), float(b), p), want, 1e-5 * std::max(1.0, std::abs(want)))
            << "a=" << a << " b=" << b << " has_limit=" << has_limit;
      }
  }
}

TEST(SwigluOai, BackwardMatchesCentralDifferencesAwayFromKinks) {
  ActParams p;
  const double eps = 1e-3;
  for (double a : {-4.0, -1.0, 0.2, 3.0, 6.5, 9.0})
    for (double b : {-8.0, -3.0, 0.4, 5.0, 7.5}) {
      float da, db;
      const float h = SwigluOai::backward(float(a), float(b), 1.0f, p, da, db);
      EXPECT_NEAR(h, reference(a, b, p.alpha, p.limit, true), 1e-4);
      const double fa = (reference(a + eps, b, p.alpha, p.limit, true) - reference(a - eps, b, p.alpha, p.limit, true)) / (2 * eps);
      const double fb = (reference(a, b + eps, p.alpha, p.limit, true) - reference(a, b - eps, p.alpha, p.limit, true)) / (2 * eps);
      EXPECT_NEAR(da, fa, 2e-3 * std::max(1.0, std::abs(fa))) << "a=" << a << " b=" << b;
      EXPECT_NEAR(db, fb, 2e-3 * std::max(1.0, std::abs(fb))) << "a=" << a << " b=" << b;
    }
}

TEST(SwigluOai, ClampMasksAreClosedIntervalsLikeTorchClamp) {
  ActParams p;  // limit 7
  float da, db;
  SwigluOai::backward(7.0f, 7.0f, 1.0f, p, da, db);  // exactly at the limits: gradient passes
  EXPECT_NE(da, 0.0f);
  EXPECT_NE(db, 0.0f);
  SwigluOai::backward(7.01f, -7.01f, 1.0f, p, da, db);  // past them: blocked
  EXPECT_EQ(da, 0.0f);
  EXPECT_EQ(db, 0.0f);
  SwigluOai::backward(-100.0f, -7.0f, 1.0f, p, da, db);  // the gate has no lower clamp
  EXPECT_EQ(db, db);  // finite
  p.has_limit = false;
  SwigluOai::backward(50.0f, 50.0f, 1.0f, p, da, db);  // no clamps at all
  EXPECT_GT(da, 0.0f);
  EXPECT_GT(db, 0.0f);
}

TEST(SwigluOai, NanPropagatesLikeTorchClamp) {
  ActParams p;
  EXPECT_TRUE(std::isnan(SwigluOai::forward(std::numeric_limits<float>::quiet_NaN(), 1.0f, p)));
  EXPECT_TRUE(std::isnan(SwigluOai::forward(1.0f, std::numeric_limits<float>::quiet_NaN(), p)));
}

// The limit-free twin (the clamps compiled out) gives the clamping unit's bits without a limit,
// NaN and infinities included, and ignores the limit it is handed.
TEST(SwigluNoLimit, SameBitsAsSwigluWithoutALimit) {
  ActParams none;
  none.has_limit = false;
  ActParams clamped;  // has_limit, 7: the twin must not clamp
  const float kInf = std::numeric_limits<float>::infinity(), kNan = std::numeric_limits<float>::quiet_NaN();
  const float values[] = {-30.0f, -7.5f, -7.0f, -1.0f, -0.0f, 0.0f, 0.3f, 6.99f, 7.0f, 9.0f, 40.0f, kInf, -kInf, kNan};
  auto same = [](float x, float y) { return (std::isnan(x) && std::isnan(y)) || std::memcmp(&x, &y, 4) == 0; };
  for (float a : values) {
    for (float b : values) {
      for (const ActParams& p : {none, clamped}) {
        EXPECT_TRUE(same(SwigluNoLimit::forward(a, b, p), Swiglu::forward(a, b, none))) << a << " " << b;
        float da0, db0, da1, db1;
        const float h0 = Swiglu::backward(a, b, 0.75f, none, da0, db0);
        const float h1 = SwigluNoLimit::backward(a, b, 0.75f, p, da1, db1);
        EXPECT_TRUE(same(h0, h1) && same(da0, da1) && same(db0, db1)) << a << " " << b;
      }
    }
  }
}

TEST(SquaredRelu, NanPropagatesLikeTorchRelu) {
  // torch.relu(nan) is nan, and so is its gradient through the square: a NaN in training
  // must stay visible rather than turn into 0.
  ActParams p;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float da = 0.0f;
  EXPECT_TRUE(std::isnan(SquaredRelu::forward(nan, p)));
  EXPECT_TRUE(std::isnan(SquaredRelu::backward(nan, 1.0f, p, da)));
  EXPECT_TRUE(std::isnan(da));
  EXPECT_EQ(SquaredRelu::forward(-2.0f, p), 0.0f);
  EXPECT_EQ(SquaredRelu::forward(3.0f, p), 9.0f);
  SquaredRelu::backward(-2.0f, 1.0f, p, da);
  EXPECT_EQ(da, 0.0f);
  SquaredRelu::backward(3.0f, 0.5f, p, da);
  EXPECT_EQ(da, 3.0f);
}

TEST(Identity, PassesValuesAndGradientsThrough) {
  ActParams p;
  float da = 0.0f;
  for (float a : {-3.5f, 0.0f, 2.25f}) {
    EXPECT_EQ(Identity::forward(a, p), a);
    EXPECT_EQ(Identity::backward(a, 1.5f, p, da), a);
    EXPECT_EQ(da, 1.5f);
  }
}

}  // namespace

#include "kernels/adamw.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/bf16.h"
#include "tests/kernels/gradcheck.h"

namespace slipstream::kernels {
namespace {

// lr 0.01, betas (0.9, 0.999), eps 1e-8, weight decay 0.1. Expected values by hand:
// step 1 from m = v = 0: p' = p (1 - 0.001) - 0.01 * g / (|g| + 1e-8)
//   (m = 0.1 g, v = 0.001 g^2, bias corrections 0.1 and 0.001 cancel them).
//   p = 1.0,  g = 0.1:  0.999   - 0.01 / (1 + 1e-7)   = 0.989000001
//   p = -0.5, g = -0.2: -0.4995 + 0.01 / (1 + 5e-8)   = -0.4895000005
//   p = 0.25, g = 0.4:  0.24975 - 0.01 / (1 + 2.5e-8) = 0.23975000025
// step 3 from m = 0.05, v = 0.01, g = -0.3, p = 2:
//   m = 0.045 - 0.03 = 0.015, v = 0.00999 + 0.00009 = 0.01008,
//   bc1 = 1 - 0.9^3 = 0.271, bc2 = 1 - 0.999^3 = 0.002997001,
//   p' = 1.998 - (0.01 / 0.271) * 0.015 / (sqrt(0.01008) / sqrt(0.002997001) + 1e-8)
//      = 1.998 - 0.000301811055... = 1.997698188945
TEST(AdamW, OneStepHandComputed) {
  const double expect[] = {0.989000001, -0.4895000005, 0.23975000025, 1.997698188945};
  const double expect_m[] = {0.01, -0.02, 0.04, 0.015};
  const double expect_v[] = {1e-5, 4e-5, 1.6e-4, 0.01008};
  const double p0[] = {1.0, -0.5, 0.25, 2.0}, g[] = {0.1, -0.2, 0.4, -0.3};
  const double m0[] = {0, 0, 0, 0.05}, v0[] = {0, 0, 0, 0.01};
  const int64_t steps[] = {1, 1, 1, 3};
  for (int i = 0; i < 4; ++i) {
    double p = p0[i], m = m0[i], v = v0[i];
    adamw_step<double>(&p, &g[i], &m, &v, nullptr, 1, 0.01, 0.9, 0.999, 1e-8, 0.1, true, steps[i]);
    EXPECT_NEAR(p, expect[i], 1e-12) << i;
    EXPECT_NEAR(m, expect_m[i], 1e-15) << i;
    EXPECT_NEAR(v, expect_v[i], 1e-15) << i;
    // float within float rounding
    float pf = float(p0[i]), gf = float(g[i]), mf = float(m0[i]), vf = float(v0[i]);
    uint16_t shadow = 0;
    adamw_step<float>(&pf, &gf, &mf, &vf, &shadow, 1, 0.01, 0.9, 0.999, 1e-8, 0.1, true, steps[i]);
    EXPECT_NEAR(pf, expect[i], 1e-6) << i;
    EXPECT_EQ(shadow, fp32_to_bf16(pf));
  }
  // No decay: p = 1.0, g = 0.1 at step 1 -> 1.0 - 0.01 / (1 + 1e-7) = 0.990000001
  double p = 1.0, gg = 0.1, m = 0, v = 0;
  adamw_step<double>(&p, &gg, &m, &v, nullptr, 1, 0.01, 0.9, 0.999, 1e-8, 0.1, false, 1);
  EXPECT_NEAR(p, 0.990000001, 1e-12);
}

// torch.optim.AdamW on float32 tensors multiplies by float(1 - 0.999) = float(0.001), not by
// 1 - float(0.999) = 0.00099998713 (1.3e-5 off): the moments must match it bit for bit.
TEST(AdamW, OneMinusBetaIsRoundedOnceAsInPyTorch) {
  float p = 1.0f, g = 1.0f, m = 0.0f, v = 0.0f;
  adamw_step<float>(&p, &g, &m, &v, nullptr, 1, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, 1);
  EXPECT_EQ(v, float(1.0 - 0.999));
  EXPECT_EQ(m, float(1.0 - 0.9));
  // Decoupled decay by float(1 - lr * wd) before the update: 1 - 1e-5, then the step of -lr.
  EXPECT_FLOAT_EQ(p, float(1.0 - 1e-3 * 0.01) - 1e-3f);
}

TEST(AdamW, LargeArrayMatchesElementwiseAndShadow) {
  std::mt19937_64 rng(1);
  const size_t n = 100003;
  auto p = test::cast<float>(test::rand_vec(n, rng)), g = test::cast<float>(test::rand_vec(n, rng));
  std::vector<float> m(n, 0.01f), v(n, 0.02f);
  auto p1 = p, m1 = m, v1 = v;
  std::vector<uint16_t> shadow(n);
  adamw_step<float>(p.data(), g.data(), m.data(), v.data(), shadow.data(), n, 1e-3f, 0.9f, 0.95f,
                    1e-8f, 0.05f, true, 10);
  for (size_t i = 0; i < n; i += 101) {
    adamw_step<float>(&p1[i], &g[i], &m1[i], &v1[i], nullptr, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.05f,
                      true, 10);
    ASSERT_EQ(p[i], p1[i]);
    ASSERT_EQ(m[i], m1[i]);
    ASSERT_EQ(v[i], v1[i]);
  }
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(shadow[i], fp32_to_bf16(p[i]));
}

TEST(GlobalNorm, SumOfSquaresAndScale) {
  std::vector<float> x(1000001);
  double expect = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = float(int(i % 7) - 3) * 0.5f;
    expect += double(x[i]) * double(x[i]);
  }
  EXPECT_DOUBLE_EQ(global_norm_sq(x.data(), x.size()), expect);
  const double small[] = {3.0, 4.0};
  EXPECT_DOUBLE_EQ(global_norm_sq(small, 2), 25.0);
  scale_inplace(x.data(), x.size(), 0.5f);
  EXPECT_DOUBLE_EQ(global_norm_sq(x.data(), x.size()), expect * 0.25);
}

}  // namespace
}  // namespace slipstream::kernels

#include "kernels/activations.h"
#include "kernels/vector_math.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/kernels/gradcheck.h"

namespace slipstream::kernels {
namespace {
using test::cast;
using test::rand_vec;

TEST(Activations, GradCheckSiluSoftplus) {
  std::mt19937_64 rng(1);
  auto x = rand_vec(50, rng, 0.1, 4.0), g = rand_vec(50, rng);
  for (int which = 0; which < 2; ++which) {
    auto fwd = [&](const std::vector<double>& in, std::vector<double>& out) {
      if (which == 0) {
        silu_forward(in.data(), out.data(), in.size());
      } else {
        softplus_forward(in.data(), out.data(), in.size());
      }
    };
    auto loss = [&] {
      std::vector<double> y(x.size());
      fwd(x, y);
      return test::dot(g, y);
    };
    std::vector<double> dx(x.size());
    if (which == 0) {
      silu_backward(x.data(), g.data(), dx.data(), x.size());
    } else {
      softplus_backward(x.data(), g.data(), dx.data(), x.size());
    }
    test::check_gradient(which ? "softplus" : "silu", loss, x, dx);
    std::vector<double> yd(x.size());
    std::vector<float> yf(x.size());
    auto xf = cast<float>(x);
    fwd(x, yd);
    if (which == 0) {
      silu_forward(xf.data(), yf.data(), xf.size());
    } else {
      softplus_forward(xf.data(), yf.data(), xf.size());
    }
    EXPECT_LT(test::rel_diff(yd, yf), 1e-6);
  }
}

TEST(Activations, SoftplusThresholdLikePyTorch) {
  // Above 20 softplus is the identity with gradient 1; just below it is log1p(exp(x)).
  const std::vector<double> x = {-30.0, -1.0, 0.0, 19.5, 20.0, 20.5, 50.0};
  std::vector<double> y(x.size()), dx(x.size()), ones(x.size(), 1.0);
  softplus_forward(x.data(), y.data(), x.size());
  softplus_backward(x.data(), ones.data(), dx.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] > 20.0) {
      EXPECT_EQ(y[i], x[i]);
      EXPECT_EQ(dx[i], 1.0);
    } else {
      EXPECT_DOUBLE_EQ(y[i], std::log1p(std::exp(x[i])));
      EXPECT_DOUBLE_EQ(dx[i], 1.0 / (1.0 + std::exp(-x[i])));
    }
  }
  // silu at large |x| stays finite.
  const float big[] = {-100.0f, 100.0f};
  float out[2];
  silu_forward(big, out, 2);
  EXPECT_EQ(out[0], -0.0f);
  EXPECT_EQ(out[1], 100.0f);
}

TEST(Activations, LargeArrayParallel) {
  std::mt19937_64 rng(2);
  auto x = cast<float>(rand_vec(1 << 18, rng, 0.1, 5.0));
  std::vector<float> y(x.size());
  silu_forward(x.data(), y.data(), x.size());
  for (size_t i = 0; i < x.size(); i += 997) {
    float one;  // the same value wherever the element sits, within 2 ulp of the double formula
    vec_silu(&x[i], &one, 1);
    ASSERT_EQ(y[i], one) << i;
    const double want = silu_scalar(double(x[i]));
    ASSERT_NEAR(y[i], want, 2.4e-7 * std::abs(want)) << x[i];
  }
  // in place
  silu_forward(x.data(), x.data(), x.size());
  EXPECT_EQ(x, y);
}

}  // namespace
}  // namespace slipstream::kernels

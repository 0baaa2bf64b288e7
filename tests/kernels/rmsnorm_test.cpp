#include "kernels/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/kernels/gradcheck.h"

namespace slipstream::kernels {
namespace {
using test::cast;
using test::rand_vec;

TEST(RmsNorm, ForwardMatchesFormula) {
  std::mt19937_64 rng(1);
  const size_t M = 3, D = 10;
  auto x = rand_vec(M * D, rng), w = rand_vec(D, rng);
  std::vector<double> y(M * D), rstd(M);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), M, D, 1e-5);
  for (size_t i = 0; i < M; ++i) {
    double ms = 0;
    for (size_t j = 0; j < D; ++j) ms += x[i * D + j] * x[i * D + j] / D;
    const double r = 1 / std::sqrt(ms + 1e-5);
    EXPECT_NEAR(rstd[i], r, 1e-14);
    for (size_t j = 0; j < D; ++j) EXPECT_NEAR(y[i * D + j], x[i * D + j] * r * w[j], 1e-14);
  }
}

TEST(RmsNorm, GradCheckAccumulationFloat) {
  std::mt19937_64 rng(2);
  const size_t M = 5, D = 70;  // two column blocks in the weight reduction
  auto x = rand_vec(M * D, rng), w = rand_vec(D, rng), g = rand_vec(M * D, rng);
  const double eps = 1e-5;
  auto loss = [&] {
    std::vector<double> y(M * D), r(M);
    rmsnorm_forward(x.data(), w.data(), y.data(), r.data(), M, D, eps);
    return test::dot(g, y);
  };
  std::vector<double> y(M * D), r(M), dx(M * D), dw(D, 0.0);
  rmsnorm_forward(x.data(), w.data(), y.data(), r.data(), M, D, eps);
  rmsnorm_backward(x.data(), w.data(), r.data(), g.data(), dx.data(), dw.data(), M, D);
  test::check_gradient("x", loss, x, dx);
  test::check_gradient("weight", loss, w, dw);
  auto dx1 = dx, dw1 = dw;
  rmsnorm_backward(x.data(), w.data(), r.data(), g.data(), dx.data(), dw.data(), M, D);
  EXPECT_EQ(dx, dx1);
  EXPECT_DOUBLED(dw, dw1);
  // dx may alias dy.
  auto inplace = g;
  std::vector<double> dw2(D, 0.0);
  rmsnorm_backward(x.data(), w.data(), r.data(), inplace.data(), inplace.data(), dw2.data(), M, D);
  EXPECT_EQ(inplace, dx1);
  EXPECT_EQ(dw2, dw1);
  // float vs double
  auto xf = cast<float>(x), wf = cast<float>(w), gf = cast<float>(g);
  std::vector<float> yf(M * D), rf(M), dxf(M * D), dwf(D, 0.0f);
  rmsnorm_forward(xf.data(), wf.data(), yf.data(), rf.data(), M, D, 1e-5f);
  rmsnorm_backward(xf.data(), wf.data(), rf.data(), gf.data(), dxf.data(), dwf.data(), M, D);
  EXPECT_LT(test::rel_diff(y, yf), 1e-5);
  EXPECT_LT(test::rel_diff(dx1, dxf), 1e-5);
  EXPECT_LT(test::rel_diff(dw1, dwf), 1e-5);
}

}  // namespace
}  // namespace slipstream::kernels

namespace slipstream::kernels {
namespace {

// The residual form is the plain norm of x + residual, and its backward the plain backward plus
// the gradient arriving around the norm, also when written in place over it.
TEST(RmsNorm, ResidualFormComposes) {
  std::mt19937_64 rng(79);
  const size_t M = 4, D = 70;
  auto x = test::rand_vec(M * D, rng), res = test::rand_vec(M * D, rng);
  auto w = test::rand_vec(D, rng), dy = test::rand_vec(M * D, rng),
       dsum = test::rand_vec(M * D, rng);
  std::vector<double> s(M * D), y(M * D), rstd(M), sum(M * D), y2(M * D), rstd2(M);
  for (size_t i = 0; i < M * D; ++i) s[i] = x[i] + res[i];
  rmsnorm_forward(s.data(), w.data(), y.data(), rstd.data(), M, D, 1e-5);
  rmsnorm_add_forward(x.data(), res.data(), w.data(), y2.data(), sum.data(), rstd2.data(), M, D,
                      1e-5);
  for (size_t i = 0; i < M * D; ++i) {
    EXPECT_NEAR(y2[i], y[i], 1e-14);
    EXPECT_NEAR(sum[i], s[i], 1e-15);
  }
  std::vector<double> dx(M * D), dw(D, 0.0), dw2(D, 0.0), ds = dsum;
  rmsnorm_backward(s.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), M, D);
  rmsnorm_add_backward(s.data(), w.data(), rstd.data(), dy.data(), ds.data(), ds.data(), dw2.data(),
                       M, D);
  for (size_t i = 0; i < M * D; ++i) EXPECT_NEAR(ds[i], dx[i] + dsum[i], 1e-13);
  for (size_t j = 0; j < D; ++j) EXPECT_NEAR(dw2[j], dw[j], 1e-13);
}

}  // namespace
}  // namespace slipstream::kernels

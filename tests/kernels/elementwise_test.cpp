#include "kernels/elementwise.h"

#include <gtest/gtest.h>

#include "tests/kernels/gradcheck.h"

namespace slipstream::kernels {
namespace {
using test::rand_vec;

TEST(Elementwise, AddMulAndBackward) {
  std::mt19937_64 rng(1);
  const size_t n = 20000;  // parallel blocks
  auto a = rand_vec(n, rng), b = rand_vec(n, rng), g = rand_vec(n, rng);
  std::vector<double> y(n), da(n), db(n);
  add(a.data(), b.data(), y.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]);
  add_inplace(y.data(), a.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], (a[i] + b[i]) + a[i]);
  mul(a.data(), b.data(), y.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] * b[i]);
  mul_backward(a.data(), b.data(), g.data(), da.data(), db.data(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(da[i], g[i] * b[i]);
    ASSERT_EQ(db[i], g[i] * a[i]);
  }
  // Small case through the gradient checker too.
  std::vector<double> a5(a.begin(), a.begin() + 5), b5(b.begin(), b.begin() + 5),
      g5(g.begin(), g.begin() + 5), da5(5), db5(5);
  auto loss = [&] {
    std::vector<double> y5(5);
    mul(a5.data(), b5.data(), y5.data(), 5);
    return test::dot(g5, y5);
  };
  mul_backward(a5.data(), b5.data(), g5.data(), da5.data(), db5.data(), 5);
  test::check_gradient("a", loss, a5, da5);
  test::check_gradient("b", loss, b5, db5);
}

TEST(Elementwise, SplitAndConcatLastDim) {
  const size_t M = 4, D1 = 3, D2 = 5;
  std::vector<float> src(M * (D1 + D2));
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
  std::vector<float> p(M * D1), q(M * D2), back(src.size(), -1.0f);
  copy_cols(src.data(), D1 + D2, p.data(), D1, M, D1);
  copy_cols(src.data() + D1, D1 + D2, q.data(), D2, M, D2);
  for (size_t r = 0; r < M; ++r) {
    for (size_t j = 0; j < D1; ++j) EXPECT_EQ(p[r * D1 + j], src[r * (D1 + D2) + j]);
    for (size_t j = 0; j < D2; ++j) EXPECT_EQ(q[r * D2 + j], src[r * (D1 + D2) + D1 + j]);
  }
  copy_cols(p.data(), D1, back.data(), D1 + D2, M, D1);
  copy_cols(q.data(), D2, back.data() + D1, D1 + D2, M, D2);
  EXPECT_EQ(back, src);
}

}  // namespace
}  // namespace slipstream::kernels

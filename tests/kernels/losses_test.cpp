#include "kernels/losses.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/kernels/gradcheck.h"

namespace slipstream::kernels {
namespace {
using test::cast;
using test::rand_vec;

TEST(SoftmaxCrossEntropy, ForwardFormulaArgmaxAccuracy) {
  const size_t N = 3, K = 4;
  const std::vector<double> x = {1.0,  2.0, 0.5, -1.0,  // argmax 1
                                 0.0,  0.0, 3.0, 0.0,   // argmax 2
                                 -2.0, 1.0, 0.0, 4.0};  // argmax 3
  const std::vector<int32_t> tgt = {1, 0, -1};          // row 2 ignored
  const double eps = 0.1;
  std::vector<double> rl(N);
  std::vector<int32_t> pred(N);
  LossStats s = softmax_cross_entropy_forward(
      x.data(), tgt.data(), static_cast<const double*>(nullptr), rl.data(), pred.data(), N, K, eps);
  EXPECT_EQ(pred, (std::vector<int32_t>{1, 2, 3}));
  double total = 0;
  for (size_t i = 0; i < 2; ++i) {
    double se = 0;
    for (size_t k = 0; k < K; ++k) se += std::exp(x[i * K + k]);
    double l = 0;
    for (size_t k = 0; k < K; ++k) {
      const double q = (int(k) == tgt[i] ? 1 - eps : 0.0) + eps / K;
      l -= q * (x[i * K + k] - std::log(se));
    }
    EXPECT_NEAR(rl[i], l, 1e-14);
    total += l;
  }
  EXPECT_EQ(rl[2], 0.0);
  EXPECT_EQ(s.weight_sum, 2.0);
  EXPECT_NEAR(s.mean(), total / 2, 1e-14);
  EXPECT_EQ(s.accuracy(), 0.5);
}

TEST(SoftmaxCrossEntropy, GradCheckWeightedSmoothed) {
  std::mt19937_64 rng(1);
  const size_t N = 6, K = 7;
  auto x = rand_vec(N * K, rng, 0.1, 3.0), w = test::rand_pos(N, rng);
  std::vector<int32_t> tgt = {0, 6, 3, -1, 2, 2};
  const double eps = 0.1;
  auto loss = [&] {
    return softmax_cross_entropy_forward(x.data(), tgt.data(), w.data(),
                                         static_cast<double*>(nullptr), nullptr, N, K, eps)
        .mean();
  };
  LossStats s = softmax_cross_entropy_forward(x.data(), tgt.data(), w.data(),
                                              static_cast<double*>(nullptr), nullptr, N, K, eps);
  std::vector<double> dx(N * K);
  softmax_cross_entropy_backward(x.data(), tgt.data(), w.data(), dx.data(), N, K, eps,
                                 1.0 / s.weight_sum);
  test::check_gradient("logits", loss, x, dx);
  for (size_t k = 0; k < K; ++k) EXPECT_EQ(dx[3 * K + k], 0.0);  // ignored row
  // float, and extreme logits stay finite
  auto xf = cast<float>(x), wf = cast<float>(w);
  xf[0] = 1e4f;
  xf[1] = -1e4f;
  std::vector<float> dxf(N * K), rl(N);
  LossStats sf = softmax_cross_entropy_forward(xf.data(), tgt.data(), wf.data(), rl.data(), nullptr,
                                               N, K, 0.1f);
  softmax_cross_entropy_backward(xf.data(), tgt.data(), wf.data(), dxf.data(), N, K, 0.1f, 1.0f);
  EXPECT_TRUE(std::isfinite(sf.loss_sum));
  for (float v : dxf) EXPECT_TRUE(std::isfinite(v));
}

TEST(BceWithLogits, ForwardGradCheckAccuracy) {
  std::mt19937_64 rng(2);
  const size_t n = 40;
  auto x = rand_vec(n, rng, 0.1, 5.0), w = test::rand_pos(n, rng);
  std::vector<double> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = double(rng() % 2);
  const double eps = 0.05;
  std::vector<double> el(n);
  LossStats s = bce_with_logits_forward(x.data(), y.data(), w.data(), el.data(), n, eps);
  double correct = 0, lsum = 0, wsum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double ys = y[i] * (1 - eps) + eps / 2, p = 1 / (1 + std::exp(-x[i]));
    const double l = -(ys * std::log(p) + (1 - ys) * std::log(1 - p));
    EXPECT_NEAR(el[i], l, 1e-12);
    lsum += w[i] * l;
    wsum += w[i];
    if ((x[i] > 0) == (y[i] > 0.5)) correct += w[i];
  }
  EXPECT_NEAR(s.mean(), lsum / wsum, 1e-12);
  EXPECT_NEAR(s.accuracy(), correct / wsum, 1e-14);
  auto loss = [&] {
    return bce_with_logits_forward(x.data(), y.data(), w.data(), static_cast<double*>(nullptr), n,
                                   eps)
        .mean();
  };
  std::vector<double> dx(n);
  bce_with_logits_backward(x.data(), y.data(), w.data(), dx.data(), n, eps, 1.0 / s.weight_sum);
  test::check_gradient("logits", loss, x, dx);
  // stable at extreme logits
  const float xs[] = {-200.0f, 200.0f}, ys[] = {1.0f, 0.0f};
  float ls[2], gs[2];
  bce_with_logits_forward(xs, ys, static_cast<const float*>(nullptr), ls, 2, 0.0f);
  bce_with_logits_backward(xs, ys, static_cast<const float*>(nullptr), gs, 2, 0.0f, 1.0f);
  EXPECT_FLOAT_EQ(ls[0], 200.0f);
  EXPECT_FLOAT_EQ(ls[1], 200.0f);
  EXPECT_FLOAT_EQ(gs[0], -1.0f);
  EXPECT_FLOAT_EQ(gs[1], 1.0f);
}

// A masked-out position (weight 0) with a NaN logit leaves the loss and the other gradients
// finite: it is skipped, as PyTorch's indexing by the mask would.
TEST(BceWithLogits, MaskedNonFiniteLogitIsSkipped) {
  const float x[] = {0.5f, std::nanf(""), -INFINITY}, y[] = {1.0f, 1.0f, 0.0f};
  const float w[] = {1.0f, 0.0f, 0.0f};
  float el[3], g[3];
  LossStats s = bce_with_logits_forward(x, y, w, el, 3, 0.0f);
  EXPECT_TRUE(std::isfinite(s.mean()));
  EXPECT_NEAR(s.mean(), std::log1p(std::exp(-0.5)), 1e-6);
  EXPECT_EQ(s.weight_sum, 1.0);
  bce_with_logits_backward(x, y, w, g, 3, 0.0f, 1.0f);
  EXPECT_TRUE(std::isfinite(g[0]));
  EXPECT_EQ(g[1], 0.0f);
  EXPECT_EQ(g[2], 0.0f);
  // The same for a softmax row with weight 0.
  const float lg[] = {1.0f, 2.0f, std::nanf(""), 0.0f};
  const int32_t t[] = {1, 0};
  const float rw[] = {1.0f, 0.0f};
  EXPECT_TRUE(std::isfinite(
      softmax_cross_entropy_forward(lg, t, rw, static_cast<float*>(nullptr), nullptr, 2, 2, 0.0f)
          .mean()));
}

}  // namespace
}  // namespace slipstream::kernels

#include "kernels/causal_conv1d.h"
#include "kernels/activations.h"

#include <gtest/gtest.h>

#include <tbb/global_control.h>

#include "tests/kernels/gradcheck.h"

namespace slipstream::kernels {
namespace {
using test::cast;
using test::rand_vec;

// Conv1d(C, C, K, groups=C, padding=K-1)(x)[..., :L] written out directly.
std::vector<double> ref_conv(const std::vector<double>& x, const std::vector<double>& w,
                             const std::vector<double>& b, int B, int L, int C, int K) {
  std::vector<double> y(size_t(B) * L * C);
  for (int bb = 0; bb < B; ++bb)
    for (int t = 0; t < L; ++t)
      for (int c = 0; c < C; ++c) {
        double s = b[c];
        for (int k = 0; k < K; ++k) {
          const int src = t - (K - 1) + k;
          if (src >= 0) s += w[c * K + k] * x[(size_t(bb) * L + src) * C + c];
        }
        y[(size_t(bb) * L + t) * C + c] = s;
      }
  return y;
}

TEST(CausalConv1d, ForwardMatchesReference) {
  std::mt19937_64 rng(1);
  const int B = 3, L = 11, C = 37, K = 4;  // C spans a partial channel block
  auto x = rand_vec(size_t(B) * L * C, rng), w = rand_vec(C * K, rng), b = rand_vec(C, rng);
  std::vector<double> y(x.size());
  causal_conv1d_forward(x.data(), w.data(), b.data(), y.data(), B, L, C, K);
  EXPECT_LT(test::rel_diff(ref_conv(x, w, b, B, L, C, K), y), 1e-15);
}

TEST(CausalConv1d, GradCheckAccumulationFloat) {
  std::mt19937_64 rng(2);
  const int B = 2, L = 9, C = 20, K = 4;
  auto x = rand_vec(size_t(B) * L * C, rng), w = rand_vec(C * K, rng), b = rand_vec(C, rng);
  auto g = rand_vec(x.size(), rng);
  auto loss = [&] {
    std::vector<double> y(x.size());
    causal_conv1d_forward(x.data(), w.data(), b.data(), y.data(), B, L, C, K);
    return test::dot(g, y);
  };
  std::vector<double> dx(x.size()), dw(w.size(), 0.0), db(b.size(), 0.0);
  causal_conv1d_backward(x.data(), w.data(), g.data(), dx.data(), dw.data(), db.data(), B, L, C, K);
  test::check_gradient("x", loss, x, dx);
  test::check_gradient("weight", loss, w, dw);
  test::check_gradient("bias", loss, b, db);
  auto dx1 = dx, dw1 = dw, db1 = db;
  causal_conv1d_backward(x.data(), w.data(), g.data(), dx.data(), dw.data(), db.data(), B, L, C, K);
  EXPECT_EQ(dx, dx1);
  EXPECT_DOUBLED(dw, dw1);
  EXPECT_DOUBLED(db, db1);
  auto xf = cast<float>(x), wf = cast<float>(w), bf = cast<float>(b), gf = cast<float>(g);
  std::vector<float> yf(x.size()), dxf(x.size()), dwf(w.size(), 0.0f), dbf(C, 0.0f);
  causal_conv1d_forward(xf.data(), wf.data(), bf.data(), yf.data(), B, L, C, K);
  causal_conv1d_backward(xf.data(), wf.data(), gf.data(), dxf.data(), dwf.data(), dbf.data(), B, L,
                         C, K);
  EXPECT_LT(test::rel_diff(ref_conv(x, w, b, B, L, C, K), yf), 1e-5);
  EXPECT_LT(test::rel_diff(dx1, dxf), 1e-5);
  EXPECT_LT(test::rel_diff(dw1, dwf), 1e-5);
}

TEST(CausalConv1d, ShortSequenceAndParallelEqualsSerial) {
  std::mt19937_64 rng(3);
  const int B = 8, L = 2, C = 300, K = 4;  // L < K - 1: only part of the window is in range
  auto x = cast<float>(rand_vec(size_t(B) * L * C, rng));
  auto w = cast<float>(rand_vec(C * K, rng)), g = cast<float>(rand_vec(x.size(), rng));
  auto run = [&] {
    std::vector<float> y(x.size()), dx(x.size()), dw(w.size(), 0.0f);
    causal_conv1d_forward(x.data(), w.data(), static_cast<const float*>(nullptr), y.data(), B, L, C,
                          K);
    causal_conv1d_backward(x.data(), w.data(), g.data(), dx.data(), dw.data(),
                           static_cast<float*>(nullptr), B, L, C, K);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  const auto par = run();
  tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
  EXPECT_EQ(par, run());
  std::vector<double> zero(C, 0.0);
  auto yref = ref_conv(cast<double>(std::vector<double>(x.begin(), x.end())),
                       std::vector<double>(w.begin(), w.end()), zero, B, L, C, K);
  EXPECT_LT(test::rel_diff(yref, std::vector<float>(par.begin(), par.begin() + x.size())), 1e-6);
}

}  // namespace
}  // namespace slipstream::kernels

namespace slipstream::kernels {
namespace {

TEST(CausalConv1d, StepEqualsForward) {
  std::mt19937_64 rng(78);
  for (int K : {1, 2, 4}) {
    const int B = 2, L = 9, C = 7;
    auto x = test::rand_vec(size_t(B) * L * C, rng), w = test::rand_vec(size_t(C) * K, rng);
    auto b = test::rand_vec(C, rng);
    std::vector<double> y(x.size());
    causal_conv1d_forward(x.data(), w.data(), b.data(), y.data(), B, L, C, K);
    silu_forward(y.data(), y.data(), y.size());
    std::vector<double> state(size_t(B) * (K - 1) * C + 1, 0.0);
    for (int t = 0; t < L; ++t) {
      std::vector<double> xt, yt(size_t(B) * C);
      for (int bb = 0; bb < B; ++bb)
        for (int c = 0; c < C; ++c) xt.push_back(x[(size_t(bb) * L + t) * C + c]);
      causal_conv1d_step(state.data(), xt.data(), w.data(), b.data(), yt.data(), B, C, K, true);
      for (int bb = 0; bb < B; ++bb)
        for (int c = 0; c < C; ++c)
          EXPECT_NEAR(yt[size_t(bb) * C + c], y[(size_t(bb) * L + t) * C + c], 1e-12) << K;
    }
  }
}

}  // namespace
}  // namespace slipstream::kernels

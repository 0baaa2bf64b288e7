#include "kernels/gru.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/kernels/gradcheck.h"

namespace slipstream::kernels {
namespace {
using test::cast;
using test::rand_vec;

struct Gru {
  int B, L, In, H;
  bool use_h0, use_bias;
  std::vector<double> x, h0, wih, whh, bih, bhh;
  Gru(int B_, int L_, int In_, int H_, bool h0_, bool bias_, uint64_t seed)
      : B(B_), L(L_), In(In_), H(H_), use_h0(h0_), use_bias(bias_) {
    std::mt19937_64 rng(seed);
    x = rand_vec(size_t(B) * L * In, rng);
    h0 = rand_vec(size_t(B) * H, rng);
    wih = rand_vec(size_t(3) * H * In, rng, 0.05, 0.6);
    whh = rand_vec(size_t(3) * H * H, rng, 0.05, 0.6);
    bih = rand_vec(3 * H, rng);
    bhh = rand_vec(3 * H, rng);
  }
  template <class T>
  std::vector<T> forward(const std::vector<T>& x_, const std::vector<T>& h0_,
                         const std::vector<T>& wih_, const std::vector<T>& whh_,
                         const std::vector<T>& bih_, const std::vector<T>& bhh_,
                         std::vector<T>* saved = nullptr) const {
    std::vector<T> y(size_t(B) * L * H), ws(gru_forward_workspace_elems(B, L, H));
    if (saved) saved->assign(gru_saved_elems(B, L, H), T(0));
    gru_forward<T>(x_.data(), use_h0 ? h0_.data() : nullptr, wih_.data(), whh_.data(),
                   use_bias ? bih_.data() : nullptr, use_bias ? bhh_.data() : nullptr, y.data(),
                   saved ? saved->data() : nullptr, ws.data(), B, L, In, H);
    return y;
  }
  std::vector<double> forward() const { return forward(x, h0, wih, whh, bih, bhh); }
};

// torch.nn.GRU equations, one step at a time.
std::vector<double> reference(const Gru& g) {
  const int H = g.H, In = g.In;
  std::vector<double> y(size_t(g.B) * g.L * H);
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  for (int b = 0; b < g.B; ++b) {
    std::vector<double> h(H, 0.0);
    if (g.use_h0) h.assign(g.h0.begin() + b * H, g.h0.begin() + (b + 1) * H);
    for (int t = 0; t < g.L; ++t) {
      const double* xt = &g.x[(size_t(b) * g.L + t) * In];
      auto gate = [&](int k, int j, bool input) {
        double s = g.use_bias ? (input ? g.bih : g.bhh)[k * H + j] : 0.0;
        if (input) {
          for (int i = 0; i < In; ++i) s += g.wih[(k * H + j) * In + i] * xt[i];
        } else {
          for (int i = 0; i < H; ++i) s += g.whh[(k * H + j) * H + i] * h[i];
        }
        return s;
      };
      std::vector<double> hn(H);
      for (int j = 0; j < H; ++j) {
        const double r = sig(gate(0, j, true) + gate(0, j, false));
        const double z = sig(gate(1, j, true) + gate(1, j, false));
        const double n = std::tanh(gate(2, j, true) + r * gate(2, j, false));
        hn[j] = (1 - z) * n + z * h[j];
      }
      h = hn;
      std::copy(h.begin(), h.end(), y.begin() + (size_t(b) * g.L + t) * H);
    }
  }
  return y;
}

void run_gradcheck(Gru& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto w = rand_vec(size_t(g.B) * g.L * g.H, rng);
  const auto wlast = rand_vec(size_t(g.B) * g.H, rng);  // extra gradient on h_n
  auto loss = [&] {
    const auto y = g.forward();
    double s = test::dot(w, y);
    for (int b = 0; b < g.B; ++b)
      for (int j = 0; j < g.H; ++j)
        s += wlast[b * g.H + j] * y[(size_t(b) * g.L + g.L - 1) * g.H + j];
    return s;
  };
  EXPECT_LT(test::rel_diff(reference(g), g.forward()), 1e-14);
  std::vector<double> saved;
  const auto y = g.forward(g.x, g.h0, g.wih, g.whh, g.bih, g.bhh, &saved);
  std::vector<double> dx(g.x.size(), 5.0), dh0(g.h0.size(), 5.0), dwih(g.wih.size(), 0.0),
      dwhh(g.whh.size(), 0.0), dbih(g.bih.size(), 0.0), dbhh(g.bhh.size(), 0.0),
      ws(gru_backward_workspace_elems(g.B, g.L, g.H), -3.0);
  auto bwd = [&] {
    gru_backward<double>(g.x.data(), g.use_h0 ? g.h0.data() : nullptr, g.wih.data(), g.whh.data(),
                         y.data(), saved.data(), w.data(), wlast.data(), dx.data(),
                         g.use_h0 ? dh0.data() : nullptr, dwih.data(), dwhh.data(),
                         g.use_bias ? dbih.data() : nullptr, g.use_bias ? dbhh.data() : nullptr,
                         ws.data(), g.B, g.L, g.In, g.H);
  };
  bwd();
  test::check_gradient("x", loss, g.x, dx);
  if (g.use_h0) test::check_gradient("h0", loss, g.h0, dh0);
  test::check_gradient("weight_ih", loss, g.wih, dwih);
  test::check_gradient("weight_hh", loss, g.whh, dwhh);
  if (g.use_bias) {
    test::check_gradient("bias_ih", loss, g.bih, dbih);
    test::check_gradient("bias_hh", loss, g.bhh, dbhh);
  }
  const auto dx1 = dx, dh01 = dh0, dwih1 = dwih, dwhh1 = dwhh, dbih1 = dbih, dbhh1 = dbhh;
  bwd();
  EXPECT_EQ(dx, dx1);
  EXPECT_EQ(dh0, dh01);
  EXPECT_DOUBLED(dwih, dwih1);
  EXPECT_DOUBLED(dwhh, dwhh1);
  EXPECT_DOUBLED(dbih, dbih1);
  EXPECT_DOUBLED(dbhh, dbhh1);

  // float against double
  std::vector<float> savedf;
  auto xf = cast<float>(g.x), h0f = cast<float>(g.h0), wihf = cast<float>(g.wih),
       whhf = cast<float>(g.whh), bihf = cast<float>(g.bih), bhhf = cast<float>(g.bhh),
       wf = cast<float>(w), wlf = cast<float>(wlast);
  const auto yf = g.forward(xf, h0f, wihf, whhf, bihf, bhhf, &savedf);
  EXPECT_LT(test::rel_diff(y, yf), 1e-5);
  std::vector<float> dxf(xf.size()), dh0f(h0f.size()), dwihf(wihf.size(), 0.0f),
      dwhhf(whhf.size(), 0.0f), dbihf(bihf.size(), 0.0f), dbhhf(bhhf.size(), 0.0f),
      wsf(gru_backward_workspace_elems(g.B, g.L, g.H));
  gru_backward<float>(xf.data(), g.use_h0 ? h0f.data() : nullptr, wihf.data(), whhf.data(),
                      yf.data(), savedf.data(), wf.data(), wlf.data(), dxf.data(),
                      g.use_h0 ? dh0f.data() : nullptr, dwihf.data(), dwhhf.data(),
                      g.use_bias ? dbihf.data() : nullptr, g.use_bias ? dbhhf.data() : nullptr,
                      wsf.data(), g.B, g.L, g.In, g.H);
  EXPECT_LT(test::rel_diff(dx1, dxf), 1e-5);
  EXPECT_LT(test::rel_diff(dwih1, dwihf), 1e-5);
  EXPECT_LT(test::rel_diff(dwhh1, dwhhf), 1e-5);
  if (g.use_h0) {
    EXPECT_LT(test::rel_diff(dh01, dh0f), 1e-5);
  }
}

TEST(Gru, GradCheckWithH0AndBias) {
  Gru g(3, 7, 4, 5, true, true, 1);
  run_gradcheck(g, 2);
}

TEST(Gru, GradCheckZeroStateNoBias) {
  Gru g(2, 6, 3, 4, false, false, 3);
  run_gradcheck(g, 4);
}

TEST(Gru, LargerBatchParallelGates) {
  // Big enough that the gate passes run as TBB tasks; still checked against the reference.
  Gru g(64, 5, 16, 48, true, true, 5);
  EXPECT_LT(test::rel_diff(reference(g), g.forward()), 1e-13);
}

}  // namespace
}  // namespace slipstream::kernels

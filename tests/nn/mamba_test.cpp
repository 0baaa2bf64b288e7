// The Mamba model: forward against a slow sequential reference, float64 finite-difference
// gradients of every parameter and the input, and the stage (names, shapes, init, bf16).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "engine/stage_harness.h"
#include "kernels/bf16.h"
#include "stages/nn/mamba_model.h"
#include "tests/kernels/gradcheck.h"
#include "tests/nn/param_gradcheck.h"
#include "tests/nn/precision_checks.h"

namespace slipstream::nn {
namespace {

using kernels::test::check_gradient;
using kernels::test::rand_vec;

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
double silu(double x) {
  return x * sigmoid(x);
}
double softplus(double x) {
  return x > 20 ? x : std::log1p(std::exp(x));
}

// Straight from the definition: one position at a time, one channel's state at a time.
std::vector<double> reference_forward(const MambaConfig& c, const MambaLayout& lay,
                                      const std::vector<double>& w, const std::vector<double>& x,
                                      int B, int L) {
  const int dm = c.d_model, di = c.d_inner(), N = c.d_state, R = c.rank(), K = c.d_conv;
  const int P = R + 2 * N;
  auto W = [&](size_t off, int r, int col, int cols) { return w[off + size_t(r) * cols + col]; };
  auto rmsnorm = [&](const std::vector<double>& v, size_t woff) {
    double ss = 0;
    for (double e : v) ss += e * e;
    const double r = 1.0 / std::sqrt(ss / double(v.size()) + c.eps);
    std::vector<double> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = v[i] * r * w[woff + i];
    return o;
  };
  std::vector<double> y(size_t(B) * L * dm);
  for (int b = 0; b < B; ++b) {
    // Per layer: conv history of x (the last K positions) and the SSM state.
    std::vector<std::vector<std::vector<double>>> hist(c.layers);
    std::vector<std::vector<double>> state(c.layers, std::vector<double>(size_t(di) * N, 0.0));
    for (int t = 0; t < L; ++t) {
      std::vector<double> h(dm);
      const double* xt = &x[(size_t(b) * L + t) * c.din];
      for (int o = 0; o < dm; ++o) {
        if (c.has_input_proj()) {
          double s = w[lay.input_proj_b + o];
          for (int i = 0; i < c.din; ++i) s += W(lay.input_proj_w, o, i, c.din) * xt[i];
          h[o] = s;
        } else {
          h[o] = xt[o];
        }
      }
      for (int l = 0; l < c.layers; ++l) {
        const auto& Lw = lay.layers[l];
        auto xn = rmsnorm(h, Lw.norm);
        std::vector<double> xz(2 * di, 0.0);
        for (int o = 0; o < 2 * di; ++o)
          for (int i = 0; i < dm; ++i) xz[o] += W(Lw.in_proj, o, i, dm) * xn[i];
        hist[l].push_back(std::vector<double>(xz.begin(), xz.begin() + di));
        std::vector<double> u(di);
        for (int ch = 0; ch < di; ++ch) {
          double s = w[Lw.conv_b + ch];
          for (int k = 0; k < K; ++k) {
            const int tt = t - (K - 1) + k;
            if (tt >= 0) s += w[Lw.conv_w + size_t(ch) * K + k] * hist[l][tt][ch];
          }
          u[ch] = silu(s);
        }
        std::vector<double> dbc(P, 0.0);
        for (int o = 0; o < P; ++o)
          for (int i = 0; i < di; ++i) dbc[o] += W(Lw.x_proj, o, i, di) * u[i];
        std::vector<double> out(di);
        for (int ch = 0; ch < di; ++ch) {
          double d = w[Lw.dt_b + ch];
          for (int r = 0; r < R; ++r) d += W(Lw.dt_w, ch, r, R) * dbc[r];
          const double dt = softplus(d);
          double yc = w[Lw.D + ch] * u[ch];
          for (int n = 0; n < N; ++n) {
            const double A = -std::exp(w[Lw.A_log + size_t(ch) * N + n]);
            double& s = state[l][size_t(ch) * N + n];
            s = std::exp(dt * A) * s + dt * dbc[R + n] * u[ch];
            yc += dbc[R + N + n] * s;
          }
          out[ch] = yc * silu(xz[di + ch]);
        }
        for (int o = 0; o < dm; ++o)
          for (int i = 0; i < di; ++i) h[o] += W(Lw.out_proj, o, i, di) * out[i];
      }
      auto yt = rmsnorm(h, lay.norm_f);
      std::copy(yt.begin(), yt.end(), y.begin() + (size_t(b) * L + t) * dm);
    }
  }
  return y;
}

MambaConfig small_config(int din) {
  MambaConfig c;
  c.din = din;
  c.d_model = 8;
  c.d_state = 16;
  c.d_conv = 4;
  c.expand = 2;
  c.layers = 2;
  return c;
}

// Random weights around the real initialisation (so no parameter is exactly 0 or 1).
std::vector<double> random_weights(const MambaConfig& c, const MambaLayout& lay, uint64_t seed) {
  std::vector<double> w(lay.params.total());
  mamba_init(c, lay, w.data(), seed);
  std::mt19937_64 rng(seed);
  auto noise = rand_vec(w.size(), rng, 0.05, 0.2);
  for (size_t i = 0; i < w.size(); ++i) w[i] += noise[i];
  return w;
}

// A forward and backward of `m` as it stands (a carried state included), then float64 central
// differences of the input and of every parameter tensor against them; g (+=) and dx (=) keep
// the backward's results.
void check_model_gradients(MambaModel<double>& m, std::vector<double>& w, std::vector<double>& x,
                           const std::vector<double>& dy, std::vector<double>& g,
                           std::vector<double>& dx) {
  std::vector<double> y(dy.size());
  auto loss = [&] {
    m.forward(x.data(), w.data(), nullptr, y.data());
    return kernels::test::dot(dy, y);
  };
  loss();
  m.backward(x.data(), dy.data(), w.data(), nullptr, g.data(), dx.data());
  check_gradient("x", loss, x, dx, 1e-6, 1e-6, 96);
  nn::test::check_parameter_gradients(m.layout().params.slots(), loss, w, g, 64);
}

class MambaModelTest : public ::testing::TestWithParam<int> {};

TEST_P(MambaModelTest, ForwardMatchesSequentialReference) {
  const MambaConfig c = small_config(GetParam());
  MambaModel<double> m(c);
  const int B = 2, L = 64;
  m.resize(B, L, false);
  auto w = random_weights(c, m.layout(), 3);
  std::mt19937_64 rng(4);
  auto x = rand_vec(size_t(B) * L * c.din, rng);
  std::vector<double> y(size_t(B) * L * c.d_model);
  m.forward(x.data(), w.data(), nullptr, y.data());
  auto ref = reference_forward(c, m.layout(), w, x, B, L);
  EXPECT_LT(kernels::test::rel_diff(ref, y), 1e-12);
}

TEST_P(MambaModelTest, GradientsMatchFiniteDifferences) {
  const MambaConfig c = small_config(GetParam());
  MambaModel<double> m(c);
  const int B = 2, L = 64;
  m.resize(B, L, false);
  auto w = random_weights(c, m.layout(), 5);
  std::mt19937_64 rng(6);
  auto x = rand_vec(size_t(B) * L * c.din, rng);
  auto dy = rand_vec(size_t(B) * L * c.d_model, rng);
  std::vector<double> y(dy.size()), g(w.size(), 0.0), dx(x.size());
  check_model_gradients(m, w, x, dy, g, dx);
  // Parameter gradients accumulate; the input gradient is overwritten.
  std::vector<double> g2 = g, dx2(x.size());
  m.forward(x.data(), w.data(), nullptr, y.data());
  m.backward(x.data(), dy.data(), w.data(), nullptr, g2.data(), dx2.data());
  EXPECT_DOUBLED(g2, g);
  EXPECT_EQ(dx2, dx);
}

// A model of config `c` that carries its rows' state from one forward to the next, for (B, L).
std::unique_ptr<MambaModel<double>> carrying_model(const MambaConfig& c, int B, int L) {
  auto m = std::make_unique<MambaModel<double>>(c);
  m->set_carry(true);
  m->resize(B, L, false);
  return m;
}

// A window that continues the one before it on a row (continues = 1) gives that row's outputs of
// the two windows as one sequence; a row that starts afresh (0) gives the window's alone.
TEST(MambaModel, CarriedStateContinuesTheSequence) {
  const MambaConfig c = small_config(5);
  const int B = 2, L = 9;
  const auto pm = carrying_model(c, B, L);
  MambaModel<double>& m = *pm;
  auto w = random_weights(c, m.layout(), 31);
  std::mt19937_64 rng(32);
  const auto x = rand_vec(size_t(B) * 2 * L * c.din, rng);  // (B, 2L, din)
  const auto whole = reference_forward(c, m.layout(), w, x, B, 2 * L);
  auto half = [&](const std::vector<double>& v, int cols, int h) {
    std::vector<double> out;
    for (int b = 0; b < B; ++b)
      out.insert(out.end(), v.begin() + (size_t(b) * 2 * L + size_t(h) * L) * cols,
                 v.begin() + (size_t(b) * 2 * L + size_t(h + 1) * L) * cols);
    return out;
  };
  const auto x1 = half(x, c.din, 0), x2 = half(x, c.din, 1);
  std::vector<double> y1(size_t(B) * L * c.d_model), y2(y1.size());
  const std::vector<double> start{0.0, 0.0}, go_on{1.0, 0.0};
  m.carry(start.data());
  m.forward(x1.data(), w.data(), nullptr, y1.data());
  EXPECT_LT(kernels::test::rel_diff(half(whole, c.d_model, 0), y1), 1e-12);
  m.carry(go_on.data());
  m.forward(x2.data(), w.data(), nullptr, y2.data());
  const size_t row = size_t(L) * c.d_model;
  const auto cont = half(whole, c.d_model, 1);
  const auto cold = reference_forward(c, m.layout(), w, x2, B, L);
  EXPECT_LT(kernels::test::rel_diff(std::vector<double>(cont.begin(), cont.begin() + long(row)),
                                    std::vector<double>(y2.begin(), y2.begin() + long(row))),
            1e-12);
  EXPECT_LT(kernels::test::rel_diff(std::vector<double>(cold.begin() + long(row), cold.end()),
                                    std::vector<double>(y2.begin() + long(row), y2.end())),
            1e-12);
  // The carried row is not what a cold start gives: the test can tell the two apart.
  EXPECT_GT(kernels::test::rel_diff(std::vector<double>(cold.begin(), cold.begin() + long(row)),
                                    std::vector<double>(y2.begin(), y2.begin() + long(row))),
            1e-4);
  // Windows shorter than d_conv - 1 (one frame at a time): the sequence still continues.
  const auto ps = carrying_model(c, B, 2);
  MambaModel<double>& s = *ps;
  std::vector<double> ys;
  for (int t0 = 0; t0 < 2 * L; t0 += 2) {
    std::vector<double> xs, y(size_t(B) * 2 * c.d_model);
    for (int b = 0; b < B; ++b)
      xs.insert(xs.end(), x.begin() + (size_t(b) * 2 * L + t0) * c.din,
                x.begin() + (size_t(b) * 2 * L + t0 + 2) * c.din);
    const std::vector<double> go(size_t(B), t0 > 0 ? 1.0 : 0.0);
    s.carry(go.data());
    s.forward(xs.data(), w.data(), nullptr, y.data());
    for (int b = 0; b < B; ++b)
      for (size_t i = 0; i < size_t(2) * c.d_model; ++i)
        EXPECT_NEAR(y[size_t(b) * 2 * c.d_model + i],
                    whole[(size_t(b) * 2 * L + t0) * c.d_model + i], 1e-12)
            << "row " << b << " step " << t0;
  }
}

// From a carried state the gradients are those of the window's loss with the state a constant.
TEST(MambaModel, CarriedStateGradientsMatchFiniteDifferences) {
  const MambaConfig c = small_config(5);
  const int B = 2, L = 12;
  const auto pm = carrying_model(c, B, L);
  MambaModel<double>& m = *pm;
  auto w = random_weights(c, m.layout(), 41);
  std::mt19937_64 rng(42);
  const auto x0 = rand_vec(size_t(B) * L * c.din, rng);
  auto x = rand_vec(x0.size(), rng);
  const auto dy = rand_vec(size_t(B) * L * c.d_model, rng);
  std::vector<double> y(dy.size()), g(w.size(), 0.0), dx(x.size());
  const std::vector<double> start{0.0, 0.0}, go_on{1.0, 1.0};
  m.carry(start.data());
  m.forward(x0.data(), w.data(), nullptr, y.data());
  m.carry(go_on.data());  // fixed from here: forward reads the start, writes the next one
  check_model_gradients(m, w, x, dy, g, dx);
}

INSTANTIATE_TEST_SUITE_P(InputProj, MambaModelTest, ::testing::Values(5, 8), [](const auto& info) {
  return info.param == 8 ? "NoInputProj" : "InputProj";
});

TEST(MambaModel, FloatMatchesDouble) {
  const MambaConfig c = small_config(6);
  MambaModel<double> md(c);
  MambaModel<float> mf(c);
  const int B = 3, L = 40;
  md.resize(B, L, false);
  mf.resize(B, L, false);
  auto w = random_weights(c, md.layout(), 7);
  std::mt19937_64 rng(8);
  auto x = rand_vec(size_t(B) * L * c.din, rng);
  auto dy = rand_vec(size_t(B) * L * c.d_model, rng);
  std::vector<double> y(dy.size()), g(w.size(), 0.0), dx(x.size());
  md.forward(x.data(), w.data(), nullptr, y.data());
  md.backward(x.data(), dy.data(), w.data(), nullptr, g.data(), dx.data());
  auto wf = kernels::test::cast<float>(w), xf = kernels::test::cast<float>(x);
  auto dyf = kernels::test::cast<float>(dy);
  std::vector<float> yf(y.size()), gf(g.size(), 0.0f), dxf(x.size());
  mf.forward(xf.data(), wf.data(), nullptr, yf.data());
  mf.backward(xf.data(), dyf.data(), wf.data(), nullptr, gf.data(), dxf.data());
  EXPECT_LT(kernels::test::rel_diff(y, yf), 2e-5);
  EXPECT_LT(kernels::test::rel_diff(g, gf), 2e-4);
  EXPECT_LT(kernels::test::rel_diff(dx, dxf), 2e-4);
}

TEST(MambaModel, InitFollowsMambaSsm) {
  MambaConfig c = small_config(8);
  c.d_model = 32;  // dt_rank = 2
  MambaLayout lay(c);
  std::vector<float> w(lay.params.total());
  mamba_init(c, lay, w.data(), 11);
  const int di = c.d_inner(), N = c.d_state;
  for (const auto& L : lay.layers) {
    for (int d = 0; d < di; ++d) {
      for (int n = 0; n < N; ++n)
        EXPECT_FLOAT_EQ(w[L.A_log + size_t(d) * N + n], std::log(float(n + 1)));
      EXPECT_EQ(w[L.D + d], 1.0f);
      const double dt = softplus(w[L.dt_b + d]);
      EXPECT_GE(dt, 0.001 * 0.999);
      EXPECT_LE(dt, 0.1 * 1.001);
    }
    const double bound = 1.0 / std::sqrt(double(c.rank()));
    for (int i = 0; i < di * c.rank(); ++i) EXPECT_LE(std::abs(w[L.dt_w + i]), bound);
    EXPECT_EQ(w[L.norm], 1.0f);
  }
  std::vector<float> w2(w.size()), w3(w.size());
  mamba_init(c, lay, w2.data(), 11);
  mamba_init(c, lay, w3.data(), 12);
  EXPECT_EQ(w, w2);
  EXPECT_NE(w, w3);
}

Tensor random_tensor(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::empty(s, DType::f32);
  std::mt19937_64 rng(seed);
  auto v = rand_vec(size_t(t.numel()), rng);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(v[size_t(i)]);
  return t;
}

TEST(MambaStage, ParameterNamesAndShapesAreMambaSsms) {
  StageHarness h("mamba", {"d_model=32", "layers=2", "d_state=16"}, "core");
  h.setup({{"x", Tensor::zeros({2, 8, 20}, DType::f32)}});
  std::map<std::string, std::pair<Shape, bool>> got;
  for (Parameter* p : h.stage().parameters()) got[p->name] = {p->value.shape(), p->weight_decay};
  const std::map<std::string, std::pair<Shape, bool>> want = {
      {"input_proj.weight", {{32, 20}, true}},
      {"input_proj.bias", {{32}, false}},
      {"layers.0.norm.weight", {{32}, false}},
      {"layers.0.mixer.in_proj.weight", {{128, 32}, true}},
      {"layers.0.mixer.conv1d.weight", {{64, 1, 4}, true}},
      {"layers.0.mixer.conv1d.bias", {{64}, false}},
      {"layers.0.mixer.x_proj.weight", {{2 + 32, 64}, true}},
      {"layers.0.mixer.dt_proj.weight", {{64, 2}, true}},
      {"layers.0.mixer.dt_proj.bias", {{64}, false}},
      {"layers.0.mixer.A_log", {{64, 16}, false}},
      {"layers.0.mixer.D", {{64}, false}},
      {"layers.0.mixer.out_proj.weight", {{32, 64}, true}},
      {"layers.1.norm.weight", {{32}, false}},
      {"layers.1.mixer.in_proj.weight", {{128, 32}, true}},
      {"layers.1.mixer.conv1d.weight", {{64, 1, 4}, true}},
      {"layers.1.mixer.conv1d.bias", {{64}, false}},
      {"layers.1.mixer.x_proj.weight", {{34, 64}, true}},
      {"layers.1.mixer.dt_proj.weight", {{64, 2}, true}},
      {"layers.1.mixer.dt_proj.bias", {{64}, false}},
      {"layers.1.mixer.A_log", {{64, 16}, false}},
      {"layers.1.mixer.D", {{64}, false}},
      {"layers.1.mixer.out_proj.weight", {{32, 64}, true}},
      {"norm_f.weight", {{32}, false}},
  };
  EXPECT_EQ(got, want);
  // Din == d_model: no input projection.
  StageHarness h2("mamba", {"d_model=20", "layers=1"}, "core");
  h2.setup({{"x", Tensor::zeros({2, 8, 20}, DType::f32)}});
  for (Parameter* p : h2.stage().parameters())
    EXPECT_EQ(p->name.find("input_proj"), std::string::npos);
}

TEST(MambaStage, SameSeedSameWeights) {
  auto weights = [](uint64_t seed) {
    StageHarness h("mamba", {"d_model=16", "layers=1"}, "core", Precision::fp32, seed);
    h.setup({{"x", Tensor::zeros({1, 4, 8}, DType::f32)}});
    std::vector<float> all;
    for (auto& [name, t] : h.weights())
      all.insert(all.end(), t.data<float>(), t.data<float>() + t.numel());
    return all;
  };
  EXPECT_EQ(weights(1), weights(1));
  EXPECT_NE(weights(1), weights(2));
}

// The stage runs MambaModel<float> on its flat buffers: the same numbers as the model alone.
TEST(MambaStage, ForwardBackwardMatchModel) {
  const int B = 2, W = 24, Din = 6;
  StageHarness h("mamba", {"d_model=8", "layers=2"}, "core");
  Tensor x = random_tensor({B, W, Din}, 21);
  h.setup({{"x", x}});
  MambaModel<double> md(small_config(Din));
  md.resize(B, W, false);
  std::vector<double> w(md.layout().params.total());
  for (Parameter* p : h.stage().parameters()) {
    size_t off = 0;
    for (const auto& s : md.layout().params.slots())
      if (s.name == p->name) off = s.offset;
    for (int64_t i = 0; i < p->value.numel(); ++i) w[off + size_t(i)] = p->value.data<float>()[i];
  }
  std::vector<double> xd(x.data<float>(), x.data<float>() + x.numel()), y(size_t(B) * W * 8);
  md.forward(xd.data(), w.data(), nullptr, y.data());
  auto out = h.forward({{"x", x}});
  EXPECT_LT(
      kernels::test::rel_diff(
          y, std::vector<float>(out["y"].data<float>(), out["y"].data<float>() + out["y"].numel())),
      1e-5);
  Tensor dy = random_tensor({B, W, 8}, 22);
  auto grads = h.backward({{"y", dy}});
  std::vector<double> dyd(dy.data<float>(), dy.data<float>() + dy.numel()), g(w.size(), 0.0),
      dx(xd.size());
  md.backward(xd.data(), dyd.data(), w.data(), nullptr, g.data(), dx.data());
  const Tensor& gx = grads["grad.x"];
  EXPECT_LT(kernels::test::rel_diff(
                dx, std::vector<float>(gx.data<float>(), gx.data<float>() + gx.numel())),
            1e-4);
  const Tensor& gA = grads["grad.layers.1.mixer.A_log"];
  const size_t off = md.layout().layers[1].A_log;
  std::vector<double> ref(g.begin() + long(off), g.begin() + long(off) + gA.numel());
  EXPECT_LT(kernels::test::rel_diff(
                ref, std::vector<float>(gA.data<float>(), gA.data<float>() + gA.numel())),
            1e-4);
}

// bf16: GEMMs on rounded operands, FP32 elsewhere; close to fp32 at bf16 precision.
TEST(MambaStage, Bf16IsCloseToFp32) {
  const int B = 4, W = 32, Din = 16;
  Tensor x = random_tensor({B, W, Din}, 31), dy = random_tensor({B, W, 32}, 32);
  auto run = [&](Precision prec) {
    StageHarness h("mamba", {"d_model=32", "layers=2"}, "core", prec, 9);
    h.setup({{"x", x}});
    auto out = h.forward({{"x", x}});
    Tensor y = out["y"].clone();
    auto g = h.backward({{"y", dy}});
    return std::make_pair(y, g);
  };
  auto [y32, g32] = run(Precision::fp32);
  auto [y16, g16] = run(Precision::bf16);
  const auto rel = test::max_relative_difference;
  EXPECT_LT(rel(y32, y16), 3e-2);
  EXPECT_GT(rel(y32, y16), 0.0);  // the bf16 path did run
  EXPECT_LT(rel(g32["grad.x"], g16["grad.x"]), 5e-2);
  EXPECT_LT(
      rel(g32["grad.layers.0.mixer.in_proj.weight"], g16["grad.layers.0.mixer.in_proj.weight"]),
      5e-2);
  // The shadow is the rounding of the master weights.
  StageHarness h("mamba", {"d_model=32", "layers=1"}, "core", Precision::bf16);
  h.setup({{"x", x}});
  test::expect_shadows_are_roundings(h.stage());
}

TEST(MambaStage, NewBatchShapeReallocates) {
  StageHarness h("mamba", {"d_model=8", "layers=1"}, "core");
  h.setup({{"x", Tensor::zeros({2, 8, 8}, DType::f32)}});
  auto a = h.forward({{"x", random_tensor({2, 8, 8}, 1)}});
  EXPECT_EQ(a["y"].shape(), (Shape{2, 8, 8}));
  auto b = h.forward({{"x", random_tensor({3, 5, 8}, 2)}});
  EXPECT_EQ(b["y"].shape(), (Shape{3, 5, 8}));
  auto g = h.backward({{"y", random_tensor({3, 5, 8}, 3)}});
  EXPECT_EQ(g["grad.x"].shape(), (Shape{3, 5, 8}));
}

// CPU ops that also count the GEMMs' floating-point operations.
struct GemmCountingOps : ops::CpuOps<double> {
  std::shared_ptr<double> flops = std::make_shared<double>(0);
  void gemm(bool ta, bool tb, int M, int N, int K, const double* A, const uint16_t* Ab, int lda,
            const double* B, const uint16_t* Bb, int ldb, double beta, double* C, int ldc,
            void* scratch) const {
    *flops += 2.0 * M * N * K;
    ops::CpuOps<double>::gemm(ta, tb, M, N, K, A, Ab, lda, B, Bb, ldb, beta, C, ldc, scratch);
  }
};

// mamba_flops (slipstream summary) counts the GEMMs forward() and backward() issue.
TEST(Mamba, FlopCountMatchesTheGemmsItRuns) {
  for (const bool input_proj : {false, true})
    for (const bool want_dx : {false, true}) {
      MambaConfig c;
      c.d_model = 8, c.din = input_proj ? 5 : 8, c.d_state = 4, c.layers = 2, c.expand = 2;
      const int B = 2, L = 7;
      GemmCountingOps ops;
      MambaModel<double, GemmCountingOps> m(c, ops);
      m.resize(B, L, false);
      std::mt19937_64 rng(3);
      const auto w = rand_vec(m.layout().params.total(), rng, 0.05, 0.3);
      const auto x = rand_vec(size_t(B) * L * c.din, rng);
      std::vector<double> y(size_t(B) * L * c.d_model), g(w.size()), dx(x.size());
      m.forward(x.data(), w.data(), nullptr, y.data());
      const double forward = *ops.flops;
      m.backward(x.data(), y.data(), w.data(), nullptr, g.data(), want_dx ? dx.data() : nullptr);
      const ModelFlops f = mamba_flops(c, B, L, want_dx);
      EXPECT_DOUBLE_EQ(f.gemm_forward, forward) << input_proj << want_dx;
      EXPECT_DOUBLE_EQ(f.gemm_backward, *ops.flops - forward) << input_proj << want_dx;
      EXPECT_GT(f.other_forward, 0);
    }
}

}  // namespace
}  // namespace slipstream::nn

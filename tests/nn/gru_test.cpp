// The GRU model: forward against a plain loop of PyTorch's nn.GRU equations, float64
// finite-difference gradients, and the stage's names, shapes and initialisation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "engine/stage_harness.h"
#include "kernels/bf16.h"
#include "stages/nn/gru_model.h"
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

// torch.nn.GRU, layer by layer, step by step.
std::vector<double> reference_forward(const GruConfig& c, const GruLayout& lay,
                                      const std::vector<double>& w, const std::vector<double>& x,
                                      int B, int L) {
  const int H = c.hidden;
  std::vector<double> in = x;
  int In = c.din;
  for (const auto& Lw : lay.layers) {
    std::vector<double> out(size_t(B) * L * H);
    for (int b = 0; b < B; ++b) {
      std::vector<double> h(H, 0.0);
      for (int t = 0; t < L; ++t) {
        const double* xt = &in[(size_t(b) * L + t) * In];
        std::vector<double> gi(3 * H), gh(3 * H);
        for (int o = 0; o < 3 * H; ++o) {
          gi[o] = w[Lw.b_ih + o];
          for (int i = 0; i < In; ++i) gi[o] += w[Lw.w_ih + size_t(o) * In + i] * xt[i];
          gh[o] = w[Lw.b_hh + o];
          for (int i = 0; i < H; ++i) gh[o] += w[Lw.w_hh + size_t(o) * H + i] * h[i];
        }
        std::vector<double> hn(H);
        for (int j = 0; j < H; ++j) {
          const double r = sigmoid(gi[j] + gh[j]);
          const double z = sigmoid(gi[H + j] + gh[H + j]);
          const double n = std::tanh(gi[2 * H + j] + r * gh[2 * H + j]);
          hn[j] = (1 - z) * n + z * h[j];
        }
        h = hn;
        std::copy(h.begin(), h.end(), out.begin() + long((size_t(b) * L + t) * H));
      }
    }
    in = out;
    In = H;
  }
  return in;
}

TEST(GruModel, ForwardMatchesTorchEquations) {
  GruConfig c{5, 7, 2};
  GruModel<double> m(c);
  const int B = 3, L = 20;
  m.resize(B, L);
  std::vector<double> w(m.layout().params.total());
  gru_init(c, m.layout(), w.data(), 3);
  std::mt19937_64 rng(1);
  auto x = rand_vec(size_t(B) * L * c.din, rng);
  std::vector<double> y(size_t(B) * L * c.hidden);
  m.forward(x.data(), w.data(), nullptr, y.data());
  EXPECT_LT(kernels::test::rel_diff(reference_forward(c, m.layout(), w, x, B, L), y), 1e-13);
}

TEST(GruModel, GradientsMatchFiniteDifferences) {
  GruConfig c{4, 6, 3};
  GruModel<double> m(c);
  const int B = 2, L = 64;
  m.resize(B, L);
  std::mt19937_64 rng(2);
  auto w = rand_vec(m.layout().params.total(), rng, 0.05, 0.5);
  auto x = rand_vec(size_t(B) * L * c.din, rng);
  auto dy = rand_vec(size_t(B) * L * c.hidden, rng);
  std::vector<double> y(dy.size()), g(w.size(), 0.0), dx(x.size());
  auto loss = [&] {
    m.forward(x.data(), w.data(), nullptr, y.data());
    return kernels::test::dot(dy, y);
  };
  loss();
  m.backward(x.data(), dy.data(), w.data(), nullptr, g.data(), dx.data());
  check_gradient("x", loss, x, dx, 1e-6, 1e-6, 128);
  nn::test::check_parameter_gradients(m.layout().params.slots(), loss, w, g, 64);
  std::vector<double> g2 = g;
  loss();
  m.backward(x.data(), dy.data(), w.data(), nullptr, g2.data(), nullptr);  // dx not wanted
  EXPECT_DOUBLED(g2, g);
}

// Rows (B, 2L) cut into their first or second half (h = 0, 1) of L steps each.
std::vector<double> half(const std::vector<double>& v, int B, int L, int cols, int h) {
  std::vector<double> out;
  for (int b = 0; b < B; ++b)
    out.insert(out.end(), v.begin() + long((size_t(b) * 2 * L + size_t(h) * L) * cols),
               v.begin() + long((size_t(b) * 2 * L + size_t(h + 1) * L) * cols));
  return out;
}
std::vector<double> rows(const std::vector<double>& v, size_t from, size_t to) {
  return std::vector<double>(v.begin() + long(from), v.begin() + long(to));
}

// A window that continues the one before it on a row (continues = 1) gives that row's outputs of
// the two windows as one sequence (every layer from its own last state); a row that starts afresh
// (0) gives the window's alone, as does every row after clear_carry().
TEST(GruModel, CarriedStateContinuesTheSequence) {
  const GruConfig c{5, 7, 2};
  const int B = 2, L = 9;
  GruModel<double> m(c);
  m.set_carry(true);
  m.resize(B, L);
  ASSERT_EQ(m.carried().size(), 1u);
  EXPECT_EQ(m.carried()[0].numel(), size_t(c.layers) * B * c.hidden);
  std::vector<double> w(m.layout().params.total());
  gru_init(c, m.layout(), w.data(), 31);
  std::mt19937_64 rng(32);
  const auto x = rand_vec(size_t(B) * 2 * L * c.din, rng);  // (B, 2L, din)
  const auto whole = reference_forward(c, m.layout(), w, x, B, 2 * L);
  const auto x1 = half(x, B, L, c.din, 0), x2 = half(x, B, L, c.din, 1);
  std::vector<double> y1(size_t(B) * L * c.hidden), y2(y1.size());
  const std::vector<double> start{0.0, 0.0}, go_on{1.0, 0.0};
  m.carry(start.data());
  m.forward(x1.data(), w.data(), nullptr, y1.data());
  EXPECT_LT(kernels::test::rel_diff(half(whole, B, L, c.hidden, 0), y1), 1e-13);
  m.carry(go_on.data());
  m.forward(x2.data(), w.data(), nullptr, y2.data());
  const size_t row = size_t(L) * c.hidden;
  const auto cont = half(whole, B, L, c.hidden, 1);
  const auto cold = reference_forward(c, m.layout(), w, x2, B, L);
  EXPECT_LT(kernels::test::rel_diff(rows(cont, 0, row), rows(y2, 0, row)), 1e-13);
  EXPECT_LT(kernels::test::rel_diff(rows(cold, row, 2 * row), rows(y2, row, 2 * row)), 1e-13);
  // The carried row is not what a cold start gives: the test can tell the two apart.
  EXPECT_GT(kernels::test::rel_diff(rows(cold, 0, row), rows(y2, 0, row)), 1e-4);
  // Forgotten: both rows start afresh though continues says 1.
  m.clear_carry();
  const std::vector<double> both{1.0, 1.0};
  m.carry(both.data());
  m.forward(x2.data(), w.data(), nullptr, y2.data());
  EXPECT_LT(kernels::test::rel_diff(cold, y2), 1e-13);
  // One frame at a time, the state carried from frame to frame: the whole sequence.
  GruModel<double> s(c), swapped(c);
  for (auto* m1 : {&s, &swapped}) {
    m1->set_carry(true);
    m1->resize(B, 1);
  }
  std::vector<double> y(size_t(B) * c.hidden), xs(size_t(B) * c.din);
  for (int t = 0; t < 2 * L; ++t) {
    for (int b = 0; b < B; ++b)
      std::copy_n(x.begin() + long((size_t(b) * 2 * L + t) * c.din), c.din,
                  xs.begin() + long(size_t(b) * c.din));
    const std::vector<double> go(size_t(B), t > 0 ? 1.0 : 0.0);
    s.carry(go.data());
    s.forward(xs.data(), w.data(), nullptr, y.data());
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < c.hidden; ++j)
        EXPECT_NEAR(y[size_t(b) * c.hidden + j], whole[(size_t(b) * 2 * L + t) * c.hidden + j],
                    1e-13)
            << "row " << b << " step " << t;
    // carry_all (every row goes on: the state buffers trade places) gives the same bits, and
    // carried() the same state.
    if (t == 0) {
      const std::vector<double> zero(size_t(B), 0.0);
      swapped.carry(zero.data());
    } else {
      swapped.carry_all();
    }
    std::vector<double> ys(y.size());
    swapped.forward(xs.data(), w.data(), nullptr, ys.data());
    EXPECT_EQ(ys, y) << "carry_all, step " << t;
    const Tensor &a = s.carried()[0], &b = swapped.carried()[0];
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "carried, step " << t;
  }
}

// From a carried state the gradients are those of the window's loss with the state a constant.
TEST(GruModel, CarriedStateGradientsMatchFiniteDifferences) {
  const GruConfig c{4, 6, 2};
  const int B = 2, L = 12;
  GruModel<double> m(c);
  m.set_carry(true);
  m.resize(B, L);
  std::mt19937_64 rng(42);
  auto w = rand_vec(m.layout().params.total(), rng, 0.05, 0.5);
  const auto x0 = rand_vec(size_t(B) * L * c.din, rng);
  auto x = rand_vec(x0.size(), rng);
  const auto dy = rand_vec(size_t(B) * L * c.hidden, rng);
  std::vector<double> y(dy.size()), g(w.size(), 0.0), dx(x.size());
  const std::vector<double> start{0.0, 0.0}, go_on{1.0, 1.0};
  m.carry(start.data());
  m.forward(x0.data(), w.data(), nullptr, y.data());
  m.carry(go_on.data());  // fixed from here: forward reads the start, writes the next one
  auto loss = [&] {
    m.forward(x.data(), w.data(), nullptr, y.data());
    return kernels::test::dot(dy, y);
  };
  loss();
  m.backward(x.data(), dy.data(), w.data(), nullptr, g.data(), dx.data());
  check_gradient("x", loss, x, dx, 1e-6, 1e-6, 64);
  nn::test::check_parameter_gradients(m.layout().params.slots(), loss, w, g, 64);
}

TEST(GruStage, NamesShapesAndTorchInit) {
  StageHarness h("gru", {"hidden=16", "layers=2"}, "core");
  h.setup({{"x", Tensor::zeros({2, 5, 9}, DType::f32)}});
  std::map<std::string, std::pair<Shape, bool>> got;
  for (Parameter* p : h.stage().parameters()) {
    got[p->name] = {p->value.shape(), p->weight_decay};
    for (int64_t i = 0; i < p->value.numel(); ++i)
      ASSERT_LE(std::abs(p->value.data<float>()[i]), 0.25f);
    EXPECT_FALSE(p->low_precision.defined());
  }
  const std::map<std::string, std::pair<Shape, bool>> want = {
      {"weight_ih_l0", {{48, 9}, true}},  {"weight_hh_l0", {{48, 16}, true}},
      {"bias_ih_l0", {{48}, false}},      {"bias_hh_l0", {{48}, false}},
      {"weight_ih_l1", {{48, 16}, true}}, {"weight_hh_l1", {{48, 16}, true}},
      {"bias_ih_l1", {{48}, false}},      {"bias_hh_l1", {{48}, false}},
  };
  EXPECT_EQ(got, want);
}

TEST(GruStage, ForwardBackwardThroughStage) {
  StageHarness h("gru", {"hidden=8", "layers=2"}, "core");
  Tensor x = Tensor::empty({2, 10, 3}, DType::f32);
  std::mt19937_64 rng(5);
  auto xv = rand_vec(size_t(x.numel()), rng);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(xv[size_t(i)]);
  h.setup({{"x", x}});
  auto out = h.forward({{"x", x}});
  ASSERT_EQ(out["y"].shape(), (Shape{2, 10, 8}));
  GruConfig c{3, 8, 2};
  GruModel<double> m(c);
  m.resize(2, 10);
  std::vector<double> w(m.layout().params.total());
  for (Parameter* p : h.stage().parameters())
    for (const auto& s : m.layout().params.slots())
      if (s.name == p->name)
        for (int64_t i = 0; i < p->value.numel(); ++i)
          w[s.offset + size_t(i)] = p->value.data<float>()[i];
  std::vector<double> y(size_t(out["y"].numel()));
  m.forward(xv.data(), w.data(), nullptr, y.data());
  EXPECT_LT(kernels::test::rel_diff(
                y, std::vector<float>(out["y"].data<float>(), out["y"].data<float>() + y.size())),
            1e-5);
  Tensor dy = Tensor::zeros({2, 10, 8}, DType::f32);
  dy.data<float>()[5] = 1.0f;
  auto g = h.backward({{"y", dy}});
  EXPECT_TRUE(g.count("grad.x"));
  EXPECT_TRUE(g.count("grad.weight_hh_l1"));
}

// precision bf16: the kernels backend runs each layer's bf16 form from the store's bf16 shadow;
// close to fp32 at bf16 precision, and not equal to it (the rounding took place).
TEST(GruStage, Bf16IsCloseToFp32) {
  const int B = 4, W = 24, Din = 10;
  std::mt19937_64 rng(41);
  auto fill = [&rng](Tensor t) {
    const auto v = rand_vec(size_t(t.numel()), rng);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(v[size_t(i)]);
    return t;
  };
  const Tensor x = fill(Tensor::empty({B, W, Din}, DType::f32));
  const Tensor dy = fill(Tensor::empty({B, W, 16}, DType::f32));
  auto run = [&](Precision prec) {
    StageHarness h("gru", {"hidden=16", "layers=2"}, "core", prec, 9);
    h.setup({{"x", x}});
    Tensor y = h.forward({{"x", x}})["y"].clone();
    auto g = h.backward({{"y", dy}});
    // The shadow is the rounding of the master weights.
    if (prec == Precision::bf16) test::expect_shadows_are_roundings(h.stage());
    return std::make_pair(y, g);
  };
  auto [y32, g32] = run(Precision::fp32);
  auto [y16, g16] = run(Precision::bf16);
  const auto rel = test::max_relative_difference;
  EXPECT_LT(rel(y32, y16), 3e-2);
  EXPECT_GT(rel(y32, y16), 1e-5);  // the bf16 form did run
  for (const char* g : {"grad.x", "grad.weight_ih_l0", "grad.weight_hh_l1", "grad.bias_hh_l0"}) {
    EXPECT_LT(rel(g32[g], g16[g]), 5e-2) << g;
    EXPECT_GT(rel(g32[g], g16[g]), 1e-5) << g;
  }
}

}  // namespace
}  // namespace slipstream::nn

// One frame at a time (MambaRecurrent, GruRecurrent) against the models' parallel forward over a
// whole window from zero state; per-row resets; no allocation in step(); a rough step timing.
//
// Measured max |parallel - stepped| (B 3, L 37, d_model 24, d_state 5, expand 2, 2 layers;
// GRU din 7, hidden 13), each printed by the tests:
//   mamba din 24 / 7, d_conv 4 / 1: float 3.6e-7 to 4.8e-7 (the parallel float scan uses the
//   AVX-512 exp polynomial where present, the step kernel std::exp), double 6.7e-16 to 8.9e-16
//   gru 1 / 2 layers: 0 in both (the same kernel, one step at a time)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "stages/nn/gru_model.h"
#include "stages/nn/gru_recurrent.h"
#include "stages/nn/mamba_model.h"
#include "stages/nn/mamba_recurrent.h"
#include "tests/nn/alloc_counter.h"

namespace slipstream::nn {
namespace {

std::vector<double> uniform(size_t n, std::mt19937_64& rng, double bound) {
  std::uniform_real_distribution<double> d(-bound, bound);
  std::vector<double> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// A model under test: its config, weights, and both ways of running it.
template <class T>
struct MambaCase {
  using Scalar = T;
  using Recurrent = MambaRecurrent<T>;
  MambaConfig c;
  std::vector<T> w;
  int din() const { return c.din; }
  int dout() const { return c.d_model; }
  std::vector<T> parallel(const std::vector<T>& x, int B, int L) const {
    MambaModel<T> m(c);
    m.resize(B, L, false);
    std::vector<T> y(size_t(B) * L * dout());
    m.forward(x.data(), w.data(), nullptr, y.data());
    return y;
  }
};

template <class T>
struct GruCase {
  using Scalar = T;
  using Recurrent = GruRecurrent<T>;
  GruConfig c;
  std::vector<T> w;
  int din() const { return c.din; }
  int dout() const { return c.hidden; }
  std::vector<T> parallel(const std::vector<T>& x, int B, int L) const {
    GruModel<T> m(c);
    m.resize(B, L);
    std::vector<T> y(size_t(B) * L * dout());
    m.forward(x.data(), w.data(), nullptr, y.data());
    return y;
  }
};

// mamba_init, then every parameter moved by up to ±0.1 so that D, biases, norms and A_log are
// not their trivial initial values.
template <class T>
MambaCase<T> make_mamba(const MambaConfig& c, uint64_t seed) {
  const MambaLayout lay(c);
  std::vector<double> w(lay.params.total());
  mamba_init(c, lay, w.data(), seed);
  std::mt19937_64 rng(seed + 1);
  const auto d = uniform(w.size(), rng, 0.1);
  for (size_t i = 0; i < w.size(); ++i) w[i] += d[i];
  return {c, cast<T>(w)};
}

template <class T>
GruCase<T> make_gru(const GruConfig& c, uint64_t seed) {
  const GruLayout lay(c);
  std::vector<double> w(lay.params.total());
  gru_init(c, lay, w.data(), seed);
  std::mt19937_64 rng(seed + 1);
  const auto d = uniform(w.size(), rng, 0.1);
  for (size_t i = 0; i < w.size(); ++i) w[i] += d[i];
  return {c, cast<T>(w)};
}

// x (B, L, din) fed frame by frame from the recurrent's current state; returns (B, L, dout)
// in the parallel forward's layout.
template <class Case, class T>
std::vector<T> run_frames(const Case& m, typename Case::Recurrent& r, const std::vector<T>& x,
                          int B, int L) {
  const size_t din = size_t(m.din()), dout = size_t(m.dout());
  std::vector<T> xt(size_t(B) * din), yt(size_t(B) * dout), y(size_t(B) * L * dout);
  for (int t = 0; t < L; ++t) {
    for (int b = 0; b < B; ++b)
      std::copy_n(x.begin() + (size_t(b) * L + t) * din, din, xt.begin() + size_t(b) * din);
    r.step(xt.data(), m.w.data(), yt.data());
    for (int b = 0; b < B; ++b)
      std::copy_n(yt.begin() + size_t(b) * dout, dout, y.begin() + (size_t(b) * L + t) * dout);
  }
  return y;
}

template <class T>
double max_abs_diff(const std::vector<T>& a, const std::vector<T>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

constexpr int kB = 3, kL = 37;

template <class T>
std::vector<T> input(int B, int L, int din, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return cast<T>(uniform(size_t(B) * L * din, rng, 1.0));
}

// Stepping a whole window from a fresh recurrent equals the parallel forward.
template <class Case>
double stepped_vs_parallel(const Case& m) {
  using T = typename Case::Scalar;
  const auto x = input<T>(kB, kL, m.din(), 11);
  const auto yp = m.parallel(x, kB, kL);
  typename Case::Recurrent r(m.c, kB);
  const auto ys = run_frames(m, r, x, kB, kL);
  // Outputs far from zero, so that an absolute tolerance means something.
  double mag = 0;
  for (T v : yp) mag = std::max(mag, std::abs(double(v)));
  EXPECT_GT(mag, 0.2);
  return max_abs_diff(yp, ys);
}

// Rows 0 and 2 run window x throughout; row 1 is reset after `t1` frames and then runs window
// x2 from its start. Row 1 must equal the parallel forward of x2, the other rows must be
// bit-identical to a run without the reset (rows never mix). Returns row 1's max difference.
template <class Case>
double reset_row_checks(const Case& m) {
  using T = typename Case::Scalar;
  const int t1 = 10, L2 = kL - t1;
  const size_t din = size_t(m.din()), dout = size_t(m.dout());
  const auto x = input<T>(kB, kL, m.din(), 21);
  const auto x2 = input<T>(1, L2, m.din(), 22);
  typename Case::Recurrent plain(m.c, kB);
  const auto y_plain = run_frames(m, plain, x, kB, kL);

  // Same frames, with row 1 switched to x2 after the reset.
  std::vector<T> xs = x;
  for (int t = t1; t < kL; ++t)
    std::copy_n(x2.begin() + size_t(t - t1) * din, din, xs.begin() + (size_t(1) * kL + t) * din);
  typename Case::Recurrent r(m.c, kB);
  const size_t bsz = size_t(kB);
  std::vector<T> xt(bsz * din), yt(bsz * dout), y(bsz * kL * dout);
  for (int t = 0; t < kL; ++t) {
    if (t == t1) r.reset(1);
    for (size_t b = 0; b < bsz; ++b)
      std::copy_n(xs.begin() + (b * kL + t) * din, din, xt.begin() + b * din);
    r.step(xt.data(), m.w.data(), yt.data());
    for (size_t b = 0; b < bsz; ++b)
      std::copy_n(yt.begin() + b * dout, dout, y.begin() + (b * kL + t) * dout);
  }
  for (size_t b : {size_t(0), size_t(2)})
    for (size_t i = b * kL * dout; i < (b + 1) * kL * dout; ++i)
      EXPECT_EQ(y[i], y_plain[i]) << "row " << b << " changed by resetting row 1, element " << i;
  // Before the reset row 1 ran x; after it, x2 from zero state.
  for (size_t i = kL * dout; i < (kL + t1) * dout; ++i)
    EXPECT_EQ(y[i], y_plain[i]) << "row 1 before its reset, element " << i;
  const auto y2 = m.parallel(x2, 1, L2);
  const std::vector<T> row1(y.begin() + (kL + t1) * dout, y.begin() + 2 * kL * dout);
  return max_abs_diff(y2, row1);
}

// reset() then the same window again reproduces the first pass exactly.
template <class Case>
void reset_all_reproduces(const Case& m) {
  using T = typename Case::Scalar;
  const auto x = input<T>(kB, kL, m.din(), 31);
  typename Case::Recurrent r(m.c, kB);
  const auto first = run_frames(m, r, x, kB, kL);
  r.reset();
  const auto second = run_frames(m, r, x, kB, kL);
  EXPECT_EQ(max_abs_diff(first, second), 0.0);
  // Without the reset the state carries over, so the check above can tell.
  const auto carried = run_frames(m, r, x, kB, kL);
  EXPECT_GT(max_abs_diff(first, carried), 1e-4);
}

// After a warm-up frame, step() performs no heap allocation.
template <class Case>
void step_allocates_nothing(const Case& m) {
  using T = typename Case::Scalar;
  typename Case::Recurrent r(m.c, kB);
  const auto x = input<T>(kB, 1, m.din(), 41);
  std::vector<T> y(size_t(kB) * m.dout());
  r.step(x.data(), m.w.data(), y.data());
  const uint64_t before = nn_test::allocations();
  for (int i = 0; i < 5; ++i) {
    r.step(x.data(), m.w.data(), y.data());
    r.reset(1);
  }
  EXPECT_EQ(nn_test::allocations() - before, 0u);
}

// The running test's parameter name (e.g. din7_conv4), for the measured values it prints.
const char* name() {
  const char* n = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const char* slash = std::strrchr(n, '/');
  return slash ? slash + 1 : n;
}

template <class Case>
void print_step_time(const char* what, const Case& m) {
  using T = typename Case::Scalar;
  typename Case::Recurrent r(m.c, 1);
  const auto x = input<T>(1, 1, m.din(), 51);
  std::vector<T> y(size_t(m.dout()));
  for (int i = 0; i < 50; ++i) r.step(x.data(), m.w.data(), y.data());
  const int n = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) r.step(x.data(), m.w.data(), y.data());
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
  std::printf("[ timing   ] %s: %.1f us per step\n", what, us);
}

// ---- Mamba ----

struct MambaShape {
  int din, d_conv;
};
void PrintTo(const MambaShape& s, std::ostream* os) {
  *os << "din " << s.din << ", d_conv " << s.d_conv;
}

MambaConfig mamba_config(const MambaShape& s) {
  MambaConfig c;
  c.din = s.din;
  c.d_model = 24;
  c.d_state = 5;
  c.expand = 2;
  c.d_conv = s.d_conv;
  c.layers = 2;
  return c;
}

class MambaRecurrentTest : public ::testing::TestWithParam<MambaShape> {};

TEST_P(MambaRecurrentTest, FloatStepsMatchParallel) {
  const double d = stepped_vs_parallel(make_mamba<float>(mamba_config(GetParam()), 7));
  std::printf("[ measured ] mamba %s float max abs diff %.3g\n", name(), d);
  EXPECT_LT(d, 1e-5);
}

TEST_P(MambaRecurrentTest, DoubleStepsMatchParallel) {
  const double d = stepped_vs_parallel(make_mamba<double>(mamba_config(GetParam()), 7));
  std::printf("[ measured ] mamba %s double max abs diff %.3g\n", name(), d);
  EXPECT_LT(d, 1e-12);
}

TEST_P(MambaRecurrentTest, ResetRowRestartsOnlyThatRow) {
  const double d = reset_row_checks(make_mamba<double>(mamba_config(GetParam()), 8));
  std::printf("[ measured ] mamba %s double reset row vs fresh window %.3g\n", name(), d);
  EXPECT_LT(d, 1e-12);
  EXPECT_LT(reset_row_checks(make_mamba<float>(mamba_config(GetParam()), 8)), 1e-5);
}

TEST_P(MambaRecurrentTest, ResetReproducesTheFirstWindow) {
  reset_all_reproduces(make_mamba<float>(mamba_config(GetParam()), 9));
}

TEST_P(MambaRecurrentTest, StepAllocatesNothing) {
  step_allocates_nothing(make_mamba<float>(mamba_config(GetParam()), 10));
}

INSTANTIATE_TEST_SUITE_P(Shapes, MambaRecurrentTest,
                         ::testing::Values(MambaShape{24, 4}, MambaShape{24, 1}, MambaShape{7, 4},
                                           MambaShape{7, 1}),
                         [](const auto& info) {
                           return "din" + std::to_string(info.param.din) + "_conv" +
                                  std::to_string(info.param.d_conv);
                         });

TEST(MambaRecurrent, RejectsBadRowsAndShapes) {
  MambaConfig c = mamba_config({24, 4});
  MambaRecurrent<float> r(c, 2);
  EXPECT_THROW(r.reset(2), std::out_of_range);
  EXPECT_THROW(r.reset(-1), std::out_of_range);
  EXPECT_THROW({ MambaRecurrent<float> bad(c, 0); }, std::invalid_argument);
  c.d_conv = kernels::kConvMaxWidth + 1;
  EXPECT_THROW({ MambaRecurrent<float> bad(c, 1); }, std::invalid_argument);
}

// hold_weights: the same frames bit for bit, and weights given at another address are read
// afresh (A from their A_log), not taken from the held ones.
TEST(MambaRecurrent, HeldWeightsGiveTheSameFramesAndOtherWeightsAreReadAfresh) {
  const auto m = make_mamba<float>(mamba_config({7, 4}), 12);
  const auto x = input<float>(kB, kL, m.din(), 13);
  MambaRecurrent<float> plain(m.c, kB), held(m.c, kB);
  held.hold_weights(m.w.data());
  const auto a = run_frames(m, plain, x, kB, kL);
  const auto b = run_frames(m, held, x, kB, kL);
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  // Other weights (A_log changed) at another address: the held A must not be used for them.
  auto other = m;
  const MambaLayout lay(m.c);
  for (size_t i = 0; i < size_t(m.c.d_inner()) * m.c.d_state; ++i)
    other.w[lay.layers[0].A_log + i] += 0.5f;
  MambaRecurrent<float> fresh(m.c, kB);
  held.reset();
  EXPECT_EQ(max_abs_diff(run_frames(other, fresh, x, kB, kL), run_frames(other, held, x, kB, kL)),
            0.0);
}

// Not asserted: a rough cost of one frame at the default width for the report.
TEST(MambaRecurrent, StepTiming) {
  MambaConfig c;  // d_model 128, d_state 16, d_conv 4, expand 2, 2 layers, din 128
  print_step_time("mamba float d_model 128, 2 layers, B 1", make_mamba<float>(c, 1));
}

// ---- GRU ----

class GruRecurrentTest : public ::testing::TestWithParam<int> {};

GruConfig gru_config(int layers) {
  GruConfig c;
  c.din = 7;
  c.hidden = 13;
  c.layers = layers;
  return c;
}

TEST_P(GruRecurrentTest, FloatStepsMatchParallel) {
  const double d = stepped_vs_parallel(make_gru<float>(gru_config(GetParam()), 7));
  std::printf("[ measured ] gru %s float max abs diff %.3g\n", name(), d);
  EXPECT_LT(d, 1e-5);
}

TEST_P(GruRecurrentTest, DoubleStepsMatchParallel) {
  const double d = stepped_vs_parallel(make_gru<double>(gru_config(GetParam()), 7));
  std::printf("[ measured ] gru %s double max abs diff %.3g\n", name(), d);
  EXPECT_LT(d, 1e-12);
}

TEST_P(GruRecurrentTest, ResetRowRestartsOnlyThatRow) {
  const double d = reset_row_checks(make_gru<double>(gru_config(GetParam()), 8));
  std::printf("[ measured ] gru %s double reset row vs fresh window %.3g\n", name(), d);
  EXPECT_LT(d, 1e-12);
  EXPECT_LT(reset_row_checks(make_gru<float>(gru_config(GetParam()), 8)), 1e-5);
}

TEST_P(GruRecurrentTest, ResetReproducesTheFirstWindow) {
  reset_all_reproduces(make_gru<float>(gru_config(GetParam()), 9));
}

TEST_P(GruRecurrentTest, StepAllocatesNothing) {
  step_allocates_nothing(make_gru<float>(gru_config(GetParam()), 10));
}

INSTANTIATE_TEST_SUITE_P(Layers, GruRecurrentTest, ::testing::Values(1, 2),
                         [](const auto& info) { return "layers" + std::to_string(info.param); });

TEST(GruRecurrent, RejectsBadRows) {
  GruRecurrent<float> r(gru_config(1), 2);
  EXPECT_THROW(r.reset(2), std::out_of_range);
  EXPECT_THROW({ GruRecurrent<float> bad(gru_config(1), 0); }, std::invalid_argument);
}

TEST(GruRecurrent, StepTiming) {
  GruConfig c;  // din 128, hidden 128
  c.layers = 2;
  print_step_time("gru float hidden 128, 2 layers, B 1", make_gru<float>(c, 1));
}

}  // namespace
}  // namespace slipstream::nn

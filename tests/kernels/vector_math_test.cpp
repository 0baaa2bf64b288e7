// The vector math of every level this CPU runs (generic libm, AVX2 and AVX-512 SLEEF) against
// double-precision references, in ulps of the float result: at most 2 across each function's
// range, specials (NaN, ±inf, the softplus threshold) as libm gives them, and every length's
// tail.
#include "kernels/vector_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace slipstream::kernels {
namespace {

using ArrayFn = void (*)(const float*, float*, size_t);

struct Level {
  CpuIsa isa;
  ArrayFn exp, log1p, softplus, sigmoid, tanh, silu;
};

template <class M>
Level level_of(CpuIsa isa) {
  return {isa, M::exp, M::log1p, M::softplus, M::sigmoid, M::tanh, M::silu};
}

// The levels this CPU can run (the supported one, not the SLIPSTREAM_CPU_ISA cap).
std::vector<Level> runnable_levels() {
  std::vector<Level> out{level_of<VecMathGeneric>(CpuIsa::generic)};
  if (cpu_isa_supported() >= CpuIsa::avx2) out.push_back(level_of<VecMathAvx2>(CpuIsa::avx2));
  if (cpu_isa_supported() >= CpuIsa::avx512) out.push_back(level_of<VecMathAvx512>(CpuIsa::avx512));
  return out;
}

// |y - ref| in units of the spacing of floats at ref (the smallest normal's below it).
double ulps(float y, double ref) {
  const double mag = std::max(std::abs(ref), double(std::numeric_limits<float>::min()));
  int e = 0;
  std::frexp(mag, &e);
  const double ulp = std::ldexp(1.0, e - 24);  // float has 24 significand bits
  return std::abs(double(y) - ref) / ulp;
}

std::vector<float> sweep(float lo, float hi, float step) {
  std::vector<float> x;
  for (float v = lo; v < hi; v += step) x.push_back(v);
  return x;
}

// Worst ulp error of fn over x against ref (skipping references outside float's normal range,
// where only the absolute error counts and is checked separately).
double worst_ulps(ArrayFn fn, const std::vector<float>& x, const std::function<double(double)>& ref,
                  const std::string& what) {
  std::vector<float> y(x.size());
  fn(x.data(), y.data(), x.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double r = ref(double(x[i]));
    if (std::abs(r) > double(std::numeric_limits<float>::max())) {
      EXPECT_TRUE(std::isinf(y[i]) && std::signbit(y[i]) == std::signbit(r)) << what << x[i];
      continue;
    }
    if (r != 0 && std::abs(r) < double(std::numeric_limits<float>::min())) {
      EXPECT_LE(std::abs(double(y[i]) - r), double(std::numeric_limits<float>::min()))
          << what << x[i];
      continue;
    }
    const double u = ulps(y[i], r);
    EXPECT_LE(u, 2.0) << what << " x=" << x[i] << " got " << y[i] << " want " << r;
    worst = std::max(worst, u);
  }
  return worst;
}

double softplus_ref(double x) {
  return x > 20.0 ? x : std::log1p(std::exp(x));
}
double sigmoid_ref(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

TEST(VectorMath, EveryLevelIsWithinTwoUlpsOfTheDoubleReference) {
  const auto wide = sweep(-110.0f, 95.0f, 0.0173f);
  const auto mid = sweep(-40.0f, 40.0f, 0.00731f);
  std::vector<float> small;  // log1p near 0 and across magnitudes
  for (float v = -0.999f; v < 0.999f; v += 0.000937f) small.push_back(v);
  for (float m = 1e-30f; m < 1e30f; m *= 1.37f) small.push_back(m);
  for (const Level& l : runnable_levels()) {
    const std::string name = std::string(cpu_isa_name(l.isa)) + " ";
    const double e = worst_ulps(
        l.exp, wide, [](double x) { return std::exp(x); }, name + "exp");
    const double lp = worst_ulps(
        l.log1p, small, [](double x) { return std::log1p(x); }, name + "log1p");
    const double sp = worst_ulps(l.softplus, mid, softplus_ref, name + "softplus");
    const double sg = worst_ulps(l.sigmoid, mid, sigmoid_ref, name + "sigmoid");
    const double th = worst_ulps(
        l.tanh, mid, [](double x) { return std::tanh(x); }, name + "tanh");
    const double si = worst_ulps(
        l.silu, mid, [](double x) { return x * sigmoid_ref(x); }, name + "silu");
    std::printf(
        "%-8s worst ulps: exp %.2f, log1p %.2f, softplus %.2f, sigmoid %.2f, tanh %.2f, silu "
        "%.2f\n",
        cpu_isa_name(l.isa), e, lp, sp, sg, th, si);
  }
}

TEST(VectorMath, SpecialsAsLibmGivesThem) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {nan, inf, -inf, 0.0f, -0.0f, 20.0f, 20.001f, 1e30f, -1e30f};
  for (const Level& l : runnable_levels()) {
    const std::string name = cpu_isa_name(l.isa);
    std::vector<float> y(x.size());
    l.exp(x.data(), y.data(), x.size());
    EXPECT_TRUE(std::isnan(y[0])) << name;
    EXPECT_EQ(y[1], inf) << name;
    EXPECT_EQ(y[2], 0.0f) << name;
    EXPECT_EQ(y[3], 1.0f) << name;
    l.softplus(x.data(), y.data(), x.size());
    EXPECT_TRUE(std::isnan(y[0])) << name;
    EXPECT_EQ(y[1], inf) << name;
    EXPECT_EQ(y[2], 0.0f) << name;
    EXPECT_EQ(y[6], 20.001f) << name << ": above the threshold softplus is x";
    EXPECT_EQ(y[7], 1e30f) << name;
    EXPECT_EQ(y[8], 0.0f) << name;
    l.sigmoid(x.data(), y.data(), x.size());
    EXPECT_TRUE(std::isnan(y[0])) << name;
    EXPECT_EQ(y[1], 1.0f) << name;
    EXPECT_EQ(y[2], 0.0f) << name;
    EXPECT_EQ(y[3], 0.5f) << name;
    l.tanh(x.data(), y.data(), x.size());
    EXPECT_TRUE(std::isnan(y[0])) << name;
    EXPECT_EQ(y[1], 1.0f) << name;
    EXPECT_EQ(y[2], -1.0f) << name;
    EXPECT_EQ(y[4], -0.0f) << name;
    EXPECT_TRUE(std::signbit(y[4])) << name;
    l.silu(x.data(), y.data(), x.size());
    EXPECT_TRUE(std::isnan(y[0])) << name;
    EXPECT_EQ(y[1], inf) << name;
    EXPECT_EQ(y[8], -0.0f) << name;
  }
}

// Every length from 0 to 40 (whole vectors and tails), in place too: the values of an element do
// not depend on where it sits, and nothing past n is written.
TEST(VectorMath, TailsAndInPlace) {
  for (const Level& l : runnable_levels()) {
    for (size_t n = 0; n <= 40; ++n) {
      std::vector<float> x(n + 1), y(n + 1, -7.0f);
      for (size_t i = 0; i < n; ++i) x[i] = -3.0f + 0.37f * float(i);
      l.softplus(x.data(), y.data(), n);
      EXPECT_EQ(y[n], -7.0f) << cpu_isa_name(l.isa) << " n=" << n;
      std::vector<float> z = x;
      l.softplus(z.data(), z.data(), n);
      for (size_t i = 0; i < n; ++i) {
        float one;
        l.softplus(&x[i], &one, 1);
        EXPECT_EQ(y[i], one) << cpu_isa_name(l.isa) << " n=" << n << " i=" << i;
        EXPECT_EQ(z[i], one);
      }
    }
  }
}

// exp_scaled_rows at every level equals the level's exp of the products, any row length.
TEST(VectorMath, ExpScaledRowsIsExpOfTheProducts) {
  const int rows = 5;
  for (int N : {1, 7, 8, 16, 19, 33}) {
    std::vector<float> a(size_t(rows) * N), s(rows), prod(a.size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = -0.05f * float(i % 23) - 0.1f;
    for (int i = 0; i < rows; ++i) s[i] = 0.3f + 0.7f * float(i);
    for (int i = 0; i < rows; ++i)
      for (int n = 0; n < N; ++n) prod[size_t(i) * N + n] = s[i] * a[size_t(i) * N + n];
    auto check = [&](auto math, const char* name) {
      std::vector<float> got(a.size()), want(a.size());
      math.exp_scaled_rows(a.data(), s.data(), got.data(), rows, N);
      math.exp(prod.data(), want.data(), prod.size());
      EXPECT_EQ(got, want) << name << " N=" << N;
    };
    check(VecMathGeneric{}, "generic");
    if (cpu_isa_supported() >= CpuIsa::avx2) check(VecMathAvx2{}, "avx2");
    if (cpu_isa_supported() >= CpuIsa::avx512) check(VecMathAvx512{}, "avx512");
  }
}

// SLIPSTREAM_CPU_ISA caps the level (ctest runs this binary's vector, activation and loss tests
// again at each lower level: kernels.isa_generic, kernels.isa_avx2; the scan's are
// kernel_ops.isa_*); without it the CPU's best is used.
TEST(VectorMath, TheCapLowersTheLevelAndNeverRaisesIt) {
  const char* cap = std::getenv("SLIPSTREAM_CPU_ISA");
  CpuIsa want = cpu_isa_supported();
  if (cap && std::string(cap) == "generic") want = CpuIsa::generic;
  if (cap && std::string(cap) == "avx2") want = std::min(want, CpuIsa::avx2);
  EXPECT_EQ(cpu_isa(), want) << (cap ? cap : "(no cap)");
  std::printf("cpu_isa: %s (supported: %s)\n", cpu_isa_name(cpu_isa()),
              cpu_isa_name(cpu_isa_supported()));
}

}  // namespace
}  // namespace slipstream::kernels

// Test helpers for the kernels: random data and a float64 central-difference gradient checker.
// The loss is L = sum(w * f(x)) with fixed random w, so the analytic input gradient is the
// kernel's backward applied to dy = w.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace slipstream::kernels::test {

// Uniform in +-[lo, hi]: never zero, either sign.
inline std::vector<double> rand_vec(size_t n, std::mt19937_64& rng, double lo = 0.1,
                                    double hi = 1.0) {
  std::uniform_real_distribution<double> mag(lo, hi);
  std::bernoulli_distribution sign(0.5);
  std::vector<double> v(n);
  for (auto& x : v) x = sign(rng) ? mag(rng) : -mag(rng);
  return v;
}

// Uniform in [lo, hi].
inline std::vector<double> rand_pos(size_t n, std::mt19937_64& rng, double lo = 0.1,
                                    double hi = 1.0) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

inline double dot(const std::vector<double>& w, const std::vector<double>& y) {
  double s = 0;
  for (size_t i = 0; i < w.size(); ++i) s += w[i] * y[i];
  return s;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Compares the analytic gradient `grad` of loss() with respect to x against central
// differences, element by element (at most max_checks evenly spaced elements when non-zero).
// The error is measured relative to max(1, max|grad|). x is restored afterwards.
inline void check_gradient(const std::string& name, const std::function<double()>& loss,
                           std::vector<double>& x, const std::vector<double>& grad, double h = 1e-6,
                           double rtol = 1e-6, size_t max_checks = 0) {
  ASSERT_EQ(x.size(), grad.size()) << name;
  const double scale = std::max(1.0, max_abs(grad));
  const size_t n = x.size();
  const size_t stride = (max_checks && n > max_checks) ? n / max_checks : 1;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < n; i += stride) {
    const double xi = x[i];
    x[i] = xi + h;
    const double lp = loss();
    x[i] = xi - h;
    const double lm = loss();
    x[i] = xi;
    const double num = (lp - lm) / (2 * h);
    const double err = std::abs(num - grad[i]) / scale;
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
    EXPECT_LE(err, rtol) << name << "[" << i << "]: analytic " << grad[i] << " numeric " << num;
    if (err > rtol) return;  // one report per tensor is enough
  }
  (void)worst_i;
}

// max |a - b| / max(1e-30, max|a|): a is the reference (double), b the value under test.
template <class T>
double rel_diff(const std::vector<double>& a, const std::vector<T>& b) {
  double m = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(a[i]));
    d = std::max(d, std::abs(a[i] - double(b[i])));
  }
  return d / std::max(m, 1e-30);
}

// x * 2 elementwise, for checking that accumulating gradients doubled.
inline std::vector<double> twice(const std::vector<double>& v) {
  std::vector<double> r(v);
  for (auto& x : r) x *= 2;
  return r;
}

// Accumulating twice gives 2x up to rounding (the second pass adds term by term onto the
// first result, so bit equality is not guaranteed).
#define EXPECT_DOUBLED(acc2, acc1)                                                                 \
  EXPECT_LT(::slipstream::kernels::test::rel_diff(::slipstream::kernels::test::twice(acc1), acc2), \
            1e-13)

}  // namespace slipstream::kernels::test

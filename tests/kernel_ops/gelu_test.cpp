// GELU (kernels/gelu.h): the reference's gradient in float64 against finite differences and its
// values against known points; the CUDA kernels against the reference, on the emulator and on a
// device (tests/kernel_ops/kernel_test.h).
#include <cmath>
#include <random>
#include <vector>

#include "kernels/gelu.h"
#include "tests/kernel_ops/kernel_test.h"

namespace slipstream::kernels::test {
namespace {

CPU_TEST(Gelu, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(1);
  std::vector<double> x = rand_vec(257, rng, 0.01, 4.0);
  const std::vector<double> w = rand_vec(x.size(), rng);
  auto loss = [&] {
    std::vector<double> y(x.size());
    gelu_forward(x.data(), y.data(), x.size());
    return dot(w, y);
  };
  std::vector<double> dx(x.size());
  gelu_backward(x.data(), w.data(), dx.data(), x.size());
  check_gradient("gelu", loss, x, dx);
}

// x·Φ(x) at these points, computed with Python's math.erf (what torch.nn.functional.gelu gives
// with approximate='none').
CPU_TEST(Gelu, ValuesOfTheExactForm) {
  const std::vector<double> x = {-3.0, -1.0, 0.0, 0.5, 1.0, 3.0};
  const std::vector<double> want = {-0.00404969409489031, -0.15865525393145707, 0.0,
                                    0.34573123063700656,  0.8413447460685429,   2.99595030590511};
  std::vector<double> y(x.size());
  gelu_forward(x.data(), y.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-9) << "x = " << x[i];
  std::vector<float> xf(x.begin(), x.end()), yf(x.size());
  gelu_forward(xf.data(), yf.data(), xf.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(yf[i], want[i], 1e-6) << "x = " << x[i];
}

KERNEL_TEST(Gelu, MatchesCpu) {
  uint64_t seed = 11;
  for (size_t n : {size_t{1}, size_t{255}, size_t{256 * 4096 + 3}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::mt19937_64 rng(seed++);
    const auto x = round_trip<float>(rand_vec(n, rng, 0.0, 5.0));
    const auto dy = round_trip<float>(rand_vec(n, rng));
    std::vector<double> y(n), dx(n);
    gelu_forward(x.data(), y.data(), n);
    gelu_backward(x.data(), dy.data(), dx.data(), n);
    Mem mem;
    const float* g_x = mem.upload(elems<float>(x));
    float* g_y = mem.template alloc<float>(n);
    Kernels::gelu_forward(g_x, g_y, n, mem.stream());
    // The backward in place on dy, as an activation's backward runs in a model.
    float* g_d = mem.upload(elems<float>(dy));
    Kernels::gelu_backward(g_x, g_d, g_d, n, mem.stream());
    mem.sync();
    EXPECT_CLOSE(values(mem.download(g_y, n)), y, 1e-6, "y");
    EXPECT_CLOSE(values(mem.download(g_d, n)), dx, 1e-6, "dx");
  }
}

}  // namespace
}  // namespace slipstream::kernels::test

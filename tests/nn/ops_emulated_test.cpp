// The model ops' generated methods (kernels/OP.h's SLIPSTREAM_OP lines, stages/ops/): the same
// call through CpuOps (the reference) and DeviceOps over the emulated kernel table gives the
// same numbers, so each line forwards to its own kernel with its arguments in order.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda_kernels.h"
#include "stages/ops/cpu_ops.h"
#include "stages/ops/device_ops.h"

namespace slipstream::ops::test {
namespace {

using Emulated = DeviceOps<kernels::EmulatedKernels>;

std::vector<float> random_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Runs `call(ops, out)` on both ops from the same starting `out` and compares.
template <class Call>
void expect_same(const char* op, std::vector<float> out, Call call) {
  auto on_cpu = out, on_device = out;
  call(CpuOps<float>(), on_cpu);
  call(Emulated(Device::cpu(), nullptr, {}), on_device);
  double changed = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_NEAR(on_device[i], on_cpu[i], 2e-6 * (1 + std::fabs(on_cpu[i]))) << op << " at " << i;
    changed += std::fabs(on_cpu[i] - out[i]);
  }
  EXPECT_GT(changed, 0) << op << " wrote nothing";
}

TEST(GeneratedOps, ForwardToTheSameKernelOnEitherBackend) {
  const size_t M = 7, N = 33, n = M * N;
  const auto x = random_values(n, 1), a = random_values(n, 2), bias = random_values(N, 3);
  const std::vector<float> zeros(n, 0.0f);
  expect_same("gelu_forward", zeros,
              [&](auto ops, auto& y) { ops.gelu_forward(x.data(), y.data(), n); });
  expect_same("gelu_backward", zeros,
              [&](auto ops, auto& dx) { ops.gelu_backward(x.data(), a.data(), dx.data(), n); });
  expect_same("silu_forward", zeros,
              [&](auto ops, auto& y) { ops.silu_forward(x.data(), y.data(), n); });
  expect_same("silu_backward", zeros,
              [&](auto ops, auto& dx) { ops.silu_backward(x.data(), a.data(), dx.data(), n); });
  expect_same("neg_exp", zeros, [&](auto ops, auto& y) { ops.neg_exp(x.data(), y.data(), n); });
  expect_same("mul_accumulate", a,
              [&](auto ops, auto& y) { ops.mul_accumulate(y.data(), x.data(), a.data(), n); });
  expect_same("add_bias_rows", x,
              [&](auto ops, auto& y) { ops.add_bias_rows(y.data(), bias.data(), M, N); });
  // Columns 5..16 of each row of x into a (M, 12) block at the front of y.
  expect_same("copy_cols", zeros,
              [&](auto ops, auto& y) { ops.copy_cols(x.data() + 5, N, y.data(), 12, M, 12); });
}

}  // namespace
}  // namespace slipstream::ops::test

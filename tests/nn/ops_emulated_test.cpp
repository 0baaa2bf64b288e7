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
  expect_same("neg_exp", zeros,
              [&](auto ops, auto& y) { ops.neg_exp(x.data(), n, y.data(), 1, n); });
  expect_same("neg_exp rows", zeros,  // rows of x, N apart, into contiguous rows of y
              [&](auto ops, auto& y) { ops.neg_exp(x.data(), N, y.data(), M, N - 5); });
  expect_same("mul_accumulate", a,
              [&](auto ops, auto& y) { ops.mul_accumulate(y.data(), x.data(), a.data(), n); });
  expect_same("add_bias_rows", x,
              [&](auto ops, auto& y) { ops.add_bias_rows(y.data(), bias.data(), M, N); });
  // Columns 5..16 of each row of x into a (M, 12) block at the front of y.
  expect_same("copy_cols", zeros,
              [&](auto ops, auto& y) { ops.copy_cols(x.data() + 5, N, y.data(), 12, M, 12); });
}

// The scan's forward and backward with Bm and Cm inside wider rows (as x_proj's output holds dt,
// Bm, Cm) and dA_log's chain rule applied by the backward (dA += sum · A): the CPU's gathering,
// scattering and scaling agree with the device kernels'; outside the Bm, Cm columns nothing moves.
TEST(GeneratedOps, ScanWithWideRowsAndAScaleAgrees) {
  const int B = 2, L = 9, D = 20, N = 8, R = 3, P = R + 2 * N;
  const size_t bld = size_t(B) * L * D, rows = size_t(B) * L;
  const auto u = random_values(bld, 11), z = random_values(bld, 12), dout = random_values(bld, 13);
  auto delta = random_values(bld, 14), A = random_values(size_t(D) * N, 15);
  for (auto& v : delta) v = 0.1f + 0.2f * std::fabs(v);
  for (auto& v : A) v = -0.3f - std::fabs(v);
  const auto Dskip = random_values(size_t(D), 16), bias = random_values(size_t(D), 17);
  const auto dbc = random_values(rows * P, 18);  // each row: dt (R), Bm (N), Cm (N)
  ScratchNeeds need;
  need.B = B, need.L = L, need.channels = D, need.state = N;
  auto forward = [&](auto ops, auto& y) {
    ops.selective_scan_forward(u.data(), delta.data(), A.data(), dbc.data() + R, dbc.data() + R + N,
                               Dskip.data(), z.data(), bias.data(), nullptr, y.data(), nullptr,
                               nullptr, B, L, D, N, nullptr, P);
  };
  expect_same("selective_scan_forward (wide rows)", std::vector<float>(bld, 0.0f), forward);
  // out: dA (D, N; starting from values, += sum · A) then x_proj's output gradient (rows of P:
  // dBm and dCm written into their columns, the first R left as they were).
  auto out0 = random_values(size_t(D) * N + rows * P, 19);
  auto backward = [&](auto ops, auto& out) {
    std::vector<float> du(bld), ddelta(bld), dz(bld), dD(static_cast<size_t>(D)),
        db(static_cast<size_t>(D));
    std::vector<char> scratch(ops.scratch_bytes(need));
    float* ddbc = out.data() + size_t(D) * N;
    ops.selective_scan_backward(u.data(), delta.data(), A.data(), dbc.data() + R,
                                dbc.data() + R + N, Dskip.data(), z.data(), bias.data(), nullptr,
                                nullptr, dout.data(), du.data(), ddelta.data(), out.data(),
                                ddbc + R, ddbc + R + N, dD.data(), dz.data(), db.data(),
                                scratch.data(), B, L, D, N, nullptr, nullptr, P, A.data());
  };
  expect_same("selective_scan_backward (wide rows, dA scale)", out0, backward);
  auto on_cpu = out0;
  backward(CpuOps<float>(), on_cpu);
  for (size_t r = 0; r < rows; ++r)
    for (int c = 0; c < R; ++c) {
      const size_t i = size_t(D) * N + r * P + size_t(c);
      EXPECT_EQ(on_cpu[i], out0[i]) << "row " << r << " column " << c << " (dt's) written";
    }
}

}  // namespace
}  // namespace slipstream::ops::test

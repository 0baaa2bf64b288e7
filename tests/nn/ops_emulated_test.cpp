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
  // Column sums added onto what the output held (x).
  expect_same("column_sum_accumulate", x, [&](auto ops, auto& y) {
    std::vector<char> scratch(ops.scratch_bytes({.norm_rows = M, .norm_cols = N}));
    ops.column_sum_accumulate(a.data(), y.data(), M, N, scratch.data());
  });
  // Columns 5..16 of each row of x into a (M, 12) block at the front of y.
  expect_same("copy_cols", zeros,
              [&](auto ops, auto& y) { ops.copy_cols(x.data() + 5, N, y.data(), 12, M, 12); });
}

// The scan's forward and backward with Bm and Cm inside wider rows (as x_proj's output holds dt,
// Bm, Cm), given A_log (A = −exp(A_log) made by the scan, dA_log's chain rule applied by the
// backward: dA_log += sum · A): the CPU's gathering, scattering and scaling agree with the device
// kernels'; outside the Bm, Cm columns nothing moves.
TEST(GeneratedOps, ScanWithWideRowsAndALogAgrees) {
  const int B = 2, L = 9, D = 20, N = 8, R = 3, P = R + 2 * N;
  const size_t bld = size_t(B) * L * D, rows = size_t(B) * L;
  const auto u = random_values(bld, 11), z = random_values(bld, 12), dout = random_values(bld, 13);
  auto delta = random_values(bld, 14), A = random_values(size_t(D) * N, 15);
  for (auto& v : delta) v = 0.1f + 0.2f * std::fabs(v);
  for (auto& v : A) v = std::log(0.3f + std::fabs(v));  // A_log
  const auto Dskip = random_values(size_t(D), 16), bias = random_values(size_t(D), 17);
  const auto dbc = random_values(rows * P, 18);  // each row: dt (R), Bm (N), Cm (N)
  ScratchNeeds need;
  need.B = B, need.L = L, need.channels = D, need.state = N;
  auto forward = [&](auto ops, auto& y) {
    ops.selective_scan_forward(u.data(), delta.data(), A.data(), dbc.data() + R, dbc.data() + R + N,
                               Dskip.data(), z.data(), bias.data(), nullptr, y.data(), nullptr,
                               nullptr, B, L, D, N, nullptr, P, 0, true);
  };
  expect_same("selective_scan_forward (wide rows)", std::vector<float>(bld, 0.0f), forward);
  // out: dA_log (D, N; starting from values, += sum · A) then x_proj's output gradient (rows of P:
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
                                scratch.data(), B, L, D, N, nullptr, nullptr, P, true);
  };
  expect_same("selective_scan_backward (wide rows, A_log)", out0, backward);
  auto on_cpu = out0;
  backward(CpuOps<float>(), on_cpu);
  for (size_t r = 0; r < rows; ++r)
    for (int c = 0; c < R; ++c) {
      const size_t i = size_t(D) * N + r * P + size_t(c);
      EXPECT_EQ(on_cpu[i], out0[i]) << "row " << r << " column " << c << " (dt's) written";
    }
}

// x and z side by side in rows of 2C (in_proj's output as the model keeps it on a device): the
// convolution reads x and writes dx (and the scan reads z and writes dz) in place in their columns,
// on both backends alike, and leaves the other half of each row as it was.
TEST(GeneratedOps, ConvAndScanOnSideBySideRowsAgree) {
  const int B = 2, L = 9, C = 20, K = 4, N = 8;
  const size_t rows = size_t(B) * L, n = rows * C, wide = rows * 2 * C;
  const auto xz = random_values(wide, 21), w = random_values(size_t(C) * K, 22);
  const auto b = random_values(size_t(C), 23), du = random_values(n, 24);
  const auto u = random_values(n, 25), dout = random_values(n, 26);
  auto delta = random_values(n, 27), A = random_values(size_t(C) * N, 28);
  for (auto& v : delta) v = 0.1f + 0.2f * std::fabs(v);
  for (auto& v : A) v = -0.3f - std::fabs(v);
  const auto Bm = random_values(rows * N, 29), Cm = random_values(rows * N, 30);
  const auto Dskip = random_values(size_t(C), 31), bias = random_values(size_t(C), 32);
  ScratchNeeds need;
  need.B = B, need.L = L, need.channels = C, need.state = N, need.conv_width = K;
  const float* x = xz.data();
  const float* z = xz.data() + C;
  expect_same("conv_silu_forward (x rows apart)", std::vector<float>(n, 0.0f),
              [&](auto ops, auto& y) {
                std::vector<float> pre(n);
                ops.conv_silu_forward(x, nullptr, w.data(), b.data(), pre.data(), y.data(), B, L, C,
                                      K, nullptr, 2 * C);
              });
  // out: dxz (dx into x's columns, z's left as they were), then dw and db (+=).
  const auto out0 = random_values(wide + size_t(C) * K + C, 33);
  auto conv_backward = [&](auto ops, auto& out) {
    std::vector<float> pre(n), u_out(n), dpre(n);
    std::vector<char> scratch(ops.scratch_bytes(need));
    ops.conv_silu_forward(x, nullptr, w.data(), b.data(), pre.data(), u_out.data(), B, L, C, K,
                          nullptr, 2 * C);
    ops.conv_silu_backward(x, nullptr, w.data(), b.data(), pre.data(), du.data(), dpre.data(),
                           out.data(), out.data() + wide, out.data() + wide + size_t(C) * K, B, L,
                           C, K, scratch.data(), nullptr, 2 * C);
  };
  expect_same("conv_silu_backward (dx rows apart)", out0, conv_backward);
  expect_same("selective_scan_forward (z rows apart)", std::vector<float>(n, 0.0f),
              [&](auto ops, auto& y) {
                ops.selective_scan_forward(u.data(), delta.data(), A.data(), Bm.data(), Cm.data(),
                                           Dskip.data(), z, bias.data(), nullptr, y.data(), nullptr,
                                           nullptr, B, L, C, N, nullptr, 0, 2 * C);
              });
  // out: dxz (dz into z's columns, x's left as they were).
  auto scan_backward = [&](auto ops, auto& out) {
    std::vector<float> du_s(n), ddelta(n), dA(size_t(C) * N), dB(rows * N), dC(rows * N);
    std::vector<float> dD(static_cast<size_t>(C)), db(static_cast<size_t>(C));
    std::vector<char> scratch(ops.scratch_bytes(need));
    ops.selective_scan_backward(u.data(), delta.data(), A.data(), Bm.data(), Cm.data(),
                                Dskip.data(), z, bias.data(), nullptr, nullptr, dout.data(),
                                du_s.data(), ddelta.data(), dA.data(), dB.data(), dC.data(),
                                dD.data(), out.data() + C, db.data(), scratch.data(), B, L, C, N,
                                nullptr, nullptr, 0, false, 2 * C);
  };
  expect_same("selective_scan_backward (dz rows apart)", out0, scan_backward);
  // Given A_log (the model's parameter, on a device), both make A = −exp(A_log) and give A_log's
  // gradient (+=) for dA.
  std::vector<float> A_log(A.size());
  for (size_t i = 0; i < A.size(); ++i) A_log[i] = std::log(-A[i]);
  expect_same(
      "selective_scan_forward (A_log)", std::vector<float>(n, 0.0f), [&](auto ops, auto& y) {
        ops.selective_scan_forward(u.data(), delta.data(), A_log.data(), Bm.data(), Cm.data(),
                                   Dskip.data(), z, bias.data(), nullptr, y.data(), nullptr,
                                   nullptr, B, L, C, N, nullptr, 0, 2 * C, true);
      });
  expect_same("selective_scan_backward (A_log's gradient)", std::vector<float>(size_t(C) * N, 0.5f),
              [&](auto ops, auto& dA_log) {
                std::vector<float> du_s(n), ddelta(n), dB(rows * N), dC(rows * N), dz(wide);
                std::vector<float> dD(static_cast<size_t>(C)), db(static_cast<size_t>(C));
                std::vector<char> scratch(ops.scratch_bytes(need));
                ops.selective_scan_backward(
                    u.data(), delta.data(), A_log.data(), Bm.data(), Cm.data(), Dskip.data(), z,
                    bias.data(), nullptr, nullptr, dout.data(), du_s.data(), ddelta.data(),
                    dA_log.data(), dB.data(), dC.data(), dD.data(), dz.data(), db.data(),
                    scratch.data(), B, L, C, N, nullptr, nullptr, 0, true, 2 * C);
              });
  auto conv_cpu = out0, scan_cpu = out0;
  conv_backward(CpuOps<float>(), conv_cpu);
  scan_backward(CpuOps<float>(), scan_cpu);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < size_t(C); ++c) {
      EXPECT_EQ(conv_cpu[r * 2 * C + C + c], out0[r * 2 * C + C + c]) << "z's columns written";
      EXPECT_EQ(scan_cpu[r * 2 * C + c], out0[r * 2 * C + c]) << "x's columns written";
    }
}

}  // namespace
}  // namespace slipstream::ops::test

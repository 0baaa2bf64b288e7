// Checks of the CUDA RMSNorm (fused residual add) against the CPU reference (float64), run by
// the emulated and the gpu tests.
#pragma once

#include <random>
#include <vector>

#include "kernels/rmsnorm.h"
#include "tests/kernels/gradcheck.h"
#include "tests/kernels_cuda/device_checks.h"

namespace slipstream::kernels::test {

struct NormShape {
  size_t M, D;
  bool residual = true, dsum = true;
};

inline std::string describe(const NormShape& s) {
  return "M" + std::to_string(s.M) + " D" + std::to_string(s.D) + (s.residual ? " residual" : "") +
         (s.dsum ? " dsum" : "");
}

template <class Kernels, class Mem, class T>
void check_rmsnorm(const NormShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  std::mt19937_64 rng(seed);
  const size_t n = s.M * s.D;
  const auto x = round_trip<T>(rand_vec(n, rng));
  const auto res = s.residual ? round_trip<T>(rand_vec(n, rng)) : std::vector<double>{};
  const auto w = round_trip<float>(rand_vec(s.D, rng));
  const auto dy = round_trip<T>(rand_vec(n, rng));
  const auto dsum = s.dsum ? round_trip<T>(rand_vec(n, rng)) : std::vector<double>{};
  const auto dw0 = round_trip<float>(rand_vec(s.D, rng));
  // Reference. The device's backward sees the sum as T stores it.
  std::vector<double> y(n), sum(n), rstd(s.M), ds(n), dw = dw0;
  rmsnorm_add_forward<double>(x.data(), s.residual ? res.data() : nullptr, w.data(), y.data(),
                              sum.data(), rstd.data(), s.M, s.D, 1e-5);
  const std::vector<double> sum_t = round_trip<T>(sum);
  rmsnorm_add_backward<double>(sum_t.data(), w.data(), rstd.data(), dy.data(),
                               s.dsum ? dsum.data() : nullptr, ds.data(), dw.data(), s.M, s.D);
  Mem mem;
  T *g_y = mem.template alloc<T>(n), *g_sum = mem.template alloc<T>(n);
  float* g_rstd = mem.template alloc<float>(s.M);
  const float* g_w = mem.upload(elems<float>(w));
  Kernels::template rmsnorm_add_forward<T>(mem.upload(elems<T>(x)),
                                           s.residual ? mem.upload(elems<T>(res)) : nullptr, g_w,
                                           g_y, g_sum, g_rstd, s.M, s.D, 1e-5f, mem.stream());
  mem.sync();
  EXPECT_CLOSE(values(mem.download(g_y, n)), y, tolerance<T>(), "y");
  EXPECT_CLOSE(values(mem.download(g_sum, n)), sum_t, tolerance<T>() / 10, "sum");
  EXPECT_CLOSE(values(mem.download(g_rstd, s.M)), rstd, 1e-5, "rstd");
  // Backward in place on the residual gradient (ds aliases dsum), as the model uses it.
  T* g_ds = s.dsum ? mem.upload(elems<T>(dsum)) : mem.template alloc<T>(n);
  float* g_dw = mem.upload(elems<float>(dw0));
  void* ws = mem.alloc_bytes(Kernels::rmsnorm_add_backward_workspace_bytes(s.M, s.D));
  Kernels::template rmsnorm_add_backward<T>(g_sum, g_w, g_rstd, mem.upload(elems<T>(dy)),
                                            s.dsum ? g_ds : nullptr, g_ds, g_dw, ws, s.M, s.D,
                                            mem.stream());
  mem.sync();
  EXPECT_CLOSE(values(mem.download(g_ds, n)), ds, tolerance<T>(), "ds");
  EXPECT_CLOSE(values(mem.download(g_dw, s.D)), dw, std::max(1e-5, tolerance<T>() / 10),
               "dweight (+=)");
}

inline std::vector<NormShape> norm_shapes() {
  return {{37, 40}, {300, 128, false, false}, {5, 257, true, false}, {1, 3, false, true}};
}

}  // namespace slipstream::kernels::test

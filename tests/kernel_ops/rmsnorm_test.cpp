// RMSNorm with the fused residual add (kernels/rmsnorm.h): the reference against its formula and
// float64 finite differences, accumulation and aliasing; the CUDA kernels against the reference
// on the emulator and on a device (tests/kernel_ops/kernel_test.h), fp32 and bf16.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/rmsnorm.h"
#include "tests/kernel_ops/kernel_test.h"

namespace slipstream::kernels::test {
namespace {

CPU_TEST(RmsNorm, ForwardMatchesFormula) {
  std::mt19937_64 rng(1);
  const size_t M = 3, D = 10;
  auto x = rand_vec(M * D, rng), w = rand_vec(D, rng);
  std::vector<double> y(M * D), rstd(M);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), M, D, 1e-5);
  for (size_t i = 0; i < M; ++i) {
    double ms = 0;
    for (size_t j = 0; j < D; ++j) ms += x[i * D + j] * x[i * D + j] / D;
    const double r = 1 / std::sqrt(ms + 1e-5);
    EXPECT_NEAR(rstd[i], r, 1e-14);
    for (size_t j = 0; j < D; ++j) EXPECT_NEAR(y[i * D + j], x[i * D + j] * r * w[j], 1e-14);
  }
}

CPU_TEST(RmsNorm, GradCheckAccumulationFloat) {
  std::mt19937_64 rng(2);
  const size_t M = 5, D = 70;  // two column blocks in the weight reduction
  auto x = rand_vec(M * D, rng), w = rand_vec(D, rng), g = rand_vec(M * D, rng);
  const double eps = 1e-5;
  auto loss = [&] {
    std::vector<double> y(M * D), r(M);
    rmsnorm_forward(x.data(), w.data(), y.data(), r.data(), M, D, eps);
    return test::dot(g, y);
  };
  std::vector<double> y(M * D), r(M), dx(M * D), dw(D, 0.0);
  rmsnorm_forward(x.data(), w.data(), y.data(), r.data(), M, D, eps);
  rmsnorm_backward(x.data(), w.data(), r.data(), g.data(), dx.data(), dw.data(), M, D);
  test::check_gradient("x", loss, x, dx);
  test::check_gradient("weight", loss, w, dw);
  auto dx1 = dx, dw1 = dw;
  rmsnorm_backward(x.data(), w.data(), r.data(), g.data(), dx.data(), dw.data(), M, D);
  EXPECT_EQ(dx, dx1);
  EXPECT_DOUBLED(dw, dw1);
  // dx may alias dy.
  auto inplace = g;
  std::vector<double> dw2(D, 0.0);
  rmsnorm_backward(x.data(), w.data(), r.data(), inplace.data(), inplace.data(), dw2.data(), M, D);
  EXPECT_EQ(inplace, dx1);
  EXPECT_EQ(dw2, dw1);
  // float vs double
  auto xf = cast<float>(x), wf = cast<float>(w), gf = cast<float>(g);
  std::vector<float> yf(M * D), rf(M), dxf(M * D), dwf(D, 0.0f);
  rmsnorm_forward(xf.data(), wf.data(), yf.data(), rf.data(), M, D, 1e-5f);
  rmsnorm_backward(xf.data(), wf.data(), rf.data(), gf.data(), dxf.data(), dwf.data(), M, D);
  EXPECT_LT(test::rel_diff(y, yf), 1e-5);
  EXPECT_LT(test::rel_diff(dx1, dxf), 1e-5);
  EXPECT_LT(test::rel_diff(dw1, dwf), 1e-5);
}

// The residual form is the plain norm of x + residual, and its backward the plain backward plus
// the gradient arriving around the norm, also when written in place over it.
CPU_TEST(RmsNorm, ResidualFormComposes) {
  std::mt19937_64 rng(79);
  const size_t M = 4, D = 70;
  auto x = test::rand_vec(M * D, rng), res = test::rand_vec(M * D, rng);
  auto w = test::rand_vec(D, rng), dy = test::rand_vec(M * D, rng),
       dsum = test::rand_vec(M * D, rng);
  std::vector<double> s(M * D), y(M * D), rstd(M), sum(M * D), y2(M * D), rstd2(M);
  for (size_t i = 0; i < M * D; ++i) s[i] = x[i] + res[i];
  rmsnorm_forward(s.data(), w.data(), y.data(), rstd.data(), M, D, 1e-5);
  rmsnorm_add_forward(x.data(), res.data(), w.data(), y2.data(), sum.data(), rstd2.data(), M, D,
                      1e-5);
  for (size_t i = 0; i < M * D; ++i) {
    EXPECT_NEAR(y2[i], y[i], 1e-14);
    EXPECT_NEAR(sum[i], s[i], 1e-15);
  }
  std::vector<double> dx(M * D), dw(D, 0.0), dw2(D, 0.0), ds = dsum;
  rmsnorm_backward(s.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), M, D);
  rmsnorm_add_backward(s.data(), w.data(), rstd.data(), dy.data(), ds.data(), ds.data(), dw2.data(),
                       M, D);
  for (size_t i = 0; i < M * D; ++i) EXPECT_NEAR(ds[i], dx[i] + dsum[i], 1e-13);
  for (size_t j = 0; j < D; ++j) EXPECT_NEAR(dw2[j], dw[j], 1e-13);
}

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
  bfloat16* g_ybf = mem.template alloc<bfloat16>(n);
  float* g_rstd = mem.template alloc<float>(s.M);
  const float* g_w = mem.upload(elems<float>(w));
  const T* g_x = mem.upload(elems<T>(x));
  const T* g_res = s.residual ? mem.upload(elems<T>(res)) : nullptr;
  Kernels::template rmsnorm_add_forward<T>(g_x, g_res, g_w, g_y, g_ybf, g_sum, g_rstd, s.M, s.D,
                                           1e-5f, mem.stream());
  mem.sync();
  const std::vector<T> y_dev = mem.download(g_y, n);
  EXPECT_CLOSE(values(y_dev), y, tolerance<T>(), "y");
  // The bf16 copy is y rounded as the cast rounds it, bit for bit.
  const std::vector<bfloat16> ybf = mem.download(g_ybf, n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(ybf[i].bits, fp32_to_bf16(float(value(y_dev[i])))) << "y_bf[" << i << "]";
  }
  // The copy alone (y null, as the bf16 model on a device asks): the same bits; no output at all
  // is refused.
  bfloat16* g_ybf_only = mem.template alloc<bfloat16>(n);
  Kernels::template rmsnorm_add_forward<T>(g_x, g_res, g_w, nullptr, g_ybf_only, g_sum, g_rstd, s.M,
                                           s.D, 1e-5f, mem.stream());
  mem.sync();
  const std::vector<bfloat16> ybf_only = mem.download(g_ybf_only, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(ybf_only[i].bits, ybf[i].bits) << "y_bf alone, " << i;
  EXPECT_THROW(Kernels::template rmsnorm_add_forward<T>(g_x, g_res, g_w, nullptr, nullptr, g_sum,
                                                        g_rstd, s.M, s.D, 1e-5f, mem.stream()),
               std::invalid_argument);
  EXPECT_CLOSE(values(mem.download(g_sum, n)), sum_t, tolerance<T>() / 10, "sum");
  EXPECT_CLOSE(values(mem.download(g_rstd, s.M)), rstd, 1e-5, "rstd");
  // Backward in place on the residual gradient (ds aliases dsum), as the model uses it.
  T* g_ds = s.dsum ? mem.upload(elems<T>(dsum)) : mem.template alloc<T>(n);
  float* g_dw = mem.upload(elems<float>(dw0));
  void* ws = mem.alloc_bytes(Kernels::rmsnorm_add_backward_workspace_bytes(s.M, s.D));
  bfloat16* g_dsbf = mem.template alloc<bfloat16>(n);
  Kernels::template rmsnorm_add_backward<T>(g_sum, g_w, g_rstd, mem.upload(elems<T>(dy)),
                                            s.dsum ? g_ds : nullptr, g_ds, g_dsbf, g_dw, ws, s.M,
                                            s.D, mem.stream());
  mem.sync();
  const std::vector<T> ds_dev = mem.download(g_ds, n);
  EXPECT_CLOSE(values(ds_dev), ds, tolerance<T>(), "ds");
  const std::vector<bfloat16> dsbf = mem.download(g_dsbf, n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(dsbf[i].bits, fp32_to_bf16(float(value(ds_dev[i])))) << "ds_bf[" << i << "]";
  }
  EXPECT_CLOSE(values(mem.download(g_dw, s.D)), dw, std::max(1e-5, tolerance<T>() / 10),
               "dweight (+=)");
  // Again, from the same dweight: the same bits (the launch's last block sums the partials in a
  // fixed order, whichever block finishes last; a partial read before its block wrote it, on a
  // GPU, would show here).
  const std::vector<float> dw_first = mem.download(g_dw, s.D);
  for (int again = 0; again < 3; ++again) {
    float* g_dw2 = mem.upload(elems<float>(dw0));
    T* g_ds2 = s.dsum ? mem.upload(elems<T>(dsum)) : mem.template alloc<T>(n);
    Kernels::template rmsnorm_add_backward<T>(g_sum, g_w, g_rstd, mem.upload(elems<T>(dy)),
                                              s.dsum ? g_ds2 : nullptr, g_ds2, nullptr, g_dw2, ws,
                                              s.M, s.D, mem.stream());
    mem.sync();
    const std::vector<float> dw_again = mem.download(g_dw2, s.D);
    ASSERT_EQ(std::memcmp(dw_again.data(), dw_first.data(), s.D * sizeof(float)), 0)
        << "dweight differs on run " << again + 2;
  }
}

// A bias row folded into the norm (the input projection's, at the first layer): the forward with
// `bias` and the backward with `s_bias` give the bits of adding the row to x first.
template <class Kernels, class Mem>
void check_rmsnorm_bias(size_t M, size_t D, uint64_t seed) {
  SCOPED_TRACE("bias row, M" + std::to_string(M) + " D" + std::to_string(D));
  std::mt19937_64 rng(seed);
  const size_t n = M * D;
  const auto x = elems<float>(round_trip<float>(rand_vec(n, rng)));
  const auto bias = elems<float>(round_trip<float>(rand_vec(D, rng)));
  const auto w = elems<float>(round_trip<float>(rand_vec(D, rng)));
  const auto dy = elems<float>(round_trip<float>(rand_vec(n, rng)));
  std::vector<float> xb(n);  // x + bias, as add_bias_rows makes it
  for (size_t i = 0; i < n; ++i) xb[i] = x[i] + bias[i % D];
  Mem mem;
  const float *g_w = mem.upload(w), *g_bias = mem.upload(bias), *g_dy = mem.upload(dy);
  void* ws = mem.alloc_bytes(Kernels::rmsnorm_add_backward_workspace_bytes(M, D));
  struct Out {
    std::vector<float> y, sum, rstd, ds, dw;
  };
  auto run = [&](const std::vector<float>& in, const float* row) {
    float *g_y = mem.template alloc<float>(n), *g_sum = mem.template alloc<float>(n);
    float *g_rstd = mem.template alloc<float>(M), *g_ds = mem.template alloc<float>(n);
    float* g_dw = mem.upload(std::vector<float>(D, 0.0f));
    const float* g_in = mem.upload(in);
    Kernels::template rmsnorm_add_forward<float>(g_in, nullptr, g_w, g_y, nullptr, g_sum, g_rstd, M,
                                                 D, 1e-5f, mem.stream(), row);
    Kernels::template rmsnorm_add_backward<float>(g_in, g_w, g_rstd, g_dy, nullptr, g_ds, nullptr,
                                                  g_dw, ws, M, D, mem.stream(), row);
    mem.sync();
    return Out{mem.download(g_y, n), mem.download(g_sum, n), mem.download(g_rstd, M),
               mem.download(g_ds, n), mem.download(g_dw, D)};
  };
  const Out folded = run(x, g_bias), added = run(xb, nullptr);
  EXPECT_EQ(folded.y, added.y) << "y";
  EXPECT_EQ(folded.sum, added.sum) << "sum (x + bias)";
  EXPECT_EQ(folded.rstd, added.rstd) << "rstd";
  EXPECT_EQ(folded.ds, added.ds) << "ds";
  EXPECT_EQ(folded.dw, added.dw) << "dweight";
}

inline std::vector<NormShape> norm_shapes() {
  // The backward's register form at 4, 8 and 16 values a lane (D 40, 128; 200, 256; 257), over
  // one and several row blocks; its two-pass form past 512 columns.
  return {{37, 40},
          {300, 128, false, false},
          {5, 257, true, false},
          {1, 3, false, true},
          {130, 256},
          {70, 200, false, true},
          {9, 600}};
}

KERNEL_TEST(RmsNorm, ForwardAndBackwardMatchCpu) {
  uint64_t seed = 201;
  for (const auto& s : norm_shapes()) {
    check_rmsnorm<Kernels, Mem, float>(s, seed++);
    check_rmsnorm<Kernels, Mem, bfloat16>(s, seed++);
  }
  if (kOnDevice) {
    check_rmsnorm<Kernels, Mem, float>({256 * 60, 128}, seed++);  // gpu_standard
    check_rmsnorm<Kernels, Mem, float>({256 * 60, 256}, seed++);  // production
  }
  check_rmsnorm_bias<Kernels, Mem>(300, 128, seed++);
  check_rmsnorm_bias<Kernels, Mem>(37, 70, seed++);
}

}  // namespace
}  // namespace slipstream::kernels::test

// The elementwise and copy ops (kernels/elementwise.h): the references against their formulas
// and float64 finite differences; the CUDA kernels (with the bf16 casts and the column sums)
// against the references on the emulator and on a device (tests/kernel_ops/kernel_test.h).

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "tests/kernel_ops/kernel_test.h"

// ---- The CPU reference ----

#if SLIPSTREAM_REFERENCE_TESTS
namespace slipstream::kernels {
namespace {
using test::rand_vec;

CPU_TEST(Elementwise, AddMulAndBackward) {
  std::mt19937_64 rng(1);
  const size_t n = 20000;  // parallel blocks
  auto a = rand_vec(n, rng), b = rand_vec(n, rng), g = rand_vec(n, rng);
  std::vector<double> y(n), da(n), db(n);
  add(a.data(), b.data(), y.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]);
  add_inplace(y.data(), a.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], (a[i] + b[i]) + a[i]);
  mul(a.data(), b.data(), y.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] * b[i]);
  mul_backward(a.data(), b.data(), g.data(), da.data(), db.data(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(da[i], g[i] * b[i]);
    ASSERT_EQ(db[i], g[i] * a[i]);
  }
  // Small case through the gradient checker too.
  std::vector<double> a5(a.begin(), a.begin() + 5), b5(b.begin(), b.begin() + 5),
      g5(g.begin(), g.begin() + 5), da5(5), db5(5);
  auto loss = [&] {
    std::vector<double> y5(5);
    mul(a5.data(), b5.data(), y5.data(), 5);
    return test::dot(g5, y5);
  };
  mul_backward(a5.data(), b5.data(), g5.data(), da5.data(), db5.data(), 5);
  test::check_gradient("a", loss, a5, da5);
  test::check_gradient("b", loss, b5, db5);
}

CPU_TEST(Elementwise, SplitAndConcatLastDim) {
  const size_t M = 4, D1 = 3, D2 = 5;
  std::vector<float> src(M * (D1 + D2));
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
  std::vector<float> p(M * D1), q(M * D2), back(src.size(), -1.0f);
  copy_cols(src.data(), D1 + D2, p.data(), D1, M, D1);
  copy_cols(src.data() + D1, D1 + D2, q.data(), D2, M, D2);
  for (size_t r = 0; r < M; ++r) {
    for (size_t j = 0; j < D1; ++j) EXPECT_EQ(p[r * D1 + j], src[r * (D1 + D2) + j]);
    for (size_t j = 0; j < D2; ++j) EXPECT_EQ(q[r * D2 + j], src[r * (D1 + D2) + D1 + j]);
  }
  copy_cols(p.data(), D1, back.data(), D1 + D2, M, D1);
  copy_cols(q.data(), D2, back.data() + D1, D1 + D2, M, D2);
  EXPECT_EQ(back, src);
}

}  // namespace
}  // namespace slipstream::kernels
#endif  // SLIPSTREAM_REFERENCE_TESTS

// ---- The CUDA kernels against the reference ----

namespace slipstream::kernels::test {

template <class Kernels, class Mem>
void check_elementwise(size_t M, size_t N, uint64_t seed) {
  SCOPED_TRACE("M" + std::to_string(M) + " N" + std::to_string(N));
  std::mt19937_64 rng(seed);
  const size_t n = M * N;
  const auto a = round_trip<float>(rand_vec(n, rng)), b = round_trip<float>(rand_vec(n, rng));
  const auto bias = round_trip<float>(rand_vec(N, rng));
  Mem mem;
  // y += a; y += a * b; y (M, N) += bias; y = -exp(a).
  std::vector<double> ref = b;
  add_inplace<double>(ref.data(), a.data(), n);
  float* y = mem.upload(elems<float>(b));
  Kernels::add_inplace(y, mem.upload(elems<float>(a)), n, mem.stream());
  EXPECT_CLOSE(values(mem.download(y, n)), ref, 1e-6, "add_inplace");
  mul_accumulate<double>(ref.data(), a.data(), b.data(), n);
  Kernels::mul_accumulate(y, mem.upload(elems<float>(a)), mem.upload(elems<float>(b)), n,
                          mem.stream());
  EXPECT_CLOSE(values(mem.download(y, n)), ref, 1e-6, "mul_accumulate");
  add_bias_rows<double>(ref.data(), bias.data(), M, N);
  Kernels::add_bias_rows(y, mem.upload(elems<float>(bias)), M, N, mem.stream());
  EXPECT_CLOSE(values(mem.download(y, n)), ref, 1e-6, "add_bias_rows");
  // Rows kept (1), cleared (0) and scaled, in place.
  std::vector<double> keep(M);
  for (size_t r = 0; r < M; ++r) keep[r] = r % 3 == 0 ? 0.0 : r % 3 == 1 ? 1.0 : 0.5;
  scale_rows<double>(ref.data(), keep.data(), ref.data(), 1, M, N, nullptr, nullptr, 0);
  for (size_t c = 0; c < N && M > 0; ++c) EXPECT_EQ(ref[c], 0.0);
  Kernels::scale_rows(y, mem.upload(elems<float>(keep)), y, 1, M, N, nullptr, nullptr, 0,
                      mem.stream());
  EXPECT_CLOSE(values(mem.download(y, n)), ref, 1e-6, "scale_rows");
  // Groups of rows sharing the scales (a model's layers): (3, M / 3, N) with M / 3 scales, each
  // group's row r against its own scaling.
  if (M >= 3) {
    const size_t G = 3, R = M / 3, gn = G * R * N;
    std::vector<double> grouped(ref.begin(), ref.begin() + gn), want = grouped;
    for (size_t g = 0; g < G; ++g)
      for (size_t r = 0; r < R; ++r)
        for (size_t c = 0; c < N; ++c) want[(g * R + r) * N + c] *= keep[r];
    // A second piece with rows of its own length (a model's conv inputs beside its scan states),
    // in the same pass.
    const size_t N2 = N + 3, gn2 = G * R * N2;
    std::vector<double> second(gn2), want2(gn2);
    for (size_t i = 0; i < gn2; ++i) second[i] = 1.0 + static_cast<double>(i % 7);
    for (size_t g = 0; g < G; ++g)
      for (size_t r = 0; r < R; ++r)
        for (size_t c = 0; c < N2; ++c) {
          const size_t i = (g * R + r) * N2 + c;
          want2[i] = second[i] * keep[r];
        }
    std::vector<double> cpu(gn), cpu2(gn2);
    scale_rows<double>(grouped.data(), keep.data(), cpu.data(), G, R, N, nullptr, nullptr, 0);
    EXPECT_EQ(cpu, want) << "scale_rows over groups (CPU)";
    scale_rows<double>(grouped.data(), keep.data(), cpu.data(), G, R, N, second.data(), cpu2.data(),
                       N2);
    EXPECT_EQ(cpu, want) << "scale_rows over groups with a second piece (CPU)";
    EXPECT_EQ(cpu2, want2) << "scale_rows' second piece (CPU)";
    float* yg = mem.template alloc<float>(gn);
    float* yg2 = mem.template alloc<float>(gn2);
    Kernels::scale_rows(mem.upload(elems<float>(grouped)), mem.upload(elems<float>(keep)), yg, G, R,
                        N, mem.upload(elems<float>(second)), yg2, N2, mem.stream());
    EXPECT_CLOSE(values(mem.download(yg, gn)), want, 1e-6, "scale_rows over groups");
    EXPECT_CLOSE(values(mem.download(yg2, gn2)), want2, 1e-6, "scale_rows' second piece");
  }
  std::vector<double> e(n);
  neg_exp<double>(a.data(), N, e.data(), M, N);
  float* ye = mem.template alloc<float>(n);
  Kernels::neg_exp(mem.upload(elems<float>(a)), N, ye, M, N, mem.stream());
  EXPECT_CLOSE(values(mem.download(ye, n)), e, 1e-6, "neg_exp");
  // Rows x_ld apart (every layer's A from its A_log, a parameter stride apart).
  if (N >= 2) {
    const size_t cols = N / 2;
    std::vector<double> er(M * cols);
    for (size_t r = 0; r < M; ++r)
      for (size_t c = 0; c < cols; ++c) er[r * cols + c] = -std::exp(a[r * N + c]);
    float* yr = mem.template alloc<float>(M * cols);
    Kernels::neg_exp(mem.upload(elems<float>(a)), N, yr, M, cols, mem.stream());
    EXPECT_CLOSE(values(mem.download(yr, M * cols)), er, 1e-6, "neg_exp rows");
  }
  Kernels::fill(ye, 2.5f, n, mem.stream());
  EXPECT_CLOSE(values(mem.download(ye, n)), std::vector<double>(n, 2.5), 1e-12, "fill");
  // Column sums accumulate onto db, deterministically.
  std::vector<double> db = bias;
  column_sum_accumulate<double>(a.data(), db.data(), M, N);
  float* g_db = mem.upload(elems<float>(bias));
  void* ws = mem.alloc_bytes(Kernels::column_sum_accumulate_workspace_bytes(M, N));
  const float* g_a = mem.upload(elems<float>(a));
  Kernels::column_sum_accumulate(g_a, g_db, M, N, ws, mem.stream());
  const std::vector<float> db_first = mem.download(g_db, N);
  EXPECT_CLOSE(values(db_first), db, 1e-5, "column_sum_accumulate");
  // Again: the same bits (the last block to finish sums the partials, in a fixed order).
  for (int again = 0; again < 3; ++again) {
    float* g_db2 = mem.upload(elems<float>(bias));
    Kernels::column_sum_accumulate(g_a, g_db2, M, N, ws, mem.stream());
    const std::vector<float> db_again = mem.download(g_db2, N);
    ASSERT_EQ(std::memcmp(db_again.data(), db_first.data(), N * sizeof(float)), 0)
        << "column sums differ on run " << again + 2;
  }
  // Column blocks out of and into wider rows (the split and concatenation of the model).
  if (N >= 3) {
    const size_t c = N / 3, off = N - c;
    std::vector<double> dst(M * c);
    copy_cols<double>(a.data() + off, N, dst.data(), c, M, c);
    float* g_dst = mem.template alloc<float>(M * c);
    Kernels::copy_cols(mem.upload(elems<float>(a)) + off, N, g_dst, c, M, c, mem.stream());
    EXPECT_CLOSE(values(mem.download(g_dst, M * c)), dst, 1e-12, "copy_cols");
  }
  float* g_copy = mem.template alloc<float>(n);
  Kernels::copy_bytes(g_copy, mem.upload(elems<float>(a)), n * sizeof(float), mem.stream());
  EXPECT_CLOSE(values(mem.download(g_copy, n)), a, 1e-12, "copy_bytes");
}

// Rounding to bf16 is bit-identical to the CPU's, specials included; widening back is exact, and
// so is adding the widened values to fp32 ones.
template <class Kernels, class Mem>
void check_bf16_rounding(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          1.00390625f,
                          1.01171875f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          1e-40f,
                          -1e-40f,
                          3.4e38f,
                          std::numeric_limits<float>::max()};
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 4000; ++i) {
    const uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  std::vector<uint16_t> ref(x.size());
  fp32_to_bf16_scalar(x.data(), ref.data(), x.size());
  Mem mem;
  bfloat16* out = mem.template alloc<bfloat16>(x.size());
  Kernels::fp32_to_bf16(mem.upload(x), out, x.size(), mem.stream());
  const auto got = mem.download(out, x.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < x.size(); ++i) mismatches += got[i].bits != ref[i];
  EXPECT_EQ(mismatches, 0u) << "of " << x.size() << " conversions";
  // Two arrays in one launch: the first 1,000 values and the rest, each as the single form.
  {
    const size_t n_a = 1000, n_b = x.size() - n_a;
    const float* g_x = mem.upload(x);
    bfloat16 *a_bf = mem.template alloc<bfloat16>(n_a), *b_bf = mem.template alloc<bfloat16>(n_b);
    Kernels::fp32_to_bf16_two(g_x, a_bf, n_a, g_x + n_a, b_bf, n_b, mem.stream());
    const auto got_a = mem.download(a_bf, n_a), got_b = mem.download(b_bf, n_b);
    size_t wrong = 0;
    for (size_t i = 0; i < n_a; ++i) wrong += got_a[i].bits != ref[i];
    for (size_t i = 0; i < n_b; ++i) wrong += got_b[i].bits != ref[n_a + i];
    EXPECT_EQ(wrong, 0u) << "of " << x.size() << " conversions of two arrays";
  }

  // Back to fp32: the exact widening (the bits, NaN's included), and y += widened.
  float* wide = mem.template alloc<float>(x.size());
  Kernels::bf16_to_fp32(out, wide, x.size(), mem.stream());
  const auto back = mem.download(wide, x.size());
  size_t widened_wrong = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = bf16_to_fp32(ref[i]);
    widened_wrong += std::memcmp(&back[i], &want, 4) != 0;
  }
  EXPECT_EQ(widened_wrong, 0u) << "of " << x.size() << " widenings";
  std::vector<float> y0(x.size()), sum(x.size());
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    y0[i] = u(rng);
    sum[i] = y0[i] + bf16_to_fp32(ref[i]);
  }
  float* y = mem.upload(y0);
  Kernels::accumulate_bf16(y, out, x.size(), mem.stream());
  const auto acc = mem.download(y, x.size());
  size_t summed_wrong = 0;
  for (size_t i = 0; i < x.size(); ++i)
    summed_wrong +=
        std::memcmp(&acc[i], &sum[i], 4) != 0 && !(std::isnan(acc[i]) && std::isnan(sum[i]));
  EXPECT_EQ(summed_wrong, 0u) << "of " << x.size() << " accumulations";
}

}  // namespace slipstream::kernels::test

namespace slipstream::kernels::test {
namespace {

KERNEL_TEST(Elementwise, MatchesCpu) {
  uint64_t seed = 301;
  // 4357 rows: 18 partials a column, more than the 16 lanes that sum them.
  for (auto [M, N] : {std::pair<size_t, size_t>{1, 1}, {37, 40}, {300, 7}, {513, 130}, {4357, 33}})
    check_elementwise<Kernels, Mem>(M, N, seed++);
}
KERNEL_TEST(Elementwise, Bf16RoundingIsBitIdentical) {
  check_bf16_rounding<Kernels, Mem>(311);
}
DEVICE_TEST(Elementwise, GpuStandardShape) {
  check_elementwise<Kernels, Mem>(256 * 60, 256, 312);
}
// The sums by a launch's last block under load: 4,096 blocks finishing in whatever order, twenty
// launches, the same bits each time (a partial read before its block's write reached the device
// would differ from run to run).
DEVICE_TEST(Elementwise, LastBlockSumsRepeatBitForBit) {
  const size_t M = size_t(1) << 20, N = 33;
  std::mt19937_64 rng(313);
  const auto a = elems<float>(round_trip<float>(rand_vec(M * N, rng)));
  Mem mem;
  const float* g_a = mem.upload(a);
  void* ws = mem.alloc_bytes(Kernels::column_sum_accumulate_workspace_bytes(M, N));
  std::vector<float> first;
  for (int run = 0; run < 20; ++run) {
    float* g_db = mem.upload(std::vector<float>(N, 0.0f));
    Kernels::column_sum_accumulate(g_a, g_db, M, N, ws, mem.stream());
    const std::vector<float> db = mem.download(g_db, N);
    if (run == 0) first = db;
    ASSERT_EQ(std::memcmp(db.data(), first.data(), N * sizeof(float)), 0) << "run " << run;
  }
}

}  // namespace
}  // namespace slipstream::kernels::test

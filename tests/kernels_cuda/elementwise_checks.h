// Checks of the CUDA elementwise ops and GEMMs against the CPU references, run by the emulated
// and the gpu tests. Mem additionally provides gemm_context() (a cuBLASLt handle + workspace on
// a device; nothing under the emulator).
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "tests/kernels/gradcheck.h"
#include "tests/kernels_cuda/device_checks.h"

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
  std::vector<double> e(n);
  neg_exp<double>(a.data(), e.data(), n);
  float* ye = mem.template alloc<float>(n);
  Kernels::neg_exp(mem.upload(elems<float>(a)), ye, n, mem.stream());
  EXPECT_CLOSE(values(mem.download(ye, n)), e, 1e-6, "neg_exp");
  Kernels::fill(ye, 2.5f, n, mem.stream());
  EXPECT_CLOSE(values(mem.download(ye, n)), std::vector<double>(n, 2.5), 1e-12, "fill");
  // Column sums accumulate onto db, deterministically.
  std::vector<double> db = bias;
  column_sum_accumulate<double>(a.data(), db.data(), M, N);
  float* g_db = mem.upload(elems<float>(bias));
  void* ws = mem.alloc_bytes(Kernels::column_sum_accumulate_workspace_bytes(M, N));
  Kernels::column_sum_accumulate(mem.upload(elems<float>(a)), g_db, M, N, ws, mem.stream());
  EXPECT_CLOSE(values(mem.download(g_db, N)), db, 1e-5, "column_sum_accumulate");
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

struct GemmShape {
  bool ta, tb;
  int M, N, K;
  double beta;
  int pad;  // extra leading-dimension elements (and an odd pointer offset when > 0)
};

// C = op(A) op(B) + beta C against the float64 product of the same operands.
template <class Kernels, class Mem, class T>
void check_gemm(const GemmShape& s, uint64_t seed) {
  SCOPED_TRACE(std::string(s.ta ? "T" : "N") + (s.tb ? "T" : "N") + " M" + std::to_string(s.M) +
               " N" + std::to_string(s.N) + " K" + std::to_string(s.K) + " beta" +
               std::to_string(s.beta) + " pad" + std::to_string(s.pad));
  std::mt19937_64 rng(seed);
  const int a_rows = s.ta ? s.K : s.M, a_cols = s.ta ? s.M : s.K;
  const int b_rows = s.tb ? s.N : s.K, b_cols = s.tb ? s.K : s.N;
  const int lda = a_cols + s.pad, ldb = b_cols + s.pad, ldc = s.N + s.pad;
  const size_t off = s.pad > 0 ? 1 : 0;  // unaligned operand starts
  const auto A = round_trip<T>(rand_vec(off + size_t(a_rows) * lda, rng));
  const auto B = round_trip<T>(rand_vec(off + size_t(b_rows) * ldb, rng));
  const auto C0 = round_trip<float>(rand_vec(off + size_t(s.M) * ldc, rng));
  std::vector<double> C = C0;
  gemm<double>(s.ta, s.tb, s.M, s.N, s.K, 1.0, A.data() + off, lda, B.data() + off, ldb, s.beta,
               C.data() + off, ldc);
  Mem mem;
  float* g_c = mem.upload(elems<float>(C0));
  Kernels::gemm(mem.gemm_context(), s.ta, s.tb, s.M, s.N, s.K, 1.0f, mem.upload(elems<T>(A)) + off,
                lda, mem.upload(elems<T>(B)) + off, ldb, float(s.beta), g_c + off, ldc,
                mem.stream());
  const auto got = values(mem.download(g_c, C0.size()));
  // Only the M x N block changes; the padding keeps its values.
  EXPECT_CLOSE(got, C, 1e-5, "C");
}

inline std::vector<GemmShape> gemm_shapes() {
  return {{false, true, 37, 50, 23, 0.0, 0}, {false, false, 64, 32, 48, 1.0, 0},
          {true, false, 19, 33, 70, 1.0, 3}, {true, true, 8, 8, 8, 0.5, 1},
          {false, true, 1, 130, 7, 0.0, 2},  {false, false, 300, 5, 129, 0.0, 0}};
}

}  // namespace slipstream::kernels::test

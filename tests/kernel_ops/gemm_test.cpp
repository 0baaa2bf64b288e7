// The GEMM (kernels/gemm.h): the reference and its bf16 form against float64 and finite
// differences; the device GEMM (cuBLASLt; the reference itself under the emulator) against the
// reference's row-major contract, fp32 and bf16 (tests/kernel_ops/kernel_test.h).

#include <tbb/global_control.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/gemm.h"
#include "kernels/gemm_onednn.h"
#include "kernels/vector_math.h"
#include "tests/kernel_ops/kernel_test.h"

// ---- The CPU reference ----

#if SLIPSTREAM_REFERENCE_TESTS
namespace slipstream::kernels {
namespace {
using test::cast;
using test::rand_vec;

// Naive C = alpha op(A) op(B) + beta C in double.
void ref_gemm(bool ta, bool tb, int M, int N, int K, double alpha, const std::vector<double>& A,
              int lda, const std::vector<double>& B, int ldb, double beta, std::vector<double>& C,
              int ldc) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k)
        s += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = alpha * s + beta * C[i * ldc + j];
    }
}

// For every transpose pair: random A, B, C with padded leading dimensions, the float64 result
// of C = 0.7 op(A) op(B) + 0.3 C by gemm<double> checked against the naive reference, then
// `more(ta, tb, ref, A, B, C, lda, ldb, ldc)` for the float checks.
template <class More>
void each_transpose(int M, int N, int K, int pad, uint64_t seed, More&& more) {
  std::mt19937_64 rng(seed);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
      auto A = rand_vec(size_t(ta ? K : M) * lda, rng);
      auto B = rand_vec(size_t(tb ? N : K) * ldb, rng);
      auto C = rand_vec(size_t(M) * ldc, rng);
      auto ref = C;
      ref_gemm(ta, tb, M, N, K, 0.7, A, lda, B, ldb, 0.3, ref, ldc);
      auto Cd = C;
      gemm<double>(ta, tb, M, N, K, 0.7, A.data(), lda, B.data(), ldb, 0.3, Cd.data(), ldc);
      EXPECT_LT(test::rel_diff(ref, Cd), 1e-14) << ta << tb;
      more(ta, tb, ref, A, B, C, lda, ldb, ldc);
    }
}

CPU_TEST(Gemm, AllTransposesWithLeadingDims) {
  const int M = 7, N = 5, K = 9;
  each_transpose(M, N, K, 3, 1,
                 [&](int ta, int tb, const auto& ref, const auto& A, const auto& B, const auto& C,
                     int lda, int ldb, int ldc) {
                   auto Af = cast<float>(A), Bf = cast<float>(B), Cf = cast<float>(C);
                   gemm<float>(ta, tb, M, N, K, 0.7f, Af.data(), lda, Bf.data(), ldb, 0.3f,
                               Cf.data(), ldc);
                   EXPECT_LT(test::rel_diff(ref, Cf), 1e-5);
                 });
}

// A few rows of C (a recurrent step of a game or a few: at most 4 rows take a matrix-vector
// product a row, 5 the general product): every transpose, padded leading dimensions (a
// transposed A's row is strided), beta 0 overwriting NaNs already in C, and with op(A) = A each
// row the bits of that row alone (a row's sums do not depend on the others).
CPU_TEST(Gemm, FewRowsAreMatrixVectorProducts) {
  const int N = 37, K = 29;
  for (const int M : {1, 2, 4, 5})
    each_transpose(
        M, N, K, 4, 2 + uint64_t(M),
        [&](int ta, int tb, const auto& ref, const auto& A, const auto& B, const auto& C, int lda,
            int ldb, int ldc) {
          SCOPED_TRACE("M " + std::to_string(M));
          auto Af = cast<float>(A), Bf = cast<float>(B), Cf = cast<float>(C);
          gemm<float>(ta, tb, M, N, K, 0.7f, Af.data(), lda, Bf.data(), ldb, 0.3f, Cf.data(), ldc);
          EXPECT_LT(test::rel_diff(ref, Cf), 1e-5) << ta << tb;
          std::vector<float> stale(Cf.size(), NAN);
          gemm<float>(ta, tb, M, N, K, 1.0f, Af.data(), lda, Bf.data(), ldb, 0.0f, stale.data(),
                      ldc);
          auto zero = C;
          std::fill(zero.begin(), zero.end(), 0.0);
          ref_gemm(ta, tb, M, N, K, 1.0, A, lda, B, ldb, 0.0, zero, ldc);
          for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j)
              EXPECT_NEAR(stale[size_t(i) * ldc + j], zero[size_t(i) * ldc + j], 1e-4)
                  << i << " " << j;
          if (ta || M > 4) return;
          for (int i = 0; i < M; ++i) {
            std::vector<float> alone(size_t(N), NAN);
            gemm<float>(false, tb, 1, N, K, 1.0f, Af.data() + size_t(i) * lda, lda, Bf.data(), ldb,
                        0.0f, alone.data(), N);
            for (int j = 0; j < N; ++j)
              ASSERT_EQ(alone[size_t(j)], stale[size_t(i) * ldc + j]) << "row " << i << " " << j;
          }
        });
}

// Products large enough to be split by rows of C over TBB tasks (odd M, every transpose,
// padded leading dimensions): equal to the reference, and bit-identical for any thread count.
CPU_TEST(Gemm, RowBlocksAcrossTasks) {
  const int M = 301, N = 64, K = 48;  // N*K = 3072: blocks of 85 rows, 4 blocks
  each_transpose(
      M, N, K, 5, 3,
      [&](int ta, int tb, const auto& ref, const auto& A, const auto& B, const auto& C, int lda,
          int ldb, int ldc) {
        auto Af = cast<float>(A), Bf = cast<float>(B);
        std::vector<float> wide = cast<float>(C), one = cast<float>(C);
        gemm<float>(ta, tb, M, N, K, 0.7f, Af.data(), lda, Bf.data(), ldb, 0.3f, wide.data(), ldc);
        EXPECT_LT(test::rel_diff(ref, wide), 1e-5) << ta << tb;
        {
          tbb::global_control serial(tbb::global_control::max_allowed_parallelism, 1);
          gemm<float>(ta, tb, M, N, K, 0.7f, Af.data(), lda, Bf.data(), ldb, 0.3f, one.data(), ldc);
        }
        EXPECT_EQ(wide, one) << ta << tb;
      });
}

// fp32 products go to oneDNN at the AVX2 and AVX-512 levels where it has more than its reference
// loops for them, else to sgemm: both against the reference (every transpose, padded leading
// dimensions, split into blocks of rows), and no oneDNN call with it off or below AVX2 (ctest
// runs this again under SLIPSTREAM_CPU_ISA=avx2 and generic: kernel_ops.isa_*).
CPU_TEST(Gemm, Fp32ByOnednnAtAvx2AndAboveElseSgemm) {
  std::printf("fp32 GEMM: %s (%s)\n", onednn_f32_gemm_native() ? "oneDNN" : "sgemm",
              onednn_f32_gemm_kernel().c_str());
  if (cpu_isa() == CpuIsa::generic) {
    EXPECT_FALSE(onednn_f32_gemm_native());
  }
  const int M = 301, N = 64, K = 48;
  each_transpose(M, N, K, 5, 4,
                 [&](int ta, int tb, const auto& ref, const auto& A, const auto& B, const auto& C,
                     int lda, int ldb, int ldc) {
                   const auto Af = cast<float>(A), Bf = cast<float>(B);
                   for (const bool on : {true, false}) {
                     const bool was = set_onednn_enabled(on);
                     const bool native = onednn_f32_gemm_native();
                     const uint64_t before = onednn_gemm_calls();
                     auto Cf = cast<float>(C);
                     gemm<float>(ta, tb, M, N, K, 0.7f, Af.data(), lda, Bf.data(), ldb, 0.3f,
                                 Cf.data(), ldc);
                     const uint64_t calls = onednn_gemm_calls() - before;
                     set_onednn_enabled(was);
                     EXPECT_LT(test::rel_diff(ref, Cf), 1e-5) << ta << tb << " oneDNN " << on;
                     if (native) {
                       EXPECT_GT(calls, 0u) << ta << tb;
                     } else {
                       EXPECT_EQ(calls, 0u) << ta << tb << " oneDNN " << on;
                     }
                   }
                 });
}

// Products that differ only in their rows (a policy stepping any number of games) share one
// oneDNN primitive after their first 8 row counts, the shared one taking M and A's and C's
// strides at each call: 20 row counts make at most 9 primitives, and every product matches the
// reference, transposed A included (its stride is M's there).
CPU_TEST(Gemm, RowCountsShareOnednnPrimitivesPastTheFirstEight) {
  if (!onednn_f32_gemm_native()) GTEST_SKIP() << "fp32 GEMMs on sgemm here";
  const int N = 23, K = 19;  // a family of its own: no other test uses these
  std::mt19937_64 rng(8);
  for (int ta = 0; ta < 2; ++ta) {
    const size_t before = onednn_gemm_primitives();
    for (int M = 5; M < 25; ++M) {
      const int lda = ta ? M : K;
      auto A = rand_vec(size_t(ta ? K : M) * lda, rng), B = rand_vec(size_t(K) * N, rng);
      auto C = rand_vec(size_t(M) * N, rng), ref = C;
      ref_gemm(ta, false, M, N, K, 0.7, A, lda, B, N, 0.3, ref, N);
      auto Af = cast<float>(A), Bf = cast<float>(B), Cf = cast<float>(C);
      gemm<float>(ta, false, M, N, K, 0.7f, Af.data(), lda, Bf.data(), N, 0.3f, Cf.data(), N);
      EXPECT_LT(test::rel_diff(ref, Cf), 1e-5) << "M " << M << " ta " << ta;
    }
    EXPECT_LE(onednn_gemm_primitives() - before, 9u) << "ta " << ta;
    EXPECT_GE(onednn_gemm_primitives() - before, 2u) << "ta " << ta;
  }
}

CPU_TEST(Gemm, Bf16EqualsSgemmOfRoundedOperands) {
  std::mt19937_64 rng(2);
  const int M = 33, N = 17, K = 40, pad = 2;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad;
      auto A = cast<float>(rand_vec(size_t(ta ? K : M) * lda, rng));
      auto B = cast<float>(rand_vec(size_t(tb ? N : K) * ldb, rng));
      std::vector<uint16_t> Ah(A.size()), Bh(B.size());
      fp32_to_bf16(A.data(), Ah.data(), A.size());
      fp32_to_bf16(B.data(), Bh.data(), B.size());
      std::vector<float> Ar(A.size()), Br(B.size());
      bf16_to_fp32(Ah.data(), Ar.data(), A.size());
      bf16_to_fp32(Bh.data(), Br.data(), B.size());
      std::vector<float> ref(size_t(M) * N, 1.0f), got(size_t(M) * N, 1.0f);
      gemm<float>(ta, tb, M, N, K, 1.5f, Ar.data(), lda, Br.data(), ldb, 0.5f, ref.data(), N);
      std::vector<float> ws(gemm_bf16_workspace_elems(M, N, K));
      gemm_bf16(ta, tb, M, N, K, 1.5f, Ah.data(), lda, Bh.data(), ldb, 0.5f, got.data(), N,
                ws.data());
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(ref[i], got[i], 1e-5f * K) << i;
    }
}

// Large enough to be split into blocks of rows (one product per TBB task): every transpose,
// alpha and beta, against sgemm of the rounded operands. On a CPU with native bf16 GEMMs (and a
// build with oneDNN) this is oneDNN's kernel; elsewhere the widening path.
CPU_TEST(Gemm, Bf16SplitIntoBlocksOfRows) {
  std::printf("bf16 GEMM: %s (%s)\n", onednn_bf16_gemm_native() ? "oneDNN" : "widen + sgemm",
              onednn_bf16_gemm_kernel().c_str());
  std::mt19937_64 rng(5);
  const int M = 3001, N = 96, K = 130;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = ta ? M : K, ldb = tb ? K : N;
      std::vector<uint16_t> Ah(size_t(ta ? K : M) * lda), Bh(size_t(tb ? N : K) * ldb);
      auto A = cast<float>(rand_vec(Ah.size(), rng)), B = cast<float>(rand_vec(Bh.size(), rng));
      fp32_to_bf16(A.data(), Ah.data(), A.size());
      fp32_to_bf16(B.data(), Bh.data(), B.size());
      bf16_to_fp32(Ah.data(), A.data(), A.size());
      bf16_to_fp32(Bh.data(), B.data(), B.size());
      for (float beta : {0.0f, 1.0f}) {
        std::vector<float> ref(size_t(M) * N, 0.25f), got(ref.size(), 0.25f);
        gemm<float>(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, beta, ref.data(), N);
        std::vector<float> ws(gemm_bf16_workspace_elems(M, N, K));
        gemm_bf16(ta, tb, M, N, K, 1.0f, Ah.data(), lda, Bh.data(), ldb, beta, got.data(), N,
                  ws.data());
        double worst = 0;
        for (size_t i = 0; i < ref.size(); ++i)
          worst = std::max(worst, double(std::abs(ref[i] - got[i])));
        EXPECT_LT(worst, 1e-5 * K) << "ta " << ta << " tb " << tb << " beta " << beta;
      }
    }
}

struct LinearCase {
  int M = 6, In = 5, Out = 4;
  std::vector<double> x, W, b, w;
};

CPU_TEST(Linear, GradCheckAndAccumulation) {
  std::mt19937_64 rng(3);
  LinearCase c;
  c.x = rand_vec(c.M * c.In, rng);
  c.W = rand_vec(c.Out * c.In, rng);
  c.b = rand_vec(c.Out, rng);
  c.w = rand_vec(c.M * c.Out, rng);
  auto loss = [&] {
    std::vector<double> y(c.M * c.Out);
    linear_forward(c.x.data(), c.W.data(), c.b.data(), y.data(), c.M, c.In, c.Out);
    return test::dot(c.w, y);
  };
  std::vector<double> dx(c.x.size(), 7.0), dW(c.W.size(), 0.0), db(c.b.size(), 0.0);
  linear_backward(c.x.data(), c.W.data(), c.w.data(), dx.data(), dW.data(), db.data(), c.M, c.In,
                  c.Out);
  test::check_gradient("x", loss, c.x, dx);
  test::check_gradient("W", loss, c.W, dW);
  test::check_gradient("b", loss, c.b, db);
  // Second call: dx overwritten, dW and db accumulate.
  auto dx1 = dx, dW1 = dW, db1 = db;
  linear_backward(c.x.data(), c.W.data(), c.w.data(), dx.data(), dW.data(), db.data(), c.M, c.In,
                  c.Out);
  EXPECT_EQ(dx, dx1);
  EXPECT_DOUBLED(dW, dW1);
  EXPECT_DOUBLED(db, db1);
  // Float agrees with double.
  auto xf = cast<float>(c.x), Wf = cast<float>(c.W), bf = cast<float>(c.b);
  std::vector<float> yf(c.M * c.Out);
  std::vector<double> yd(c.M * c.Out);
  linear_forward(xf.data(), Wf.data(), bf.data(), yf.data(), c.M, c.In, c.Out);
  linear_forward(c.x.data(), c.W.data(), c.b.data(), yd.data(), c.M, c.In, c.Out);
  EXPECT_LT(test::rel_diff(yd, yf), 1e-5);
}

CPU_TEST(Linear, NoBiasAndLargeColumnSum) {
  std::mt19937_64 rng(4);
  const int M = 300, In = 3, Out = 1500;  // several column blocks, parallel
  auto x = rand_vec(M * In, rng), W = rand_vec(Out * In, rng), dy = rand_vec(M * Out, rng);
  std::vector<double> y(M * Out), db(Out, 1.0);
  linear_forward(x.data(), W.data(), static_cast<const double*>(nullptr), y.data(), M, In, Out);
  for (int i = 0; i < M; i += 37)
    for (int o = 0; o < Out; o += 101) {
      double s = 0;
      for (int k = 0; k < In; ++k) s += x[i * In + k] * W[o * In + k];
      EXPECT_NEAR(y[i * Out + o], s, 1e-12);
    }
  column_sum_accumulate(dy.data(), db.data(), M, Out);
  for (int o = 0; o < Out; ++o) {
    double s = 1.0;
    for (int i = 0; i < M; ++i) s += dy[i * Out + o];
    ASSERT_NEAR(db[o], s, 1e-10);
  }
}

}  // namespace
}  // namespace slipstream::kernels
#endif  // SLIPSTREAM_REFERENCE_TESTS

// ---- The CUDA kernels against the reference ----

namespace slipstream::kernels::test {

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

namespace slipstream::kernels::test {
namespace {

// The emulated GEMM is the CPU reference itself; there this checks the row-major contract the
// device ops are written against, and on a device cuBLASLt against the reference.
KERNEL_TEST(Gemm, MatchesCpu) {
  uint64_t seed = 321;
  for (const auto& s : gemm_shapes()) {
    check_gemm<Kernels, Mem, float>(s, seed++);
    check_gemm<Kernels, Mem, bfloat16>(s, seed++);
  }
}
// Products of few rows by gemm_small_rows (Kernels::set_small_gemm on): every row count up to
// kSmallGemmRows (each of the kernel's four instantiations, rows past M left alone), columns
// fewer than and not a multiple of a block's 8, K below and across the 32 lanes, beta 0 and 1,
// padded leading dimensions from unaligned starts; the other transposes and more rows still go
// to the general GEMM.
KERNEL_TEST(Gemm, SmallRowsMatchCpu) {
  struct On {  // the switch put back however the test ends
    bool was = Kernels::small_gemm();
    On() { Kernels::set_small_gemm(true); }
    ~On() { Kernels::set_small_gemm(was); }
  } on;
  uint64_t seed = 361;
  for (const int M : {1, 2, 3, 5, 8})
    for (const GemmShape& s :
         {GemmShape{false, true, M, 40, 256, 0.0, 0}, GemmShape{false, true, M, 81, 7, 1.0, 2},
          GemmShape{false, true, M, 3, 33, 0.5, 1}, GemmShape{false, true, M, 130, 128, 0.0, 3}}) {
      check_gemm<Kernels, Mem, float>(s, seed++);
      check_gemm<Kernels, Mem, bfloat16>(s, seed++);
    }
  for (const GemmShape& s :
       {GemmShape{false, false, 2, 40, 64, 1.0, 0}, GemmShape{true, true, 3, 17, 9, 0.0, 1},
        GemmShape{false, true, 9, 20, 30, 0.0, 0}})
    check_gemm<Kernels, Mem, float>(s, seed++);
  Mem mem;
  float* c = mem.template alloc<float>(9 * 4);
  const float* x = mem.upload(std::vector<float>(9 * 4, 1.0f));
  EXPECT_THROW(Kernels::gemm_small_rows(9, 4, 4, 1.0f, x, 4, x, 4, 0.0f, c, 4, mem.stream()),
               std::invalid_argument);
}
DEVICE_TEST(Gemm, GpuStandardShape) {
  uint64_t seed = 341;
  for (const GemmShape& s : {GemmShape{false, true, 256 * 60, 512, 128, 0.0, 0},     // in_proj
                             GemmShape{true, false, 512, 128, 256 * 60, 1.0, 0}}) {  // its dW
    check_gemm<Kernels, Mem, float>(s, seed++);
    check_gemm<Kernels, Mem, bfloat16>(s, seed++);
  }
}

}  // namespace
}  // namespace slipstream::kernels::test

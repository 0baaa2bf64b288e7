// GEMMs go to OpenBLAS, or to oneDNN where it multiplies faster (fp32 at the AVX2 and AVX-512
// levels, bf16 where the CPU multiplies bf16 natively: gemm_onednn.h), run single-threaded inside
// TBB tasks: one thread pool for the whole process (run.threads bounds it), instead of the
// libraries' own threads spinning beside TBB's (measured faster on 2 cores, docs/kernels.md). A
// large product is split by rows of C into fixed blocks, one sgemm each; one of a few rows is a
// matrix-vector product a row. Bias sums are column-blocked so each TBB task owns its outputs (no
// atomics, deterministic).
#include "kernels/gemm.h"

#include <cblas.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <cstdlib>

#include "kernels/bf16.h"
#include "kernels/gemm_onednn.h"
#include "kernels/parallel.h"

namespace slipstream::kernels {

namespace {

// OpenBLAS single-threaded from the first product on, unless the user set OPENBLAS_NUM_THREADS
// (then its threads do the splitting, as before). True when TBB splits the rows.
bool tbb_splits_gemms() {
  static const bool splits = [] {
#ifdef OPENBLAS_VERSION
    if (std::getenv("OPENBLAS_NUM_THREADS")) return false;
    openblas_set_num_threads(1);
#endif
    return true;
  }();
  return splits;
}

// Rows of C per task: enough multiply-adds to dwarf a task's cost (2^18), or a oneDNN call's
// (2^20: its execute and wait; blocks 4x larger took cpu_large's fp32 step from 52.3 to 49.4 ms
// on the 2-core EPYC, 2^22 to 47.9 ms, which would leave fewer blocks than cores for a mid-sized
// product on a larger machine), and a fixed size, so the blocks, and therefore the sums, are the
// same for every thread count.
constexpr size_t kGemmBlockWork = size_t{1} << 18;
constexpr size_t kOnednnBlockWork = size_t{1} << 20;

template <class TA, class TC, class Blas>
void gemm_in_row_blocks(bool trans_a, int M, int N, int K, const TA* A, int lda, TC* C, int ldc,
                        Blas&& blas, size_t block_work = kGemmBlockWork) {
  const size_t per_row = static_cast<size_t>(N) * static_cast<size_t>(std::max(K, 1));
  const int rows = static_cast<int>(std::max<size_t>(16, block_work / per_row));
  if (!tbb_splits_gemms() || M <= rows) {
    blas(M, A, C);
    return;
  }
  tbb::parallel_for(
      tbb::blocked_range<int>(0, M, rows),
      [&](const tbb::blocked_range<int>& r) {
        // Rows m of op(A): row m of A, or column m of A when it is stored transposed.
        const TA* a = trans_a ? A + r.begin() : A + static_cast<size_t>(r.begin()) * lda;
        blas(r.end() - r.begin(), a, C + static_cast<size_t>(r.begin()) * ldc);
      },
      tbb::simple_partitioner());
}

// Products of at most kGemvRows rows with op(A) = A (a policy's frame of a game or a few, the
// recurrent step): a matrix-vector product a row, which reads op(B) as it lies, where sgemm packs
// all of it first. At the frame's shapes (d_model 128: N x K of 512 x 128, 40 x 256, 128 x 256, 81
// x 128; 2-core EPYC, OpenBLAS 0.3.21) one row took 0.14-0.21x sgemm's time, two 0.27-0.38x, four
// 0.58-0.86x, eight 0.84-1.30x. The sums' order then follows from M alone, as the row blocks'
// does: the same bits for any thread count. C is written, not read, where beta is 0 (BLAS's
// contract, NaN included: gemv would scale what C held).
constexpr int kGemvRows = 4;
template <class T, class Gemv>
bool rows_by_gemv(bool trans_a, bool trans_b, int M, int N, int K, const T* A, int lda, T beta,
                  T* C, int ldc, Gemv&& gemv) {
  if (trans_a || M > kGemvRows || K < 1) return false;
  tbb_splits_gemms();  // OpenBLAS single-threaded before its first call
  for (int m = 0; m < M; ++m) {
    T* c = C + static_cast<size_t>(m) * ldc;
    if (beta == T(0)) std::fill(c, c + N, T(0));
    // op(B) = Bᵀ: B (N, K), y = B a; op(B) = B: B (K, N), y = Bᵀ a.
    gemv(trans_b ? CblasNoTrans : CblasTrans, trans_b ? N : K, trans_b ? K : N,
         A + static_cast<size_t>(m) * lda, c);
  }
  return true;
}

}  // namespace

bool gemm_f32_uses_onednn() {
  return tbb_splits_gemms() && onednn_f32_gemm_native();
}

template <>
void gemm<float>(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  if (rows_by_gemv<float>(trans_a, trans_b, M, N, K, A, lda, beta, C, ldc,
                          [&](CBLAS_TRANSPOSE t, int rows, int cols, const float* a, float* c) {
                            cblas_sgemv(CblasRowMajor, t, rows, cols, alpha, B, ldb, a, 1, beta, c,
                                        1);
                          }))
    return;
  // oneDNN where it has more than its reference loops for the product, else sgemm; each block of
  // rows is a product of its own, asked of its own shape.
  const bool onednn = gemm_f32_uses_onednn();
  gemm_in_row_blocks<float, float>(
      trans_a, M, N, K, A, lda, C, ldc,
      [&](int m, const float* a, float* c) {
        if (!onednn ||
            !onednn_gemm_f32(trans_a, trans_b, m, N, K, alpha, a, lda, B, ldb, beta, c, ldc))
          cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                      trans_b ? CblasTrans : CblasNoTrans, m, N, K, alpha, a, lda, B, ldb, beta, c,
                      ldc);
      },
      onednn ? kOnednnBlockWork : kGemmBlockWork);
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                  int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  if (M == 0 || N == 0) return;
  if (rows_by_gemv<double>(trans_a, trans_b, M, N, K, A, lda, beta, C, ldc,
                           [&](CBLAS_TRANSPOSE t, int rows, int cols, const double* a, double* c) {
                             cblas_dgemv(CblasRowMajor, t, rows, cols, alpha, B, ldb, a, 1, beta, c,
                                         1);
                           }))
    return;
  gemm_in_row_blocks<double, double>(
      trans_a, M, N, K, A, lda, C, ldc, [&](int m, const double* a, double* c) {
        cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, m, N, K, alpha, a, lda, B, ldb, beta, c,
                    ldc);
      });
}

std::string gemm_operation_name(const char* type, bool trans_a, bool trans_b, int M, int N, int K) {
  return std::string("gemm ") + type + " " + std::to_string(M) + "x" + std::to_string(N) + "x" +
         std::to_string(K) + " " + (trans_a ? "T" : "N") + (trans_b ? "T" : "N");
}

size_t gemm_bf16_workspace_elems(int M, int N, int K) {
  return static_cast<size_t>(M) * K + static_cast<size_t>(K) * N;
}

// Widen a (rows, cols) bf16 block with leading dimension ld into a dense fp32 block.
static void widen(const uint16_t* src, int ld, int rows, int cols, float* dst) {
  parallel_blocks(rows, cols, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) bf16_to_fp32_scalar(src + r * ld, dst + r * cols, cols);
  });
}

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, float* C, int ldc,
               float* workspace) {
  if (M == 0 || N == 0) return;
  // Native bf16 products (oneDNN on AVX-512 BF16 / AMX), one per block of rows.
  if (onednn_bf16_gemm_native() &&
      onednn_gemm_bf16_native_for(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta)) {
    gemm_in_row_blocks<uint16_t, float>(
        trans_a, M, N, K, A, lda, C, ldc,
        [&](int m, const uint16_t* a, float* c) {
          onednn_gemm_bf16(trans_a, trans_b, m, N, K, alpha, a, lda, B, ldb, beta, c, ldc);
        },
        kOnednnBlockWork);
    return;
  }
  float* a32 = workspace;
  float* b32 = workspace + static_cast<size_t>(M) * K;
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  widen(A, lda, a_rows, a_cols, a32);
  widen(B, ldb, b_rows, b_cols, b32);
  gemm<float>(trans_a, trans_b, M, N, K, alpha, a32, a_cols, b32, b_cols, beta, C, ldc);
}

template <class T>
void linear_forward(const T* x, const T* W, const T* b, T* y, int M, int In, int Out) {
  T beta = 0;
  if (b) {
    // Seed every row with the bias and let the GEMM accumulate onto it.
    parallel_blocks(M, Out, [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; ++r) std::copy(b, b + Out, y + r * Out);
    });
    beta = 1;
  }
  gemm<T>(false, true, M, Out, In, T(1), x, In, W, In, beta, y, Out);
}

template <class T>
void linear_backward(const T* x, const T* W, const T* dy, T* dx, T* dW, T* db, int M, int In,
                     int Out) {
  if (dx) gemm<T>(false, false, M, In, Out, T(1), dy, Out, W, In, T(0), dx, In);
  if (dW) gemm<T>(true, false, Out, In, M, T(1), dy, Out, x, In, T(1), dW, In);
  if (db) column_sum_accumulate(dy, db, M, Out);
}

template <class T>
void column_sum_accumulate(const T* dy, T* db, size_t M, size_t N) {
  constexpr size_t kCols = 64;  // a few cache lines per task, no false sharing
  parallel_blocks((N + kCols - 1) / kCols, M * kCols, [&](size_t c0, size_t c1) {
    const size_t j0 = c0 * kCols, j1 = std::min(N, c1 * kCols);
    T acc[kCols * 16];  // up to 16 column blocks per task are summed in registers/L1
    for (size_t jb = j0; jb < j1; jb += kCols * 16) {
      const size_t je = std::min(j1, jb + kCols * 16), w = je - jb;
      std::fill(acc, acc + w, T(0));
      for (size_t i = 0; i < M; ++i) {
        const T* row = dy + i * N + jb;
        for (size_t j = 0; j < w; ++j) acc[j] += row[j];
      }
      for (size_t j = 0; j < w; ++j) db[jb + j] += acc[j];
    }
  });
}

#define INSTANTIATE(T)                                                                       \
  template void linear_forward<T>(const T*, const T*, const T*, T*, int, int, int);          \
  template void linear_backward<T>(const T*, const T*, const T*, T*, T*, T*, int, int, int); \
  template void column_sum_accumulate<T>(const T*, T*, size_t, size_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace slipstream::kernels

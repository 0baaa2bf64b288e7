// Products of few rows (a policy's frame: one row a game) by a warp a column of C, instead of
// cuBLASLt: kernels/gemm.h's gemm_small_rows. The row-major contract of gemm with op(A) = A and
// op(B) = Bᵀ (a linear layer's forward: B holds the weight's rows), FP32 accumulation; compiled
// for CUDA and for the emulator alike, so its tests run without a GPU.
#include <stdexcept>
#include <string>

#include "kernels/cuda_common.cuh"
#include "kernels/gemm.h"

namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS {

namespace {

constexpr int kSmallWarps = 8;  // columns of C a block

// Warp w of block x: column n = 8x + w of C for each of its M ≤ kRows rows. The lanes stride
// over K (coalesced reads of B's row n and of A's rows, which every warp of the grid shares), so
// a row's dot product is 32 partial sums added by a butterfly in a fixed order: the same bits
// every run. Lane m stores row m.
template <class DT, int kRows>
__global__ void __launch_bounds__(kSmallWarps * 32)
    gemm_small_rows_kernel(int M, int N, int K, float alpha, const DT* A, int lda, const DT* B,
                           int ldb, float beta, float* C, int ldc) {
  const int lane = int(threadIdx.x) & 31;
  const int n = int(blockIdx.x) * kSmallWarps + (int(threadIdx.x) >> 5);
  if (n >= N) return;  // a whole warp: no barrier follows
  float acc[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) acc[m] = 0.f;
  lanes_dot_rows(M, A, size_t(lda), B + size_t(n) * size_t(ldb), K, acc);
#pragma unroll
  for (int m = 0; m < kRows; ++m) acc[m] = group_sum<32>(acc[m]);
#pragma unroll
  for (int m = 0; m < kRows; ++m)
    if (m < M && lane == m) {
      float* c = C + size_t(m) * size_t(ldc) + size_t(n);
      *c = beta == 0.f ? alpha * acc[m] : alpha * acc[m] + beta * *c;  // beta 0: C not read
    }
}

template <class T>
void small_rows(int M, int N, int K, float alpha, const T* A, int lda, const T* B, int ldb,
                float beta, float* C, int ldc, cudaStream_t stream) {
  const char* name = "gemm_small_rows";
  if (M < 1 || M > Kernels::kSmallGemmRows || N < 0 || K < 1)
    throw std::invalid_argument(
        std::string(name) + ": needs 1 <= M <= " + std::to_string(Kernels::kSmallGemmRows) +
        " and K >= 1, got M=" + std::to_string(M) + " K=" + std::to_string(K));
  if (N == 0) return;
  const dim3 grid(unsigned((N + kSmallWarps - 1) / kSmallWarps)), block(kSmallWarps * 32);
  const auto* a = dev(A);
  const auto* b = dev(B);
  using DT = dev_t<T>;
  // Rows rounded up to a power of two: four instantiations a type.
  const auto kernel = M == 1   ? &gemm_small_rows_kernel<DT, 1>
                      : M == 2 ? &gemm_small_rows_kernel<DT, 2>
                      : M <= 4 ? &gemm_small_rows_kernel<DT, 4>
                               : &gemm_small_rows_kernel<DT, 8>;
  SLIPSTREAM_LAUNCH_AS(name, kernel, grid, block, stream, M, N, K, alpha, a, lda, b, ldb, beta, C,
                       ldc);
  check_launch(name);
}

// SLIPSTREAM_SMALL_GEMM's form: `warps` (this file's kernel), or cuBLASLt (unset, empty or
// `cublaslt`).
bool& small_gemm_slot() {
  static bool on = second_form_from_environment("SLIPSTREAM_SMALL_GEMM", "cublaslt", "warps",
                                                "the small-row products");
  return on;
}

}  // namespace

void Kernels::set_small_gemm(bool on) {
  small_gemm_slot() = on;
}
bool Kernels::small_gemm() {
  return small_gemm_slot();
}
bool Kernels::takes_small_gemm(bool trans_a, bool trans_b, int M, int K) {
  return small_gemm() && !trans_a && trans_b && M >= 1 && M <= kSmallGemmRows && K >= 1;
}

void Kernels::gemm_small_rows(int M, int N, int K, float alpha, const float* A, int lda,
                              const float* B, int ldb, float beta, float* C, int ldc,
                              cudaStream_t stream) {
  small_rows(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream);
}
void Kernels::gemm_small_rows(int M, int N, int K, float alpha, const bfloat16* A, int lda,
                              const bfloat16* B, int ldb, float beta, float* C, int ldc,
                              cudaStream_t stream) {
  small_rows(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream);
}

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS

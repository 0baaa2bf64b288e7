// The CUDA GEMM entry points for emulated runs: cuBLASLt cannot run on the CPU, so the
// emulated namespace multiplies with the CPU references (kernels/gemm_cpu.cpp). Same contract
// as kernels::CudaKernels::gemm; bf16 operands are widened exactly, as cuBLASLt does, and
// accumulated in fp32 (summation order differs from the device's, within fp32 rounding).
// Products of few rows take gemm_small_rows (kernels/gemm_small_cuda.cu, emulated) when
// small_gemm() is on, as on a device.
#include <stdexcept>
#include <vector>

#include "kernels/cuda_kernels.h"
#include "kernels/gemm.h"
#include "kernels/step_recorder.h"

namespace slipstream::kernels::cuda_emulated {

namespace {
bool nothing_to_do(int M, int N, int K) {
  if (M < 0 || N < 0 || K < 0) throw std::invalid_argument("gemm: negative dimension");
  return M == 0 || N == 0;
}
}  // namespace

void Kernels::gemm(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                   float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                   float* C, int ldc, cudaStream_t stream) {
  (void)ctx;
  if (nothing_to_do(M, N, K)) return;
  if (takes_small_gemm(trans_a, trans_b, M, K))
    return gemm_small_rows(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream);
  capture::enqueue(
      capture::stable_name(kernels::gemm_operation_name("fp32", trans_a, trans_b, M, N, K)), stream,
      [&] {
        return capture::key_of(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      },
      [=] {
        kernels::gemm<float>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      });
}

void Kernels::gemm(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                   float alpha, const bfloat16* A, int lda, const bfloat16* B, int ldb, float beta,
                   float* C, int ldc, cudaStream_t stream) {
  (void)ctx;
  if (nothing_to_do(M, N, K)) return;
  if (takes_small_gemm(trans_a, trans_b, M, K))
    return gemm_small_rows(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream);
  capture::enqueue(
      capture::stable_name(kernels::gemm_operation_name("bf16", trans_a, trans_b, M, N, K)), stream,
      [&] {
        return capture::key_of(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      },
      [=] {
        std::vector<float> ws(gemm_bf16_workspace_elems(M, N, K));
        gemm_bf16(trans_a, trans_b, M, N, K, alpha, reinterpret_cast<const uint16_t*>(A), lda,
                  reinterpret_cast<const uint16_t*>(B), ldb, beta, C, ldc, ws.data());
      });
}

}  // namespace slipstream::kernels::cuda_emulated

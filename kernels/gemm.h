// Dense matrix products on row-major matrices, and the linear layer built on them.
//
// Declared once for both builds: the CPU reference below, and the CUDA entry points in the
// second part, which kernels/cuda_kernels.h includes into its kernel tables (kernels::cuda::Kernels
// and kernels::cuda_emulated::Kernels) as static members.
#if !defined(SLIPSTREAM_CUDA_ENTRY_POINTS) && !defined(SLIPSTREAM_OPS_METHODS)
#ifndef SLIPSTREAM_KERNELS_GEMM_H
#define SLIPSTREAM_KERNELS_GEMM_H

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda_api.h"

namespace slipstream::kernels {

// C (M, N) = alpha * op(A) * op(B) + beta * C, row-major. op(A) is (M, K): A is (M, K) with
// leading dimension lda, or (K, M) when trans_a. op(B) is (K, N): B is (K, N), or (N, K) when
// trans_b. With beta == 0, C is not read (NaNs in it do not propagate). float: oneDNN's matmul
// on AVX2 and AVX-512 CPUs (kernels/gemm_onednn.h), OpenBLAS's sgemm below; double: OpenBLAS.
template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
          int ldb, T beta, T* C, int ldc);

// Whether gemm<float> asks oneDNN for its products: where oneDNN has native kernels, unless
// OPENBLAS_NUM_THREADS is set (then OpenBLAS's sgemm and its threads split them, as asked).
bool gemm_f32_uses_onednn();

// gemm with bf16 operands (uint16_t storage, e.g. the optimizer's bf16 weight shadow and bf16
// activations) and fp32 accumulation and output: an fp32 product of the rounded operands, up to
// summation order. On a CPU that multiplies bf16 natively (AVX-512 BF16, AMX) and a build with
// oneDNN, its bf16 matmul does it (kernels/gemm_onednn.h; about twice the fp32 GEMMs there);
// otherwise the operands are widened to fp32 into the caller's workspace (exact: every bf16 is
// an fp32) and multiplied by gemm<float>. Workspace: gemm_bf16_workspace_elems floats (op(A) and
// op(B) stored densely, M*K + K*N).
size_t gemm_bf16_workspace_elems(int M, int N, int K);
void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, float* C, int ldc,
               float* workspace);

// "gemm bf16 15360x512x128 NT": a product's operand type, M x N x K, and op(A) and op(B) (N as
// stored, T transposed). The device's GEMMs name their recorded operations with it, so a step's
// operation times (slipstream bench --op-times) and errors tell its products apart.
std::string gemm_operation_name(const char* type, bool trans_a, bool trans_b, int M, int N, int K);

// Linear layer, PyTorch layout: y (M, Out) = x (M, In) * W^T + b, W (Out, In), b (Out) or null.
template <class T>
void linear_forward(const T* x, const T* W, const T* b, T* y, int M, int In, int Out);

// Backward of linear_forward given dy (M, Out).
//   dx (M, In)   overwritten (=); may be null when not needed.
//   dW (Out, In) accumulated (+=); may be null.
//   db (Out)     accumulated (+=); may be null.
template <class T>
void linear_backward(const T* x, const T* W, const T* dy, T* dx, T* dW, T* db, int M, int In,
                     int Out);

// db (N) += sum over rows of dy (M, N) (bias gradients). Parallel over column blocks.
template <class T>
void column_sum_accumulate(const T* dy, T* db, size_t M, size_t N);

}  // namespace slipstream::kernels

#endif  // SLIPSTREAM_KERNELS_GEMM_H
#elif defined(SLIPSTREAM_CUDA_ENTRY_POINTS)

// The CUDA GEMMs (kernels/gemm_cuda.cu): cuBLASLt, the same row-major contract as gemm above,
// FP32 accumulation and output. fp32 operands use true fp32 arithmetic (no TF32), so they match
// the CPU to fp32 rounding; bf16 operands are the bf16 GEMM (tensor cores on sm_80+), equal to
// gemm_bf16 up to summation order. The plan of each shape (layouts, alignment, the heuristic's
// algorithm) is built once and cached, so the steady state makes no heuristic query, and the
// matmul itself goes through the step recorder (kernels/step_recorder.h), so a training step's
// GEMMs can be captured in its CUDA graph. Errors throw std::runtime_error naming the cuBLASLt
// call.
// A cuBLASLt handle and the device workspace its algorithms may use; owned by the caller (the
// engine's execution context), one per stream that issues GEMMs concurrently.
struct GemmContext {
  void* lt_handle = nullptr;  // cublasLtHandle_t
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

static void gemm(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                 float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                 float* C, int ldc, cudaStream_t stream);
static void gemm(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                 float alpha, const bfloat16* A, int lda, const bfloat16* B, int ldb, float beta,
                 float* C, int ldc, cudaStream_t stream);

// Products of at most kSmallGemmRows rows (a policy's frame of a few games: nine of its 19
// launches are GEMMs of one row at gpu_standard's model) by our own kernel
// (kernels/gemm_small_cuda.cu: a warp a column of C, the lanes striding over K, a butterfly's
// fixed order), where op(A) = A and op(B) = Bᵀ (every forward linear layer): gemm_small_rows.
// gemm takes it for such products when small_gemm() is on (takes_small_gemm): off by default
// until a GPU times it against cuBLASLt (bench_kernels_cuda's gemm_small/*, bench_infer's
// one-game frame); set_small_gemm, or SLIPSTREAM_SMALL_GEMM=warps in the environment for a
// process (cublaslt: the default; another name is the first GEMM's error). The emulator's gemm
// takes it too, so tests check it there. Not thread-safe.
static constexpr int kSmallGemmRows = 8;
static void set_small_gemm(bool on);
static bool small_gemm();
static bool takes_small_gemm(bool trans_a, bool trans_b, int M, int K);
static void gemm_small_rows(int M, int N, int K, float alpha, const float* A, int lda,
                            const float* B, int ldb, float beta, float* C, int ldc,
                            cudaStream_t stream);
static void gemm_small_rows(int M, int N, int K, float alpha, const bfloat16* A, int lda,
                            const bfloat16* B, int ldb, float beta, float* C, int ldc,
                            cudaStream_t stream);

#endif  // the parts

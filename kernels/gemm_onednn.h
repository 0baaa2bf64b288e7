// GEMMs through oneDNN's matmul primitive, where it multiplies faster than OpenBLAS's sgemm:
// - bf16 operands on CPUs that multiply bf16 natively (AVX-512 BF16, AMX): about twice sgemm's
//   throughput there; gemm_bf16 (gemm.h) widens to fp32 for sgemm otherwise;
// - fp32 operands at the AVX2 and AVX-512 levels: oneDNN's kernels for the product (its brgemm
//   for dense strides, its jit gemm for others) took 0.43-0.57x the time of OpenBLAS 0.3.21's
//   sgemm at the model's shapes on an AVX-512 EPYC, on which OpenBLAS runs its AVX2 kernels;
//   with both held to AVX2 the whole cpu_quick / cpu_large step took 0.91x / 0.78x the time;
//   below AVX2 gemm<float> stays on sgemm (docs/kernels.md). SLIPSTREAM_CPU_ISA's cap holds for
//   oneDNN's kernels too.
// Built when oneDNN (Debian's libdnnl-dev) is found: SLIPSTREAM_HAS_ONEDNN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace slipstream::kernels {

// True when oneDNN is built in and enabled, the CPU has AVX-512 BF16, the level is not capped
// below AVX-512 (SLIPSTREAM_CPU_ISA), and oneDNN picks a native bf16 kernel for a probe product.
bool onednn_bf16_gemm_native();
// oneDNN's name for the kernel it runs (e.g. "brg:avx512_core_bf16"), or why none is used.
std::string onednn_bf16_gemm_kernel();
// The same for fp32 products: enabled, the level AVX2 or above, and a kernel other than oneDNN's
// reference loops for a probe product.
bool onednn_f32_gemm_native();
std::string onednn_f32_gemm_kernel();

// Whether oneDNN runs a native bf16 kernel for this product: some strides get only its reference
// loops; gemm_bf16 then widens.
bool onednn_gemm_bf16_native_for(bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb,
                                 int ldc, float alpha, float beta);
// gemm_bf16's and gemm<float>'s contracts (gemm.h), run on the calling thread: oneDNN's OpenMP
// threads are held to one, so TBB alone splits the work (one call per block of rows). The fp32
// one runs nothing and returns false where oneDNN has only its reference loops for the product
// (gemm<float> then calls sgemm); the answer is kept per thread and shape, so the steady state
// takes no lock.
void onednn_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                      const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta, float* C,
                      int ldc);
bool onednn_gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                     int lda, const float* B, int ldb, float beta, float* C, int ldc);

// Turns both oneDNN paths off (gemm_bf16 then widens, gemm<float> calls sgemm) or back on;
// SLIPSTREAM_ONEDNN=0 in the environment starts with them off. For comparisons and tests.
// Returns the previous setting.
bool set_onednn_enabled(bool enabled);

// onednn_gemm_bf16 and onednn_gemm_f32 calls so far (all threads). oneDNN's execute allocates a
// few small objects per call (its argument map and bookkeeping): the zero-allocation tests
// bound them with this.
uint64_t onednn_gemm_calls();

// The matmul primitives made so far (each a JIT-compiled kernel, kept for the process). Products
// differing only in their rows and A's and C's strides share one after their first 8 row counts.
size_t onednn_gemm_primitives();

}  // namespace slipstream::kernels

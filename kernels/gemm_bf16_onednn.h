// bf16 GEMMs through oneDNN's matmul primitive, for CPUs that multiply bf16 natively (AVX-512 BF16,
// AMX): about twice sgemm's throughput there (docs/kernels.md). gemm_bf16 (gemm.h) takes this
// path when onednn_bf16_gemm_native() says so and widens to fp32 for sgemm otherwise. Built when
// oneDNN (Debian's libdnnl-dev) is found: SLIPSTREAM_HAS_ONEDNN.
#pragma once

#include <cstdint>
#include <string>

namespace slipstream::kernels {

// True when oneDNN is built in and enabled, the CPU has AVX-512 BF16, the level is not capped
// below AVX-512 (SLIPSTREAM_CPU_ISA), and oneDNN picks a native bf16 kernel for a probe product.
bool onednn_bf16_gemm_native();
// oneDNN's name for the kernel it runs (e.g. "brg:avx512_core_bf16"), or why none is used.
std::string onednn_bf16_gemm_kernel();

// Whether oneDNN runs a native bf16 kernel for this product (some strides get only its
// reference loops; gemm_bf16 then widens instead).
bool onednn_gemm_bf16_native_for(bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb,
                                 int ldc, float alpha, float beta);
// gemm_bf16's contract (gemm.h), run on the calling thread: oneDNN's OpenMP threads are held to
// one, so TBB alone splits the work (gemm_bf16 runs one call per block of rows).
void onednn_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                      const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta, float* C,
                      int ldc);

// Turns the oneDNN path off (gemm_bf16 then widens) or back on; SLIPSTREAM_ONEDNN=0 in the
// environment starts with it off. For comparisons and tests. Returns the previous setting.
bool set_onednn_bf16_enabled(bool enabled);

// onednn_gemm_bf16 calls so far (all threads). oneDNN's execute allocates a few small objects
// per call (its argument map and bookkeeping): the zero-allocation tests bound them with this.
uint64_t onednn_gemm_bf16_calls();

}  // namespace slipstream::kernels

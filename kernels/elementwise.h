// The few elementwise and copy operations the Mamba block needs between its kernels.
// All are parallel over large arrays. Outputs may alias inputs unless stated.
//
// Declared once, in three parts: the CPU reference; the CUDA entry points, which
// kernels/cuda_kernels.h includes into its kernel tables (kernels::cuda::Kernels and
// kernels::cuda_emulated::Kernels) as static members; and the model ops' methods for the ops
// whose two forms take the same arguments (stages/ops/).
#if !defined(SLIPSTREAM_CUDA_ENTRY_POINTS) && !defined(SLIPSTREAM_OPS_METHODS)
#ifndef SLIPSTREAM_KERNELS_ELEMENTWISE_H
#define SLIPSTREAM_KERNELS_ELEMENTWISE_H

#include <cstddef>

#include "kernels/cuda_api.h"

namespace slipstream::kernels {

// y = a + b (residual add). Its backward is the identity on both inputs.
template <class T>
void add(const T* a, const T* b, T* y, size_t n);

// y += a (gradient accumulation into an existing buffer).
template <class T>
void add_inplace(T* y, const T* a, size_t n);

// y = a * b.
template <class T>
void mul(const T* a, const T* b, T* y, size_t n);

// Backward of mul: da = dy * b, db = dy * a, both overwritten (=); either may be null.
// da/db must not alias a or b.
template <class T>
void mul_backward(const T* a, const T* b, const T* dy, T* da, T* db, size_t n);

// Strided block copy: dst[r, 0:cols] = src[r, 0:cols] for rows r, with leading dimensions
// src_ld and dst_ld (in elements). Splitting (M, D1 + D2) along the last dimension is
// copy_cols(src, D1 + D2, dst1, D1, M, D1) and copy_cols(src + D1, D1 + D2, dst2, D2, M, D2);
// concatenating (and the backward of a split) is the same with src and dst swapped.
// Must not overlap.
template <class T>
void copy_cols(const T* src, size_t src_ld, T* dst, size_t dst_ld, size_t rows, size_t cols);

// y (M, N) += b (N) on every row (a linear layer's bias).
template <class T>
void add_bias_rows(T* y, const T* b, size_t M, size_t N);

// y (rows, cols) = -exp(x) of x's rows, x_ld elements apart (Mamba's A from A_log: every
// layer's in one pass, as the layers' parameters sit a fixed stride apart). y may alias x only
// where x_ld == cols.
template <class T>
void neg_exp(const T* x, size_t x_ld, T* y, size_t rows, size_t cols);

// y += a * b (a chain rule applied into an accumulating gradient, e.g. dA_log += dA * A).
template <class T>
void mul_accumulate(T* y, const T* a, const T* b, size_t n);

// y (G, M, N) = x (G, M, N) with row r of each group times s[r] (a carried state kept where a
// batch row continues its sequence, s = 1, and cleared where it starts a new one, s = 0; the
// groups are a model's layers, whose states lie one after another); and y2 (G, M, N2) = x2 the
// same way where x2 is not null (a model's second kind of carried state, rows N2 long: one pass,
// one launch on a device, for both). y may alias x, y2 x2.
template <class T>
void scale_rows(const T* x, const T* s, T* y, size_t G, size_t M, size_t N, const T* x2, T* y2,
                size_t N2);

}  // namespace slipstream::kernels

#endif  // SLIPSTREAM_KERNELS_ELEMENTWISE_H
#elif defined(SLIPSTREAM_CUDA_ENTRY_POINTS)

// The CUDA forms (kernels/elementwise_cuda.cu): same math on device pointers, enqueued on
// `stream`. column_sum_accumulate sums row blocks into workspace partials, and its last block
// adds them onto db in a fixed order, in one launch (deterministic: no float atomics).
template <class T>
static void add_inplace(T* y, const T* a, size_t n, cudaStream_t stream);
template <class T>
static void copy_cols(const T* src, size_t src_ld, T* dst, size_t dst_ld, size_t rows, size_t cols,
                      cudaStream_t stream);
static void add_bias_rows(float* y, const float* b, size_t M, size_t N, cudaStream_t stream);
static void neg_exp(const float* x, size_t x_ld, float* y, size_t rows, size_t cols,
                    cudaStream_t stream);
static void mul_accumulate(float* y, const float* a, const float* b, size_t n, cudaStream_t stream);
static void scale_rows(const float* x, const float* s, float* y, size_t G, size_t M, size_t N,
                       const float* x2, float* y2, size_t N2, cudaStream_t stream);
static size_t column_sum_accumulate_workspace_bytes(size_t M, size_t N);
// db += the column sums of dy (M, N).
static void column_sum_accumulate(const float* dy, float* db, size_t M, size_t N, void* workspace,
                                  cudaStream_t stream);
// bf16 rounding with the CPU's semantics (kernels/bf16.h: nearest-even, NaN kept and quietened,
// denormals to zero), so a GPU and a CPU run round the same operands the same way.
static void fp32_to_bf16(const float* src, bfloat16* dst, size_t n, cudaStream_t stream);
// Two arrays rounded in one launch (a's n_a elements, then b's n_b), each as fp32_to_bf16.
static void fp32_to_bf16_two(const float* a, bfloat16* a_bf, size_t n_a, const float* b,
                             bfloat16* b_bf, size_t n_b, cudaStream_t stream);
// The exact widening back (dst = src), and y += a with a widened: for data a library keeps in
// bf16 (the cuDNN GRU's bf16 form, kernels/gru_cudnn.h).
static void bf16_to_fp32(const bfloat16* src, float* dst, size_t n, cudaStream_t stream);
static void accumulate_bf16(float* y, const bfloat16* a, size_t n, cudaStream_t stream);
// y = silu(x) and dx = dy * silu'(x) (dx may alias dy): kernels/activations.h's math.
static void silu_forward(const float* x, float* y, size_t n, cudaStream_t stream);
static void silu_backward(const float* x, const float* dy, float* dx, size_t n,
                          cudaStream_t stream);
static void fill(float* y, float value, size_t n, cudaStream_t stream);
// cudaMemcpyAsync device to device (memcpy under the emulator).
static void copy_bytes(void* dst, const void* src, size_t bytes, cudaStream_t stream);

#else  // SLIPSTREAM_OPS_METHODS

// ops.NAME(args): kernels::NAME(args) on the CPU, Kernels::NAME(args, stream) on a device.
SLIPSTREAM_OP(copy_cols,
              (const Scalar* src, size_t src_ld, Scalar* dst, size_t dst_ld, size_t rows,
               size_t cols),
              (src, src_ld, dst, dst_ld, rows, cols))
SLIPSTREAM_OP(add_bias_rows, (Scalar * y, const Scalar* b, size_t M, size_t N), (y, b, M, N))
SLIPSTREAM_OP(neg_exp, (const Scalar* x, size_t x_ld, Scalar* y, size_t rows, size_t cols),
              (x, x_ld, y, rows, cols))
SLIPSTREAM_OP(mul_accumulate, (Scalar * y, const Scalar* a, const Scalar* b, size_t n),
              (y, a, b, n))
SLIPSTREAM_OP(scale_rows,
              (const Scalar* x, const Scalar* s, Scalar* y, size_t G, size_t M, size_t N,
               const Scalar* x2, Scalar* y2, size_t N2),
              (x, s, y, G, M, N, x2, y2, N2))
SLIPSTREAM_OP(silu_forward, (const Scalar* x, Scalar* y, size_t n), (x, y, n))
// dx = dy * silu'(x); dx may alias dy.
SLIPSTREAM_OP(silu_backward, (const Scalar* x, const Scalar* dy, Scalar* dx, size_t n),
              (x, dy, dx, n))

#endif  // the parts

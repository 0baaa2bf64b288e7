// The few elementwise and copy operations the Mamba block needs between its kernels.
// All are parallel over large arrays. Outputs may alias inputs unless stated.
#pragma once

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

// y = -exp(x) (Mamba's A from A_log). y may alias x.
template <class T>
void neg_exp(const T* x, T* y, size_t n);

// y += a * b (a chain rule applied into an accumulating gradient, e.g. dA_log += dA * A).
template <class T>
void mul_accumulate(T* y, const T* a, const T* b, size_t n);

// The CUDA forms (kernels/elementwise_cuda.cu): same math on device pointers, enqueued on
// `stream`. column_sum_accumulate sums row blocks into workspace partials, then in a fixed order
// (deterministic, no atomics).
namespace cuda {
#include "kernels/elementwise_cuda.inc"
}  // namespace cuda

}  // namespace slipstream::kernels

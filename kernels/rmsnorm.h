// RMSNorm over the last dimension: y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).
#pragma once

#include <cstddef>

namespace slipstream::kernels {

// x, y (M, D); weight (D); rstd (M) is saved for the backward. y may alias x.
template <class T>
void rmsnorm_forward(const T* x, const T* weight, T* y, T* rstd, size_t M, size_t D, T eps);

// dx (M, D) overwritten (=), may alias dy; dweight (D) accumulated (+=). Uses the forward's rstd.
template <class T>
void rmsnorm_backward(const T* x, const T* weight, const T* rstd, const T* dy, T* dx, T* dweight,
                      size_t M, size_t D);

}  // namespace slipstream::kernels

// Pointwise activations. Forward: y may alias x. Backward: dx is overwritten (=) and may alias dy.
#pragma once

#include <cmath>
#include <cstddef>

namespace slipstream::kernels {

// PyTorch's default softplus threshold: above it softplus(x) = x exactly (gradient 1).
inline constexpr double kSoftplusThreshold = 20.0;

template <class T>
inline T sigmoid_scalar(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
template <class T>
inline T softplus_scalar(T x) {
  return x > T(kSoftplusThreshold) ? x : std::log1p(std::exp(x));
}
// d softplus / dx = sigmoid(x), 1 above the threshold.
template <class T>
inline T softplus_grad_scalar(T x) {
  return x > T(kSoftplusThreshold) ? T(1) : sigmoid_scalar(x);
}
template <class T>
inline T silu_scalar(T x) {
  return x * sigmoid_scalar(x);
}
// d silu / dx = s * (1 + x * (1 - s)), s = sigmoid(x).
template <class T>
inline T silu_grad_scalar(T x) {
  const T s = sigmoid_scalar(x);
  return s * (T(1) + x * (T(1) - s));
}

// silu(x) = x * sigmoid(x).
template <class T>
void silu_forward(const T* x, T* y, size_t n);
// dx = dy * silu'(x).
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, size_t n);

// softplus(x) = log(1 + exp(x)), = x for x > 20 (PyTorch's beta=1, threshold=20).
template <class T>
void softplus_forward(const T* x, T* y, size_t n);
template <class T>
void softplus_backward(const T* x, const T* dy, T* dx, size_t n);

}  // namespace slipstream::kernels

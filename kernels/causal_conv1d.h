// Depthwise causal convolution over time, mamba-ssm's causal_conv1d semantics (a PyTorch
// Conv1d with groups = C, weight (C, 1, K), padding K - 1, output truncated to the first L):
//   y[b, t, c] = bias[c] + sum_k weight[c, k] * x[b, t - K + 1 + k, c],  x[b, <0, c] = 0.
// Layout: x, y (B, L, C) (mamba-ssm uses (B, C, L)); weight (C, K); K <= kConvMaxWidth.
#pragma once

#include <cstddef>

namespace slipstream::kernels {

inline constexpr int kConvMaxWidth = 16;

// bias may be null. y must not alias x.
template <class T>
void causal_conv1d_forward(const T* x, const T* weight, const T* bias, T* y, int B, int L, int C,
                           int K);

// dx (B, L, C) overwritten (=); dweight (C, K) and dbias (C) accumulated (+=); dbias may be null.
template <class T>
void causal_conv1d_backward(const T* x, const T* weight, const T* dy, T* dx, T* dweight, T* dbias,
                            int B, int L, int C, int K);

}  // namespace slipstream::kernels

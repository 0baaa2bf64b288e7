// Depthwise causal convolution over time, mamba-ssm's causal_conv1d semantics (a PyTorch
// Conv1d with groups = C, weight (C, 1, K), padding K - 1, output truncated to the first L):
//   y[b, t, c] = bias[c] + sum_k weight[c, k] * x[b, t - K + 1 + k, c],
//   x[b, -(K - 1) + j, c] = prefix[b, j, c] (j < K - 1) when a prefix is given, else 0.
// A prefix (B, K - 1, C), oldest first (the step's conv_state layout), holds the inputs before
// the window: a window that continues the one before it passes that window's last K - 1 inputs.
// No gradient flows into the prefix (training carries it as a constant: truncated BPTT).
// Layout: x, y (B, L, C) (mamba-ssm uses (B, C, L)); weight (C, K); K <= kConvMaxWidth.
//
// Declared once for both builds: the CPU reference below, and the CUDA entry points in the
// second part, which kernels/cuda_kernels.h includes into its kernel tables (kernels::cuda::Kernels
// and kernels::cuda_emulated::Kernels) as static members.
#if !defined(SLIPSTREAM_CUDA_ENTRY_POINTS) && !defined(SLIPSTREAM_OPS_METHODS)
#ifndef SLIPSTREAM_KERNELS_CAUSAL_CONV1D_H
#define SLIPSTREAM_KERNELS_CAUSAL_CONV1D_H

#include <cstddef>

#include "kernels/cuda_api.h"

namespace slipstream::kernels {

inline constexpr int kConvMaxWidth = 16;

// prefix and bias may be null. y must not alias x. `last` (B, K - 1, C), may be null, receives
// the window's last K - 1 inputs (the prefix's, or zeros, where the window is shorter): the next
// window's prefix, kept by the forward itself for a model that carries its state. It must alias
// neither x nor the prefix.
template <class T>
void causal_conv1d_forward(const T* x, const T* prefix, const T* weight, const T* bias, T* y, int B,
                           int L, int C, int K, T* last = nullptr);

// dx (B, L, C) overwritten (=); dweight (C, K) and dbias (C) accumulated (+=); dbias may be null.
// prefix: the forward's.
template <class T>
void causal_conv1d_backward(const T* x, const T* prefix, const T* weight, const T* dy, T* dx,
                            T* dweight, T* dbias, int B, int L, int C, int K);

// One frame for inference: conv_state (B, K - 1, C) holds the previous K - 1 inputs, oldest
// first (zeros before the first frame), and is shifted to include x (B, C). y (B, C) is the
// forward's output at this frame, passed through SiLU when `silu`; it must not overlap x or the
// state. Frame after frame it equals the forward over the same frames.
template <class T>
void causal_conv1d_step(T* conv_state, const T* x, const T* weight, const T* bias, T* y, int B,
                        int C, int K, bool silu);

}  // namespace slipstream::kernels

#endif  // SLIPSTREAM_KERNELS_CAUSAL_CONV1D_H
#elif defined(SLIPSTREAM_CUDA_ENTRY_POINTS)

// The CUDA convolution (kernels/causal_conv1d_cuda.cu). T (float or bfloat16) is the type of
// x, y, dy, dx and the step state; weight, bias and their gradients are fp32, arithmetic is fp32.
// With `silu` the output is SiLU(conv(x) + bias) (mamba-ssm's fused activation); the backward
// then takes dy of that output and recomputes the pre-activation instead of storing it.
// Parameter gradients go through per-(batch, time-block) partials summed in a fixed order.
// `y_bf` (may be null) receives y rounded to bf16 as well, as fp32_to_bf16 of y would: the bf16
// GEMMs' copy without a cast launch. `x_ld`: elements from one row (b, t) of x (and, in the
// backward, of dx and dx_bf) to the next: C (0), or more where x is columns of a wider tensor.
// `last` (may be null): the window's last K - 1 inputs, as the reference keeps them (the threads
// of the window's last step write them; no copy launches).
template <class T>
static void causal_conv1d_forward(const T* x, const T* prefix, const float* weight,
                                  const float* bias, T* y, bfloat16* y_bf, int B, int L, int C,
                                  int K, bool silu, cudaStream_t stream, int x_ld = 0,
                                  T* last = nullptr);

static size_t causal_conv1d_backward_workspace_bytes(int B, int L, int C, int K, bool silu);

// dx (=); dweight, dbias (+=, dbias may be null). `dx_bf` (may be null) receives dx rounded to
// bf16 as well, as fp32_to_bf16 of dx would: the backward GEMMs' copy without a cast launch. dx
// may be null where dx_bf is given (a caller that reads only the copy: no write of dx).
template <class T>
static void causal_conv1d_backward(const T* x, const T* prefix, const float* weight,
                                   const float* bias, const T* dy, T* dx, bfloat16* dx_bf,
                                   float* dweight, float* dbias, void* workspace, int B, int L,
                                   int C, int K, bool silu, cudaStream_t stream, int x_ld = 0);

template <class T>
static void causal_conv1d_step(T* conv_state, const T* x, const float* weight, const float* bias,
                               T* y, int B, int C, int K, bool silu, cudaStream_t stream);

#endif  // the parts

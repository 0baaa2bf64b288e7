// GELU, the exact form (PyTorch's nn.GELU() default): y = x · Φ(x), Φ the standard normal CDF,
// Φ(x) = (1 + erf(x / √2)) / 2; dy/dx = Φ(x) + x · φ(x), φ(x) = exp(-x² / 2) / √(2π).
// Forward: y may alias x. Backward: dx is overwritten (=) and may alias dy.
//
// Declared once, in three parts: the CPU reference; the CUDA entry points, which
// kernels/cuda_kernels.h includes into its kernel tables as static members; and the model ops'
// methods (stages/ops/: ops.gelu_forward(x, y, n) on either backend).
#if !defined(SLIPSTREAM_CUDA_ENTRY_POINTS) && !defined(SLIPSTREAM_OPS_METHODS)
#ifndef SLIPSTREAM_KERNELS_GELU_H
#define SLIPSTREAM_KERNELS_GELU_H

#include <cstddef>

namespace slipstream::kernels {

template <class T>
void gelu_forward(const T* x, T* y, size_t n);
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, size_t n);

}  // namespace slipstream::kernels

#endif  // SLIPSTREAM_KERNELS_GELU_H
#elif defined(SLIPSTREAM_CUDA_ENTRY_POINTS)

// The CUDA forms (kernels/gelu_cuda.cu): fp32, one thread an element (grid-stride).
static void gelu_forward(const float* x, float* y, size_t n, cudaStream_t stream);
static void gelu_backward(const float* x, const float* dy, float* dx, size_t n,
                          cudaStream_t stream);

#else  // SLIPSTREAM_OPS_METHODS

SLIPSTREAM_OP(gelu_forward, (const Scalar* x, Scalar* y, size_t n), (x, y, n))
SLIPSTREAM_OP(gelu_backward, (const Scalar* x, const Scalar* dy, Scalar* dx, size_t n),
              (x, dy, dx, n))

#endif  // the parts

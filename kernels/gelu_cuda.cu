// GELU on CUDA; math of the CPU reference (kernels/gelu_cpu.cpp), against which
// tests/kernel_ops/gelu_test.cpp checks it. erff and expf in fp32; grid-stride loops, so one
// launch covers any n.
#include "kernels/cuda_common.cuh"
#include "kernels/gelu.h"

namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS {

namespace {

__device__ __forceinline__ float normal_cdf(float x) {
  return 0.5f * (1.f + erff(x * 0.70710678118654752f));
}
__device__ __forceinline__ float normal_pdf(float x) {
  return expf(-0.5f * x * x) * 0.39894228040143268f;
}

__global__ void gelu_forward_kernel(const float* x, float* y, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride()) y[i] = x[i] * normal_cdf(x[i]);
}

__global__ void gelu_backward_kernel(const float* x, const float* dy, float* dx, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride())
    dx[i] = dy[i] * (normal_cdf(x[i]) + x[i] * normal_pdf(x[i]));
}

}  // namespace

void Kernels::gelu_forward(const float* x, float* y, size_t n, cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("gelu_forward", gelu_forward_kernel, n, stream, x, y, n);
}

void Kernels::gelu_backward(const float* x, const float* dy, float* dx, size_t n,
                            cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("gelu_backward", gelu_backward_kernel, n, stream, x, dy, dx, n);
}

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS

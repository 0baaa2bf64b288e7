// RMSNorm over the last dimension: y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).
//
// Declared once for both builds: the CPU reference below, and the CUDA entry points in the
// second part, which kernels/cuda_kernels.h includes into its kernel tables (kernels::cuda::Kernels
// and kernels::cuda_emulated::Kernels) as static members.
#if !defined(SLIPSTREAM_CUDA_ENTRY_POINTS) && !defined(SLIPSTREAM_OPS_METHODS)
#ifndef SLIPSTREAM_KERNELS_RMSNORM_H
#define SLIPSTREAM_KERNELS_RMSNORM_H

#include <cstddef>

#include "kernels/cuda_api.h"

namespace slipstream::kernels {

// x, y (M, D); weight (D); rstd (M) is saved for the backward. y may alias x.
template <class T>
void rmsnorm_forward(const T* x, const T* weight, T* y, T* rstd, size_t M, size_t D, T eps);

// dx (M, D) overwritten (=), may alias dy; dweight (D) accumulated (+=). Uses the forward's rstd.
template <class T>
void rmsnorm_backward(const T* x, const T* weight, const T* rstd, const T* dy, T* dx, T* dweight,
                      size_t M, size_t D);

// The residual-stream form (mamba-ssm's fused add + norm): s = x + residual (residual may be
// null: s = x), y = RMSNorm(s) * weight; sum (may be null, may alias x) receives s.
template <class T>
void rmsnorm_add_forward(const T* x, const T* residual, const T* weight, T* y, T* sum, T* rstd,
                         size_t M, size_t D, T eps);

// Its backward: ds = RMSNorm'(dy) + dsum, where dsum (may be null) is the gradient reaching s
// around the norm (the residual path); ds (=) is the gradient of both x and residual and may
// alias dy or dsum. dweight (+=).
template <class T>
void rmsnorm_add_backward(const T* s, const T* weight, const T* rstd, const T* dy, const T* dsum,
                          T* ds, T* dweight, size_t M, size_t D);

}  // namespace slipstream::kernels

#endif  // SLIPSTREAM_KERNELS_RMSNORM_H
#elif defined(SLIPSTREAM_CUDA_ENTRY_POINTS)

// The CUDA norm (kernels/rmsnorm_cuda.cu): T (float or bfloat16) for x, residual, y, sum, dy,
// dsum, ds; weight, rstd and dweight fp32; fp32 arithmetic. One warp per row; the backward is
// one launch: dweight summed over row blocks into workspace partials, which the launch's last
// block adds in a fixed order. `y_bf` (may be null) receives y
// rounded to bf16 as well, as fp32_to_bf16 of y would: the bf16 GEMMs' copy without a cast launch;
// y may be null where y_bf is given (a caller that reads only the copy).
// `bias` (D; may be null): a row added to every row of x + residual first, bit for bit as an
// add_bias_rows before (a linear layer's bias folded into the norm that reads its output); the
// backward then takes the same row as `s_bias`, s being the input without it.
template <class T>
static void rmsnorm_add_forward(const T* x, const T* residual, const float* weight, T* y,
                                bfloat16* y_bf, T* sum, float* rstd, size_t M, size_t D, float eps,
                                cudaStream_t stream, const float* bias = nullptr);

static size_t rmsnorm_add_backward_workspace_bytes(size_t M, size_t D);

// `ds_bf` (may be null) receives ds rounded to bf16 as well, as fp32_to_bf16 of ds would (the
// backward GEMMs' copy of the residual stream's gradient without a cast launch).
template <class T>
static void rmsnorm_add_backward(const T* s, const float* weight, const float* rstd, const T* dy,
                                 const T* dsum, T* ds, bfloat16* ds_bf, float* dweight,
                                 void* workspace, size_t M, size_t D, cudaStream_t stream,
                                 const float* s_bias = nullptr);

#endif  // the parts

// Optimizer step and gradient-clipping helpers.
//
// Declared once for both builds: the CPU reference below, and the CUDA entry points in the
// second part, which kernels/cuda_kernels.h includes into its kernel tables (kernels::cuda::Kernels
// and kernels::cuda_emulated::Kernels) as static members.
#if !defined(SLIPSTREAM_CUDA_ENTRY_POINTS) && !defined(SLIPSTREAM_OPS_METHODS)
#ifndef SLIPSTREAM_KERNELS_ADAMW_H
#define SLIPSTREAM_KERNELS_ADAMW_H

#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/cuda_api.h"

namespace slipstream::kernels {

// One AdamW step (PyTorch torch.optim.AdamW semantics, amsgrad off) on n elements, in place:
//   p -= lr * weight_decay * p                   (decoupled; skipped when !decay)
//   m  = beta1 m + (1 - beta1) g
//   v  = beta2 v + (1 - beta2) g^2
//   p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// step is 1 for the first update. When param_bf16 is not null the rounded bf16 copy of the
// updated parameter is written there in the same pass (the shadow the bf16 GEMMs read).
// The bf16 shadow is only available for T = float. The hyperparameters are doubles, as PyTorch's
// Python floats are: 1 - beta, 1 - lr * weight_decay and the bias corrections are formed in
// double and rounded to T once (1 - float(0.999) would be off by 1.3e-5 relative).
template <class T>
void adamw_step(T* param, const T* grad, T* m, T* v, uint16_t* param_bf16, size_t n, double lr,
                double beta1, double beta2, double eps, double weight_decay, bool decay,
                int64_t step);

// sum of x^2 accumulated in double, deterministic parallel reduction. For the global norm,
// add the results over all tensors and take the sqrt.
template <class T>
double global_norm_sq(const T* x, size_t n);

// x *= s (gradient clipping: s = max_norm / max(norm, max_norm)).
template <class T>
void scale_inplace(T* x, size_t n, T s);

}  // namespace slipstream::kernels

#endif  // SLIPSTREAM_KERNELS_ADAMW_H
#elif defined(SLIPSTREAM_CUDA_ENTRY_POINTS)

// The fused multi-tensor AdamW on CUDA (kernels/adamw_cuda.cu).
// One tensor of the update: FP32 value, gradient and moments, optional bf16 copy (may be null).
struct AdamWSegment {
  float* param;
  float* grad;
  float* m;
  float* v;
  bfloat16* shadow;
  size_t n;
  int decay;   // weight decay applies
  float* ema;  // EMA of the weights (may be null): ema = d·ema + (1 - d)·param after an update
};

// The betas, weight decay and EMA decay stay double so 1 - x is formed before rounding (as
// kernels::adamw_step does).
struct AdamWHyper {
  double beta1, beta2;
  float eps;
  double weight_decay;
  float clip;        // max global gradient norm; 0: no clipping
  float grad_scale;  // applied to the gradients first (1 / micro-batches accumulated)
  double ema_decay;  // d of the segments' EMA
};

// Lives in device memory; the kernels read and write it, the host reads it back when it logs.
struct AdamWDeviceState {
  int64_t step;     // updates applied so far (skipped steps do not count)
  float grad_norm;  // of the last step, after grad_scale
  float lr;         // used by the last step
  float scale;      // grad_scale times the clipping factor of the last step
  int finite;       // 0 when the last step was skipped (non-finite gradient norm)
};

static size_t adamw_workspace_bytes(int count, size_t max_n);

// One optimizer step over `count` segments (`segments` in device memory, max_n the largest n),
// with torch.optim.AdamW's math (kernels::adamw_step) and the CPU optimizer's policy, decided on
// the device so the host never waits: the global gradient norm (per-block partials summed in a
// fixed order: deterministic); when it is not finite the step is skipped (weights and moments
// kept); otherwise gradients are scaled (grad_scale, clipping), lr = lr_table[min(step, lr_len -
// 1)], step += 1 and the bias corrections use the new step; bf16 copies and EMAs are refreshed.
// Every gradient is zeroed for the next accumulation.
// ZeRO-1 (the segments are this rank's pieces of the weights): `sum_over_ranks`, when given, is
// called between the sum of squares of these segments (one double in device memory, in the
// workspace) and the decision, to enqueue on `stream` what makes it the sum over every rank's.
static void adamw_step(const AdamWSegment* segments, int count, size_t max_n,
                       const AdamWHyper& hyper, const float* lr_table, size_t lr_len,
                       AdamWDeviceState* state, void* workspace, cudaStream_t stream,
                       const std::function<void(double*)>& sum_over_ranks = {});
// ZeRO-1, after the other ranks' pieces of the weights were gathered into `segments` (their
// m, v may be null): when the last adamw_step was taken, their bf16 copies and EMAs as the
// update writes its own; their gradients zeroed either way.
static void adamw_finish_gathered(const AdamWSegment* segments, int count, size_t max_n,
                                  const AdamWHyper& hyper, const AdamWDeviceState* state,
                                  cudaStream_t stream);

#endif  // the parts

// Optimizer step and gradient-clipping helpers.
#pragma once

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

// The fused multi-tensor AdamW on CUDA (kernels/adamw_cuda.cu).
namespace cuda {
#include "kernels/adamw_cuda.inc"
}  // namespace cuda

}  // namespace slipstream::kernels

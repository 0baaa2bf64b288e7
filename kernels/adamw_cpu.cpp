#include "kernels/adamw.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/bf16.h"
#include "kernels/parallel.h"
#include "kernels/reduce.h"

namespace slipstream::kernels {

namespace {
constexpr size_t kBlock = 8192;
}

template <class T>
void adamw_step(T* param, const T* grad, T* m, T* v, uint16_t* param_bf16, size_t n, double lr,
                double beta1, double beta2, double eps_d, double weight_decay, bool decay,
                int64_t step) {
  // Bias corrections in double: 1 - beta^t loses digits in float for small t.
  const double bc1 = 1.0 - std::pow(beta1, double(step));
  const double bc2 = 1.0 - std::pow(beta2, double(step));
  const T step_size = T(lr / bc1);
  const T sqrt_bc2 = T(std::sqrt(bc2));
  const T shrink = decay ? T(1.0 - lr * weight_decay) : T(1);
  const T beta1_t = T(beta1), one_b1 = T(1.0 - beta1), beta2_t = T(beta2), one_b2 = T(1.0 - beta2);
  const T eps = T(eps_d);
  parallel_blocks((n + kBlock - 1) / kBlock, kBlock * 16, [&](size_t b0, size_t b1) {
    const size_t i0 = b0 * kBlock, i1 = std::min(n, b1 * kBlock);
    for (size_t i = i0; i < i1; ++i) {
      const T g = grad[i];
      const T mi = beta1_t * m[i] + one_b1 * g;
      const T vi = beta2_t * v[i] + one_b2 * g * g;
      m[i] = mi;
      v[i] = vi;
      param[i] = param[i] * shrink - step_size * mi / (std::sqrt(vi) / sqrt_bc2 + eps);
    }
    if constexpr (std::is_same_v<T, float>) {
      if (param_bf16) fp32_to_bf16_scalar(param + i0, param_bf16 + i0, i1 - i0);
    }
  });
}

template <class T>
double global_norm_sq(const T* x, size_t n) {
  return deterministic_sum<double>(n, 1 << 14, [&](size_t i0, size_t i1) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // independent chains so the loop vectorises
    size_t i = i0;
    for (; i + 8 <= i1; i += 8)
      for (int k = 0; k < 8; ++k) acc[k] += double(x[i + k]) * double(x[i + k]);
    for (; i < i1; ++i) acc[0] += double(x[i]) * double(x[i]);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  });
}

template <class T>
void scale_inplace(T* x, size_t n, T s) {
  parallel_blocks((n + kBlock - 1) / kBlock, kBlock, [&](size_t b0, size_t b1) {
    const size_t i1 = std::min(n, b1 * kBlock);
    for (size_t i = b0 * kBlock; i < i1; ++i) x[i] *= s;
  });
}

#define INSTANTIATE(T)                                                                         \
  template void adamw_step<T>(T*, const T*, T*, T*, uint16_t*, size_t, double, double, double, \
                              double, double, bool, int64_t);                                  \
  template double global_norm_sq<T>(const T*, size_t);                                         \
  template void scale_inplace<T>(T*, size_t, T);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace slipstream::kernels

// GELU's reference: T = double for the gradient checks, float for the stages.
#include <cmath>

#include "kernels/gelu.h"
#include "kernels/parallel.h"

namespace slipstream::kernels {

namespace {

template <class T>
T normal_cdf(T x) {
  return T(0.5) * (T(1) + std::erf(x * T(M_SQRT1_2)));
}
template <class T>
T normal_pdf(T x) {
  return std::exp(T(-0.5) * x * x) * T(0.5 * M_2_SQRTPI * M_SQRT1_2);
}

}  // namespace

template <class T>
void gelu_forward(const T* x, T* y, size_t n) {
  parallel_blocks(n, 20, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) y[i] = x[i] * normal_cdf(x[i]);
  });
}

template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, size_t n) {
  parallel_blocks(n, 20, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) dx[i] = dy[i] * (normal_cdf(x[i]) + x[i] * normal_pdf(x[i]));
  });
}

template void gelu_forward<float>(const float*, float*, size_t);
template void gelu_forward<double>(const double*, double*, size_t);
template void gelu_backward<float>(const float*, const float*, float*, size_t);
template void gelu_backward<double>(const double*, const double*, double*, size_t);

}  // namespace slipstream::kernels

// Elementwise, memory-bound: block the array into TBB tasks and apply the scalar formula.
#include "kernels/activations.h"

#include <algorithm>

#include "kernels/parallel.h"

namespace slipstream::kernels {

namespace {
constexpr size_t kBlock = 4096;

template <class F>
void pointwise(size_t n, F&& f) {
  parallel_blocks((n + kBlock - 1) / kBlock, kBlock * 8, [&](size_t b0, size_t b1) {
    const size_t i1 = std::min(n, b1 * kBlock);
    for (size_t i = b0 * kBlock; i < i1; ++i) f(i);
  });
}
}  // namespace

template <class T>
void silu_forward(const T* x, T* y, size_t n) {
  pointwise(n, [&](size_t i) { y[i] = silu_scalar(x[i]); });
}
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, size_t n) {
  pointwise(n, [&](size_t i) { dx[i] = dy[i] * silu_grad_scalar(x[i]); });
}
template <class T>
void softplus_forward(const T* x, T* y, size_t n) {
  pointwise(n, [&](size_t i) { y[i] = softplus_scalar(x[i]); });
}
template <class T>
void softplus_backward(const T* x, const T* dy, T* dx, size_t n) {
  pointwise(n, [&](size_t i) { dx[i] = dy[i] * softplus_grad_scalar(x[i]); });
}

#define INSTANTIATE(T)                                            \
  template void silu_forward<T>(const T*, T*, size_t);            \
  template void silu_backward<T>(const T*, const T*, T*, size_t); \
  template void softplus_forward<T>(const T*, T*, size_t);        \
  template void softplus_backward<T>(const T*, const T*, T*, size_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace slipstream::kernels

// Elementwise, memory-bound: block the array into TBB tasks; float through the vector math.
#include "kernels/activations.h"

#include <algorithm>
#include <type_traits>

#include "kernels/parallel.h"
#include "kernels/vector_math.h"

namespace slipstream::kernels {

namespace {
constexpr size_t kBlock = 4096;

// f(i0, i1) over blocks of at most kBlock elements, in parallel.
template <class F>
void blocks(size_t n, F&& f) {
  parallel_blocks((n + kBlock - 1) / kBlock, kBlock * 8, [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) f(b * kBlock, std::min(n, (b + 1) * kBlock));
  });
}
template <class F>
void pointwise(size_t n, F&& f) {
  blocks(n, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) f(i);
  });
}
}  // namespace

// float: the vector math of cpu_isa()'s level (SLEEF on AVX2/AVX-512), per block; double (the
// gradient checks): the scalar formulas.
template <class T>
void silu_forward(const T* x, T* y, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    blocks(n, [&](size_t i0, size_t i1) { vec_silu(x + i0, y + i0, i1 - i0); });
  } else {
    pointwise(n, [&](size_t i) { y[i] = silu_scalar(x[i]); });
  }
}
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    blocks(n, [&](size_t i0, size_t i1) {
      float s[kBlock];
      vec_sigmoid(x + i0, s, i1 - i0);
      for (size_t i = i0; i < i1; ++i) {
        const float si = s[i - i0];
        dx[i] = dy[i] * (si * (1.0f + x[i] * (1.0f - si)));
      }
    });
  } else {
    pointwise(n, [&](size_t i) { dx[i] = dy[i] * silu_grad_scalar(x[i]); });
  }
}
template <class T>
void softplus_forward(const T* x, T* y, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    blocks(n, [&](size_t i0, size_t i1) { vec_softplus(x + i0, y + i0, i1 - i0); });
  } else {
    pointwise(n, [&](size_t i) { y[i] = softplus_scalar(x[i]); });
  }
}
template <class T>
void softplus_backward(const T* x, const T* dy, T* dx, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    blocks(n, [&](size_t i0, size_t i1) {
      float s[kBlock];
      vec_sigmoid(x + i0, s, i1 - i0);
      for (size_t i = i0; i < i1; ++i)
        dx[i] = dy[i] * (x[i] > float(kSoftplusThreshold) ? 1.0f : s[i - i0]);
    });
  } else {
    pointwise(n, [&](size_t i) { dx[i] = dy[i] * softplus_grad_scalar(x[i]); });
  }
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

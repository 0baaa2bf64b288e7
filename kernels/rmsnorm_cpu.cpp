// Rows are independent in the forward and for dx; dweight is a column reduction done in a
// second, column-blocked pass so each task owns its outputs.
#include "kernels/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "kernels/parallel.h"

namespace slipstream::kernels {

template <class T>
void rmsnorm_add_forward(const T* x, const T* residual, const T* weight, T* y, T* sum, T* rstd,
                         size_t M, size_t D, T eps) {
  parallel_blocks(M, 3 * D, [&](size_t r0, size_t r1) {
    for (size_t i = r0; i < r1; ++i) {
      T ss = 0;
      for (size_t j = 0; j < D; ++j) {
        const T v = x[i * D + j] + (residual ? residual[i * D + j] : T(0));
        ss += v * v;
      }
      const T r = T(1) / std::sqrt(ss / T(D) + eps);
      rstd[i] = r;
      for (size_t j = 0; j < D; ++j) {
        const T v = x[i * D + j] + (residual ? residual[i * D + j] : T(0));
        if (sum) sum[i * D + j] = v;
        y[i * D + j] = v * r * weight[j];
      }
    }
  });
}

template <class T>
void rmsnorm_add_backward(const T* x, const T* weight, const T* rstd, const T* dy, const T* dsum,
                          T* dx, T* dweight, size_t M, size_t D) {
  // dweight first: dx may alias dy. Each dx element is written after its dy and dsum are read.
  constexpr size_t kCols = 64;
  parallel_blocks((D + kCols - 1) / kCols, M * kCols, [&](size_t c0, size_t c1) {
    const size_t j0 = c0 * kCols, j1 = std::min(D, c1 * kCols);
    T acc[kCols];
    for (size_t jb = j0; jb < j1; jb += kCols) {
      const size_t w = std::min(j1 - jb, kCols);
      std::fill(acc, acc + w, T(0));
      for (size_t i = 0; i < M; ++i) {
        const T r = rstd[i];
        const T* xi = x + i * D + jb;
        const T* gi = dy + i * D + jb;
        for (size_t j = 0; j < w; ++j) acc[j] += gi[j] * xi[j] * r;
      }
      for (size_t j = 0; j < w; ++j) dweight[jb + j] += acc[j];
    }
  });
  // dx = r * w * dy - x * r^3 / D * sum(dy * w * x) + dsum
  parallel_blocks(M, 3 * D, [&](size_t r0, size_t r1) {
    for (size_t i = r0; i < r1; ++i) {
      const T* xi = x + i * D;
      const T* gi = dy + i * D;
      T* di = dx + i * D;
      const T r = rstd[i];
      T dot = 0;
      for (size_t j = 0; j < D; ++j) dot += gi[j] * weight[j] * xi[j];
      const T c = dot * r * r * r / T(D);
      for (size_t j = 0; j < D; ++j)
        di[j] = r * weight[j] * gi[j] - xi[j] * c + (dsum ? dsum[i * D + j] : T(0));
    }
  });
}

template <class T>
void rmsnorm_forward(const T* x, const T* weight, T* y, T* rstd, size_t M, size_t D, T eps) {
  rmsnorm_add_forward(x, static_cast<const T*>(nullptr), weight, y, static_cast<T*>(nullptr), rstd,
                      M, D, eps);
}

template <class T>
void rmsnorm_backward(const T* x, const T* weight, const T* rstd, const T* dy, T* dx, T* dweight,
                      size_t M, size_t D) {
  rmsnorm_add_backward(x, weight, rstd, dy, static_cast<const T*>(nullptr), dx, dweight, M, D);
}

#define INSTANTIATE(T)                                                                            \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, size_t, size_t, T);                \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, size_t,       \
                                    size_t);                                                      \
  template void rmsnorm_add_forward<T>(const T*, const T*, const T*, T*, T*, T*, size_t, size_t,  \
                                       T);                                                        \
  template void rmsnorm_add_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, \
                                        size_t, size_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace slipstream::kernels

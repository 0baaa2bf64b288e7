// Memory-bound loops, blocked into TBB tasks; the inner loops vectorise.
#include "kernels/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/parallel.h"

namespace slipstream::kernels {

namespace {
constexpr size_t kBlock = 8192;

template <class F>
void blocked(size_t n, F&& f) {
  parallel_blocks((n + kBlock - 1) / kBlock, kBlock,
                  [&](size_t b0, size_t b1) { f(b0 * kBlock, std::min(n, b1 * kBlock)); });
}
}  // namespace

template <class T>
void add(const T* a, const T* b, T* y, size_t n) {
  blocked(n, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) y[i] = a[i] + b[i];
  });
}

template <class T>
void add_inplace(T* y, const T* a, size_t n) {
  blocked(n, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) y[i] += a[i];
  });
}

template <class T>
void mul(const T* a, const T* b, T* y, size_t n) {
  blocked(n, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) y[i] = a[i] * b[i];
  });
}

template <class T>
void mul_backward(const T* a, const T* b, const T* dy, T* da, T* db, size_t n) {
  blocked(n, [&](size_t i0, size_t i1) {
    if (da)
      for (size_t i = i0; i < i1; ++i) da[i] = dy[i] * b[i];
    if (db)
      for (size_t i = i0; i < i1; ++i) db[i] = dy[i] * a[i];
  });
}

template <class T>
void copy_cols(const T* src, size_t src_ld, T* dst, size_t dst_ld, size_t rows, size_t cols) {
  parallel_blocks(rows, cols, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r)
      std::memcpy(dst + r * dst_ld, src + r * src_ld, cols * sizeof(T));
  });
}

template <class T>
void add_bias_rows(T* y, const T* b, size_t M, size_t N) {
  parallel_blocks(M, N, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r)
      for (size_t j = 0; j < N; ++j) y[r * N + j] += b[j];
  });
}

template <class T>
void neg_exp(const T* x, size_t x_ld, T* y, size_t rows, size_t cols) {
  blocked(rows * cols, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) y[i] = -std::exp(x[i / cols * x_ld + i % cols]);
  });
}

template <class T>
void mul_accumulate(T* y, const T* a, const T* b, size_t n) {
  blocked(n, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) y[i] += a[i] * b[i];
  });
}

template <class T>
void scale_rows(const T* x, const T* s, T* y, size_t G, size_t M, size_t N, const T* x2, T* y2,
                size_t N2) {
  blocked(G * M * N, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) y[i] = x[i] * s[i / N % M];
  });
  if (x2)
    blocked(G * M * N2, [&](size_t i0, size_t i1) {
      for (size_t i = i0; i < i1; ++i) y2[i] = x2[i] * s[i / N2 % M];
    });
}

#define INSTANTIATE(T)                                                         \
  template void add<T>(const T*, const T*, T*, size_t);                        \
  template void add_inplace<T>(T*, const T*, size_t);                          \
  template void mul<T>(const T*, const T*, T*, size_t);                        \
  template void mul_backward<T>(const T*, const T*, const T*, T*, T*, size_t); \
  template void copy_cols<T>(const T*, size_t, T*, size_t, size_t, size_t);    \
  template void add_bias_rows<T>(T*, const T*, size_t, size_t);                \
  template void neg_exp<T>(const T*, size_t, T*, size_t, size_t);              \
  template void mul_accumulate<T>(T*, const T*, const T*, size_t);             \
  template void scale_rows<T>(const T*, const T*, T*, size_t, size_t, size_t, const T*, T*, size_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace slipstream::kernels

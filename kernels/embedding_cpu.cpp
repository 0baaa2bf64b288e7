#include "kernels/embedding.h"

#include <algorithm>
#include <cstring>

#include "kernels/parallel.h"

namespace slipstream::kernels {

template <class T>
void embedding_forward(const int32_t* ids, const T* table, T* out, size_t N, size_t D) {
  parallel_blocks(N, D, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i)
      std::memcpy(out + i * D, table + static_cast<size_t>(ids[i]) * D, D * sizeof(T));
  });
}

template <class T>
void embedding_backward(const int32_t* ids, const T* dout, T* dtable, size_t N, size_t D) {
  constexpr size_t kCols = 16;  // 64 bytes of float: blocks never share a cache line
  parallel_blocks((D + kCols - 1) / kCols, N * kCols, [&](size_t c0, size_t c1) {
    const size_t j0 = c0 * kCols, j1 = std::min(D, c1 * kCols);
    for (size_t i = 0; i < N; ++i) {
      T* row = dtable + static_cast<size_t>(ids[i]) * D;
      const T* g = dout + i * D;
      for (size_t j = j0; j < j1; ++j) row[j] += g[j];
    }
  });
}

#define INSTANTIATE(T)                                                              \
  template void embedding_forward<T>(const int32_t*, const T*, T*, size_t, size_t); \
  template void embedding_backward<T>(const int32_t*, const T*, T*, size_t, size_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace slipstream::kernels

// Rows are independent; the batch sums use a deterministic reduction (fixed blocks, fixed
// order) so a run is reproducible whatever the thread count.
#include "kernels/losses.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/parallel.h"
#include "kernels/reduce.h"
#include "kernels/vector_math.h"

namespace slipstream::kernels {

namespace {
struct Acc {
  double loss = 0, weight = 0, correct = 0;
  Acc operator+(const Acc& o) const {
    return {loss + o.loss, weight + o.weight, correct + o.correct};
  }
};

template <class T>
T row_weight(const T* weights, const int32_t* targets, size_t i) {
  if (targets && targets[i] < 0) return T(0);
  return weights ? weights[i] : T(1);
}

// e[k] = exp(x[k] - mx) for k < K (e may be x's own row buffer); returns their sum, added in
// order. float: vector exp at cpu_isa()'s level (vector_math.h).
template <class T>
T shifted_exp(const T* x, size_t K, T mx, T* e) {
  for (size_t k = 0; k < K; ++k) e[k] = x[k] - mx;
  if constexpr (std::is_same_v<T, float>) {
    vec_exp(e, e, K);
  } else {
    for (size_t k = 0; k < K; ++k) e[k] = std::exp(e[k]);
  }
  T se = 0;
  for (size_t k = 0; k < K; ++k) se += e[k];
  return se;
}

// The sum of exp(x[k] - mx) without keeping the values, through a stack buffer.
template <class T>
T sum_shifted_exp(const T* x, size_t K, T mx) {
  constexpr size_t kChunk = 256;
  T e[kChunk];
  T se = 0;
  for (size_t k0 = 0; k0 < K; k0 += kChunk) {
    const size_t n = std::min(kChunk, K - k0);
    se += shifted_exp(x + k0, n, mx, e);
  }
  return se;
}
}  // namespace

template <class T>
LossStats softmax_cross_entropy_forward(const T* logits, const int32_t* targets, const T* weights,
                                        T* row_loss, int32_t* pred, size_t N, size_t K, T eps) {
  const T off = eps / T(K), on = T(1) - eps + eps / T(K);
  const size_t grain = std::max<size_t>(1, 8192 / std::max<size_t>(K, 1));
  Acc a = deterministic_sum<Acc>(N, grain, [&](size_t i0, size_t i1) {
    Acc acc;
    for (size_t i = i0; i < i1; ++i) {
      const T* x = logits + i * K;
      size_t am = 0;
      for (size_t k = 1; k < K; ++k)
        if (x[k] > x[am]) am = k;
      if (pred) pred[i] = static_cast<int32_t>(am);
      const T w = row_weight(weights, targets, i);
      if (targets[i] < 0 || w == T(0)) {  // masked rows are skipped: their logits may be NaN
        if (row_loss) row_loss[i] = 0;
        continue;
      }
      const T mx = x[am];
      T sx = 0;
      for (size_t k = 0; k < K; ++k) sx += x[k];
      const T lse = mx + std::log(sum_shifted_exp(x, K, mx));
      // sum_k q_k x_k = off * sum(x) + (on - off) * x[target]
      const T loss = lse - (off * sx + (on - off) * x[targets[i]]);
      if (row_loss) row_loss[i] = loss;
      acc.loss += double(w) * double(loss);
      acc.weight += double(w);
      if (static_cast<int32_t>(am) == targets[i]) acc.correct += double(w);
    }
    return acc;
  });
  return {a.loss, a.weight, a.correct};
}

template <class T>
void softmax_cross_entropy_backward(const T* logits, const int32_t* targets, const T* weights,
                                    T* dlogits, size_t N, size_t K, T eps, T scale) {
  const T off = eps / T(K), on = T(1) - eps + eps / T(K);
  parallel_blocks(N, 4 * K, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      const T* x = logits + i * K;
      T* g = dlogits + i * K;
      const T w = row_weight(weights, targets, i) * scale;
      if (w == T(0)) {
        std::fill(g, g + K, T(0));
        continue;
      }
      T mx = x[0];
      for (size_t k = 1; k < K; ++k) mx = std::max(mx, x[k]);
      const T inv = T(1) / shifted_exp(x, K, mx, g);  // g holds exp(x - mx) for now
      const size_t tgt = static_cast<size_t>(targets[i]);
      for (size_t k = 0; k < K; ++k) g[k] = (g[k] * inv - (k == tgt ? on : off)) * w;
    }
  });
}

template <class T>
LossStats bce_with_logits_forward(const T* logits, const T* labels, const T* weights, T* elem_loss,
                                  size_t n, T eps) {
  Acc a = deterministic_sum<Acc>(n, 8192, [&](size_t i0, size_t i1) {
    Acc acc;
    for (size_t i = i0; i < i1; ++i) {
      const T w = weights ? weights[i] : T(1);
      // A masked-out position is skipped, not multiplied by 0: its logit may be NaN/Inf.
      if (w == T(0)) {
        if (elem_loss) elem_loss[i] = 0;
        continue;
      }
      const T x = logits[i], y = labels[i] * (T(1) - eps) + eps / T(2);
      const T loss = std::max(x, T(0)) - x * y + std::log1p(std::exp(-std::abs(x)));
      if (elem_loss) elem_loss[i] = loss;
      acc.loss += double(w) * double(loss);
      acc.weight += double(w);
      if ((x > T(0)) == (labels[i] > T(0.5))) acc.correct += double(w);
    }
    return acc;
  });
  return {a.loss, a.weight, a.correct};
}

template <class T>
void bce_with_logits_backward(const T* logits, const T* labels, const T* weights, T* dlogits,
                              size_t n, T eps, T scale) {
  constexpr size_t kBlock = 4096;
  parallel_blocks((n + kBlock - 1) / kBlock, kBlock * 8, [&](size_t b0, size_t b1) {
    const size_t i1 = std::min(n, b1 * kBlock);
    for (size_t i = b0 * kBlock; i < i1; ++i) {
      const T x = logits[i], y = labels[i] * (T(1) - eps) + eps / T(2);
      const T w = (weights ? weights[i] : T(1)) * scale;
      if (w == T(0)) {  // masked: exactly 0 even where the logit is not finite
        dlogits[i] = 0;
        continue;
      }
      // sigmoid without overflow for large |x|
      const T e = std::exp(-std::abs(x));
      const T s = x >= T(0) ? T(1) / (T(1) + e) : e / (T(1) + e);
      dlogits[i] = (s - y) * w;
    }
  });
}

#define INSTANTIATE(T)                                                                            \
  template LossStats softmax_cross_entropy_forward<T>(const T*, const int32_t*, const T*, T*,     \
                                                      int32_t*, size_t, size_t, T);               \
  template void softmax_cross_entropy_backward<T>(const T*, const int32_t*, const T*, T*, size_t, \
                                                  size_t, T, T);                                  \
  template LossStats bce_with_logits_forward<T>(const T*, const T*, const T*, T*, size_t, T);     \
  template void bce_with_logits_backward<T>(const T*, const T*, const T*, T*, size_t, T, T);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace slipstream::kernels

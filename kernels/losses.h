// Classification losses with label smoothing, for the behaviour-cloning heads.
// Per-row weights (or a 0/1 mask) are optional; a null weight pointer means every row weighs 1.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slipstream::kernels {

// Sums over the batch, weighted; mean() is the weighted mean loss, accuracy() the weighted
// fraction of correct predictions (rows with weight 0 count for nothing).
struct LossStats {
  double loss_sum = 0;
  double weight_sum = 0;
  double correct = 0;
  double mean() const { return weight_sum > 0 ? loss_sum / weight_sum : 0.0; }
  double accuracy() const { return weight_sum > 0 ? correct / weight_sum : 0.0; }
};

// Softmax cross-entropy over logits (N, K) with targets (N) in [0, K); a negative target or a
// zero weight marks a row ignored (skipped: its logits may be non-finite). Label smoothing eps: the
// target distribution puts 1 - eps + eps/K on the target class and eps/K on every other:
//   loss_i = logsumexp(x_i) - sum_k q_ik x_ik.
// row_loss (N, unweighted, 0 for ignored rows) and pred (N, argmax) may be null.
template <class T>
LossStats softmax_cross_entropy_forward(const T* logits, const int32_t* targets, const T* weights,
                                        T* row_loss, int32_t* pred, size_t N, size_t K, T eps);

// dlogits (N, K) = (softmax(x_i) - q_i) * weight_i * scale, overwritten (=); may alias logits.
// For the gradient of mean(), pass scale = 1 / weight_sum.
template <class T>
void softmax_cross_entropy_backward(const T* logits, const int32_t* targets, const T* weights,
                                    T* dlogits, size_t N, size_t K, T eps, T scale);

// Binary cross-entropy on logits (n elements, e.g. (N, buttons) flattened) with labels in {0,1}
// smoothed to y' = y (1 - eps) + eps / 2. Numerically stable form:
//   loss = max(x, 0) - x y' + log1p(exp(-|x|)).
// weights (n) optional, a zero weight skips the element (its logit may be non-finite); elem_loss
// (n) may be null. Correct means (x > 0) == (y > 0.5).
template <class T>
LossStats bce_with_logits_forward(const T* logits, const T* labels, const T* weights, T* elem_loss,
                                  size_t n, T eps);

// dlogits = (sigmoid(x) - y') * weight * scale, overwritten (=); may alias logits.
template <class T>
void bce_with_logits_backward(const T* logits, const T* labels, const T* weights, T* dlogits,
                              size_t n, T eps, T scale);

}  // namespace slipstream::kernels

// The Melee model stages' kernel tables (their CUDA entry points, melee_cuda.inc, beside those of
// kernels/), and the host-side glue of their device path: the embedding's dims by value and the BC
// loss's per-position statistics, whose column sums the stage turns into bc_loss_forward's result.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda_kernels.h"
#include "stages/melee/model_math.h"

namespace slipstream::melee {

// bc_loss_rows' per-position columns: the weight, then kBcPerHead per head h at
// kBcPerHead * h + (kBcLoss | kBcNll | kBcCorrect), then the bad-label flag. Plain constants, so
// device code uses them too.
inline constexpr int kBcWeight = 0;   // the mask where the position is valid, else 0
inline constexpr int kBcLoss = 1;     // weight · smoothed loss (buttons: summed over the 8)
inline constexpr int kBcNll = 2;      // weight · loss without smoothing
inline constexpr int kBcCorrect = 3;  // weight · correct (buttons: the fraction of the 8)
inline constexpr int kBcPerHead = 3;
inline constexpr int kBcBadLabel = 1 + kBcPerHead * kHeads;  // 1: a label out of range
// kRepeatItems columns from kBcSame: weight · [the label repeats the previous input] per button
// and stick head, on the raw (unmirrored) tensors: count_repeats' and the baseline's sums.
inline constexpr int kBcSame = kBcBadLabel + 1;
// Where the input changes (bc_change_forward's sums): w · [every head right]; w · [no item
// changed]; per head, w · the changed items the model gets right, and w · their NLL.
inline constexpr int kBcAllRight = kBcSame + kRepeatItems;
inline constexpr int kBcUnchanged = kBcAllRight + 1;
inline constexpr int kBcChangedRight = kBcUnchanged + 1;
inline constexpr int kBcChangedNll = kBcChangedRight + kHeads;
// How often the controller acts: w · [the recorded one acts], w · P(the one drawn at temperature
// 1 acts), w · [the most likely one acts].
inline constexpr int kBcActsRecorded = kBcChangedNll + kHeads;
inline constexpr int kBcActsSampled = kBcActsRecorded + 1;
inline constexpr int kBcActsLikely = kBcActsSampled + 1;
inline constexpr int kBcStats = kBcActsLikely + 1;

// The Melee kernel tables: every entry point of kernels/ (inherited) and the game's own, so a
// Melee stage's device path takes all its kernels from one table (Ops::Table).
namespace cuda {
struct Kernels : kernels::cuda::Kernels {
#include "stages/melee/melee_cuda.inc"
};
}  // namespace cuda
namespace cuda_emulated {
struct Kernels : kernels::cuda_emulated::Kernels {
#include "stages/melee/melee_cuda.inc"
};
}  // namespace cuda_emulated

// The pair with_ops (stages/ops/with_ops.h) builds a Melee stage's device ops over.
struct MeleeKernelFamily {
  using Cuda = cuda::Kernels;
  using Emulated = cuda_emulated::Kernels;
};

template <class Dims>
Dims embed_dims(const EmbedLayout& L) {
  Dims d{};
  d.action_dim = L.action_dim;
  d.character_dim = L.character_dim;
  d.stage_dim = L.stage_dim;
  d.prev_classes = L.prev_classes ? 1 : 0;
  for (int f = 0; f < kNumericFeatures; ++f) {
    d.numeric_scale[f] = kNumericScale[f];
    if (mirrors_numeric(f)) d.mirror_numeric |= 1u << f;
  }
  for (int c = 0; c < kControllerFeatures; ++c)
    if (mirrors_controller(c)) d.mirror_controller |= 1u << c;
  return d;
}

// Σ w · changed items of head h: the positions' weight, less the repeats, per item.
inline double changed_weight(const float sums[kBcStats], int h) {
  const int first = h == 0 ? 0 : kButtons + h - 1, items = h == 0 ? kButtons : 1;
  double c = 0;
  for (int k = first; k < first + items; ++k)
    c += static_cast<double>(sums[kBcWeight]) - sums[kBcSame + k];
  return std::max(c, 0.0);
}

// bc_loss_forward's and bc_change_forward's result from the column sums of bc_loss_rows'
// statistics.
inline BcLossResult bc_loss_result(const float sums[kBcStats], const float head_weights[kHeads]) {
  BcLossResult r;
  r.weight_sum = sums[kBcWeight];
  r.all_right = r.weight_sum > 0 ? sums[kBcAllRight] / r.weight_sum : 0.0;
  if (r.weight_sum > 0) {
    r.acts_recorded = sums[kBcActsRecorded] / r.weight_sum;
    r.acts_sampled = sums[kBcActsSampled] / r.weight_sum;
    r.acts_most_likely = sums[kBcActsLikely] / r.weight_sum;
  }
  for (int h = 0; h < kHeads; ++h) {
    r.changed[h] = changed_weight(sums, h);
    r.changed_acc[h] = r.changed[h] > 0 ? sums[kBcChangedRight + h] / r.changed[h] : 0.0;
    r.changed_nll[h] = r.changed[h] > 0 ? sums[kBcChangedNll + h] / r.changed[h] : 0.0;
  }
  for (int h = 0; h < kHeads; ++h) {
    const double w = r.weight_sum;
    const float* s = sums + kBcPerHead * h;
    r.loss[h] = w > 0 ? s[kBcLoss] / w : 0.0;
    r.nll[h] = w > 0 ? s[kBcNll] / w : 0.0;
    r.acc[h] = w > 0 ? s[kBcCorrect] / w : 0.0;
    r.total += static_cast<double>(head_weights[h]) * r.loss[h];
    r.total_nll += static_cast<double>(head_weights[h]) * r.nll[h];
  }
  return r;
}

// count_repeats over a batch from the same sums.
inline void add_repeats(const float sums[kBcStats], RepeatCounts& c) {
  c.total += sums[kBcWeight];
  for (int k = 0; k < kRepeatItems; ++k) c.same[k] += sums[kBcSame + k];
}

// baseline_forward from the sums: with W = Σ w and S_k = Σ w·same_k, a head's loss is
// Σ_k (S_k · nll_same_k + (W - S_k) · nll_other_k) / W and its accuracy Σ_k S_k / (W · items).
inline BaselineResult baseline_from_sums(const float sums[kBcStats],
                                         const float head_weights[kHeads],
                                         const double p[kRepeatItems]) {
  BaselineResult r;
  const double W = sums[kBcWeight];
  r.weight_sum = W;
  if (!(W > 0)) return r;
  double loss[kHeads] = {}, correct[kHeads] = {}, changed_loss[kHeads] = {};
  for (int k = 0; k < kRepeatItems; ++k) {
    const double q = std::clamp(p[k], kBaselinePClamp, 1.0 - kBaselinePClamp);
    const int K = k < kButtons ? 2 : head_classes(k - kButtons);
    const int h = k < kButtons ? 0 : k - kButtons + 1;
    const double S = sums[kBcSame + k];
    const double other = -std::log((1.0 - q) / (K - 1));
    loss[h] += S * -std::log(q) + (W - S) * other;
    changed_loss[h] += std::max(W - S, 0.0) * other;
    correct[h] += S;
  }
  for (int h = 0; h < kHeads; ++h) {
    r.loss[h] = loss[h] / W;
    r.acc[h] = correct[h] / (W * (h == 0 ? kButtons : 1));
    const double changed = changed_weight(sums, h);
    r.changed_nll[h] = changed > 0 ? changed_loss[h] / changed : 0.0;
    r.total += static_cast<double>(head_weights[h]) * r.loss[h];
  }
  r.all_right = sums[kBcUnchanged] / W;
  return r;
}

}  // namespace slipstream::melee

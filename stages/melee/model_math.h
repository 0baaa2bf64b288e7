// The math of the Melee model stages (melee_embedding, controller_heads, bc_loss) as plain
// functions on raw row-major pointers, templated on T (float for the stages, double for the
// finite-difference checks in tests/melee_model). The stages add ports, buffers, RNG and bf16.
// Layouts and conventions: docs/melee_features.md. Backward: table/weight gradients accumulate
// (+=), input gradients are overwritten (=), as in kernels/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/losses.h"
#include "kernels/parallel.h"
#include "stages/melee/batch_layout.h"

namespace slipstream::melee {

// ---------------------------------------------------------------- embedding

// Columns of one position of the embedding output:
//   per slot s (player, opponent, Nana): [numeric × kNumericScale (18) | action (A) | character
//   (C)] then stage (S), then prev_controller (13), then (prev_classes) the previous input's
//   stick and shoulder classes one-hot (73), then zero padding up to a multiple of 8.
struct EmbedLayout {
  int action_dim = 32, character_dim = 8, stage_dim = 4;
  bool prev_classes = true;  // the previous input's classes, one-hot (batch_layout.h)
  int slot_width() const { return kNumericFeatures + action_dim + character_dim; }
  int slot_offset(int s) const { return s * slot_width(); }
  int action_offset(int s) const { return slot_offset(s) + kNumericFeatures; }
  int character_offset(int s) const { return action_offset(s) + action_dim; }
  int stage_offset() const { return kSlots * slot_width(); }
  int controller_offset() const { return stage_offset() + stage_dim; }
  int prev_class_offset() const { return controller_offset() + kControllerFeatures; }
  int raw_width() const { return prev_class_offset() + (prev_classes ? kPrevClassFeatures : 0); }
  // The `prev_input` output: the previous-input columns of x (controller, then its classes).
  int prev_input_width() const { return raw_width() - controller_offset(); }
  int width() const { return (raw_width() + 7) / 8 * 8; }  // tensor-core friendly
};

// Features a left-right mirror negates: facing, x position and the x speeds.
// The embedding's noise draws use splitmix64(batch key ^ this), apart from the mirror draws.
inline constexpr uint64_t kEmbedNoiseSalt = 0x6E6F697365ull;  // "noise"

inline constexpr bool mirrors_numeric(int f) {
  return f == kFacing || f == kX || f == kSpeedAirX || f == kSpeedAttackX || f == kSpeedGroundX;
}
// prev_controller: main stick x and c-stick x.
inline constexpr bool mirrors_controller(int c) {
  return c == kButtons + kMainX || c == kButtons + kCX;
}
inline constexpr bool mirrors_head(int stick_head) {
  return stick_head == kMainX || stick_head == kCX;
}
// stick_class(-v) == 16 - stick_class(v) exactly (round-half-even is symmetric about 8).
inline constexpr int mirror_stick_class(int c) {
  return kStickClasses - 1 - c;
}
// The class of head h in the previous input (prev_controller's row), mirrored as the targets.
template <class T>
int prev_head_class(const T* prev_controller, int head, bool mirrored) {
  const float v = static_cast<float>(prev_controller[kButtons + head]);
  if (head == kShoulder) return shoulder_class(v);
  const int c = stick_class(v);
  return mirrored && mirrors_head(head) ? mirror_stick_class(c) : c;
}

// A slot's embeddings are used (and trained) only where the slot exists (Nana is absent for
// most characters; row 0 of the tables must not stand in for "nobody").
template <class T>
inline bool slot_exists(const T* slot_numeric) {
  return slot_numeric[kExists] > T(0.5);
}

// out (rows, width) from the loader's tensors for `rows` = B·W positions. mirrored (B) may be
// null (no window mirrored); window = W maps a row to its window. ids must be in range.
template <class T>
void embed_forward(const EmbedLayout& L, size_t rows, size_t window, const T* numeric,
                   const int32_t* action, const int32_t* character, const int32_t* stage,
                   const T* prev_controller, const uint8_t* mirrored, const T* action_table,
                   const T* character_table, const T* stage_table, T* out) {
  const size_t E = static_cast<size_t>(L.width());
  kernels::parallel_blocks(rows, E, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      T* o = out + r * E;
      const bool m = mirrored && mirrored[r / window];
      for (int s = 0; s < kSlots; ++s) {
        const size_t rs = r * kSlots + static_cast<size_t>(s);
        const T* num = numeric + rs * kNumericFeatures;
        T* os = o + L.slot_offset(s);
        for (int f = 0; f < kNumericFeatures; ++f) {
          T v = num[f] * static_cast<T>(kNumericScale[f]);
          os[f] = (m && mirrors_numeric(f)) ? -v : v;
        }
        T* oa = o + L.action_offset(s);
        T* oc = o + L.character_offset(s);
        if (slot_exists(num)) {
          std::copy_n(action_table + static_cast<size_t>(action[rs]) * L.action_dim, L.action_dim,
                      oa);
          std::copy_n(character_table + static_cast<size_t>(character[rs]) * L.character_dim,
                      L.character_dim, oc);
        } else {
          std::fill_n(oa, L.action_dim, T(0));
          std::fill_n(oc, L.character_dim, T(0));
        }
      }
      std::copy_n(stage_table + static_cast<size_t>(stage[r]) * L.stage_dim, L.stage_dim,
                  o + L.stage_offset());
      T* oc = o + L.controller_offset();
      const T* pc = prev_controller + r * kControllerFeatures;
      for (int c = 0; c < kControllerFeatures; ++c)
        oc[c] = (m && mirrors_controller(c)) ? -pc[c] : pc[c];
      if (L.prev_classes) {
        T* op = o + L.prev_class_offset();
        std::fill_n(op, kPrevClassFeatures, T(0));
        for (int h = 0; h < kStickHeads; ++h)
          op[prev_class_column(h) + prev_head_class(pc, h, m)] = T(1);
      }
      std::fill(o + L.raw_width(), o + E, T(0));
    }
  });
}

// Table gradients (+=) from dout (rows, width). Serial: repeated ids would race, and the work
// (rows × ~124 adds) is small next to the model.
template <class T>
void embed_backward(const EmbedLayout& L, size_t rows, const T* numeric, const int32_t* action,
                    const int32_t* character, const int32_t* stage, const T* dout, T* daction_table,
                    T* dcharacter_table, T* dstage_table) {
  const size_t E = static_cast<size_t>(L.width());
  for (size_t r = 0; r < rows; ++r) {
    const T* g = dout + r * E;
    for (int s = 0; s < kSlots; ++s) {
      const size_t rs = r * kSlots + static_cast<size_t>(s);
      if (!slot_exists(numeric + rs * kNumericFeatures)) continue;
      T* da = daction_table + static_cast<size_t>(action[rs]) * L.action_dim;
      const T* ga = g + L.action_offset(s);
      for (int k = 0; k < L.action_dim; ++k) da[k] += ga[k];
      T* dc = dcharacter_table + static_cast<size_t>(character[rs]) * L.character_dim;
      const T* gc = g + L.character_offset(s);
      for (int k = 0; k < L.character_dim; ++k) dc[k] += gc[k];
    }
    T* ds = dstage_table + static_cast<size_t>(stage[r]) * L.stage_dim;
    const T* gs = g + L.stage_offset();
    for (int k = 0; k < L.stage_dim; ++k) ds[k] += gs[k];
  }
}

// ---------------------------------------------------------------- controller heads

// The six heads' logits are computed as one fused (M, 81) product; each head's rows of the fused
// weight are contiguous, so the per-head parameters are views of one buffer.
inline constexpr int kHeads = 6;  // buttons, then the kStickHeads in StickHead order
inline constexpr const char* kHeadNames[kHeads] = {"buttons", "main_x", "main_y",
                                                   "c_x",     "c_y",    "shoulder"};
inline constexpr int head_width(int h) {
  return h == 0 ? kButtons : head_classes(h - 1);
}
inline constexpr int head_offset(int h) {
  return h == 0 ? 0 : head_offset(h - 1) + head_width(h - 1);
}
inline constexpr int kHeadsWidth = head_offset(kHeads);  // 81

// x (M, H) -> logits (M, 81). hidden > 0: pre = x Whᵀ + bh, act = silu(pre) (both (M, hidden),
// kept for the backward), logits = act Woᵀ + bo; hidden == 0: logits = x Woᵀ + bo.
template <class T>
void heads_forward(const T* x, int M, int H, int hidden, const T* Wh, const T* bh, T* pre, T* act,
                   const T* Wo, const T* bo, T* logits) {
  if (hidden > 0) {
    kernels::linear_forward(x, Wh, bh, pre, M, H, hidden);
    kernels::silu_forward(pre, act, static_cast<size_t>(M) * hidden);
    kernels::linear_forward(act, Wo, bo, logits, M, hidden, kHeadsWidth);
  } else {
    kernels::linear_forward(x, Wo, bo, logits, M, H, kHeadsWidth);
  }
}

// dlogits (M, 81) -> dx (=, may be null), dWo/dbo/dWh/dbh (+=). dact: (M, hidden) scratch.
template <class T>
void heads_backward(const T* x, int M, int H, int hidden, const T* Wh, const T* pre, const T* act,
                    const T* Wo, const T* dlogits, T* dx, T* dWh, T* dbh, T* dWo, T* dbo, T* dact) {
  if (hidden > 0) {
    kernels::linear_backward(act, Wo, dlogits, dact, dWo, dbo, M, hidden, kHeadsWidth);
    kernels::silu_backward(pre, dact, dact, static_cast<size_t>(M) * hidden);
    kernels::linear_backward(x, Wh, dact, dx, dWh, dbh, M, H, hidden);
  } else {
    kernels::linear_backward(x, Wo, dlogits, dx, dWo, dbo, M, H, kHeadsWidth);
  }
}

// The heads' direct path from the previous input (controller_heads' `prev_input`, (M, P)):
// logits += prev Wpᵀ with Wp (81, P); backward dWp += dlogitsᵀ prev (prev is data: no gradient).
template <class T>
void heads_prev_forward(const T* prev, int M, int P, const T* Wp, T* logits) {
  for (int i = 0; i < M; ++i)
    for (int o = 0; o < kHeadsWidth; ++o) {
      T s = 0;
      for (int k = 0; k < P; ++k) s += prev[static_cast<size_t>(i) * P + k] * Wp[o * P + k];
      logits[static_cast<size_t>(i) * kHeadsWidth + o] += s;
    }
}
template <class T>
void heads_prev_backward(const T* prev, int M, int P, const T* dlogits, T* dWp) {
  for (int i = 0; i < M; ++i)
    for (int o = 0; o < kHeadsWidth; ++o) {
      const T g = dlogits[static_cast<size_t>(i) * kHeadsWidth + o];
      for (int k = 0; k < P; ++k) dWp[o * P + k] += g * prev[static_cast<size_t>(i) * P + k];
    }
}

// ---------------------------------------------------------------- autoregressive heads
//
// controller_heads' `autoregressive` form orders the controller's items — the 8 buttons one by
// one, then main x, main y, c x, c y, shoulder (kArItems) — and conditions each item's logits on
// the items before it: logits += onehot(earlier items) Waᵀ, Wa (81, 81) zero wherever the input
// column's item is not before the output column's (heads_ar_allowed). An item's one-hot: a
// button's column is 1 when pressed; an axis has a 1 at its class. Training conditions on the
// recorded items (teacher forcing: heads_ar_teacher); every other pass on the model's own most
// likely items, in order (heads_ar_decode), and a bot samples in the same order
// (controller_choice.h).
inline constexpr int kArItems = kButtons + kStickHeads;  // 13
inline constexpr int ar_item_of_column(int c) {
  if (c < kButtons) return c;
  int h = 1;
  while (h + 1 < kHeads && c >= head_offset(h + 1)) ++h;
  return kButtons + h - 1;
}
inline constexpr int ar_item_first_column(int item) {
  return item < kButtons ? item : head_offset(item - kButtons + 1);
}
inline constexpr int ar_item_width(int item) {
  return item < kButtons ? 1 : head_width(item - kButtons + 1);
}
// Wa[r][c] may be non-zero: column c's item comes before row r's.
inline constexpr bool heads_ar_allowed(int r, int c) {
  return ar_item_of_column(c) < ar_item_of_column(r);
}

// teacher (M, 81): the recorded items one-hot at each position, the x axes' classes mirrored
// where the window is (mirrored (B) may be null; window = W). A class outside its head's range
// (a masked position) leaves that head's columns zero.
template <class T>
void heads_ar_teacher(size_t M, size_t window, const T* target_buttons,
                      const int32_t* target_sticks, const uint8_t* mirrored, T* teacher) {
  for (size_t i = 0; i < M; ++i) {
    T* t = teacher + i * kHeadsWidth;
    std::fill_n(t, kHeadsWidth, T(0));
    for (int b = 0; b < kButtons; ++b) t[b] = target_buttons[i * kButtons + b] > T(0.5) ? 1 : 0;
    const bool m = mirrored && mirrored[i / window];
    for (int h = 0; h < kStickHeads; ++h) {
      int c = target_sticks[i * kStickHeads + static_cast<size_t>(h)];
      if (c < 0 || c >= head_classes(h)) continue;
      if (m && mirrors_head(h)) c = mirror_stick_class(c);
      t[head_offset(h + 1) + c] = 1;
    }
  }
}

// Wa's entries outside heads_ar_allowed set to zero (its gradient, after each accumulation).
template <class T>
void heads_ar_mask(T* Wa) {
  for (int r = 0; r < kHeadsWidth; ++r)
    for (int c = 0; c < kHeadsWidth; ++c)
      if (!heads_ar_allowed(r, c)) Wa[r * kHeadsWidth + c] = T(0);
}

// The most likely controller, item by item: each item's logits (M, 81, in place) gain Wa's
// columns of the items chosen before it; a button is chosen when its logit is > 0, an axis takes
// its first largest class. On return logits are the conditioned ones, whose most likely items are
// the decoded controller.
template <class T>
void heads_ar_decode(size_t M, const T* Wa, T* logits) {
  for (size_t i = 0; i < M; ++i) {
    T* z = logits + i * kHeadsWidth;
    int chosen[kArItems];  // the column chosen per item, -1: a button not pressed
    for (int k = 0; k < kArItems; ++k) {
      const int c0 = ar_item_first_column(k), n = ar_item_width(k);
      for (int r = c0; r < c0 + n; ++r)
        for (int j = 0; j < k; ++j)
          if (chosen[j] >= 0) z[r] += Wa[r * kHeadsWidth + chosen[j]];
      if (k < kButtons) {
        chosen[k] = z[c0] > T(0) ? c0 : -1;
      } else {
        int best = 0;
        for (int q = 1; q < n; ++q)
          if (z[c0 + q] > z[c0 + best]) best = q;
        chosen[k] = c0 + best;
      }
    }
  }
}

// ---------------------------------------------------------------- loss

struct BcLossResult {
  double weight_sum = 0;  // Σ mask: the positions the means run over
  double total = 0;       // Σ_h w_h · loss_h (smoothed: what is optimised)
  double total_nll = 0;   // the same without label smoothing
  double loss[kHeads] = {}, nll[kHeads] = {}, acc[kHeads] = {};
  // Where the player's input changes (bc_change_forward; validation): an item — one of the 8
  // buttons, or a stick head — changes when its label differs from the previous input's class.
  // changed: Σ mask · changed items; changed_acc, changed_nll: the model's accuracy and NLL
  // over them. all_right: the share of positions with every head right (buttons: all 8).
  double changed[kHeads] = {}, changed_acc[kHeads] = {}, changed_nll[kHeads] = {};
  double all_right = 0;
  // How often a controller acts (a button, a stick off centre, the trigger; validation): the
  // recorded one, the policy's drawn at temperature 1 (the expectation, 1 - P(nothing)), and its
  // most likely one — shares of the positions.
  double acts_recorded = 0, acts_sampled = 0, acts_most_likely = 0;
};

// Scratch for bc_loss_forward/backward, sized for M positions by the caller:
//   targets (kStickHeads · M) i32: per stick head, the class (x heads mirrored), -1 where masked;
//   button_weights (M · kButtons): the mask repeated per button.
template <class T>
struct BcLossScratch {
  int32_t* targets;
  T* button_weights;
};

// Fills the scratch from the labels; throws on a class out of range at a valid position.
template <class T>
void bc_loss_prepare(size_t M, size_t window, const int32_t* target_sticks, const T* mask,
                     const uint8_t* mirrored, BcLossScratch<T> s) {
  for (size_t i = 0; i < M; ++i) {
    const bool valid = mask[i] > T(0);
    const bool m = mirrored && mirrored[i / window];
    for (int h = 0; h < kStickHeads; ++h) {
      int32_t c = target_sticks[i * kStickHeads + static_cast<size_t>(h)];
      if (valid && (c < 0 || c >= head_classes(h)))
        throw std::runtime_error("target_sticks: class " + std::to_string(c) + " of head " +
                                 kHeadNames[h + 1] + " at position " + std::to_string(i) +
                                 " is outside [0, " + std::to_string(head_classes(h)) + ")");
      if (m && mirrors_head(h)) c = mirror_stick_class(c);
      s.targets[static_cast<size_t>(h) * M + i] = valid ? c : -1;
    }
    std::fill_n(s.button_weights + i * kButtons, kButtons, valid ? mask[i] : T(0));
  }
}

// Loss = Σ_h w_h · (Σ_i mask_i · loss_hi) / Σ_i mask_i, loss_hi = BCE summed over the 8 buttons
// (head 0) or softmax cross-entropy (stick heads), both with label smoothing eps. acc/buttons
// is the per-button mean accuracy. Call bc_loss_prepare first.
template <class T>
BcLossResult bc_loss_forward(size_t M, const T* const logits[kHeads], const T* target_buttons,
                             const T* mask, const T* head_weights, T eps, BcLossScratch<T> s) {
  BcLossResult r;
  for (int h = 0; h < kHeads; ++h) {
    kernels::LossStats st, raw;
    if (h == 0) {
      st = kernels::bce_with_logits_forward<T>(logits[0], target_buttons, s.button_weights, nullptr,
                                               M * kButtons, eps);
      raw = eps == T(0)
                ? st
                : kernels::bce_with_logits_forward<T>(logits[0], target_buttons, s.button_weights,
                                                      nullptr, M * kButtons, T(0));
      r.weight_sum = st.weight_sum / kButtons;
      r.acc[0] = st.accuracy();
    } else {
      const int32_t* tg = s.targets + static_cast<size_t>(h - 1) * M;
      const size_t K = static_cast<size_t>(head_width(h));
      st = kernels::softmax_cross_entropy_forward<T>(logits[h], tg, mask, nullptr, nullptr, M, K,
                                                     eps);
      raw = eps == T(0) ? st
                        : kernels::softmax_cross_entropy_forward<T>(logits[h], tg, mask, nullptr,
                                                                    nullptr, M, K, T(0));
      r.acc[h] = st.accuracy();
    }
    r.loss[h] = st.loss_sum;
    r.nll[h] = raw.loss_sum;
  }
  for (int h = 0; h < kHeads; ++h) {
    r.loss[h] = r.weight_sum > 0 ? r.loss[h] / r.weight_sum : 0.0;
    r.nll[h] = r.weight_sum > 0 ? r.nll[h] / r.weight_sum : 0.0;
    r.total += static_cast<double>(head_weights[h]) * r.loss[h];
    r.total_nll += static_cast<double>(head_weights[h]) * r.nll[h];
  }
  return r;
}

// dlogits[h] (M, width_h) = d total / d logits[h], overwritten.
template <class T>
void bc_loss_backward(size_t M, const T* const logits[kHeads], const T* target_buttons,
                      const T* mask, const T* head_weights, T eps, double weight_sum,
                      BcLossScratch<T> s, T* const dlogits[kHeads]) {
  for (int h = 0; h < kHeads; ++h) {
    const T scale =
        weight_sum > 0 ? static_cast<T>(static_cast<double>(head_weights[h]) / weight_sum) : T(0);
    if (h == 0)
      kernels::bce_with_logits_backward<T>(logits[0], target_buttons, s.button_weights, dlogits[0],
                                           M * kButtons, eps, scale);
    else
      kernels::softmax_cross_entropy_backward<T>(
          logits[h], s.targets + static_cast<size_t>(h - 1) * M, mask, dlogits[h], M,
          static_cast<size_t>(head_width(h)), eps, scale);
  }
}

// ---------------------------------------------------------------- "repeat the last input" baseline

// The previous input's class per head element: 8 buttons (0/1), then the 5 stick heads.
inline constexpr int kRepeatItems = kButtons + kStickHeads;

template <class T>
inline int prev_class(const T* prev_controller_row, int item) {
  if (item < kButtons) return prev_controller_row[item] > T(0.5) ? 1 : 0;
  const int h = item - kButtons;
  const float v = static_cast<float>(prev_controller_row[kButtons + h]);
  return h == kShoulder ? shoulder_class(v) : stick_class(v);
}
template <class T>
inline int label_class(const T* target_buttons_row, const int32_t* target_sticks_row, int item) {
  if (item < kButtons) return target_buttons_row[item] > T(0.5) ? 1 : 0;
  return target_sticks_row[item - kButtons];
}

// How often the label repeats the previous input, over training positions (mask-weighted).
// Mirroring flips label and previous input alike, so raw (unmirrored) tensors are compared.
struct RepeatCounts {
  double total = 0;
  double same[kRepeatItems] = {};
  double p(int item, double prior) const { return total > 0 ? same[item] / total : prior; }
};

template <class T>
void count_repeats(size_t M, const T* prev_controller, const T* target_buttons,
                   const int32_t* target_sticks, const T* mask, RepeatCounts& c) {
  for (size_t i = 0; i < M; ++i) {
    const double w = static_cast<double>(mask[i]);
    if (!(w > 0)) continue;
    c.total += w;
    const T* pc = prev_controller + i * kControllerFeatures;
    for (int k = 0; k < kRepeatItems; ++k)
      if (label_class(target_buttons + i * kButtons, target_sticks + i * kStickHeads, k) ==
          prev_class(pc, k))
        c.same[k] += w;
  }
}

// The baseline as a distribution: P(previous input) = p, the rest spread evenly over the other
// classes (for a button: Bernoulli with P(previous state) = p_button). No label smoothing.
struct BaselineResult {
  double weight_sum = 0, total = 0;
  double loss[kHeads] = {}, acc[kHeads] = {};
  // Its NLL over the changed items (its accuracy there is 0 by construction), and its share of
  // positions with every head right: those where no item changes.
  double changed_nll[kHeads] = {};
  double all_right = 0;
};

inline constexpr double kBaselinePClamp = 1e-6;  // keeps the NLL finite when p reaches 0 or 1

template <class T>
BaselineResult baseline_forward(size_t M, const T* prev_controller, const T* target_buttons,
                                const int32_t* target_sticks, const T* mask, const T* head_weights,
                                const double p[kRepeatItems]) {
  double nll_same[kRepeatItems], nll_other[kRepeatItems];
  for (int k = 0; k < kRepeatItems; ++k) {
    const double q = std::clamp(p[k], kBaselinePClamp, 1.0 - kBaselinePClamp);
    const int K = k < kButtons ? 2 : head_classes(k - kButtons);
    nll_same[k] = -std::log(q);
    nll_other[k] = -std::log((1.0 - q) / (K - 1));
  }
  BaselineResult r;
  double loss[kHeads] = {}, correct[kHeads] = {}, changed[kHeads] = {}, changed_loss[kHeads] = {};
  double unchanged = 0;
  for (size_t i = 0; i < M; ++i) {
    const double w = static_cast<double>(mask[i]);
    if (!(w > 0)) continue;
    r.weight_sum += w;
    const T* pc = prev_controller + i * kControllerFeatures;
    bool all_same = true;
    for (int k = 0; k < kRepeatItems; ++k) {
      const bool same = label_class(target_buttons + i * kButtons, target_sticks + i * kStickHeads,
                                    k) == prev_class(pc, k);
      const int h = k < kButtons ? 0 : k - kButtons + 1;
      loss[h] += w * (same ? nll_same[k] : nll_other[k]);
      correct[h] += same ? w : 0.0;
      if (!same) {
        changed[h] += w;
        changed_loss[h] += w * nll_other[k];
        all_same = false;
      }
    }
    unchanged += all_same ? w : 0.0;
  }
  for (int h = 0; h < kHeads; ++h) {
    r.loss[h] = r.weight_sum > 0 ? loss[h] / r.weight_sum : 0.0;
    r.acc[h] = r.weight_sum > 0 ? correct[h] / (r.weight_sum * (h == 0 ? kButtons : 1)) : 0.0;
    r.changed_nll[h] = changed[h] > 0 ? changed_loss[h] / changed[h] : 0.0;
    r.total += static_cast<double>(head_weights[h]) * r.loss[h];
  }
  r.all_right = r.weight_sum > 0 ? unchanged / r.weight_sum : 0.0;
  return r;
}

// BcLossResult's view of the changed items and the all-heads-right share, from the logits (the
// model is right where a button's logit has the label's sign, a stick head's argmax is its
// class). `s` holds bc_loss_prepare's targets (mirrored where the window is); whether an item
// changed is read on the raw tensors, as the baseline reads it.
template <class T>
void bc_change_forward(size_t M, const T* const logits[kHeads], const T* target_buttons,
                       const int32_t* target_sticks, const T* mask, const T* prev_controller,
                       BcLossScratch<T> s, BcLossResult& r) {
  double weight = 0, all_right = 0, changed[kHeads] = {}, right[kHeads] = {}, nll[kHeads] = {};
  double acts_recorded = 0, acts_sampled = 0, acts_likely = 0;
  for (size_t i = 0; i < M; ++i) {
    const double w = static_cast<double>(mask[i]);
    if (!(w > 0)) continue;
    weight += w;
    const T* pc = prev_controller + i * kControllerFeatures;
    const T* tb = target_buttons + i * kButtons;
    const int32_t* ts = target_sticks + i * kStickHeads;
    bool every = true, recorded_acts = false, likely_acts = false;
    double log_still = 0;  // log P(the drawn controller does nothing)
    for (int b = 0; b < kButtons; ++b) {
      const double x = static_cast<double>(logits[0][i * kButtons + static_cast<size_t>(b)]);
      const double y = static_cast<double>(tb[b]);
      const bool ok = (x > 0) == (y > 0.5);
      every = every && ok;
      recorded_acts = recorded_acts || y > 0.5;
      likely_acts = likely_acts || x > 0;
      log_still -= std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x)));
      if (label_class(tb, ts, b) == prev_class(pc, b)) continue;
      changed[0] += w;
      right[0] += ok ? w : 0.0;
      nll[0] += w * (std::max(x, 0.0) - x * y + std::log1p(std::exp(-std::fabs(x))));
    }
    for (int h = 1; h < kHeads; ++h) {
      const size_t K = static_cast<size_t>(head_width(h));
      const T* x = logits[h] + i * K;
      const int32_t c = s.targets[static_cast<size_t>(h - 1) * M + i];
      size_t am = 0;
      for (size_t q = 1; q < K; ++q)
        if (x[q] > x[am]) am = q;
      const bool ok = static_cast<int32_t>(am) == c;
      every = every && ok;
      const int item = kButtons + h - 1;
      const int rest = h - 1 == kShoulder ? 0 : kStickClasses / 2;
      recorded_acts = recorded_acts || ts[h - 1] != rest;  // the rest class mirrors to itself
      likely_acts = likely_acts || static_cast<int>(am) != rest;
      const double mx = static_cast<double>(x[am]);
      double se = 0;
      for (size_t q = 0; q < K; ++q) se += std::exp(static_cast<double>(x[q]) - mx);
      log_still += static_cast<double>(x[rest]) - mx - std::log(se);
      if (label_class(tb, ts, item) == prev_class(pc, item)) continue;
      changed[h] += w;
      right[h] += ok ? w : 0.0;
      nll[h] += w * (mx + std::log(se) - static_cast<double>(x[c]));
    }
    all_right += every ? w : 0.0;
    acts_recorded += recorded_acts ? w : 0.0;
    acts_likely += likely_acts ? w : 0.0;
    acts_sampled += w * -std::expm1(log_still);
  }
  for (int h = 0; h < kHeads; ++h) {
    r.changed[h] = changed[h];
    r.changed_acc[h] = changed[h] > 0 ? right[h] / changed[h] : 0.0;
    r.changed_nll[h] = changed[h] > 0 ? nll[h] / changed[h] : 0.0;
  }
  r.all_right = weight > 0 ? all_right / weight : 0.0;
  r.acts_recorded = weight > 0 ? acts_recorded / weight : 0.0;
  r.acts_sampled = weight > 0 ? acts_sampled / weight : 0.0;
  r.acts_most_likely = weight > 0 ? acts_likely / weight : 0.0;
}

}  // namespace slipstream::melee

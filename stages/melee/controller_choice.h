// A controller as a bot presses it, chosen from the heads' outputs. At temperature T > 0 each
// button is pressed with probability sigmoid(z / T) and each stick axis and the trigger take a
// class drawn with weights p^(1/T), p the head's softmax; at T = 0 the most likely input (a
// button when z > 0, each axis at its most likely class). The policy library answers with it
// (policy/policy.cpp) and `slipstream infer` measures how often it acts. Autoregressive heads
// (controller_heads' `autoregressive`) are drawn item by item, each given the ones before.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/stage.h"
#include "stages/melee/model_math.h"
#include "stages/melee/window_index.h"

namespace slipstream::melee {

struct ChosenController {
  uint32_t buttons = 0;           // bit b: button b pressed
  int classes[kStickHeads] = {};  // main x/y, c x/y (0..16, 8 at rest), trigger (0..4)
  // Anything pressed: a button, a stick off centre or the trigger.
  bool acts() const {
    if (buttons) return true;
    for (int h = 0; h < kStickHeads; ++h)
      if (classes[h] != (h == kShoulder ? 0 : kStickClasses / 2)) return true;
    return false;
  }
};

// p = softmax(logits) over n classes.
inline void head_softmax(const float* logits, int n, float* p) {
  const float m = *std::max_element(logits, logits + n);
  float sum = 0;
  for (int i = 0; i < n; ++i) sum += p[i] = std::exp(logits[i] - m);
  for (int i = 0; i < n; ++i) p[i] /= sum;
}

// The distribution a policy answers with from one position's 81 logits `z`: each button's
// sigmoid, each stick head's and the shoulder's softmax, in the heads' column order.
inline void heads_distribution(const float z[kHeadsWidth], float d[kHeadsWidth]) {
  for (int k = 0; k < kButtons; ++k) d[k] = 1.0f / (1.0f + std::exp(-z[k]));
  for (int h = 1; h < kHeads; ++h)
    head_softmax(z + head_offset(h), head_width(h), d + head_offset(h));
}

// The draws are counter-based (splitmix64 of a key and an index, no generator state): game g's
// frame f draws item k's uniform from (frame_draws_key(game key, f), k). A device that samples a
// batch of games (the policy's kernel, melee_cuda.inc) draws the very same numbers from the same
// keys, with no per-game generator to keep in device memory or copy.
inline uint64_t frame_draws_key(uint64_t game_key, uint64_t frame) {
  return mix64(game_key ^ mix64(frame));
}
// A uniform in [0, 1) on a 2^-24 grid, exact in float.
inline float item_uniform(uint64_t frame_key, int item) {
  return static_cast<float>(mix64(frame_key + static_cast<uint64_t>(item)) >> 40) * 0x1p-24f;
}

// A class of `n` from logits `z` at `temperature` given the uniform `u`: class i with weight
// exp((z_i - max z) / T) — the softmax of z / T, i.e. each class's probability p_i^(1/T)
// renormalised — walked in class order against u · Σ weights; at T = 0 the largest logit (the
// first on ties). Float operations in a fixed order: the device kernel repeats them exactly.
inline int choose_class(const float* z, int n, float temperature, float u) {
  if (temperature <= 0) return static_cast<int>(std::max_element(z, z + n) - z);
  const float m = *std::max_element(z, z + n);
  float w[kStickClasses], sum = 0;
  for (int i = 0; i < n; ++i) sum += w[i] = std::exp((z[i] - m) / temperature);
  float target = u * sum;
  int last = 0;  // the last class of nonzero weight: where rounding leaves target >= 0
  for (int i = 0; i < n; ++i) {
    if (w[i] > 0) last = i;
    if ((target -= w[i]) < 0) return i;
  }
  return last;
}

// Button pressed at `temperature` given the uniform `u`: with probability sigmoid(z / T).
inline bool choose_button(float z, float temperature, float u) {
  return temperature <= 0 ? z > 0 : u < 1.0f / (1.0f + std::exp(-z / temperature));
}

// The controller's items in order (model_math.h: the 8 buttons, then main x, main y, c x, c y,
// shoulder), each drawn from its logits. `logits` (81) are the heads' outputs for one position;
// `ar` the autoregressive heads' weight (81, 81; null for independent heads). Those heads answer,
// outside training, with each item's logits conditioned on the most likely earlier items; here
// each item is conditioned on the items actually drawn before it instead (Wa's columns of the
// drawn items in, of the most likely ones out), so at temperature 0 the answer is the heads' own
// most likely controller. Item k's uniform is item_uniform(frame_key, k): the draws a key gives
// are fixed, on the CPU and on a device alike.
inline ChosenController choose_controller(const float logits[kHeadsWidth], const float* ar,
                                          float temperature, uint64_t frame_key) {
  int likely[kArItems], drawn[kArItems];      // a column per item; -1: a button not pressed
  for (int k = 0; ar && k < kArItems; ++k) {  // independent heads condition on nothing
    const float* z = logits + ar_item_first_column(k);
    likely[k] = k < kButtons ? (z[0] > 0 ? k : -1)
                             : ar_item_first_column(k) +
                                   static_cast<int>(std::max_element(z, z + ar_item_width(k)) - z);
  }
  ChosenController c;
  for (int k = 0; k < kArItems; ++k) {
    const int c0 = ar_item_first_column(k), n = ar_item_width(k);
    float z[kStickClasses];
    for (int q = 0; q < n; ++q) {
      z[q] = logits[c0 + q];
      if (!ar) continue;
      const float* row = ar + static_cast<size_t>(c0 + q) * kHeadsWidth;
      for (int j = 0; j < k; ++j) {
        if (drawn[j] == likely[j]) continue;
        if (drawn[j] >= 0) z[q] += row[drawn[j]];
        if (likely[j] >= 0) z[q] -= row[likely[j]];
      }
    }
    const float u = item_uniform(frame_key, k);
    if (k < kButtons) {
      const bool pressed = choose_button(z[0], temperature, u);
      drawn[k] = pressed ? c0 : -1;
      if (pressed) c.buttons |= 1u << k;
    } else {
      const int cls = choose_class(z, n, temperature, u);
      c.classes[k - kButtons] = cls;
      drawn[k] = c0 + cls;
    }
  }
  return c;
}

// The autoregressive weight (ar.weight, 81 × 81) of a controller_heads stage, where its
// parameters are; null when its heads are independent.
inline const Parameter* autoregressive_weight_parameter(Stage& heads) {
  for (const Parameter* p : heads.parameters())
    if (p->name == "ar.weight") return p;
  return nullptr;
}

// The same weight copied to the host, empty when the heads are independent.
inline std::vector<float> autoregressive_weight(Stage& heads) {
  const Parameter* p = autoregressive_weight_parameter(heads);
  if (!p) return {};
  const Tensor w = p->value.to(Device::cpu());
  return std::vector<float>(w.data<float>(), w.data<float>() + w.numel());
}

}  // namespace slipstream::melee

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
#include <random>
#include <vector>

#include "engine/stage.h"
#include "stages/melee/model_math.h"

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

// A class of `n` drawn from probabilities `p` at `temperature` (0: the most likely).
inline int choose_class(const float* p, int n, float temperature, std::mt19937_64& rng) {
  if (temperature <= 0) return static_cast<int>(std::max_element(p, p + n) - p);
  double w[kStickClasses], sum = 0;
  for (int i = 0; i < n; ++i)
    sum += w[i] = std::pow(std::max(double(p[i]), 1e-30), 1.0 / temperature);
  double u = std::uniform_real_distribution<double>(0, sum)(rng);
  for (int i = 0; i < n; ++i)
    if ((u -= w[i]) < 0) return i;
  return n - 1;
}

// The controller's items in order (model_math.h: the 8 buttons, then main x, main y, c x, c y,
// shoulder), each drawn from its logits. `logits` (81) are the heads' outputs for one position;
// `ar` the autoregressive heads' weight (81, 81; null for independent heads). Those heads answer,
// outside training, with each item's logits conditioned on the most likely earlier items; here
// each item is conditioned on the items actually drawn before it instead (Wa's columns of the
// drawn items in, of the most likely ones out), so at temperature 0 the answer is the heads' own
// most likely controller. One uniform draw per button and per axis, in item order: the draws a
// seed gives are fixed.
inline ChosenController choose_controller(const float logits[kHeadsWidth], const float* ar,
                                          float temperature, std::mt19937_64& rng) {
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
    if (k < kButtons) {
      const bool pressed = temperature <= 0 ? z[0] > 0
                                            : std::uniform_real_distribution<float>(0, 1)(rng) <
                                                  1.0f / (1.0f + std::exp(-z[0] / temperature));
      drawn[k] = pressed ? c0 : -1;
      if (pressed) c.buttons |= 1u << k;
    } else {
      float p[kStickClasses];
      head_softmax(z, n, p);
      const int cls = choose_class(p, n, temperature, rng);
      c.classes[k - kButtons] = cls;
      drawn[k] = c0 + cls;
    }
  }
  return c;
}

// The autoregressive weight (ar.weight, 81 × 81, on the host) of a controller_heads stage, empty
// when its heads are independent.
inline std::vector<float> autoregressive_weight(Stage& heads) {
  for (Parameter* p : heads.parameters())
    if (p->name == "ar.weight") {
      const Tensor w = p->value.to(Device::cpu());
      return std::vector<float>(w.data<float>(), w.data<float>() + w.numel());
    }
  return {};
}

}  // namespace slipstream::melee

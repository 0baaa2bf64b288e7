// A controller as a bot presses it, chosen from the heads' outputs. At temperature T > 0 each
// button is pressed with probability sigmoid(z / T) and each stick axis and the trigger take a
// class drawn with weights p^(1/T), p the head's softmax; at T = 0 the most likely input (a
// button when z > 0, each axis at its most likely class). The policy library answers with it
// (policy/policy.cpp) and `slipstream infer` measures how often it acts.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>

#include "stages/melee/batch_layout.h"

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

// Buttons first, then the five axes in head order: the draws a seed gives are fixed.
inline ChosenController choose_controller(const float button_logits[kButtons],
                                          const float* const probabilities[kStickHeads],
                                          float temperature, std::mt19937_64& rng) {
  ChosenController c;
  for (int b = 0; b < kButtons; ++b) {
    const float z = button_logits[b];
    const bool pressed = temperature <= 0 ? z > 0
                                          : std::uniform_real_distribution<float>(0, 1)(rng) <
                                                1.0f / (1.0f + std::exp(-z / temperature));
    if (pressed) c.buttons |= 1u << b;
  }
  for (int h = 0; h < kStickHeads; ++h)
    c.classes[h] = choose_class(probabilities[h], head_classes(h), temperature, rng);
  return c;
}

}  // namespace slipstream::melee

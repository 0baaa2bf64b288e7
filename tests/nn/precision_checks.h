// Checks the model stages' bf16 tests share: how far two float tensors are apart, and that a
// stage's bf16 shadows are the rounding of its FP32 weights.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/stage.h"
#include "kernels/bf16.h"

namespace slipstream::nn::test {

// max |a - b| / max |a| over two float tensors of one size.
inline double max_relative_difference(const Tensor& a, const Tensor& b) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    d = std::max(d, double(std::abs(a.data<float>()[i] - b.data<float>()[i])));
    m = std::max(m, double(std::abs(a.data<float>()[i])));
  }
  return d / m;
}

// Every parameter of `stage` has a bf16 shadow, element by element the rounding of its value.
inline void expect_shadows_are_roundings(Stage& stage) {
  for (Parameter* p : stage.parameters()) {
    EXPECT_TRUE(p->low_precision.defined()) << p->name;
    if (!p->low_precision.defined()) continue;
    int64_t differ = 0;
    for (int64_t i = 0; i < p->value.numel(); ++i)
      differ +=
          p->low_precision.data<uint16_t>()[i] != kernels::fp32_to_bf16(p->value.data<float>()[i]);
    EXPECT_EQ(differ, 0) << p->name;
  }
}

}  // namespace slipstream::nn::test

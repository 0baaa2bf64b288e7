// What one forward and one backward of a model cost in floating-point operations (a
// multiply-add counts 2; an exp or a division counts 1): the GEMMs, counted exactly, apart from
// the element-wise work (scans, norms, gates), which is an estimate from per-element counts.
// Stages report the sum through Stage::cost() for `slipstream summary`.
#pragma once

namespace slipstream::nn {

struct ModelFlops {
  double gemm_forward = 0, gemm_backward = 0, other_forward = 0, other_backward = 0;
  double forward() const { return gemm_forward + other_forward; }
  double backward() const { return gemm_backward + other_backward; }
};

}  // namespace slipstream::nn

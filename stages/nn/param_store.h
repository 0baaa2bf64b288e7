// A model stage's weights as three flat tensors (FP32 values, FP32 gradients, optional bf16
// shadow) and one Parameter view per slot of a ParamLayout. One allocation each, in setup; the
// views share the flat storage, so checkpoints and optimizers writing a Parameter write the
// buffer the model math reads.
#pragma once

#include <vector>

#include "engine/stage.h"
#include "stages/nn/param_layout.h"

namespace slipstream::nn {

class ParamStore {
 public:
  void allocate(const ParamLayout& layout, bool bf16_shadow);
  float* values() const { return values_.data<float>(); }
  float* grads() const { return grads_.data<float>(); }
  // Null when there is no shadow (fp32 runs).
  const uint16_t* shadow() const { return shadow_.defined() ? shadow_.data<uint16_t>() : nullptr; }
  // Rewrites the bf16 shadow from the FP32 values (after init or an outside write).
  void refresh_shadow() const;
  std::vector<Parameter*> pointers();
  size_t size() const { return static_cast<size_t>(values_.numel()); }

 private:
  Tensor values_, grads_, shadow_;
  std::vector<Parameter> params_;
};

}  // namespace slipstream::nn

// A model stage's weights as three flat tensors (FP32 values, FP32 gradients, optional bf16
// shadow) on the stage's device, and one Parameter view per slot of a ParamLayout. One
// allocation each, in setup; the views share the flat storage, so checkpoints and optimizers
// writing a Parameter write the buffer the model math reads.
#pragma once

#include <vector>

#include "engine/stage.h"
#include "stages/nn/param_layout.h"

namespace slipstream::nn {

class ParamStore {
 public:
  // `arena`, when given (a stage's ctx.run().param_arena), takes the store in once every
  // model stage is set up (engine/param_arena.h): the store's tensors and Parameters then view
  // its slices. The store must not move after this call (a stage member does not).
  void allocate(const ParamLayout& layout, bool bf16_shadow, const Device& device = Device::cpu(),
                ParamArena* arena = nullptr);
  // The initial values, written by init(float* host_values) on the host and copied to the
  // store's device (setup only).
  template <class Init>
  void initialize(Init&& init) {
    if (values_.device().is_cpu()) {
      init(values());
      return;
    }
    std::vector<float> host(size());
    init(host.data());
    values_.copy_from(Tensor::borrow(host.data(), values_.shape(), DType::f32, Device::cpu()));
  }
  float* values() const { return values_.data<float>(); }
  float* grads() const { return grads_.data<float>(); }
  // Null when there is no shadow (fp32 runs).
  const uint16_t* shadow() const { return shadow_.defined() ? shadow_.data<uint16_t>() : nullptr; }
  // Rewrites the bf16 shadow from the FP32 values (after init or an outside write), with the
  // ops the model runs on (cpu_ops.h, device_ops.h).
  template <class Ops>
  void refresh_shadow(const Ops& ops) const {
    if (shadow_.defined()) ops.to_bf16(values(), shadow_.data<uint16_t>(), size());
  }
  std::vector<Parameter*> pointers();
  size_t size() const { return static_cast<size_t>(values_.numel()); }

 private:
  // Points the store and its Parameters (the same objects) at flat buffers of its size.
  void bind(const Tensor& values, const Tensor& grads, const Tensor& shadow);

  Tensor values_, grads_, shadow_;
  std::vector<ParamSlot> slots_;
  std::vector<Parameter> params_;
};

}  // namespace slipstream::nn

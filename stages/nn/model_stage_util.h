// Small helpers shared by the model stages (mamba, gru).
#pragma once

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/graph.h"
#include "engine/stage.h"

namespace slipstream::nn {

// Whether anything upstream wants the gradient of input `port`: false when its producer is not
// differentiable (a data stage), which saves the input-gradient GEMM of the first layer. True
// when the producer is unknown (a stage run alone by StageHarness).
inline bool input_grad_wanted(StageContext& ctx, size_t port_index) {
  const GraphPlan& plan = ctx.graph_plan();
  for (const auto& s : plan.stages) {
    if (s.name != ctx.name()) continue;
    if (port_index >= s.inputs.size() || s.inputs[port_index].producer < 0) return true;
    return plan.stages[static_cast<size_t>(s.inputs[port_index].producer)]
        .schema->is_differentiable();
  }
  return true;
}

// The (B, W, D) shape of a sequence input on the stage's device, checked.
inline void check_sequence(const StageContext& ctx, const Tensor& x, int64_t d,
                           const Device& device = Device::cpu()) {
  if (x.dtype() != DType::f32 || x.rank() != 3 || x.dim(2) != d || x.device() != device)
    throw std::runtime_error("stage '" + ctx.name() + "': input x must be f32 (B, W, " +
                             std::to_string(d) + ") on " + device.str() + ", got " + x.describe());
}

// Each layer's parameters (names "layers.<l>.") of a model with `layers` layers, so its backward
// pass can announce a layer's gradients final as it leaves the layer (the reducer of a
// multi-rank run starts sending them while the layers below compute theirs).
inline std::vector<std::vector<Parameter*>> parameters_by_layer(
    const std::vector<Parameter*>& params, int layers) {
  std::vector<std::vector<Parameter*>> out(static_cast<size_t>(layers));
  for (Parameter* p : params)
    for (int l = 0; l < layers; ++l)
      if (p->name.starts_with("layers." + std::to_string(l) + "."))
        out[static_cast<size_t>(l)].push_back(p);
  return out;
}

// The gradient of the output must match the output a stage produced.
inline void check_output_grad(const StageContext& ctx, const Tensor& dy, const Tensor& y) {
  if (!(dy.shape() == y.shape()) || dy.dtype() != DType::f32)
    throw std::runtime_error("stage '" + ctx.name() + "': gradient of y is " + dy.describe() +
                             ", expected " + y.describe());
}

// A model stage's state on a stream (Runner::stream) on the CPU: a recurrent form of the model
// (Recurrent(config, B) with step(x (B, din), w, y (B, dout))) whose row r continues sequence r
// from batch to batch. begin() starts every sequence afresh. (On a device the stage's model
// carries the state itself: sequence_stage.h.)
template <class Recurrent, class Config>
class FrameStream {
 public:
  void begin() {
    model_.reset();  // sized, at the start of every sequence, by the first batch
  }

  // Row `row` starts its sequence again; the others keep their state. Before the first batch
  // (no state yet) every row starts from zero anyway.
  void reset_row(int64_t row) {
    if (model_) model_->reset(static_cast<int>(row));
  }

  // y (B, W, dout) from x (B, W, din): each row's W frames in order, state carried.
  void forward(const Config& c, const Tensor& x, const float* w, Tensor& y, size_t din,
               size_t dout) {
    const int B = static_cast<int>(x.dim(0)), W = static_cast<int>(x.dim(1));
    if (model_ && model_->batch() != B)
      throw std::runtime_error("a stream of " + std::to_string(model_->batch()) +
                               " sequence(s) got a batch of " + std::to_string(B));
    if (!model_) {
      model_ = std::make_unique<Recurrent>(c, B);
      // Weights do not change during a stream (no training step runs).
      if constexpr (requires { model_->hold_weights(w); }) model_->hold_weights(w);
      in_.assign(static_cast<size_t>(B) * din, 0.0f);
      out_.assign(static_cast<size_t>(B) * dout, 0.0f);
    }
    const float* xs = x.data<float>();
    float* ys = y.data<float>();
    const size_t Bs = static_cast<size_t>(B), Ws = static_cast<size_t>(W);
    for (size_t t = 0; t < Ws; ++t) {
      for (size_t r = 0; r < Bs; ++r) std::copy_n(xs + (r * Ws + t) * din, din, &in_[r * din]);
      model_->step(in_.data(), w, out_.data());
      for (size_t r = 0; r < Bs; ++r) std::copy_n(&out_[r * dout], dout, ys + (r * Ws + t) * dout);
    }
  }

 private:
  std::unique_ptr<Recurrent> model_;
  std::vector<float> in_, out_;
};

}  // namespace slipstream::nn

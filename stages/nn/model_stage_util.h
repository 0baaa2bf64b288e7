// Small helpers shared by the model stages (mamba, gru).
#pragma once

#include <stdexcept>
#include <string>

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

// The gradient of the output must match the output a stage produced.
inline void check_output_grad(const StageContext& ctx, const Tensor& dy, const Tensor& y) {
  if (!(dy.shape() == y.shape()) || dy.dtype() != DType::f32)
    throw std::runtime_error("stage '" + ctx.name() + "': gradient of y is " + dy.describe() +
                             ", expected " + y.describe());
}

}  // namespace slipstream::nn

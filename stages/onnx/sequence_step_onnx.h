// The temporal models' one-frame step as ONNX (for `slipstream export --format onnx`): the math
// of nn::MambaRecurrent and nn::GruRecurrent (stages/nn/*_recurrent.h) for a batch of independent
// streams, each layer's state an input and its next value an output, so a caller runs the graph
// once per frame and feeds the states back (zeros before a stream's first frame).
//   mamba: inputs PREFIX.conv.L (B, d_conv - 1, d_inner), the layer's last inputs to the conv,
//          oldest first (none when d_conv is 1), and PREFIX.ssm.L (B, d_inner, d_state);
//   gru:   PREFIX.h.L (B, hidden), ONNX's GRU operator (linear_before_reset, PyTorch's gates);
// outputs the same names with ".next".
#pragma once

#include <functional>
#include <string>

#include "engine/tensor.h"
#include "stages/nn/gru_model.h"
#include "stages/nn/mamba_model.h"
#include "stages/onnx/onnx_graph.h"

namespace slipstream::onnx_export {

// A parameter of the model by its name in the stage (e.g. "layers.0.mixer.D"): a host f32
// tensor of the layout's shape; throws naming what is missing.
using WeightOf = std::function<const Tensor&(const std::string&)>;
// Its values, checked to be n floats (throws naming the parameter and what it holds).
const float* weight_values(const WeightOf& w, const std::string& name, size_t n);

// x (B, din) -> y (B, d_model) after the final norm.
std::string mamba_step(OnnxGraph& g, const nn::MambaConfig& c, const WeightOf& w,
                       const std::string& x, const std::string& prefix);
// x (B, din) -> y (B, hidden), the last layer's state.
std::string gru_step(OnnxGraph& g, const nn::GruConfig& c, const WeightOf& w, const std::string& x,
                     const std::string& prefix);

}  // namespace slipstream::onnx_export

// The Melee policy's one-frame step as an ONNX model (`slipstream export --format onnx`): the
// trained graph's melee_embedding, its temporal model (mamba or gru, stages/onnx/) and its
// controller_heads, with the checkpoint's weights as initializers. Inputs per frame, B streams at
// once: the loader's tensors of that frame (numeric (B, 3, 18) f32, action and character (B, 3)
// i64, stage (B) i64, prev_controller (B, 13) f32, docs/melee_features.md) and the temporal
// model's state (zeros at a stream's first frame); outputs the 81 logits, each head's
// probabilities (buttons: sigmoid; sticks and shoulder: softmax) and the next state.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/graph.h"
#include "engine/tensor.h"
#include "stages/onnx/onnx_graph.h"

namespace slipstream::melee {

struct PolicyOnnx {
  std::unique_ptr<onnx_export::OnnxGraph> graph;
  std::vector<std::string> state_inputs;  // in the order the model declares them
  std::string core_kind;                  // mamba or gru
};

// From the planned graph (its stages' parameters) and the checkpoint's weights ("stage.param"
// names). Throws naming what it cannot export: a graph other than replays -> melee_embedding ->
// mamba | gru -> controller_heads, autoregressive heads (their in-order sampling is not in the
// step), a missing or misshapen parameter.
PolicyOnnx build_policy_onnx(const GraphPlan& plan, const std::map<std::string, Tensor>& weights);

}  // namespace slipstream::melee

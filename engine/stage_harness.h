// Runs one stage alone on given tensors: forward, and backward when output gradients are given.
// Backs `slipstream stage run` (compare a stage with another implementation on the same numbers)
// and the stages' own tests (finite-difference checks through the real stage code).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/graph.h"

namespace slipstream {

class StageHarness {
 public:
  // overrides: "param=value" (YAML values); the stage is named `name` (parameter names in
  // weight files are "<name>.<param>" or just "<param>").
  StageHarness(const std::string& kind, const std::vector<std::string>& overrides,
               const std::string& name = "stage", Precision precision = Precision::fp32,
               uint64_t seed = 1);
  ~StageHarness();

  // Declares the input shapes and runs setup(). Inputs not given stay unconnected. An output
  // setup leaves undeclared is an error, as in a graph.
  void setup(const std::map<std::string, Tensor>& inputs);
  Stage& stage();
  StageContext& context();
  RunState& run();

  // Loads weights (names with or without the "<name>." prefix); every parameter must be present.
  void load_weights(const std::map<std::string, Tensor>& weights);
  std::map<std::string, Tensor> weights();  // "<param>" -> value

  // Forward on the inputs; returns outputs by port name. A training forward on inputs of
  // setup's shapes must set every output, each of the shape setup declared (what a graph's
  // consumers were promised): otherwise an error naming the output.
  std::map<std::string, Tensor> forward(const std::map<std::string, Tensor>& inputs,
                                        bool training = true);
  // Backward after forward: output gradients by port name (none for a loss stage). Returns the
  // input gradients as "grad.<port>" and the parameter gradients as "grad.<param>" (parameter
  // gradients are zeroed first, so they are this call's alone).
  std::map<std::string, Tensor> backward(const std::map<std::string, Tensor>& output_grads);

  std::map<std::string, double> metrics() const { return metrics_; }

 private:
  GraphPlan plan_;
  RunState run_;
  std::unique_ptr<Stage> stage_;
  std::unique_ptr<StageContext> ctx_;
  Batch batch_;
  std::map<std::string, double> metrics_;
  std::map<std::string, Shape> setup_shapes_;  // the inputs setup saw
};

}  // namespace slipstream

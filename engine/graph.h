// A validated graph: stages in topological order with their resolved parameters, port bindings
// and tensor slots; then instantiated and set up. All validation happens in plan_graph, before
// anything runs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/stage.h"

namespace slipstream {

// The run section's schema (device, precision, seed, epochs, steps, ...), validated like a
// stage's params; `slipstream stages run` prints it.
const StageSchema& run_schema();

struct PortBinding {
  int producer = -1;  // stage index in topological order
  int producer_port = -1;
  int slot = -1;
  int grad_slot = -1;
};

struct SlotInfo {
  explicit SlotInfo(std::string n = {}) : name(std::move(n)) {}
  std::string name;  // "embed.y" or "grad:embed.y"
  Shape shape;       // declared in setup (-1 for dimensions known only per batch)
  DType dtype = DType::f32;
  bool declared = false;
  // The slot of this output's bf16 copy ("bf16:embed.y"), where a stage it feeds reads one
  // (StageSchema::reads_bf16_copy); -1: none.
  int bf16_copy = -1;
};

struct PlannedStage {
  std::string name;
  const StageSchema* schema = nullptr;
  Params params;
  SourceMark mark;
  int concurrency = 1;
  std::vector<int> upstream;           // direct producers (stage indices)
  std::vector<PortBinding> inputs;     // per schema input port
  std::vector<int> output_slots;       // per schema output port
  std::vector<int> output_grad_slots;  // per schema output port
  std::vector<int> passthrough_slots;  // passthrough stages: the tensors they act on
  bool in_section = false;             // part of the trainable section
  bool after_loss = false;             // runs after the backward pass
};

struct GraphPlan {
  Config config;
  Params run;
  std::vector<PlannedStage> stages;  // topological order
  std::vector<SlotInfo> slots;
  int head_end = 0;                     // stages [0, head_end) are the source and its rebatchers
  int section_begin = 0;                // stages [section_begin, size) form the trainable section
  int64_t micro_batches = 1;            // batches per optimizer step (StageSchema::micro_batches())
  std::vector<Stage*> instances;        // filled by Graph
  std::vector<StageContext*> contexts;  // filled by Graph
};

// Loads plugins, checks kinds, parameters (names, types, ranges, required), inputs (existing,
// acyclic, port dtype/rank), roles and ordering; throws ConfigError listing every problem.
GraphPlan plan_graph(Config config);

// The planned graph as a self-contained graph file (every stage parameter resolved, the run
// section): RUN/config.yaml, and the `slipstream.config` metadata of a checkpoint's weights.
std::string resolved_config_yaml(const GraphPlan& plan);

// Instantiated stages with their contexts; setup() runs each stage's setup in order.
class Graph {
 public:
  Graph(GraphPlan plan, RunState& run);
  ~Graph();
  void setup();
  GraphPlan& plan() { return plan_; }
  size_t size() const { return stages_.size(); }
  Stage& stage(size_t i) { return *stages_[i]; }
  StageContext& context(size_t i) { return *contexts_[i]; }
  int find(std::string_view name) const;  // -1 when absent
  Batch new_batch() const;                // slots sized for this graph

 private:
  GraphPlan plan_;
  std::vector<std::unique_ptr<Stage>> stages_;
  std::vector<std::unique_ptr<StageContext>> contexts_;
};

}  // namespace slipstream

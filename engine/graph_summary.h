// What a graph is before it runs (`slipstream summary`): each stage's parameters and its cost
// in floating-point operations per optimizer step, and the totals. Built by setting the graph up
// on its device (Runner::setup_only); no batch runs.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace slipstream {

class Runner;

struct GraphSummary {
  std::string graph_file, device, precision;
  int64_t samples_per_batch = 0;  // the source side's declared batch rows; 0 when per batch
  int64_t micro_batches = 1;      // batches per optimizer step
  struct Stage {
    std::string name, kind;
    bool in_section = false;
    uint64_t parameters = 0;                       // weights (elements)
    uint64_t tensors = 0;                          // parameter tensors
    double forward_flops = 0, backward_flops = 0;  // per batch
    double update_flops = 0;                       // per optimizer step
    double step_flops = 0;                         // micro_batches x (forward + backward) + update
  };
  std::vector<Stage> stages;
  uint64_t parameters = 0;
  double step_flops = 0;    // every stage's, one optimizer step
  double sample_flops = 0;  // step_flops per sample (0 when the batch rows are unknown)
};

// Sets the runner's graph up and reads every stage's parameters and Stage::cost().
GraphSummary summarize_graph(Runner& runner);

std::string format_graph_summary(const GraphSummary& s);
nlohmann::json graph_summary_json(const GraphSummary& s);

}  // namespace slipstream

// The device's time in each operation of a run's CUDA graphs (StepGraphs::time_operations,
// `slipstream bench --op-times`): where a training step's device time goes, kernel by kernel
// and stage by stage, read from time stamps between the operations of the graph as it runs —
// no profiler needed, caches and clocks as the step leaves them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace slipstream {

struct OperationTime {
  std::string what;        // the kernel or call (a recorded operation's name)
  int stage = -1;          // the graph stage that enqueued it
  std::string stage_name;  // set by the runner ("" when unknown)
  uint64_t launches = 0;
  double device_ms = 0;  // summed over its launches
};

struct OperationTimes {
  uint64_t graphs = 0;             // graph launches timed
  uint64_t untimed = 0;            // batches in the timed steps whose work ran without a graph
  double graph_ms = 0;             // the timed launches from their first stamp to their last
  std::vector<OperationTime> ops;  // most device time first
};

// A table for people: the device's time a `unit` ("step", "frame": `batches_per_unit` timed
// graphs each) and each operation's calls, microseconds and share a unit, most first (the first
// 30; the rest summed on one line), after a line that says what was timed.
std::string format_operation_times(const OperationTimes& t, uint64_t batches_per_unit,
                                   const std::string& unit);
// The same as JSON: graphs_timed, untimed_batches, batches_per_<unit>, device_ms_per_<unit>,
// ops [{what, stage, calls_per_<unit>, us_per_<unit>, share_pct}].
nlohmann::json operation_times_json(const OperationTimes& t, uint64_t batches_per_unit,
                                    const std::string& unit);

// --op-times' overrides for a command's --device: under "emulated", where run.cuda_graph's auto
// is off, graph mode on (the stamps live in the graph) unless `sets` already set it.
void add_operation_time_sets(std::vector<std::string>& sets, const std::string& device);

}  // namespace slipstream

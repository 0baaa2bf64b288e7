// `auto` batch sizes (StageSchema::batch_size(), e.g. replays.batch_size: auto): before a run
// starts, the largest batch that fits its device's memory.
//
// Probes train two steps of the same graph at 8 and at 32 samples (RunOptions::embedded: nothing
// written) and read the peak of the device's memory pool; the peak is fitted as
// fixed + batch · per_sample (weights, optimizer state and workspaces; activations, gradients
// of activations and the prefetch ring), and the batch is the largest multiple of 8 whose fitted
// peak stays within 90% of the budget — run.device_memory, or what the device has free when the
// run starts. A probe at that size checks it; one that runs out of memory, or past the budget,
// takes 15% off and tries again (three times at most). The pool's cache is then given back, so
// the run starts with the memory the probes measured.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/device.h"
#include "engine/graph.h"

namespace slipstream {

struct AutoBatch {
  std::string param;  // "replays.batch_size"
  int64_t batch = 0;
  double budget_bytes = 0;      // 90% of the memory the run may use
  double fixed_bytes = 0;       // the fit's intercept
  double per_sample_bytes = 0;  // ... and slope
  double peak_bytes = 0;        // the checking probe's peak at `batch` (this rank's choice)
  int ranks = 1;                // several: each probed its device, all take the smallest choice
  std::string summary() const;  // one line for the run's log
};

// The graph's batch-size parameters (StageSchema::batch_size()) that its stages hold: (stage
// index, spec) in graph order.
std::vector<std::pair<size_t, const ParamSpec*>> batch_size_params(const GraphPlan& plan);

// Replaces the plan's `auto` batch size (one at most) by the chosen number; nullopt when no
// parameter is auto. `device` is where the run trains. With several ranks each probes its own
// device as one process (RunOptions::single_process) and all take the smallest choice
// (RankReduce::min through engine/rank_reduce.h: every rank must call this, as every rank's
// Runner does). Throws std::runtime_error naming the parameter when it cannot choose: a CPU
// run, an emulated device without run.device_memory, not even 8 samples fitting, or a probe
// failing for another reason than memory.
std::optional<AutoBatch> resolve_auto_batch(GraphPlan& plan, const DeviceChoice& device,
                                            int world_size);

struct RunOptions;
// The same for a run about to be built with `options`, before its Runner (which refuses an
// `auto` left in its plan): the device and world size that Runner will have (run.device, the
// launcher's rank), the choice's line added to options.notes for the run's log.
void resolve_auto_batch(GraphPlan& plan, RunOptions& options);

}  // namespace slipstream

// Checkpoints: a directory `step-<N>/` holding
//   model.safetensors  every trainable parameter, named "<stage>.<param>" (FP32 master values);
//   state.safetensors  every stage's save() output (optimizer moments, EMA, RNG, ...) under
//                      "<stage>.<key>", with scalars and the run position in the metadata
//                      (run.step, run.next_batch, run.seed, run.precision).
// Files are written atomically; a checkpoint directory is complete once `DONE` exists in it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace slipstream {

struct GraphPlan;
struct RunState;

struct CheckpointInfo {
  std::string dir;
  uint64_t step = 0;
  uint64_t next_batch = 0;
};

// Writes a checkpoint of every stage of `graph` into `dir` (created; replaced if present).
// `next_batch` is the index of the first batch not yet trained on.
void save_checkpoint(GraphPlan& graph, const RunState& run, uint64_t next_batch,
                     const std::string& dir);
// Loads parameters and stage state from `dir`; returns the position to resume from.
CheckpointInfo load_checkpoint(GraphPlan& graph, const std::string& dir);
// The newest complete checkpoint under `run_dir/checkpoints/`, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

}  // namespace slipstream

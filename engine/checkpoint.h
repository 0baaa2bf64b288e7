// Checkpoints: a directory `step-<N>/` holding
//   model.safetensors  every trainable parameter, named "<stage>.<param>" (FP32 master values),
//                      and in its metadata `slipstream.config`: the resolved graph file that
//                      made them (RUN/config.yaml at that step), so the file alone rebuilds it;
//   state.safetensors  every stage's save() output (optimizer moments, EMA, RNG, ...) under
//                      "<stage>.<key>", with scalars and the run position in the metadata
//                      (run.step, run.next_batch, run.seed, run.precision).
// Files are written atomically; a checkpoint directory is complete once `DONE` exists in it.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace slipstream {

struct GraphPlan;
struct RunState;

struct CheckpointInfo {
  std::string dir;
  uint64_t step = 0;
  uint64_t next_batch = 0;
  int world_size = 1;  // ranks that trained it (1 for checkpoints written before it was saved)
  // Early stopping's books at the checkpoint (RunState): the lowest validation loss (none before
  // the first validation) and the validations since it improved.
  std::optional<double> best_validation_loss;
  int64_t validations_without_improvement = 0;
};

// Writes a checkpoint of every stage of `graph` into `dir` (created; replaced if present).
// `next_batch` is the index of the first batch not yet trained on. A write whose folder was
// removed from under it (the run directory deleted meanwhile) throws CheckpointRemoved; any
// other failure (a full disk) its own error; either way nothing of `dir`.tmp is left.
struct CheckpointRemoved : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void save_checkpoint(GraphPlan& graph, const RunState& run, uint64_t next_batch,
                     const std::string& dir);
// Loads parameters and stage state from `dir`; returns the position to resume from. Stages
// before `first_stage` (e.g. the data stages when scoring other data) keep their own state.
CheckpointInfo load_checkpoint(GraphPlan& graph, const std::string& dir, size_t first_stage = 0);
// Loads only the trainable parameters (model.safetensors) of every stage that has some: a warm
// start. Every parameter must be in the file with its shape. Returns the checkpoint's step.
uint64_t load_weights(GraphPlan& graph, const std::string& dir);
// "step-120" -> 120, "best-step-120" -> 120 (with `prefix` "best-step-"): the names checkpoints
// are written under. Anything else, such as "step-120.bak" or "step-120-good", is none.
bool checkpoint_step(const std::string& name, const std::string& prefix, uint64_t& step);
// Either name a run writes: "step-N" (periodic) or "best-step-N".
bool run_checkpoint_step(const std::string& name, uint64_t& step);
// The newest complete checkpoint under `run_dir/checkpoints/`, if any; with `before`, the newest
// of those of a lower step.
std::optional<std::string> latest_checkpoint(const std::string& run_dir,
                                             std::optional<uint64_t> before = {});
// For a run without a periodic checkpoint: its complete best ones and how to go on from one
// ("; its best checkpoint: best-step-100 (give RUN/checkpoints/best-step-100 for the newest)"),
// or "".
std::string best_checkpoints_note(const std::string& run_dir);

// A path a user gave for a checkpoint: a run directory (its newest checkpoint), one of its
// checkpoints (RUN/checkpoints/step-N), or a checkpoint directory on its own (copied out of its
// run; its model.safetensors names one too). `checkpoint` is empty when `path` names a run
// directory (the caller picks latest_checkpoint; `graph_file` is then empty too); `run_dir` is
// empty for a checkpoint on its own; `error` says what is wrong when it is none of these.
struct CheckpointPath {
  std::string run_dir;     // holds config.yaml
  std::string checkpoint;  // a checkpoint directory, or empty
  // What rebuilds the model, for load_config: the graph its model.safetensors carries
  // (`slipstream.config`, the run's config.yaml at that step), or for checkpoints written before
  // the weights carried one, the run's config.yaml.
  std::string graph_file;
  // How the run's config.yaml now differs from the graph the checkpoint was trained with (a
  // later resume's --set), one setting a line; run: settings aside. Callers say so.
  std::vector<std::string> config_changes;
  std::string error;
};
CheckpointPath resolve_checkpoint_path(const std::string& path);
// For `--resume PATH` of a run directory whose config.yaml is missing or empty (deleted, or left
// empty by a full disk) while its checkpoints are there: config.yaml written again from the graph
// the checkpoint to resume carries (PATH's own step-N, or the run's newest), so the run goes on
// with its optimizer state. Returns the line saying so, or "" when nothing was done.
std::string restore_run_config(const std::string& path);
// The same, with a run directory's newest complete checkpoint filled in (an error when it has
// none): the checkpoint a user means by `path` (eval, infer, run.init_from).
CheckpointPath find_checkpoint(const std::string& path);

}  // namespace slipstream

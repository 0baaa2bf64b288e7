// Small runs of the real behaviour-cloning graph (configs/train_bc.yaml) for integration tests.
#pragma once

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "engine/graph.h"
#include "engine/runner.h"
#include "stages/melee/slp/synth.h"

namespace slipstream::testing {

inline std::string source_path(const std::string& rel) {
  return std::string(SLIPSTREAM_SOURCE_DIR) + "/" + rel;
}

inline std::string shared_replays() {
  std::string p = std::string(SLIPSTREAM_SOURCE_DIR) + "/../shared/replays";
  return std::filesystem::exists(p) ? p : std::string();
}

// A tiny model and short windows so a step takes milliseconds.
inline std::vector<std::string> tiny_overrides(const std::string& dir) {
  return {"replays.batch_size=8",
          "replays.window=16",
          "replays.stride=16",
          "replays.synthetic=6",
          "replays.synthetic_dir=" + dir + "/synth",
          "core.d_model=16",
          "core.layers=1",
          "core.d_state=8",
          "embed.action_dim=8",
          "step.lr=1.0e-3",
          "run.runs_dir=" + dir + "/runs",
          "run.log_every=1000",
          "run.validate_every=0",
          "run.device=cpu"};
}

inline RunOptions quiet_run_options(std::ostream& log) {
  RunOptions o;
  o.publish_stats = false;
  o.log = &log;
  return o;
}

// A tiny run that validates on two pinned synthetic games; returns its result. `graph` and
// `core` choose the temporal model (the tiny sizes of tiny_overrides are Mamba's).
inline RunResult train_with_pinned_validation(const std::string& dir, const std::string& val_dir,
                                              int steps, const std::string& graph = "train_bc.yaml",
                                              const std::vector<std::string>& core = {}) {
  slp::write_synthetic_games(val_dir, 2, 99, 900);
  auto sets = tiny_overrides(dir);
  if (!core.empty()) {
    std::erase_if(sets, [](const std::string& s) { return s.starts_with("core."); });
    sets.insert(sets.end(), core.begin(), core.end());
  }
  sets.push_back("replays.validation_paths=[" + val_dir + "]");
  sets.push_back("run.steps=" + std::to_string(steps));
  sets.push_back("run.validate_every=4");
  sets.push_back("run.validate_batches=all");
  sets.push_back("step.ema=0.9");  // eval must score the EMA weights, as validation does
  std::ostringstream log;
  Runner r(plan_graph(load_config(source_path("configs/" + graph), sets)), quiet_run_options(log));
  return r.run();
}

}  // namespace slipstream::testing

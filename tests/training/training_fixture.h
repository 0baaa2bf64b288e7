// Small runs of the real behaviour-cloning graph (configs/train_bc.yaml) for integration tests.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "engine/runner.h"

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

}  // namespace slipstream::testing

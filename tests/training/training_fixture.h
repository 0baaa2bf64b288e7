// Small runs of the real behaviour-cloning graph (configs/train_bc.yaml) for integration tests.
#pragma once

#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/graph.h"
#include "engine/runner.h"
#include "stages/melee/replay_scoring.h"
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

// Every head's logits of the first `frames` positions of port 1's view of `replay` under the
// checkpoint `run_dir` trained last: from one window forward (`streaming` false), or frame by
// frame through Runner::stream, as `infer` and the policy library play; with `sets` (e.g.
// run.device=...) over the run's config; `result`, when given, gets the pass's EvalResult.
inline std::vector<std::vector<float>> head_outputs(const std::string& run_dir,
                                                    const std::string& replay, int frames,
                                                    bool streaming,
                                                    const std::vector<std::string>& sets = {},
                                                    EvalResult* result = nullptr,
                                                    std::optional<uint64_t> time_after = {}) {
  const int window = streaming ? 1 : frames;
  melee::ReplaySelection sel{{replay}, 1, "test", {}};
  sel.loader = {{"batch_size", YAML::Node(1)},
                {"window", YAML::Node(window)},
                {"stride", YAML::Node(window)},
                {"shuffle", YAML::Node(false)}};
  std::ostringstream log;
  RunOptions opt = quiet_run_options(log);
  opt.create_run_dir = false;
  opt.handle_sigint = false;
  opt.time_operations_after_batches = time_after;  // EvalResult::operation_times
  Runner r(plan_graph(melee::config_for_replays(run_dir + "/config.yaml", sets, sel)), opt);
  const int heads = r.graph().find("heads");
  std::vector<std::vector<float>> out(6);
  const char* names[6] = {"buttons", "main_x", "main_y", "c_x", "c_y", "shoulder"};
  auto take = [&](const Batch& b, double) {
    for (int h = 0; h < 6; ++h) {
      const Tensor t =
          r.graph().context(static_cast<size_t>(heads)).output(b, names[h]).to(Device::cpu());
      const float* p = t.data<float>();
      out[static_cast<size_t>(h)].insert(out[static_cast<size_t>(h)].end(), p, p + t.numel());
    }
  };
  const std::string ckpt = *latest_checkpoint(run_dir);
  const EvalResult e = streaming ? r.stream(ckpt,
                                            [&](const Batch& b, double s) {
                                              if (b.index < static_cast<uint64_t>(frames))
                                                take(b, s);
                                            })
                                 : r.evaluate(ckpt, [&](const Batch& b, double s) {
                                     if (b.index == 0) take(b, s);
                                   });
  if (result) *result = e;
  return out;
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

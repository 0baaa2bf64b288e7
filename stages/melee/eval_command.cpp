// `slipstream eval`: scores a training checkpoint on replays, with the run's own graph
// (config.yaml; for a checkpoint copied out of its run, the one its weights carry), so the
// features, windows and heads are the ones it trained with. The replay loader is pointed at the
// given replays, all of them in its validation split, and the engine's Runner::evaluate runs one
// validation pass over every window: the figures are the ones a validation pass of the run reports
// on the same games. Printed as a per-head table of the model and the repeat-the-previous-input
// baseline, and as JSON with --json.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/command_registry.h"
#include "engine/graph.h"
#include "engine/runner.h"
#include "stages/melee/model_math.h"
#include "stages/melee/replay_scoring.h"

namespace slipstream::melee {
namespace {

namespace fs = std::filesystem;

struct EvalArgs {
  std::string checkpoint;
  std::vector<std::string> replays;
  std::optional<int> port;
  std::string json;
  std::string device;
  std::vector<std::string> sets;
  bool whole_games = false;  // rows: streams, the model's state carried through each game
};

nlohmann::json number(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

nlohmann::json report_json(const EvalResult& r, const std::string& checkpoint, const EvalArgs& a,
                           const std::string& perspectives, const TrainingOverlap& overlap) {
  nlohmann::json j;
  j["checkpoint"] = fs::absolute(checkpoint).lexically_normal().string();
  j["step"] = r.step;
  j["replays"] = a.replays;
  j["perspectives"] = perspectives;
  j["training_overlap"] = training_overlap_json(overlap);
  j["windows"] = r.samples;
  j["whole_games"] = a.whole_games;
  j["batches"] = r.batches;
  j["seconds"] = r.seconds;
  nlohmann::json heads = nlohmann::json::object();
  for (int h = 0; h < kHeads; ++h) {
    const std::string n = kHeadNames[h];
    heads[n] = {{"nll", number(metric(r.metrics, "nll/" + n))},
                {"acc", number(metric(r.metrics, "acc/" + n))},
                {"baseline_nll", number(metric(r.metrics, "baseline/loss/" + n))},
                {"baseline_acc", number(metric(r.metrics, "baseline/acc/" + n))},
                {"changed_share", number(metric(r.metrics, "changed/share/" + n))},
                {"changed_acc", number(metric(r.metrics, "changed/acc/" + n))},
                {"changed_nll", number(metric(r.metrics, "changed/nll/" + n))},
                {"baseline_changed_nll", number(metric(r.metrics, "baseline/changed/nll/" + n))}};
  }
  j["heads"] = heads;
  j["total"] = {{"nll", number(metric(r.metrics, "nll"))},
                {"loss", number(metric(r.metrics, "loss"))},
                {"baseline_nll", number(metric(r.metrics, "baseline/loss"))},
                {"all_right", number(metric(r.metrics, "all_right"))},
                {"baseline_all_right", number(metric(r.metrics, "baseline/all_right"))},
                {"acts_recorded", number(metric(r.metrics, "acts/recorded"))},
                {"acts_sampled", number(metric(r.metrics, "acts/sampled"))},
                {"acts_most_likely", number(metric(r.metrics, "acts/most_likely"))}};
  nlohmann::json all = nlohmann::json::object();
  for (const auto& [k, v] : r.metrics) all[k] = number(v);
  j["metrics"] = all;
  return j;
}

int eval_command(const EvalArgs& a) {
  // With the JSON on stdout, progress goes to stderr so the output stays parseable.
  std::ostream& log = a.json == "-" ? std::cerr : std::cout;
  const auto found = command_checkpoint(a.checkpoint, std::cerr, log);
  if (!found) return 1;
  const CheckpointPath& where = *found;
  const std::string& checkpoint = where.checkpoint;
  // Where the report goes, checked before the scoring rather than after it.
  if (!a.json.empty() && a.json != "-") {
    const fs::path parent = fs::absolute(a.json).parent_path();
    std::error_code ec;
    if (!fs::is_directory(parent, ec) || ::access(parent.c_str(), W_OK) != 0) {
      std::cerr << "error: cannot write " << a.json << ": " << parent.string()
                << (fs::is_directory(parent, ec) ? " is not writable" : " is not a folder") << "\n";
      return 1;
    }
  }
  GraphPlan plan;
  std::string perspectives = "all";
  try {
    std::vector<std::string> sets = a.sets;
    if (!a.device.empty()) sets.push_back("run.device=" + a.device);
    ReplaySelection sel{a.replays, a.port, "eval", {}};
    if (a.whole_games)
      sel.loader = {{"rows", YAML::Node("streams")},
                    {"stride", YAML::Node(0)},
                    {"validation_rows", YAML::Node("whole_games")}};
    plan = plan_graph(config_for_replays(where.graph_file, sets, sel));
    // "all" for every player (the loader's "both"), as the report has always said.
    for (const PlannedStage& s : plan.stages)
      if (s.schema->kind() == "slippi_replays") perspectives = s.params.string("perspectives");
    if (perspectives == "both") perspectives = "all";
    if (a.whole_games) {
      // Whole games carry the state from window to window through `continues`: a graph whose
      // model (a stage carrying a state, Streaming::recurrent) does not read it would score
      // every window from zero state under that name.
      for (const PlannedStage& s : plan.stages) {
        if (s.schema->streaming_kind() != Streaming::recurrent) continue;
        const auto& ports = s.schema->inputs();
        for (size_t i = 0; i < ports.size(); ++i)
          if (ports[i].name == "continues" && s.inputs[i].slot < 0) {
            std::cerr << "error: --whole-games carries the model's state from window to window "
                         "through `continues`, and stage '"
                      << s.name << "' (" << s.schema->kind()
                      << ") of this run's graph does not read it (every window would start "
                         "from zero state): score without --whole-games\n";
            return 2;
          }
      }
      for (const std::string& s : a.sets)
        if (s.starts_with("replays.rows=") || s.starts_with("replays.stride="))
          std::cerr << "note: --whole-games reads rows: streams with stride = window; --set " << s
                    << " is not used\n";
    }
  } catch (const ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  EvalResult r;
  TrainingOverlap overlap;
  try {
    Runner runner(std::move(plan), RunOptions::embedded(&log));
    r = runner.evaluate(checkpoint);
    overlap = training_overlap(where, runner.graph());
  } catch (const ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << checkpoint << ": " << e.what() << "\n";
    return 1;
  }
  if (r.samples == 0) {
    std::cerr << "error: no window to score in the given replays\n";
    return 1;
  }
  note_training_overlap(overlap, where, std::cerr);
  log << "eval of " << checkpoint << " (step " << r.step << "): " << r.samples << " windows in "
      << r.batches << " batches, " << fixed(r.seconds, 1) << " s"
      << (a.whole_games ? "; whole games, the state carried from window to window" : "") << "\n"
      << head_table(r.metrics);
  if (!a.json.empty()) {
    const std::string text = report_json(r, checkpoint, a, perspectives, overlap).dump(1) + "\n";
    if (a.json == "-") {
      std::cout << text;
    } else {
      std::ofstream f(a.json);
      f << text;
      f.close();
      if (!f) {
        std::cerr << "error: cannot write " << a.json << "\n";
        return 1;
      }
    }
  }
  return 0;
}

void setup_eval(CLI::App& parent) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* eval = parent.add_subcommand(
      "eval",
      "Score a checkpoint on replays: per-head NLL and accuracy, on every frame and on the "
      "items whose input changes, the share of frames with every head right, and the "
      "repeat-the-previous-input baseline on the same frames (the run's own graph and features)");
  add_checkpoint_option(*eval, a->checkpoint);
  eval->add_option("--replays", a->replays, "replay files, folders, globs or corpus directories")
      ->required();
  eval->add_option("--port", a->port,
                   "only this port's player (1-4; default: the players the run's "
                   "replays.perspectives keeps, every player for both)")
      ->check(CLI::Range(1, 4));
  eval->add_option("--json", a->json, "also write the figures as JSON to FILE (- for stdout)");
  eval->add_option("--device", a->device, "auto | cpu | cuda | cuda:N | emulated");
  eval->add_flag("--whole-games", a->whole_games,
                 "score each game's windows in order with the model's state carried from one to "
                 "the next, as a bot plays a whole game (replays.rows: streams, stride = window); "
                 "default: the run's own windows, each from zero state unless the run trained so");
  eval->add_option("--set,-s", a->sets,
                   "override stage.param=value or run.key=value (e.g. replays.batch_size=64)");
  eval->callback([a] {
    if (const int code = eval_command(*a); code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace
}  // namespace slipstream::melee

SLIPSTREAM_REGISTER_COMMAND(melee_eval, "eval", slipstream::melee::setup_eval);

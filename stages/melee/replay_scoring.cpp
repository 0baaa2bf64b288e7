// See replay_scoring.h.
#include "stages/melee/replay_scoring.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "stages/melee/model_math.h"
#include "stages/melee/replay_inputs.h"
#include "stages/melee/replay_report.h"
#include "stages/melee/replays.h"

namespace slipstream::melee {

void add_checkpoint_option(CLI::App& cmd, std::string& checkpoint) {
  cmd.add_option("--checkpoint", checkpoint,
                 "a run directory (its newest checkpoint), RUN/checkpoints/step-N, or a checkpoint "
                 "directory copied out of its run")
      ->required();
}

std::optional<CheckpointPath> command_checkpoint(const std::string& path, std::ostream& err,
                                                 std::ostream& notes) {
  CheckpointPath where = find_checkpoint(path);
  if (!where.error.empty()) {
    err << where.error << "\n";
    return std::nullopt;
  }
  note_config_changes(where, notes);
  return where;
}

int stage_of_kind(const GraphPlan& plan, const std::string& kind) {
  for (size_t k = 0; k < plan.stages.size(); ++k)
    if (plan.stages[k].schema->kind() == kind) return static_cast<int>(k);
  return -1;
}

ReplaySelection frame_by_frame(const std::string& replay, int port, std::string origin) {
  if (std::error_code ec; !std::filesystem::is_regular_file(replay, ec))
    throw ConfigError(
        {{SourceMark{"<" + origin + ">", 0, 0},
          "--replay " + replay + ": " +
              (std::filesystem::exists(replay, ec) ? "not a file" : "no such file")}});
  ReplaySelection sel{{replay}, port, std::move(origin), {}};
  sel.loader = {{"batch_size", YAML::Node(1)},
                {"window", YAML::Node(1)},
                {"stride", YAML::Node(1)},
                {"shuffle", YAML::Node(false)},
                {"rows", YAML::Node("shuffled")},
                {"validation_rows", YAML::Node("stretches")},  // whole games need streams
                {"min_frames", YAML::Node(0)},
                {"characters", YAML::Node(YAML::NodeType::Sequence)},
                {"stages", YAML::Node(YAML::NodeType::Sequence)}};
  return sel;
}

Config config_for_replays(const std::string& graph_file, const std::vector<std::string>& sets,
                          const ReplaySelection& sel) {
  Config cfg = load_config(graph_file, sets);
  const SourceMark mark{"<" + sel.origin + ">", 0, 0};
  YAML::Node paths(YAML::NodeType::Sequence);
  for (const std::string& r : sel.replays) paths.push_back(r);
  bool found = false;
  for (StageConfig& s : cfg.stages) {
    if (s.kind != "slippi_replays") continue;
    found = true;
    s.params["paths"] = ConfigValue{paths, mark};
    s.params["validation_paths"] = ConfigValue{YAML::Node(YAML::NodeType::Sequence), mark};
    s.params["validation_fraction"] = ConfigValue{YAML::Node(1.0), mark};
    s.params["synthetic"] = ConfigValue{YAML::Node(0), mark};
    if (sel.port)
      s.params["perspectives"] = ConfigValue{YAML::Node("port" + std::to_string(*sel.port)), mark};
    for (const auto& [key, value] : sel.loader) s.params[key] = ConfigValue{value, mark};
  }
  if (!found)
    throw ConfigError({{{cfg.graph_file, 0, 0},
                        "the run's graph has no slippi_replays stage to read replays with"}});
  return cfg;
}

TrainingOverlap training_overlap(const CheckpointPath& where,
                                 const std::vector<std::string>& sources,
                                 const std::vector<uint64_t>& same_games) {
  namespace fs = std::filesystem;
  TrainingOverlap o;
  o.of = sources.size();
  std::string run_dir = where.run_dir;
  // A checkpoint a rewind set aside (RUN/set-aside/after-step-N-T/checkpoints/step-M) was
  // trained on RUN's splits.
  if (run_dir.empty() && !where.checkpoint.empty()) {
    const fs::path p = fs::path(where.checkpoint).lexically_normal();
    const fs::path aside = p.parent_path().parent_path();
    if (p.parent_path().filename() == "checkpoints" &&
        aside.parent_path().filename() == "set-aside") {
      const fs::path run = aside.parent_path().parent_path();
      run_dir = run.empty() ? std::string(".") : run.string();
    }
  }
  if (run_dir.empty()) return o;
  auto same_file = [](const std::string& p) {
    std::error_code ec;
    const fs::path c = fs::weakly_canonical(p, ec);
    return ec ? p : c.string();
  };
  std::set<std::string> trained, trained_games;
  // The run's own splits, then those of the run its weights started from (run.init_from in its
  // config.yaml, which holds it absolute), and so on: a fine-tuned model saw those games too.
  std::set<std::string> runs;
  for (std::string dir = run_dir; !dir.empty() && runs.insert(same_file(dir)).second;) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (!name.ends_with(".splits.json")) continue;
      try {
        std::ifstream in(e.path());
        const nlohmann::json j = nlohmann::json::parse(in);
        for (const auto& g : j.at("train")) trained.insert(same_file(g.get<std::string>()));
        if (j.contains("train_games"))
          for (const auto& g : j.at("train_games")) trained_games.insert(g.get<std::string>());
        if (o.splits_file.empty()) o.splits_file = e.path().string();
        o.known = true;
      } catch (const std::exception&) {
        // A damaged splits file says nothing either way; the scoring goes on.
      }
    }
    std::string from;
    try {
      const YAML::Node run = YAML::LoadFile((fs::path(dir) / "config.yaml").string())["run"];
      if (run && run["init_from"]) from = run["init_from"].as<std::string>();
    } catch (const std::exception&) {
      // No readable config: the chain ends here.
    }
    dir = from.empty() ? std::string() : resolve_checkpoint_path(from).run_dir;
  }
  o.via_init_from = runs.size() > 1;
  for (size_t i = 0; i < sources.size(); ++i) {
    const bool by_game = i < same_games.size() && same_games[i] != 0 &&
                         trained_games.count(same_game_text(same_games[i]));
    if (!by_game && !trained.count(same_file(sources[i]))) continue;
    if (o.games++ < 5) o.examples.push_back(sources[i]);
  }
  return o;
}

TrainingOverlap training_overlap(const CheckpointPath& where, Graph& graph) {
  for (size_t k = 0; k < graph.size(); ++k)
    if (const auto* r = dynamic_cast<const ReplaysStage*>(&graph.stage(k)))
      return training_overlap(where, r->sources(), r->same_games());
  return {};
}

void note_training_overlap(const TrainingOverlap& o, const CheckpointPath& where,
                           std::ostream& out) {
  if (!o.known) {
    out << "note: " << where.checkpoint
        << " has no run directory with its replays' splits beside it (copied out of its run?): "
           "whether these replays trained it cannot be told\n";
    return;
  }
  if (o.games == 0) return;
  out << "warning: " << o.games << " of the " << o.of
      << " games scored were in this run's training split"
      << (o.via_init_from ? " or that of a run its weights started from (run.init_from)" : "")
      << " (" << o.splits_file << "; matched by the game, whatever its file's name): their "
      << "figures are not held out:";
  for (size_t i = 0; i < o.examples.size(); ++i) out << (i ? ", " : " ") << o.examples[i];
  if (o.games > o.examples.size()) out << ", ... (" << o.games - o.examples.size() << " more)";
  out << "\n";
}

nlohmann::json training_overlap_json(const TrainingOverlap& o) {
  if (!o.known) return nullptr;
  return {{"games", o.games}, {"of", o.of}, {"examples", o.examples}};
}

void note_config_changes(const CheckpointPath& where, std::ostream& out) {
  if (where.config_changes.empty()) return;
  std::string list;
  for (const auto& c : where.config_changes) list += (list.empty() ? "" : "; ") + c;
  out << "note: " << where.checkpoint << " was trained with a graph its run's config.yaml no "
      << "longer holds (" << list << "); it is opened with the graph it was trained with\n";
}

double metric(const std::map<std::string, double>& metrics, const std::string& name) {
  auto it = metrics.find(name);
  return it == metrics.end() ? NAN : it->second;
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

namespace {
std::string percent(double v) {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.2f%%", 100 * v);
  return b;
}
}  // namespace

std::string head_table(const std::map<std::string, double>& m) {
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "%-10s %10s %9s %13s %13s\n", "head", "nll", "acc",
                "baseline nll", "baseline acc");
  out += line;
  for (int h = 0; h < kHeads; ++h) {
    const std::string n = kHeadNames[h];
    std::snprintf(line, sizeof line, "%-10s %10s %9s %13s %13s\n", n.c_str(),
                  fixed(metric(m, "nll/" + n), 4).c_str(), percent(metric(m, "acc/" + n)).c_str(),
                  fixed(metric(m, "baseline/loss/" + n), 4).c_str(),
                  percent(metric(m, "baseline/acc/" + n)).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "%-10s %10s %9s %13s\n", "total",
                fixed(metric(m, "nll"), 4).c_str(), "",
                fixed(metric(m, "baseline/loss"), 4).c_str());
  out += line;
  out +=
      "(nll: head-weighted, without label smoothing; acc/buttons: per-button mean; baseline: "
      "repeat the previous input)\n";
  if (!std::isfinite(metric(m, "changed/share/buttons"))) return out;  // not from bc_loss
  // Where repeat-last is wrong by construction: the items whose label differs from the
  // previous input (its accuracy there is 0), and the positions with every head right.
  out += "where the input changes:\n";
  std::snprintf(line, sizeof line, "%-10s %10s %9s %10s %13s\n", "head", "changed", "acc", "nll",
                "baseline nll");
  out += line;
  for (int h = 0; h < kHeads; ++h) {
    const std::string n = kHeadNames[h];
    std::snprintf(line, sizeof line, "%-10s %10s %9s %10s %13s\n", n.c_str(),
                  percent(metric(m, "changed/share/" + n)).c_str(),
                  percent(metric(m, "changed/acc/" + n)).c_str(),
                  fixed(metric(m, "changed/nll/" + n), 4).c_str(),
                  fixed(metric(m, "baseline/changed/nll/" + n), 4).c_str());
    out += line;
  }
  out += "all heads right: " + percent(metric(m, "all_right")) + " (baseline " +
         percent(metric(m, "baseline/all_right")) + ")\n";
  if (std::isfinite(metric(m, "acts/recorded")))
    out += "positions acting (a button, a stick off centre, the trigger): recorded " +
           percent(metric(m, "acts/recorded")) + ", policy sampled at temperature 1 " +
           percent(metric(m, "acts/sampled")) + " (expected), most likely input " +
           percent(metric(m, "acts/most_likely")) + "\n";
  return out;
}

}  // namespace slipstream::melee

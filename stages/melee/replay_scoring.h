// What `slipstream eval` and `slipstream infer` share: the graph a checkpoint was trained with
// (the one its weights carry; RUN/config.yaml for checkpoints written before they carried one),
// so features, windows and heads are the ones it trained with, with its replay loaders pointed
// at other replays, all of them in the validation split.
#pragma once

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/graph.h"

namespace CLI {
class App;
}

namespace slipstream::melee {

// The required --checkpoint option eval, infer and export share (find_checkpoint's forms).
void add_checkpoint_option(CLI::App& cmd, std::string& checkpoint);

struct ReplaySelection {
  std::vector<std::string> replays;  // files, folders, globs or corpus directories
  std::optional<int> port;           // 1-4: only that port's player
  std::string origin;                // how error marks name these values, e.g. "eval --replays"
  // More loader parameters to set (YAML values), e.g. {"window", 1}.
  std::map<std::string, YAML::Node> loader;
};

// The stage of `kind` in the plan (the first one), or -1.
int stage_of_kind(const GraphPlan& plan, const std::string& kind);

// One replay's frames of one port, every frame in game order, one at a time (batch 1, window 1):
// what `infer` plays and `export --replay` records. The replay is the user's choice, so the run's
// game filters (characters, stages, minimum length) do not apply. A replay that is not a file is
// a ConfigError.
ReplaySelection frame_by_frame(const std::string& replay, int port, std::string origin);

// The checkpoint's graph (CheckpointPath::graph_file: its weights' `slipstream.config`, or
// RUN/config.yaml) with `sets` (--set, --device) applied and every slippi_replays stage reading
// `sel` for validation only. Throws ConfigError (e.g. a graph without such a stage).
Config config_for_replays(const std::string& graph_file, const std::vector<std::string>& sets,
                          const ReplaySelection& sel);

// find_checkpoint(path) for a command: its error printed to `err` (nullopt: the command exits
// 1), else the checkpoint, with note_config_changes said to `notes`.
std::optional<CheckpointPath> command_checkpoint(const std::string& path, std::ostream& err,
                                                 std::ostream& notes);

// One line saying that the run's config.yaml changed since the checkpoint (a later resume's
// --set) and that the checkpoint's own graph is used; nothing when it did not change.
void note_config_changes(const CheckpointPath& where, std::ostream& out);

// Which of the games scored the checkpoint's run trained on: its loaders'
// RUN/<stage>.splits.json "train" lists, and those of the runs its weights started from (through
// each config.yaml's run.init_from), matched by the game (its same-game key, "train_games":
// a copy under another name, a corpus of the files) and by its source. `known` is false when
// the checkpoint has no run directory with splits beside it (copied out of its run).
struct TrainingOverlap {
  bool known = false;
  size_t games = 0, of = 0;           // trained games among `of` scored
  std::vector<std::string> examples;  // the first few, by source
  std::string splits_file;            // the first splits file read
  bool via_init_from = false;         // a run its weights started from was read too
};
// The games scored: their sources and same-game keys (ReplaysStage::sources, same_games).
TrainingOverlap training_overlap(const CheckpointPath& where,
                                 const std::vector<std::string>& sources,
                                 const std::vector<uint64_t>& same_games);
// The overlap of the run's replays stage in `graph` (after its setup).
TrainingOverlap training_overlap(const CheckpointPath& where, Graph& graph);
// A warning when some games trained the model (their figures are not held out), a note when
// it cannot be told; nothing when none did.
void note_training_overlap(const TrainingOverlap& o, const CheckpointPath& where,
                           std::ostream& out);
// The overlap for a --json report: null when it cannot be told.
nlohmann::json training_overlap_json(const TrainingOverlap& o);

// A metric of a pass, NaN when absent.
double metric(const std::map<std::string, double>& metrics, const std::string& name);
// "%.*f", or "-" when not finite.
std::string fixed(double v, int digits);
// The pass's per-head NLL and accuracy beside the baseline's (bc_loss's metric names), with a
// total row and a line saying what the figures are.
std::string head_table(const std::map<std::string, double>& metrics);

}  // namespace slipstream::melee

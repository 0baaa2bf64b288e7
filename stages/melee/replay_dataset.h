// The replay loader's games: every input decoded once (TBB threads), filtered, and kept as
// compact feature arrays (window_index.h's GameFeatures) in identity order; skips counted per
// reason with examples. Training and validation copies of the stage share one dataset through a
// process-wide cache keyed by what was read and how it was filtered.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "stages/melee/replay_inputs.h"
#include "stages/melee/slp/game.h"
#include "stages/melee/window_index.h"

namespace slipstream::melee {

// Why a file or game was left out; the report counts each and shows a few examples.
enum Reason {
  kSkipNotFound,
  kSkipUnreadable,
  kSkipPlayers,
  kSkipStage,
  kSkipNoFrames,
  kSkipShort,
  kSkipCharacters,
  kSkipNotHuman,
  kSkipVersion,
  kSkipDuplicate,
  kSkipReasons
};
constexpr size_t kSkipExamples = 3;  // file names shown per reason
// Problems (not found, unreadable, no frames, a duplicate, damage) are named in the run's list of
// them up to this many each; a filter's skips (players, stage, length, characters, humans,
// version) are counted, their first few named: a filter leaves out most of a big dump by design.
constexpr size_t kSkipListed = 100000;
inline bool skip_is_problem(int reason) {
  return reason == kSkipNotFound || reason == kSkipUnreadable || reason == kSkipNoFrames ||
         reason == kSkipDuplicate;
}
// Their short names, as ReplaysStage::skipped() gives them.
inline constexpr const char* kSkipNames[kSkipReasons] = {
    "not found", "unreadable", "players",   "stage",   "no frames",
    "too short", "characters", "not human", "version", "duplicate"};

// Out of memory while a game loads: this machine's state, not the game's (never a reason to
// leave the game out).
struct LoadOutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Filters {
  RollbackMode rollback = RollbackMode::last;
  FieldReading fields = FieldReading::slippi;
  bool one_vs_one = true;
  bool humans_only = false;                 // every player human (type 0)
  std::optional<slp::Version> min_version;  // recorded by this Slippi or a later one
  bool skip_duplicates = false;             // one copy of a game recorded twice
  std::vector<int64_t> stages, characters;
  int64_t min_frames = 0, min_rows = 0;
  std::string perspectives;
  // shard: games with several ranks: this rank decodes only the games whose draw from (seed,
  // name) falls to it.
  int shard_rank = 0, shard_world = 1;
  uint64_t shard_seed = 0;
  bool shard_ranges = true;  // contiguous ranges of the inputs; false: a hashed draw (older runs)

  std::string key() const {
    std::ostringstream k;
    k << (rollback == RollbackMode::last ? "last" : "all") << '|' << one_vs_one << '|' << min_rows
      << '|' << perspectives << '|' << shard_rank << '/' << shard_world << '/' << shard_seed << '/'
      << shard_ranges << '|' << humans_only << '|' << (min_version ? min_version->str() : "") << '|'
      << skip_duplicates << '|' << (fields == FieldReading::libmelee ? "libmelee" : "slippi")
      << "|s";
    for (auto s : stages) k << ',' << s;
    k << "|c";
    for (auto c : characters) k << ',' << c;
    return k.str();
  }
};

// "[a, b, c]".
inline std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Where a game of a dataset is read from: a .slp file (Inputs::files[index]), a game of a corpus
// or of a feature corpus (the dataset's `corpus`-th of that kind, game `index`).
struct GameItem {
  enum Kind : uint8_t { kFile, kCorpus, kFeatures };
  Kind kind = kFile;
  int corpus = -1;
  size_t index = 0;
};

struct ReplayDataset {
  // Sorted by identity. Resident: each with its arrays. Not resident (bounded memory, the
  // stage's resident_games): only the facts the split and the window index need (rows,
  // players, identity, source); read_game gives the arrays.
  std::vector<GameFeatures> games;
  std::vector<std::vector<uint8_t>> players;  // per game: players whose perspective is used
  struct Skip {
    size_t count = 0;
    std::vector<std::string> examples;  // named (kSkipListed or kSkipExamples of them)
  };
  std::array<Skip, kSkipReasons> skips;
  std::array<std::string, kSkipReasons> reason_text;
  size_t files = 0, corpus_games = 0, damaged = 0;
  size_t shard_of = 0;  // with shard: games, the files and corpus games of every rank together
  std::vector<std::string> damaged_examples;  // named as a problem's skips are
  size_t bytes = 0, frames = 0;               // the games' arrays (resident or not) and rows
  std::vector<uint64_t> game_bytes;           // each game's arrays
  double seconds = 0;
  int threads = 1;
  bool resident = true;
  uint64_t resident_games = 0;  // not resident: at most this many games in memory at once

  // Game g's features read again from its source (a feature corpus: read and decoded; a game
  // corpus or .slp file: decoded and extracted, as setup did). Safe from several threads.
  GameFeatures read_game(size_t g) const;
  struct Sources;  // the inputs, the opened corpora and each game's GameItem
  std::shared_ptr<const Sources> sources;
};

// The dataset of `in` under `f`, loaded on `arena`'s threads or found in the cache (`fresh`:
// loaded by this call). `on_demand` 0: every game's arrays kept; N: only the facts, the stage
// reading at most N games at once (read_game). `given`: the paths and filters the stage was
// given, under which live_dataset finds it.
std::shared_ptr<const ReplayDataset> cached_dataset(const Inputs& in, const Filters& f,
                                                    tbb::task_arena& arena, bool& fresh,
                                                    uint64_t on_demand = 0,
                                                    const std::string& given = {});
// The dataset loaded for `given` that is still in use (or null): the validation copy takes the
// training copy's, resident or not, even when files changed on disk since (a folder a recorder
// still writes to) — it validates on the games the run split, within the training's memory.
std::shared_ptr<const ReplayDataset> live_dataset(const std::string& given);

}  // namespace slipstream::melee

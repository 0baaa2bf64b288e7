// A feature corpus: the loader's per-game feature arrays (window_index.h's GameFeatures),
// extracted once by `slipstream corpus build --features` and stored so that a run opens an index
// instead of parsing every replay again:
//
//   features.json   format version, the extraction settings (rollback, fields), totals, and the
//                   inputs the build skipped with why — no per-game entries
//   features.index  binary: a fixed-size record a game (what the loader's filters and window
//                   index need: identity, rows, stage, Game Start players, version, duplicate
//                   key, where its arrays are), then the games' source names
//   features.bin    each game's arrays as one zstd frame, read with pread and decoded on its
//                   own: the page cache is the only cache, nothing is mapped
//
// Layout in docs/loader.md. Written with engine/atomic_file.h, one build a folder at a time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "stages/melee/slp/game.h"
#include "stages/melee/window_index.h"

namespace slipstream::melee {

inline constexpr int kFeatureCorpusVersion = 1;
inline constexpr const char* kFeatureManifestName = "features.json";

struct FeatureCorpusError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A folder holding a feature corpus (its features.json).
bool is_feature_corpus(const std::filesystem::path& dir);

struct FeatureCorpusOptions {
  RollbackMode rollback = RollbackMode::last;
  FieldReading fields = FieldReading::slippi;
  int zstd_level = 3;
  int threads = 0;  // 0: TBB's default
};

struct FeatureBuildReport {
  size_t games = 0, skipped = 0;
  uint64_t frames = 0;
  uint64_t source_bytes = 0;                  // the .slp files (or corpus sources) read
  uint64_t feature_bytes = 0;                 // the arrays, decoded
  uint64_t stored_bytes = 0;                  // features.bin
  std::vector<std::string> skipped_examples;  // "path (why)", the first few
};

// Extracts the features of every game `inputs` hold (.slp files, folders, globs, game corpora:
// replay_inputs.h) under `options`, and writes the corpus into `out_dir` (replacing one there,
// whole or not at all; one build at a time a folder). Games are kept in input order; a file that
// cannot be read, a game with fewer than two players or with a player without frames is skipped
// and listed, never fatal. Memory: one chunk of games in flight, whatever the input's size.
FeatureBuildReport build_feature_corpus(const std::vector<std::string>& inputs,
                                        const std::filesystem::path& out_dir,
                                        const FeatureCorpusOptions& options = {});

// One game's record: the Game Start facts the loader filters on, and its features' shape.
struct FeatureEntry {
  uint64_t identity = 0;  // game_identity
  uint32_t rows = 0;      // kept rows
  slp::GameStart start;   // players (port, character, type), stage, random seed, version
  struct Player {         // GameFeatures::players, without the arrays
    uint8_t port = 0, character = slp::kNoCharacter;
    bool has_follower = false;
  };
  std::vector<Player> players;
  bool damaged = false;  // the source was cut short; `damage` says where
  std::string source, damage;
  uint64_t feature_bytes = 0;  // decoded arrays (GameFeatures::bytes())
};

class FeatureCorpus {
 public:
  // Reads features.json and features.index; throws FeatureCorpusError naming the file and what
  // is wrong (missing, another format version, cut short).
  static FeatureCorpus open(const std::filesystem::path& dir);
  FeatureCorpus(FeatureCorpus&&) noexcept;
  FeatureCorpus& operator=(FeatureCorpus&&) noexcept;
  ~FeatureCorpus();

  size_t size() const;
  const FeatureEntry& entry(size_t game) const;
  RollbackMode rollback() const;
  FieldReading fields() const;
  const std::filesystem::path& dir() const;
  uint64_t feature_bytes() const;  // all games' arrays, decoded
  uint64_t source_bytes() const;   // the replays it was built from
  // A GameFeatures with the entry's facts and no arrays (what the loader keeps of a game that
  // is not resident).
  GameFeatures header(size_t game) const;
  // The game's features, read and decoded now. Safe from several threads at once. Throws
  // FeatureCorpusError naming the file and byte offset when the stored frame is damaged.
  GameFeatures load(size_t game) const;

 private:
  struct State;
  explicit FeatureCorpus(std::unique_ptr<State> s);
  std::unique_ptr<State> state_;
};

// What opening `dir` will hold (from features.json alone): its games and their decoded arrays.
struct FeatureFootprint {
  size_t games = 0;
  uint64_t feature_bytes = 0, source_bytes = 0;
};
FeatureFootprint feature_footprint(const std::filesystem::path& dir);

}  // namespace slipstream::melee

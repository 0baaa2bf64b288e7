// Corpus cache: many parsed games as frame-aligned columns in one directory, memory-mappable.
//
//   manifest.json  format version, options, source files (size, mtime, hash), skipped files with
//                  reasons, per game: GameInfo, frame/item counts and offsets, its tracks
//                  (one per port leader/follower), and the column directory
//   columns.bin    each column at a 64-byte-aligned offset: fixed-width little-endian values,
//                  all games back to back; with --zstd, each game's slice of each column is a
//                  zstd frame of its own (a table of offsets first), so one game is decoded
//                  without the others (format version 1's whole-column zstd is still read)
//
// Three column groups: frame columns (one value per row of every game), track columns (one
// value per row of every track: "present", "pre.*", "post.*") and item columns. See
// docs/slp_format.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "stages/melee/slp/game.h"
#include "stages/melee/slp/parser.h"

namespace slipstream::slp {

inline constexpr int kCorpusFormatVersion = 2;  // written; 1 and 2 are read

struct CorpusError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct CorpusOptions {
  Rollbacks rollbacks = Rollbacks::kLastCopy;  // training sees what the game finally showed
  bool items = true;
  bool zstd = false;
  int zstd_level = 3;
};

struct CorpusBuildReport {
  size_t games = 0;
  size_t skipped = 0;  // unreadable inputs, not in the corpus (manifest.json lists each)
  size_t damaged = 0;  // games kept with the rows before their damage (GameInfo::partial)
  size_t frames = 0;
  uint64_t input_bytes = 0;
  uint64_t output_bytes = 0;          // columns.bin
  std::vector<std::string> examples;  // the first skipped and damaged inputs, with why
};

// A path a folder scan passed over, and why (unreadable folder, symlink loop, a .slp name on
// something that is not a regular file).
struct SkippedPath {
  std::filesystem::path path;
  std::string reason;
};
struct ReplayScan {
  std::vector<std::filesystem::path> files;
  std::vector<SkippedPath> skipped;  // sorted by path
};

// Expands directories (recursively, *.slp, sorted) and keeps files as given. Never throws on
// what it finds inside a folder: unreadable subfolders, symlink loops and non-regular .slp
// entries are listed in `skipped`. Symlinked folders are not followed, so nothing loops.
ReplayScan scan_replays(std::span<const std::filesystem::path> inputs);
// scan_replays(inputs).files.
std::vector<std::filesystem::path> find_replays(std::span<const std::filesystem::path> inputs);

// Parses `inputs` (files or directories) and writes the corpus into `out_dir`, replacing one
// that is there. Unreadable files, and what scan_replays skips, are listed as skipped, not fatal.
CorpusBuildReport build_corpus(std::span<const std::filesystem::path> inputs,
                               const std::filesystem::path& out_dir,
                               const CorpusOptions& options = {});

// A 64-bit content hash (the manifest records it to detect changed sources).
uint64_t content_hash(std::span<const uint8_t> bytes);

// What opening a corpus will take, from its manifest alone (before anything is mapped or
// decompressed): its games' source .slp bytes, and the columns' decompressed bytes a zstd
// corpus holds in memory while it is open. The manifest's per-game entries are skipped while
// reading, so a large corpus costs little memory here. Throws CorpusError naming the file on a
// missing or malformed manifest.
struct CorpusFootprint {
  size_t games = 0;
  uint64_t source_bytes = 0;        // the .slp files it was built from
  uint64_t decompressed_bytes = 0;  // a version-1 zstd corpus's columns, unpacked at open; else 0
  uint64_t mapped_bytes = 0;        // columns.bin, mapped whole at open (address space, not RSS)
};
CorpusFootprint corpus_footprint(const std::filesystem::path& dir);

// One game of a corpus: views into the corpus's mapping or, for a corpus built with --zstd, into
// the game's columns decoded when it was read (held here, freed with it). Valid while this and
// the Corpus live.
class CorpusGame {
 public:
  const GameView& view() const { return view_; }
  // The bytes decoded for this game (0 for an uncompressed corpus).
  size_t decoded_bytes() const { return decoded_bytes_; }

 private:
  friend class Corpus;
  GameView view_;
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> owned_;
  size_t decoded_bytes_ = 0;
};

class Corpus {
 public:
  // Maps the corpus; throws CorpusError on a missing or malformed corpus or another format
  // version (the message says to rebuild).
  static Corpus open(const std::filesystem::path& dir);

  Corpus(Corpus&&) noexcept;
  Corpus& operator=(Corpus&&) noexcept;
  ~Corpus();

  size_t size() const;  // games
  // Game `index` (CorpusGame above). Absent fields give empty columns, as in a parsed Game.
  // Safe to call from several threads at once.
  CorpusGame game(size_t index) const;
  size_t total_frames() const;
  const std::filesystem::path& dir() const;
  // How its games kept rolled-back frames (`corpus build --keep-rollbacks`: kKeepAll).
  Rollbacks rollbacks() const;

 private:
  struct State;
  explicit Corpus(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace slipstream::slp

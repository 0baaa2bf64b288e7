// The replay loader's inputs: what `paths` name (.slp files, folders, globs, corpus folders)
// resolved into files, corpora and feature corpora, with what was missing, unreadable or not read;
// and the synthetic games a run without replays may train on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace slipstream::melee {

struct Inputs {
  std::vector<std::filesystem::path> files;            // .slp files, in the order found
  std::vector<std::filesystem::path> corpora;          // corpus directories
  std::vector<std::filesystem::path> feature_corpora;  // feature corpus directories
  std::vector<std::string> missing;
  std::vector<std::string> unreadable;  // what folder scans passed over, with why
  std::vector<std::string> ignored;     // replays the inputs hold but are not read, with why
};

// A folder with a corpus manifest (slp/corpus.h).
bool is_corpus(const std::filesystem::path& dir);
// Nothing to read: no files, corpora or feature corpora.
inline bool holds_nothing(const Inputs& in) {
  return in.files.empty() && in.corpora.empty() && in.feature_corpora.empty();
}
// Expands each path (a glob, a folder scanned for .slp files, a corpus folder, a file).
Inputs resolve_inputs(const std::vector<std::string>& paths);
// What each of `paths` (which together hold no replays) is, for the error that says so.
std::string describe_empty_paths(const std::vector<std::string>& paths);
// The validation check of a `paths` parameter: "" when any path that exists holds replays (what
// is missing, must_exist names), else the parameter's error naming every path and what it is —
// at `slipstream validate`, not when a run's setup finds the set empty. A folder is walked
// only to its first .slp file.
std::string check_paths_hold_replays(const std::string& param,
                                     const std::vector<std::string>& paths);
// The folder holding `games` synthetic games for `seed` under `root`, written when absent
// (`generated` says which); safe when several processes ask at once.
std::filesystem::path synthetic_games(const std::filesystem::path& root, uint64_t seed,
                                      int64_t games, bool& generated);

}  // namespace slipstream::melee

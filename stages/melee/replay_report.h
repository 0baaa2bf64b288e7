// The replay loader's setup report: what was loaded, skipped and split, as the stage prints it
// (once per loaded dataset) and keeps it (ReplaysStage::report()).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "stages/melee/replay_dataset.h"

namespace slipstream::melee {

struct ReportFacts {
  std::string who;                        // "slippi_replays 'NAME'"
  int shard_rank = -1;                    // shard: games: this rank (its share is reported)
  bool validation_copy = false;           // the stage serving the validation split
  const ReplayDataset* pinned = nullptr;  // validation_paths' games, if any
  uint64_t batch = 1;
  uint64_t world = 1;  // shard: windows over several ranks: an epoch's step takes world batches
  std::array<size_t, 2> games{}, windows{};  // [0] train, [1] validation
  size_t overlap = 0;                        // games in both paths and validation_paths
  std::string skipped_file;                  // where every skipped file is listed, if anywhere
};

// Every skipped and damaged file of `ds`, a line each: "REASON<tab>FILE" (RUN/NAME.skipped.txt).
std::string skipped_list(const ReplayDataset& ds);

// The lines of the report, each ending in a newline.
std::string dataset_report(const ReplayDataset& ds, const ReportFacts& f);

// The error of a training split without a window: what was read, skipped and kept.
std::string no_windows_error(const ReplayDataset& ds, const std::string& who,
                             size_t validation_games, double validation_fraction);

// RUN/NAME.splits.json: the sources of the games that trained and of those that validated
// (pinned: validation_paths' games), so a run can be audited and repeated, and the trained
// games' same-game keys ("train_games", GameFeatures::same_game as 16 hex digits), by which
// eval and infer know a training game under another name. shard_world > 1: shard: games, the
// games of this rank's share.
// A same-game key (GameFeatures::same_game) as splits.json holds it: 16 hex digits.
std::string same_game_text(uint64_t key);

std::string splits_json(const ReplayDataset& ds, const std::vector<uint32_t>& train,
                        const std::vector<uint32_t>& validation, const ReplayDataset* pinned,
                        int shard_world);

// A resumed run's splits file: `current` (splits_json of this start) with the games the file
// already listed as trained (`previous`, its text) kept in "train" after this start's own, so
// the file names every game the run has trained on across its resumes (eval's and infer's
// held-out warning reads it). `trained_then_validating` gets this start's validation games that
// an earlier start trained on (a changed seed, validation_fraction or validation_paths).
// A `previous` that does not parse is replaced.
std::string merged_splits_json(const std::string& current, const std::string& previous,
                               std::vector<std::string>& trained_then_validating);

}  // namespace slipstream::melee

// The replay loader's setup report: see replay_report.h.
#include "stages/melee/replay_report.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace slipstream::melee {

std::string skipped_list(const ReplayDataset& ds) {
  std::string out;
  // What is not named: a filter's skips past their first few, a problem's past kSkipListed.
  const auto unnamed = [&](const std::string& reason, size_t count, size_t named) {
    if (count > named)
      out += "# " + reason + ": " + std::to_string(count - named) + " more, not named\n";
  };
  for (size_t r = 0; r < kSkipReasons; ++r) {
    for (const std::string& name : ds.skips[r].examples)
      out += ds.reason_text[r] + "\t" + name + "\n";
    unnamed(ds.reason_text[r], ds.skips[r].count, ds.skips[r].examples.size());
  }
  const std::string damaged = "damaged (rows before it used)";
  for (const std::string& name : ds.damaged_examples) out += damaged + "\t" + name + "\n";
  unnamed(damaged, ds.damaged, ds.damaged_examples.size());
  return out;
}

std::string dataset_report(const ReplayDataset& ds, const ReportFacts& f) {
  std::ostringstream out;
  size_t skipped = 0;
  for (const auto& s : ds.skips) skipped += s.count;
  out << f.who << ": " << ds.files << " files" << (ds.corpus_games ? " + " : "")
      << (ds.corpus_games ? std::to_string(ds.corpus_games) + " corpus games" : "")
      << (f.shard_rank >= 0 ? " (rank " + std::to_string(f.shard_rank) + "'s share of " +
                                  std::to_string(ds.shard_of) + ")"
                            : std::string())
      << " -> " << ds.games.size() << " games, " << ds.frames << " frames, " << (ds.bytes >> 20)
      << " MiB of features" << (ds.resident ? "" : " (read on demand)") << " in "
      << static_cast<int>(ds.seconds * 1000) << " ms on " << ds.threads << " threads; " << skipped
      << " skipped\n";
  // The first few of each kind; the rest in the run's list of them.
  const auto first_few = [&](const std::vector<std::string>& names) {
    for (size_t i = 0; i < std::min(names.size(), kSkipExamples); ++i)
      out << (i ? ", " : "") << names[i];
    if (names.size() > kSkipExamples)
      out << ", ..." << (f.skipped_file.empty() ? "" : " (the list: " + f.skipped_file + ")");
    out << "\n";
  };
  for (size_t r = 0; r < kSkipReasons; ++r) {
    const auto& s = ds.skips[r];
    if (!s.count) continue;
    out << "  skipped " << s.count << ' ' << ds.reason_text[r] << ": ";
    first_few(s.examples);
  }
  if (ds.damaged) {
    out << "  note: " << ds.damaged << " damaged (rows before the damage used): ";
    first_few(ds.damaged_examples);
  }
  if (f.pinned && f.validation_copy) {
    out << "  validation (validation_paths): " << f.games[1] << " games, " << f.windows[1]
        << " windows\n";
  } else {
    out << "  train: " << f.games[0] << " games, " << f.windows[0] << " windows ("
        << f.windows[0] / (f.batch * std::max<uint64_t>(1, f.world)) << " batches of " << f.batch
        << (f.world > 1 ? " on each of " + std::to_string(f.world) + " ranks" : std::string())
        << " per epoch); validation: ";
    if (f.pinned)
      out << f.pinned->games.size() << " games from validation_paths"
          << (f.overlap ? " (" + std::to_string(f.overlap) + " of them also in paths: not trained)"
                        : std::string());
    else
      out << f.games[1] << " games, " << f.windows[1] << " windows";
    out << "\n";
  }
  return out.str();
}

std::string no_windows_error(const ReplayDataset& ds, const std::string& who,
                             size_t validation_games, double validation_fraction) {
  std::ostringstream e;
  e << who << ": no training windows: " << ds.files << " files";
  if (ds.corpus_games) e << " + " << ds.corpus_games << " corpus games";
  for (size_t r = 0; r < kSkipReasons; ++r)
    if (ds.skips[r].count) e << ", " << ds.skips[r].count << ' ' << ds.reason_text[r];
  e << ", " << ds.games.size() << " games kept (" << validation_games
    << " of them in validation, validation_fraction=" << validation_fraction << ")";
  return e.str();
}

std::string same_game_text(uint64_t key) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(key));
  return text;
}

std::string splits_json(const ReplayDataset& ds, const std::vector<uint32_t>& train,
                        const std::vector<uint32_t>& validation, const ReplayDataset* pinned,
                        int shard_world) {
  nlohmann::json splits;
  if (shard_world > 1)  // the games of rank 0's share (each rank draws its own)
    splits["shard"] = {{"by", "games"}, {"rank", 0}, {"world", shard_world}};
  splits["train"] = nlohmann::json::array();
  splits["train_games"] = nlohmann::json::array();
  splits["validation"] = nlohmann::json::array();
  for (uint32_t g : train) {
    splits["train"].push_back(ds.games[g].source);
    if (ds.games[g].same_game)  // 0: not known
      splits["train_games"].push_back(same_game_text(ds.games[g].same_game));
  }
  if (pinned)
    for (const GameFeatures& g : pinned->games) splits["validation"].push_back(g.source);
  else
    for (uint32_t g : validation) splits["validation"].push_back(ds.games[g].source);
  return splits.dump(1) + "\n";
}

std::string merged_splits_json(const std::string& current, const std::string& previous,
                               std::vector<std::string>& trained_then_validating) {
  nlohmann::json now = nlohmann::json::parse(current);
  std::vector<std::string> before, before_games;
  try {
    const nlohmann::json then = nlohmann::json::parse(previous);
    for (const auto& g : then.at("train")) before.push_back(g.get<std::string>());
    if (then.contains("train_games"))
      for (const auto& g : then.at("train_games")) before_games.push_back(g.get<std::string>());
  } catch (const std::exception&) {
    return current;  // nothing readable to keep
  }
  std::set<std::string> keys;
  for (const auto& g : now["train_games"]) keys.insert(g.get<std::string>());
  for (const std::string& g : before_games)
    if (keys.insert(g).second) now["train_games"].push_back(g);
  std::set<std::string> listed;
  for (const auto& g : now["train"]) listed.insert(g.get<std::string>());
  std::set<std::string> validating;
  for (const auto& g : now["validation"]) validating.insert(g.get<std::string>());
  for (const std::string& g : before) {
    if (validating.count(g)) trained_then_validating.push_back(g);
    if (listed.insert(g).second) now["train"].push_back(g);
  }
  return now.dump(1) + "\n";
}

}  // namespace slipstream::melee

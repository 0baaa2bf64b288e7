// Bounded memory (the loader's resident_games): the features of the games a run is reading, read
// from their source when wanted (ReplayDataset::read_game) and dropped once nothing wants them.
// The games wanted next are read ahead on a thread of its own, so a batch rarely waits for one.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "stages/melee/window_index.h"

namespace slipstream::melee {

struct ReplayDataset;

class ResidentGames {
 public:
  explicit ResidentGames(std::shared_ptr<const ReplayDataset> data);
  ~ResidentGames();
  ResidentGames(const ResidentGames&) = delete;
  ResidentGames& operator=(const ResidentGames&) = delete;

  // The games wanted from now on: `now` (those the batches being read may need) and `ahead`
  // (those after them); what is not resident is read in the background in that order, and a
  // batch that needs a game before then reads it itself (get). Any other game is dropped; a
  // batch being filled keeps its own references until it is done.
  void want(const std::vector<uint32_t>& now, const std::vector<uint32_t>& ahead);
  // Game g's features: resident, or read now (a wait, counted). A game that cannot be read (its
  // source damaged or changed since setup) is null, from then on without reading it again; the
  // call that found it sets `failure` to why, the later ones leave it empty.
  std::shared_ptr<const GameFeatures> get(uint32_t g, std::string* failure);

  struct Stats {
    uint64_t reads = 0;                       // games read, ahead or not
    uint64_t waits = 0;                       // games a batch had to read itself
    uint64_t games = 0, bytes = 0;            // resident now
    uint64_t peak_games = 0, peak_bytes = 0;  // at most, since the start
    uint64_t unreadable = 0;                  // games that could not be read
  };
  Stats stats() const;

 private:
  void read_ahead();
  void insert(uint32_t g, std::shared_ptr<const GameFeatures> f);  // under mu_

  std::shared_ptr<const ReplayDataset> data_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint32_t, std::shared_ptr<const GameFeatures>> games_;
  std::unordered_set<uint32_t> wanted_;
  std::unordered_set<uint32_t> unreadable_;
  std::deque<uint32_t> queue_;
  Stats stats_;
  bool stop_ = false;
  std::thread reader_;
};

}  // namespace slipstream::melee

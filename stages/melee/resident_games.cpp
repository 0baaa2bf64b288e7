// Bounded memory: see resident_games.h.
#include "stages/melee/resident_games.h"

#include <algorithm>

#include "stages/melee/replay_dataset.h"

namespace slipstream::melee {

ResidentGames::ResidentGames(std::shared_ptr<const ReplayDataset> data)
    : data_(std::move(data)), reader_([this] { read_ahead(); }) {}

ResidentGames::~ResidentGames() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  reader_.join();
}

void ResidentGames::insert(uint32_t g, std::shared_ptr<const GameFeatures> f) {
  const uint64_t bytes = f->bytes();
  if (!games_.emplace(g, std::move(f)).second) return;  // read twice at once: the first stays
  stats_.games = games_.size();
  stats_.bytes += bytes;
  stats_.peak_games = std::max(stats_.peak_games, stats_.games);
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.bytes);
}

void ResidentGames::want(const std::vector<uint32_t>& now, const std::vector<uint32_t>& ahead) {
  {
    std::lock_guard lock(mu_);
    wanted_.clear();
    wanted_.insert(now.begin(), now.end());
    wanted_.insert(ahead.begin(), ahead.end());
    for (auto it = games_.begin(); it != games_.end();) {
      if (wanted_.count(it->first)) {
        ++it;
        continue;
      }
      stats_.bytes -= it->second->bytes();
      it = games_.erase(it);
    }
    stats_.games = games_.size();
    // The current games first (a batch reads only some of them; the rest are read here before
    // a later batch needs them), then those ahead.
    queue_.clear();
    for (const auto* list : {&now, &ahead})
      for (uint32_t g : *list)
        if (!games_.count(g)) queue_.push_back(g);
  }
  cv_.notify_all();
}

std::shared_ptr<const GameFeatures> ResidentGames::get(uint32_t g, std::string* failure) {
  {
    std::lock_guard lock(mu_);
    if (auto it = games_.find(g); it != games_.end()) return it->second;
    if (unreadable_.count(g)) return nullptr;
  }
  std::shared_ptr<const GameFeatures> f;
  try {
    f = std::make_shared<const GameFeatures>(data_->read_game(g));
  } catch (const std::bad_alloc&) {
    throw;  // the machine's memory, not the game: the run's error, not a game left out
  } catch (const LoadOutOfMemory&) {
    throw;
  } catch (const std::exception& e) {
    std::lock_guard lock(mu_);
    if (unreadable_.insert(g).second) {
      ++stats_.unreadable;
      if (failure) *failure = e.what();
    }
    return nullptr;
  }
  std::lock_guard lock(mu_);
  ++stats_.reads;
  ++stats_.waits;
  if (wanted_.count(g)) insert(g, f);
  return f;
}

void ResidentGames::read_ahead() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const uint32_t g = queue_.front();
    queue_.pop_front();
    if (games_.count(g) || !wanted_.count(g) || unreadable_.count(g)) continue;
    lock.unlock();
    std::shared_ptr<const GameFeatures> f;
    try {
      f = std::make_shared<const GameFeatures>(data_->read_game(g));
    } catch (...) {
      // Read again by get() on the batch's own path, where the error reaches the run.
    }
    lock.lock();
    if (!f) continue;
    ++stats_.reads;
    if (wanted_.count(g)) insert(g, std::move(f));
  }
}

ResidentGames::Stats ResidentGames::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace slipstream::melee

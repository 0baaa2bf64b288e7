// The replay loader's split and order: see replay_split.h.
#include "stages/melee/replay_split.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <queue>
#include <set>
#include <span>
#include <stdexcept>
#include <string>

namespace fs = std::filesystem;

namespace slipstream::melee {

GameSplit split_games(const ReplayDataset& ds, const ReplayDataset* pinned, bool validation_copy,
                      double fraction, uint64_t seed, int window, int stride, int delay) {
  const size_t ng = ds.games.size();
  std::vector<char> is_val(ng, 0);
  GameSplit s;
  if (pinned) {
    std::set<uint64_t> ids;
    for (const auto& g : pinned->games) ids.insert(g.identity);
    for (size_t g = 0; g < ng; ++g) is_val[g] = validation_copy || ids.count(ds.games[g].identity);
    if (!validation_copy)
      s.overlap = static_cast<size_t>(std::count(is_val.begin(), is_val.end(), 1));
  } else {
    std::vector<double> draw(ng);
    for (size_t g = 0; g < ng; ++g) {
      draw[g] = split_draw(seed, ds.games[g].identity);
      is_val[g] = fraction >= 1 || draw[g] < fraction;
    }
    const size_t nval = static_cast<size_t>(std::count(is_val.begin(), is_val.end(), 1));
    if (ng >= 2 && fraction > 0 && nval == 0)
      is_val[static_cast<size_t>(std::min_element(draw.begin(), draw.end()) - draw.begin())] = 1;
    if (ng >= 2 && fraction < 1 && nval == ng)
      is_val[static_cast<size_t>(std::max_element(draw.begin(), draw.end()) - draw.begin())] = 0;
  }
  for (size_t g = 0; g < ng; ++g) {
    const int side = is_val[g] ? 1 : 0;
    s.games[side].push_back(static_cast<uint32_t>(g));
    const auto& players = ds.games[g].players;
    for (uint8_t pl : ds.players[g])
      s.perspectives[side].push_back(
          {static_cast<uint32_t>(g), pl, static_cast<uint8_t>((pl + 1) % players.size())});
  }
  for (int side = 0; side < 2; ++side)
    s.windows[side] = count_windows(ds.games, s.perspectives[side], window, stride, delay);
  return s;
}

// Validation's fixed order is the permutation of this epoch number.
constexpr uint64_t kValidationOrder = uint64_t{1} << 40;

void WindowOrder::reset(size_t windows, uint64_t batch, uint64_t batches_per_epoch, bool validation,
                        bool shuffle, bool keyed, uint64_t seed, uint64_t rank, uint64_t world) {
  if (shuffle && !keyed && windows > std::numeric_limits<uint32_t>::max())
    throw std::runtime_error(
        "shuffle_order: table holds at most 2^32 - 1 windows, and the data have " +
        std::to_string(windows) + "; use shuffle_order: keyed");
  keyed_ = keyed;
  keyed_perm_.reset();
  windows_ = windows;
  batch_ = batch;
  batches_per_epoch_ = std::max<uint64_t>(1, batches_per_epoch);
  validation_ = validation;
  shuffle_ = shuffle;
  seed_ = seed;
  rank_ = rank;
  world_ = world;
  perm_.clear();
  perm_epoch_ = -1;
  first_.clear();
  stream_epoch_ = -1;
  game_first_.clear();
  game_epoch_ = -1;
  pool_perm_.reset();
}

void WindowOrder::set_pools(std::vector<uint64_t> game_first, uint64_t pool) {
  if (game_first.empty() || game_first.back() != windows_ || pool == 0)
    throw std::logic_error("WindowOrder::set_pools: the offsets must end at the windows' count");
  game_first_ = std::move(game_first);
  pool_ = pool;
  game_epoch_ = -1;
  pool_perm_.reset();
}

std::optional<KeyedPermutation> WindowOrder::game_order(uint64_t epoch) const {
  if (!shuffle_) return std::nullopt;  // the games in index order
  return KeyedPermutation(game_first_.size() - 1, seed_ ^ 0x9001A11Bu, epoch);
}

void WindowOrder::order_games(uint64_t epoch) const {
  if (game_epoch_ == static_cast<int64_t>(epoch)) return;
  const uint64_t n = game_first_.size() - 1;
  game_order_.resize(n);
  game_start_.resize(n + 1);
  const std::optional<KeyedPermutation> perm = game_order(epoch);
  uint64_t at = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t g = perm ? (*perm)(i) : i;
    game_order_[i] = static_cast<uint32_t>(g);
    game_start_[i] = at;
    at += game_first_[g + 1] - game_first_[g];
  }
  game_start_[n] = at;
  game_epoch_ = static_cast<int64_t>(epoch);
}

size_t WindowOrder::pooled_window_at(uint64_t k, uint64_t r) const {
  const uint64_t j = validation_ ? k : k % batches_per_epoch_;
  const uint64_t pos = (j * world_ + rank_) * batch_ + r;
  if (pos >= windows_) return kPadding;
  const uint64_t epoch = epoch_of(k);
  order_games(epoch);
  const uint64_t n = game_order_.size();
  // The game whose windows hold pos in the epoch's sequence, then its pool's span.
  const uint64_t at = static_cast<uint64_t>(
      std::upper_bound(game_start_.begin(), game_start_.end(), pos) - game_start_.begin() - 1);
  const uint64_t q = at / pool_;
  const uint64_t g0 = q * pool_, g1 = std::min(n, g0 + pool_);
  const uint64_t begin = game_start_[g0], size = game_start_[g1] - begin;
  uint64_t target = pos;
  if (shuffle_) {
    const Pool key{epoch, q};
    if (!pool_perm_ || !(pool_perm_of_ == key)) {
      pool_perm_.emplace(size, mix64(seed_ ^ 0x9001B00Cu ^ mix64(q)), epoch);
      pool_perm_of_ = key;
    }
    target = begin + (*pool_perm_)(pos - begin);
  }
  const auto first = game_start_.begin() + static_cast<std::ptrdiff_t>(g0);
  const auto last = game_start_.begin() + static_cast<std::ptrdiff_t>(g1) + 1;
  const uint64_t i =
      static_cast<uint64_t>(std::upper_bound(first, last, target) - game_start_.begin() - 1);
  return static_cast<size_t>(game_first_[game_order_[i]] + (target - game_start_[i]));
}

std::vector<WindowOrder::Pool> WindowOrder::pools_of(uint64_t k) const {
  const uint64_t j = validation_ ? k : k % batches_per_epoch_;
  const uint64_t first = (j * world_ + rank_) * batch_;
  const uint64_t last = std::min<uint64_t>(first + batch_, windows_);
  if (first >= last) return {};
  const uint64_t epoch = epoch_of(k);
  order_games(epoch);
  auto pool_at = [&](uint64_t pos) {
    const uint64_t at = static_cast<uint64_t>(
        std::upper_bound(game_start_.begin(), game_start_.end(), pos) - game_start_.begin() - 1);
    return Pool{epoch, at / pool_};
  };
  std::vector<Pool> out;
  for (uint64_t q = pool_at(first).index; q <= pool_at(last - 1).index; ++q)
    out.push_back({epoch, q});
  return out;
}

WindowOrder::Pool WindowOrder::pool_after(Pool p) const {
  // Training reads positions below batches_per_epoch · world · B of each epoch.
  const uint64_t read = validation_ ? windows_ : batches_per_epoch_ * world_ * batch_;
  order_games(p.epoch);
  const uint64_t n = game_order_.size();
  const uint64_t next = (p.index + 1) * pool_;
  if (next < n && game_start_[next] < read) return {p.epoch, p.index + 1};
  return {validation_ ? p.epoch : p.epoch + 1, 0};
}

std::vector<uint32_t> WindowOrder::pool_games(Pool p) const {
  const uint64_t n = game_first_.size() - 1;
  const std::optional<KeyedPermutation> perm = game_order(p.epoch);
  std::vector<uint32_t> out;
  for (uint64_t i = p.index * pool_; i < std::min(n, (p.index + 1) * pool_); ++i)
    out.push_back(static_cast<uint32_t>(perm ? (*perm)(i) : i));
  return out;
}

void WindowOrder::set_streams(std::vector<uint64_t> first, bool whole_games) {
  if (first.empty() || first.back() != windows_)
    throw std::logic_error("WindowOrder::set_streams: the offsets must end at the windows' count");
  first_ = std::move(first);
  stream_epoch_ = -1;
  row_perspectives_.clear();
  row_starts_.clear();
  row_batches_ = 0;
  if (!validation_ || !whole_games) return;
  // Whole perspectives to rows, longest-row-last: each to the row with the fewest windows so
  // far (the lowest such row), in the order the stretches read them before.
  const uint64_t n = first_.size() - 1;
  const KeyedPermutation perm(n, seed_ ^ 0x5732EA45u, kValidationOrder);
  row_perspectives_.assign(batch_, {});
  row_starts_.assign(batch_, {0});
  using Load = std::pair<uint64_t, uint64_t>;  // (windows so far, row)
  std::priority_queue<Load, std::vector<Load>, std::greater<>> rows;
  for (uint64_t r = 0; r < batch_; ++r) rows.push({0, r});
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t p = shuffle_ ? perm(i) : i, length = first_[p + 1] - first_[p];
    if (length == 0) continue;
    const auto [load, r] = rows.top();
    rows.pop();
    row_perspectives_[r].push_back(p);
    row_starts_[r].push_back(load + length);
    rows.push({load + length, r});
    row_batches_ = std::max(row_batches_, load + length);
  }
}

size_t WindowOrder::stream_window_at(uint64_t k, uint64_t r, bool* continues) const {
  if (continues) *continues = false;
  if (!row_starts_.empty()) {
    if (r >= row_starts_.size() || k >= row_starts_[r].back()) return kPadding;
    const std::vector<uint64_t>& starts = row_starts_[r];
    const size_t i =
        static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), k) - starts.begin() - 1);
    const uint64_t within = k - starts[i];
    if (continues) *continues = within > 0;
    return static_cast<size_t>(first_[row_perspectives_[r][i]] + within);
  }
  const uint64_t j = validation_ ? k : k % batches_per_epoch_;
  const uint64_t stretch = validation_ ? (windows_ + batch_ - 1) / batch_ : batches_per_epoch_;
  const uint64_t pos = (rank_ * batch_ + r) * stretch + j;
  if (pos >= windows_) return kPadding;
  const uint64_t epoch = epoch_of(k);
  if (stream_epoch_ != static_cast<int64_t>(epoch)) {
    const uint64_t n = first_.size() - 1;
    stream_order_.resize(n);
    stream_start_.resize(n + 1);
    const KeyedPermutation perm(n, seed_ ^ 0x5732EA45u, epoch);
    uint64_t at = 0;
    for (uint64_t i = 0; i < n; ++i) {
      stream_order_[i] = shuffle_ ? perm(i) : i;
      stream_start_[i] = at;
      at += first_[stream_order_[i] + 1] - first_[stream_order_[i]];
    }
    stream_start_[n] = at;
    stream_epoch_ = static_cast<int64_t>(epoch);
  }
  // The perspective whose windows hold position pos: the last one starting at or before it.
  const auto it = std::upper_bound(stream_start_.begin(), stream_start_.end(), pos) - 1;
  const uint64_t i = static_cast<uint64_t>(it - stream_start_.begin());
  const uint64_t within = pos - *it;
  if (continues) *continues = j > 0 && within > 0;
  return static_cast<size_t>(first_[stream_order_[i]] + within);
}

uint64_t WindowOrder::epoch_of(uint64_t k) const {
  return validation_ ? kValidationOrder : k / batches_per_epoch_;
}

size_t WindowOrder::window_at(uint64_t k, uint64_t r, bool* continues) const {
  if (streams()) return stream_window_at(k, r, continues);
  if (continues) *continues = false;
  if (pooled()) return pooled_window_at(k, r);
  const uint64_t j = validation_ ? k : k % batches_per_epoch_;
  const uint64_t pos = (j * world_ + rank_) * batch_ + r;
  if (pos >= windows_) return kPadding;  // validation's last batch
  if (!shuffle_) return pos;
  const uint64_t epoch = epoch_of(k);
  if (perm_epoch_ != static_cast<int64_t>(epoch)) {
    if (keyed_)
      keyed_perm_.emplace(windows_, seed_, epoch);
    else
      perm_ = epoch_permutation(windows_, seed_, epoch);
    perm_epoch_ = static_cast<int64_t>(epoch);
  }
  return keyed_ ? static_cast<size_t>((*keyed_perm_)(pos)) : perm_[pos];
}

void check_ranks_agree(RunState& run, const Inputs& in, const ReplayDataset& ds, bool by_games,
                       uint64_t fingerprint, const std::string& who) {
  uint64_t found = mix64(in.files.size() ^ (in.corpora.size() << 40));
  for (const auto& file : in.files) {
    std::error_code ec;
    const std::string key =
        file.filename().string() + ":" + std::to_string(fs::file_size(file, ec));
    for (unsigned char c : key) found = mix64(found ^ c);
  }
  const uint64_t agreed = by_games ? found : fingerprint;
  const double games = static_cast<double>(ds.games.size());
  const double files = static_cast<double>(in.files.size());
  std::array<double, 8> v = {static_cast<double>(agreed >> 32),
                             static_cast<double>(agreed & 0xffffffffu),
                             games,
                             files,
                             -static_cast<double>(agreed >> 32),
                             -static_cast<double>(agreed & 0xffffffffu),
                             -games,
                             -files};
  run.reduce_over_ranks(std::span<double>(v), RankReduce::min,
                        who + ": the ranks' data fingerprints");
  if (v[0] != -v[4] || v[1] != -v[5]) {
    auto range = [](double lo, double hi) {
      return lo == hi ? std::to_string(static_cast<int64_t>(lo))
                      : std::to_string(static_cast<int64_t>(lo)) + " to " +
                            std::to_string(static_cast<int64_t>(hi));
    };
    throw std::runtime_error(
        who + ": the ranks did not find the same data (replay files found: " + range(v[3], -v[7]) +
        (by_games ? "" : ", games kept: " + range(v[2], -v[6])) +
        "; this rank: " + std::to_string(in.files.size()) + " files, " +
        std::to_string(ds.games.size()) + " games kept). Every rank must see the same " +
        "replays.paths, readable on its node; each rank's report says what it skipped");
  }
}

}  // namespace slipstream::melee

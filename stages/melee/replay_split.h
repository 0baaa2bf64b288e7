// The replay loader's split and order: which games validate and which train, the windows of each
// side, and which window fills each row of each batch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/stage.h"
#include "stages/melee/replay_dataset.h"
#include "stages/melee/window_index.h"

namespace slipstream::melee {

// Both sides of the split ([0] train, [1] validation): their games (indexes into the dataset),
// perspectives and window counts.
struct GameSplit {
  std::array<std::vector<uint32_t>, 2> games;
  std::array<std::vector<Perspective>, 2> perspectives;
  std::array<size_t, 2> windows{};
  size_t overlap = 0;  // games in both paths and validation_paths (validated, not trained)
};

// Whole games, by a draw from (seed, identity) below `fraction`; never a side left empty by
// chance when there are games enough for both, unless the fraction is 0 or 1. With pinned games
// (validation_paths) the validation side is exactly those: the validation copy of the stage
// (`validation_copy`) reads only them, the training copy leaves out any game it also holds.
GameSplit split_games(const ReplayDataset& ds, const ReplayDataset* pinned, bool validation_copy,
                      double fraction, uint64_t seed, int window, int stride, int delay);

// Which window fills row r of batch k. Training: epoch e = k / batches_per_epoch reads positions
// (j·world + rank)·B + r, j = k mod batches_per_epoch, of the permutation drawn from (seed, e)
// (or of the windows in order without shuffle), so ranks see disjoint windows. Validation: one
// fixed shuffled order, the same every pass, so a pass of a few batches samples every validation
// game; positions past the windows are padding. The permutation is a KeyedPermutation
// (`keyed`: computed per position, any number of windows) or, for runs from before it, the
// epoch's table (epoch_permutation: fewer than 2^32 windows).
//
// Pools (bounded memory, `resident_games`, set_pools): the windows grouped by game. An epoch
// orders the games by a draw from (seed, epoch) (validation: one fixed order; in index order
// without shuffle) and cuts that order into pools of `pool` games; each pool's windows are
// read in an order of their own drawn from (seed, epoch, pool), pool after pool, at the same
// positions as above. So the batches of a pool read only its games, and only the pool being
// read and the next need to be in memory.
//
// Streams (`rows: streams`, set_streams): each batch row walks consecutive windows of one game
// seen from one player, so a model can carry its state from a row's window to the row's next.
// An epoch lays the perspectives end to end, in an order drawn from (seed, epoch) (validation: one
// fixed order; none without shuffle), each one's windows in time order, and cuts that sequence
// into world·B equal stretches: global row g (rank·B + r) reads position g·P + j of it at the
// epoch's batch j, P = batches_per_epoch. The windows past world·B·P are left out of the epoch
// (another tail each epoch); validation's stretches are ceil(windows / B) long, padded. With
// whole_games (eval --whole-games), validation gives each row whole perspectives instead (each,
// in the fixed order, to the row with the fewest windows so far), padded at the end: every
// perspective starts at its first window from zero state and its state is carried to its last,
// whatever B; validation_stream_batches() long.
class WindowOrder {
 public:
  static constexpr size_t kPadding = static_cast<size_t>(-1);

  void reset(size_t windows, uint64_t batch, uint64_t batches_per_epoch, bool validation,
             bool shuffle, bool keyed, uint64_t seed, uint64_t rank, uint64_t world);
  // Streams, after reset: `first[p]` is perspective p's first window and first.back() the number
  // of windows (the windows grouped by perspective, each group in time order).
  void set_streams(std::vector<uint64_t> first, bool whole_games = false);
  bool streams() const { return !first_.empty(); }
  // Validation streams of whole games: the batches that hold every row's perspectives (the
  // longest row).
  uint64_t validation_stream_batches() const { return row_batches_; }
  // Pools, after reset: `game_first[g]` is game g's first window, game_first.back() the count.
  void set_pools(std::vector<uint64_t> game_first, uint64_t pool);
  bool pooled() const { return !game_first_.empty(); }
  struct Pool {
    uint64_t epoch = 0, index = 0;
    bool operator==(const Pool&) const = default;
  };
  // The pools batch k reads (one, or two where it crosses from one to the next), and the pool
  // read after the last of them (the next epoch's first, past an epoch's last; validation: its
  // first again).
  std::vector<Pool> pools_of(uint64_t k) const;
  Pool pool_after(Pool p) const;
  // The games (indexes into game_first) of a pool.
  std::vector<uint32_t> pool_games(Pool p) const;
  uint64_t epoch_of(uint64_t k) const;
  // The window index of row r of batch k, or kPadding. `continues`, when given, says whether the
  // window follows the window row r held in batch k - 1 (streams only; else false).
  size_t window_at(uint64_t k, uint64_t r, bool* continues = nullptr) const;

 private:
  size_t stream_window_at(uint64_t k, uint64_t r, bool* continues) const;
  size_t windows_ = 0;
  uint64_t batch_ = 1, batches_per_epoch_ = 1, seed_ = 0, rank_ = 0, world_ = 1;
  bool validation_ = false, shuffle_ = true, keyed_ = true;
  // The current epoch's order (recomputed when a batch of another epoch is asked for).
  mutable std::vector<uint32_t> perm_;
  mutable std::optional<KeyedPermutation> keyed_perm_;
  mutable int64_t perm_epoch_ = -1;
  // Streams: each perspective's first window; the epoch's perspective order and where each of
  // them starts in the epoch's sequence (recomputed for another epoch).
  std::vector<uint64_t> first_;
  mutable std::vector<uint64_t> stream_order_, stream_start_;
  mutable int64_t stream_epoch_ = -1;
  // Validation streams: each row's perspectives and where each starts in the row (one more:
  // the row's length); the longest row.
  std::vector<std::vector<uint64_t>> row_perspectives_, row_starts_;
  uint64_t row_batches_ = 0;
  // Pools: each game's first window; the epoch's game order and where each game starts in the
  // epoch's sequence (recomputed for another epoch); the last pool's own permutation.
  size_t pooled_window_at(uint64_t k, uint64_t r) const;
  void order_games(uint64_t epoch) const;
  std::optional<KeyedPermutation> game_order(uint64_t epoch) const;  // none: index order
  std::vector<uint64_t> game_first_;
  uint64_t pool_ = 1;
  mutable std::vector<uint32_t> game_order_;
  mutable std::vector<uint64_t> game_start_;
  mutable int64_t game_epoch_ = -1;
  mutable std::optional<KeyedPermutation> pool_perm_;
  mutable Pool pool_perm_of_{~uint64_t{0}, 0};
};

// Ranks that each read the whole data set (shard: windows) must have read the same one: a rank
// whose node lacks some files, or cannot read them, would train on another order of other
// windows while the run goes on as one. They compare `fingerprint` (the split's windows and
// games); with shard: games (`by_games`) each rank holds its own games by design, and the ranks
// compare the replay files they found to share out instead. Throws, on every rank, naming the
// counts each found.
void check_ranks_agree(RunState& run, const Inputs& in, const ReplayDataset& ds, bool by_games,
                       uint64_t fingerprint, const std::string& who);

}  // namespace slipstream::melee

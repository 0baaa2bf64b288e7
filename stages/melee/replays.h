// slippi_replays: the Melee replay loader (role source). Turns .slp files, folders, globs or
// corpus directories into batches of training windows laid out as in batch_layout.h.
//
// Batch k (global across epochs) is a pure function of (stage seed, split, k): at setup the
// loader decodes every game once (TBB threads) into compact feature arrays — kept in memory, or
// with resident_games: N only their facts, the arrays read again when the order reaches them —
// and indexes every window of its split; epoch e = k / batches_per_epoch reads positions
// [j*B, (j+1)*B) of a permutation drawn from (seed, e) (pool by pool when on demand). See
// docs/loader.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "engine/stage.h"
#include "stages/melee/replay_split.h"
#include "stages/melee/resident_games.h"
#include "stages/melee/window_index.h"

namespace slipstream::melee {

// Games after loading and filtering, shared by the training and validation copies of the stage
// (both load the same inputs; the second finds the first's in a process-wide cache).
struct ReplayDataset;

class ReplaysStage : public Stage {
 public:
  ReplaysStage();
  ~ReplaysStage() override;
  static StageSchema schema();

  void setup(StageContext& ctx) override;
  bool produce(Batch& out, StageContext& ctx) override;
  void seek(uint64_t next_index, StageContext& ctx) override;
  void save(StateWriter& w) const override;
  void load(StateReader& r) override;
  void start(StageContext& ctx) override;

  // ---- introspection (tests, benchmarks, tools) ----
  struct WindowInfo {
    std::string source;         // file (or corpus source) of the game
    int player_port = 0;        // 0-based port shown in slot 0
    int opponent_port = 0;      // slot 1
    bool has_follower = false;  // slot 2 holds the player's Nana
    uint32_t start = 0;         // first kept row of the window (index into GameFeatures rows)
    uint32_t recorded_row = 0;  // the same row in the game as decoded (parse or corpus)
    int32_t frame = 0;          // the game's frame number of that row (-123 is the first)
    bool padding = false;       // a padded row (validation's last batch)
    bool continues = false;     // rows: streams, the window follows the row's previous one
  };
  // Which window fills row `row` of batch `batch` (throws std::out_of_range past the end).
  WindowInfo window(uint64_t batch, int64_t row) const;
  uint64_t windows() const { return windows_.size(); }
  uint64_t batches_per_epoch() const { return batches_per_epoch_; }
  uint64_t total_batches() const { return total_batches_; }
  // Games of this stage's split, as their sources, in index order.
  std::vector<std::string> sources() const;
  // The same games' GameFeatures::same_game keys, in the same order.
  std::vector<uint64_t> same_games() const;
  // Files skipped (or games left out) per reason, e.g. {"unreadable", 1}.
  std::vector<std::pair<std::string, size_t>> skipped() const;
  // Damaged files whose rows before the damage were used.
  size_t damaged() const;
  // Bounded memory: the games read and held (nothing when every game is resident).
  std::optional<ResidentGames::Stats> resident_stats() const;
  // The setup report (what was loaded, skipped, split), as printed.
  const std::string& report() const { return report_; }
  // Where the synthetic fallback wrote its games ("" when it was not used).
  const std::string& synthetic_dir() const { return synthetic_dir_used_; }
  // Serve this split whatever the context says (tests drive the stage without a runner).
  void force_split(StageContext::Split s) { forced_split_ = s; }

 private:
  // setup's parts: the game filters (this rank's share with shard: games, `by_games`); the
  // inputs, or the synthetic games when paths is empty (a line for the report in `rep`); the
  // batches of an epoch and of the run; the window order.
  Filters filters(const StageContext& ctx, bool by_games) const;
  Inputs inputs_or_synthetic(const StageContext& ctx, const std::string& who,
                             std::ostringstream& rep);
  void count_batches(StageContext& ctx, bool by_games, const std::string& who);
  void set_order();
  // How many games may be in memory at once (0: all), from resident_games and the memory the
  // inputs' features need against replays.memory; refuses what cannot fit.
  uint64_t resident_games(const StageContext& ctx, const Inputs& in, int ranks) const;
  void read_on_demand(StageContext& ctx, bool by_games);
  uint64_t pool_games() const;
  void want_games(uint64_t k);
  const GameFeatures& game_of(const WindowRef& w) const;
  // Writes the rows; a row's game is `held[i]` when set (bounded memory), else the dataset's.
  void fill(const std::vector<std::optional<WindowRef>>& rows,
            const std::vector<std::shared_ptr<const GameFeatures>>& held,
            const BatchView& view) const;

  std::shared_ptr<const ReplayDataset> data_;
  // RUN/NAME.skipped.txt's lines, written at start by the training copy of rank 0 ("": no
  // skips, an earlier start's list goes); nothing for the other copies.
  std::optional<std::string> skipped_;
  std::vector<Perspective> perspectives_;
  WindowIndex windows_;
  std::vector<uint32_t> split_games_;  // indexes into the dataset's games
  std::optional<StageContext::Split> forced_split_;
  bool validation_ = false;
  bool shuffle_ = true;
  bool streams_ = false;      // rows: streams (WindowOrder::set_streams)
  bool whole_games_ = false;  // validation_rows: whole_games, on a validation copy of streams
  bool keyed_order_ = true;   // shuffle_order: keyed (KeyedPermutation) or table
  int64_t batch_ = 256, window_ = 60, delay_ = 0, stride_ = 5;
  int64_t epochs_ = 1;
  uint64_t seed_ = 0;
  uint64_t batches_per_epoch_ = 0, total_batches_ = 0;
  // Data-parallel runs: rank r of `world` trains on rows [(j*world + r)*B, +B) of each epoch's
  // order, so ranks see disjoint windows and the same number of batches. Validation is whole.
  uint64_t rank_ = 0, world_ = 1;
  uint64_t next_ = 0;
  WindowOrder order_;  // which window fills each row of each batch
  // Bounded memory (resident_games): the games read on demand, the dataset game of each of the
  // order's games (pools), and the pools last asked for.
  std::unique_ptr<ResidentGames> resident_;
  std::vector<uint32_t> order_games_;
  std::vector<WindowOrder::Pool> wanted_pools_;
  std::unique_ptr<tbb::task_arena> arena_;
  std::string report_, synthetic_dir_used_, fingerprint_;
  std::string load_warning_;  // said at start(): load() has no context to say it with
  std::string splits_;        // RUN/NAME.splits.json as this start sees it, written at start()
};

}  // namespace slipstream::melee

// slippi_replays: see replays.h and docs/loader.md.
#include "stages/melee/replays.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_set>
#include <utility>
#include <variant>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "engine/atomic_file.h"
#include "engine/config.h"
#include "engine/host_memory.h"
#include "engine/memory_pool.h"
#include "engine/registry.h"
#include "engine/text_match.h"
#include "stages/melee/feature_corpus.h"
#include "stages/melee/replay_dataset.h"
#include "stages/melee/replay_inputs.h"
#include "stages/melee/replay_report.h"
#include "stages/melee/replay_split.h"
#include "stages/melee/resident_games.h"
#include "stages/melee/slp/corpus.h"
#include "stages/melee/slp/names.h"
#include "stages/melee/window_batch.h"

namespace fs = std::filesystem;

namespace slipstream::melee {

namespace {

struct IdNames {
  const char* what;  // "character", "stage"
  int64_t max_id;
  std::optional<int> (*id_of)(std::string_view);
  std::vector<std::string> (*names)();
  std::vector<std::string> (*spellings)();
};

// The `characters` / `stages` filter: each element an id or a name (slp/names.h). Sorted and
// without repeats, so [fox, 1] and [1] filter alike and share the dataset cache key. Returns
// the ids, or sets `problem` (the schema's check reports it at validation).
std::vector<int64_t> resolve_ids(const std::vector<std::string>& values, const std::string& param,
                                 const IdNames& k, std::string& problem) {
  std::vector<int64_t> ids;
  for (const std::string& text : values) {
    int64_t id = 0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, id);
    if (ec == std::errc() && ptr == end && !text.empty()) {
      if (id < 0 || id > k.max_id) {
        problem = "parameter '" + param + "': " + k.what + " id " + text + " is out of range [0, " +
                  std::to_string(k.max_id) + "]";
        return {};
      }
    } else if (const auto named = k.id_of(text)) {
      id = *named;
    } else {
      std::string lowered = text;
      for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::string valid;
      for (const std::string& n : k.names()) valid += (valid.empty() ? "" : ", ") + n;
      problem = "parameter '" + param + "': unknown " + k.what + " '" + text + "'" +
                did_you_mean(lowered, k.spellings()) + " (an id, or a name in any case: " + valid +
                ")";
      return {};
    }
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

const IdNames kStageNames{"stage", 65535, slp::stage_id, slp::stage_names, slp::stage_spellings};
const IdNames kCharacterNames{"character", 255, slp::internal_character_id,
                              slp::internal_character_names, slp::character_spellings};

// A schema check for a filter parameter (its problem, or "").
std::string check_ids(const std::string& param, const IdNames& k, const ParamValue& v) {
  std::string problem;
  if (const auto* list = std::get_if<std::vector<std::string>>(&v))
    resolve_ids(*list, param, k, problem);
  return problem;
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string paths_str(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s + "]";
}

}  // namespace

ReplaysStage::ReplaysStage() = default;
ReplaysStage::~ReplaysStage() = default;

namespace {

// rows: streams walks each game window after window: the windows must abut.
std::optional<StageSchema::RuleProblem> streams_problem(const Params& p) {
  const int64_t window = p.integer("window"), stride = p.integer("stride");
  if (p.string("rows") != "streams" || stride == 0 || stride == window) return std::nullopt;
  return StageSchema::RuleProblem{"stride", "rows: streams (" + p.mark("rows").str() +
                                                ") needs windows that abut, stride = window (" +
                                                std::to_string(window) + ") or 0, got stride " +
                                                std::to_string(stride) + " (set stride: 0)"};
}

}  // namespace

StageSchema ReplaysStage::schema() {
  using S = std::vector<std::string>;
  StageSchema s("slippi_replays");
  s.family("melee")
      .doc(
          "Slippi replays (or a corpus cache) -> deterministic, resumable batches of training "
          "windows (stages/melee/batch_layout.h).")
      .role(StageRole::source);
  return declare_window_outputs(s)
      .param("paths", S{}, "replay files, folders (recursive), globs or corpus directories")
      .path(/*must_exist=*/true)
      .check([](const ParamValue& v) {
        return check_paths_hold_replays("paths", std::get<std::vector<std::string>>(v));
      })
      .param("validation_paths", S{},
             "games for validation (same forms as paths): all of them validate, none of them "
             "trains, and validation_fraction is not applied")
      .path(/*must_exist=*/true)
      .check([](const ParamValue& v) {
        return check_paths_hold_replays("validation_paths", std::get<std::vector<std::string>>(v));
      })
      // Upper bounds: 2^20 frames is ~4.8 hours of play, far past any game, and keeps the window
      // arithmetic in 32-bit ints (window_index.h) and the batch's byte counts in range.
      .param("batch_size", int64_t{256},
             "windows per batch (training drops an epoch's last partial batch, validation pads it, "
             "mask 0); auto: the largest "
             "that fits the device's memory (run.device_memory)")
      .range(1, 1 << 20)
      .batch_size()
      .param("window", int64_t{60}, "frames per window")
      .range(1, 1 << 20)
      .param("stride", int64_t{5}, "frames between window starts (0: the window, so windows abut)")
      .range(0, 1 << 20)
      .param("delay", int64_t{0},
             "frame delay D: features see the controller of t + D, labels t + D + 1")
      .range(0, 600)
      .param("min_frames", int64_t{300}, "skip games with fewer frames")
      .range(0, 1 << 30)
      .param("characters", S{},
             "characters whose perspective is kept, as internal ids or names (fox, falcon, "
             "\"ice climbers\"; empty: all)")
      .check([](const ParamValue& v) { return check_ids("characters", kCharacterNames, v); })
      .param("stages", S{},
             "stages to keep, as ids or names (battlefield, fd, \"yoshis story\"; empty: all)")
      .check([](const ParamValue& v) { return check_ids("stages", kStageNames, v); })
      .param("one_vs_one", true, "only games with exactly 2 players (Nana is not a player)")
      .param("humans_only", false,
             "only games whose every player is human (leaves out games with a CPU or a demo "
             "player)")
      .param("min_version", std::string(),
             "skip replays recorded by a Slippi older than this, e.g. 3.0.0 (empty: any)")
      .check([](const ParamValue& v) -> std::string {
        const auto* text = std::get_if<std::string>(&v);
        if (!text || text->empty() || slp::Version::parse(*text)) return "";
        return "min_version: '" + *text + "' is not a version (MAJOR[.MINOR[.BUILD]], e.g. 3.0.0)";
      })
      .param("skip_duplicates", true,
             "leave out a game recorded twice (same random seed, stage, players and length: a "
             "copied file, or two consoles' recordings), keeping the copy first in identity "
             "order; counted in the report")
      .in_older_runs(false)
      .param("validation_fraction", 0.1,
             "fraction of whole games held out, by seed and game identity (1: all of them)")
      .range(0, 1)
      .param("shuffle", true, "shuffle windows each epoch (permutation from seed and epoch)")
      .param("rows", std::string("shuffled"),
             "what a batch row holds: shuffled, any window of the epoch's order; streams, the "
             "window right after the row's previous one, so each row walks one game (seen from "
             "one player) window by window, games in an order drawn each epoch, and `continues` "
             "says which rows go on (a model with it connected carries its state across "
             "batches); needs stride = window")
      .choices({"shuffled", "streams"})
      .param("validation_rows", std::string("stretches"),
             "validation under rows: streams: stretches, the games' windows end to end cut into "
             "batch_size equal stretches (a stretch may start inside a game, from zero state); "
             "whole_games, each row whole games from their first window to their last (what "
             "eval --whole-games reads: every game scored with its state carried; batch_size at "
             "most the number of games' perspectives)")
      .choices({"stretches", "whole_games"})
      .param("shuffle_order", std::string("keyed"),
             "keyed: each position's window computed from (seed, epoch) — no table, any number of "
             "windows, nothing built at an epoch's start; table: the epoch's permutation as a "
             "table of 32-bit indices (runs from before this parameter; under 2^32 windows)")
      .choices({"keyed", "table"})
      .in_older_runs(std::string("table"))
      .param("shard", std::string("windows"),
             "with several ranks, windows: every rank loads every game and trains on its rows of "
             "each global batch (the batches of one process at world x batch_size); games: each "
             "rank decodes only its own share of the games, as shard_order says (for corpora "
             "too big for one process's memory; needs MPI)")
      .choices({"windows", "games"})
      .param("shard_order", std::string("ranges"),
             "with shard: games, ranges: each rank takes a contiguous range of the inputs in "
             "name order (one stretch of a corpus per rank); hashed: games spread by a draw from "
             "the seed (runs from before this parameter)")
      .choices({"ranges", "hashed"})
      .in_older_runs(std::string("hashed"))
      .param("perspectives", std::string("both"),
             "both: every player's view; first/second: the first/second player's (the lower/"
             "higher port's in 1v1); port1..port4: that port's")
      .choices({"both", "first", "second", "port1", "port2", "port3", "port4"})
      .param("rollback", std::string("last"), "last: the last copy of each frame; all: as recorded")
      .choices({"last", "all"})
      .param("fields", std::string("slippi"),
             "slippi: the replay's own Post-Frame values; libmelee: as libmelee's GameState "
             "shows them to a bot (whole-frame counters, hitstun = Misc AS, invulnerable = "
             "hurtbox state), for a policy played through libmelee (python/)")
      .choices({"slippi", "libmelee"})
      .param("memory", std::string("auto"),
             "the memory the loaded features may take, checked before decoding (resident_games "
             "auto or all): auto (what the host or the job's cgroup leaves) or a number of GiB")
      .check([](const ParamValue& v) -> std::string {
        const auto* text = std::get_if<std::string>(&v);
        if (!text || *text == "auto") return "";
        try {
          size_t used = 0;
          const double gib = std::stod(*text, &used);
          if (used == text->size() && gib > 0) return "";
        } catch (...) {
        }
        return "memory: '" + *text + "' is neither auto nor a positive number of GiB";
      })
      .param("resident_games", std::string("auto"),
             "how many games' features the training copy holds at once (validation: a third): "
             "all (every game, read once at "
             "setup); N (at least 3: games read when their pool comes up, pools of N/3 games "
             "shuffled each epoch, the next pool read ahead; with rows: streams, at least 2 x "
             "batch_size); auto: all when they fit 80 % of the memory budget (memory), else the N "
             "that fits 40 % of it (a format-version-1 zstd corpus: all)")
      .check([](const ParamValue& v) -> std::string {
        const auto* text = std::get_if<std::string>(&v);
        if (!text || *text == "auto" || *text == "all") return "";
        try {
          size_t used = 0;
          const long long n = std::stoll(*text, &used);
          if (used == text->size() && n >= 3) return "";
        } catch (...) {
        }
        return "resident_games: '" + *text + "' is neither all, auto nor a number of games >= 3";
      })
      .in_older_runs(std::string("all"))
      .param("threads", int64_t{0}, "decode/assembly threads (0: TBB default)")
      .range(0, 1024)
      .param("synthetic", int64_t{0},
             "games to generate and train on when paths is empty (0: none; a given path that "
             "holds no replays is always an error)")
      .range(0, 1000000)
      .param("synthetic_dir", std::string("data/synth"),
             "where synthetic games are cached (<dir>/<seed>-<n>)")
      .path()
      .rule(streams_problem)
      .rule([](const Params& p) -> std::optional<StageSchema::RuleProblem> {
        if (p.string("validation_rows") != "whole_games" || p.string("rows") == "streams")
          return std::nullopt;
        return StageSchema::RuleProblem{
            "validation_rows",
            "validation_rows: whole_games reads the games' windows in order "
            "and needs rows: streams (rows is " +
                p.string("rows") +
                (p.mark("rows").file == "<default>" ? ", the default"
                                                    : ", at " + p.mark("rows").str()) +
                ")"};
      });
}

// The share of the memory budget every game's features may take (resident_games: all); auto
// takes all of them up to 80 %.
constexpr double kAllGamesShare = 0.9;

// Features take about 0.7 bytes per byte of .slp (measured: 0.62 on the shared replays' 63
// MiB, 0.68 of RSS per byte on synthetic sets of 500 to 20,000 games, window index included).
constexpr double kFeatureBytesPerSlpByte = 0.7;

// Before decoding anything: the features the inputs will take (this rank's share with
// shard: games) against what the process can use (replays.memory: auto, what the host or the
// cgroup leaves; or a budget in GiB). A corpus counts the .slp bytes it was built from, and a
// format-version-1 zstd corpus also its columns, which opening it decompresses into memory (all
// ranks alike); today's zstd corpora decode one game at a time; a feature corpus says exactly.
// resident_games: all — past 90 % of the budget, setup stops with both figures and the knobs
// instead of the kernel's OOM kill an hour into decoding, past 80 % a note; N — games on demand, at
// most N in memory; auto — all when they fit 80 % of the budget, else the N that fits 40 % of it.
// Returns N, or 0 for all.
namespace {

// What the inputs' features will take, from file sizes and manifests alone.
struct FeatureEstimate {
  uint64_t slp = 0, decompressed = 0, stored = 0;  // .slp bytes, zstd v1 columns, feature corpora
  uint64_t mapped = 0;  // game corpora's columns.bin, mapped whole: address space, not memory
  size_t games = 0;
  double arrays = 0, need = 0, per_game = 0;  // this rank's arrays, with the columns; a game's
  std::string what;                           // "8 .slp files (1 MiB of replays)"
};

FeatureEstimate estimate_features(const Inputs& in, int ranks) {
  FeatureEstimate e;
  e.games = in.files.size();
  for (const auto& f : in.files) {
    std::error_code ec;
    const auto n = fs::file_size(f, ec);
    if (!ec) e.slp += n;
  }
  for (const auto& dir : in.corpora) {
    const slp::CorpusFootprint c = slp::corpus_footprint(dir);
    e.slp += c.source_bytes;
    e.decompressed += c.decompressed_bytes;
    e.mapped += c.mapped_bytes;
    e.games += c.games;
  }
  for (const auto& dir : in.feature_corpora) {
    const FeatureFootprint c = feature_footprint(dir);
    e.stored += c.feature_bytes;
    e.games += c.games;
  }
  const double share = 1.0 / std::max(1, ranks);
  const double all =
      kFeatureBytesPerSlpByte * static_cast<double>(e.slp) + static_cast<double>(e.stored);
  e.arrays = all * share;
  e.need = e.arrays + static_cast<double>(e.decompressed);
  e.per_game = e.games ? all / static_cast<double>(e.games) : 0;
  e.what = std::to_string(in.files.size()) + " .slp files";
  if (!in.corpora.empty()) e.what += ", " + std::to_string(in.corpora.size()) + " corpora";
  if (!in.feature_corpora.empty())
    e.what += ", " + std::to_string(in.feature_corpora.size()) + " feature corpora";
  e.what += " (" + format_bytes(e.slp) + " of replays" +
            (e.stored ? ", " + format_bytes(e.stored) + " of features in feature corpora"
                      : std::string()) +
            (e.decompressed ? ", " + format_bytes(e.decompressed) + " of zstd columns to unpack"
                            : std::string()) +
            ")";
  return e;
}

}  // namespace

uint64_t ReplaysStage::resident_games(const StageContext& ctx, const Inputs& in, int ranks) const {
  const Params& p = ctx.params();
  FeatureEstimate e;
  try {
    e = estimate_features(in, ranks);
  } catch (const std::exception& err) {
    throw ConfigError({{p.mark("paths"), "stage '" + ctx.name() + "': " + err.what()}});
  }
  const std::string setting = p.string("resident_games");
  if (setting != "all" && setting != "auto") return std::stoull(setting);
  const double need = e.need;
  std::optional<HostMemory> have;
  const std::string budget = p.string("memory");
  if (budget == "auto")
    have = usable_host_memory();
  else
    have = HostMemory{static_cast<uint64_t>(std::stod(budget) * 1073741824.0),
                      "replays.memory: " + budget + " GiB"};
  if (!have || need <= 0) return 0;
  // Under an address space limit (ulimit -v) the mapped columns count too: the mapping takes
  // that space whole, resident or not (it failed in setup with a bare bad_alloc).
  if (have->source.starts_with("ulimit -v") && e.mapped > 0) {
    have->bytes -= std::min(have->bytes, e.mapped);
    have->source += ", less " + format_bytes(e.mapped) + " of game corpus columns mapped";
  }
  const double avail = static_cast<double>(have->bytes);
  const std::string& what = e.what;
  const std::string figures = what + " need about " + format_bytes(static_cast<uint64_t>(need)) +
                              " of features" +
                              (ranks > 1 ? " on this rank (1/" + std::to_string(ranks) + ")" : "") +
                              "; " + format_bytes(have->bytes) + " usable (" + have->source + ")";
  // A version-1 zstd corpus unpacks whole at open: reading its games on demand saves nothing.
  if (setting == "auto" && need > 0.8 * avail && e.per_game > 0 && e.decompressed == 0) {
    const double n = std::floor(0.4 * avail / e.per_game);
    if (n >= 3 && n < static_cast<double>(e.games) / std::max(1, ranks)) {
      ctx.log("note: " + figures + ": games are read on demand, at most " +
              std::to_string(static_cast<uint64_t>(n)) +
              " in memory (resident_games: auto; resident_games: N sets it)");
      return static_cast<uint64_t>(n);
    }
  }
  // The features leave room for the rest of the process (the model, batches in flight, the
  // threads' stacks): at 99 % of the budget, setup ran out of memory with no word of the cause.
  if (need > kAllGamesShare * avail) {
    // With auto, on demand was not possible here: say why instead of suggesting it.
    std::string on_demand = "Read games on demand (resident_games: auto, or N games at once)";
    if (setting == "auto")
      on_demand =
          e.decompressed > 0
              ? "A version-1 --zstd game corpus unpacks whole at open, so reading its games on "
                "demand saves nothing: rebuild it with `slipstream corpus build --zstd`"
              : "Games read on demand need at least 3 in memory and 40 % of this budget holds " +
                    std::to_string(e.per_game > 0 ? static_cast<uint64_t>(0.4 * avail / e.per_game)
                                                  : 0) +
                    " (resident_games: N sets it)";
    throw ConfigError(
        {{p.mark("paths"), "stage '" + ctx.name() + "': " + figures +
                               (need <= avail ? " (features past 90 % of it leave too little "
                                                "for the rest of the run)"
                                              : std::string()) +
                               ". " + on_demand +
                               ", train on fewer replays (paths), shard: games over more ranks "
                               "(each holds its share), or give the job more memory; "
                               "replays.memory: N (GiB) sets the budget this check uses"}});
  }
  if (need > 0.8 * avail) ctx.log("note: " + figures + ": memory is tight");
  return 0;
}

Filters ReplaysStage::filters(const StageContext& ctx, bool by_games) const {
  const Params& p = ctx.params();
  Filters f;
  f.rollback = p.string("rollback") == "all" ? RollbackMode::all : RollbackMode::last;
  f.fields = p.string("fields") == "libmelee" ? FieldReading::libmelee : FieldReading::slippi;
  f.one_vs_one = p.boolean("one_vs_one");
  f.humans_only = p.boolean("humans_only");
  if (!p.string("min_version").empty())
    f.min_version = slp::Version::parse(p.string("min_version"));
  f.skip_duplicates = p.boolean("skip_duplicates");
  std::string problem;  // none: the schema's checks passed at validation
  f.stages = resolve_ids(p.strings("stages"), "stages", kStageNames, problem);
  f.characters = resolve_ids(p.strings("characters"), "characters", kCharacterNames, problem);
  if (!problem.empty()) throw ConfigError({{p.mark("characters"), problem}});
  f.min_frames = p.integer("min_frames");
  f.min_rows = std::max(f.min_frames, window_ + delay_ + 1);
  f.perspectives = p.string("perspectives");
  if (by_games) {
    if (!ctx.run().reduce_over_ranks)
      throw ConfigError({{p.mark("shard"), "stage '" + ctx.name() +
                                               "': shard: games with several ranks needs MPI "
                                               "(this build has none); use shard: windows"}});
    f.shard_rank = ctx.run().rank;
    f.shard_world = ctx.run().world_size;
    f.shard_seed = ctx.run().seed;
    f.shard_ranges = p.string("shard_order") == "ranges";
  }
  return f;
}

Inputs ReplaysStage::inputs_or_synthetic(const StageContext& ctx, const std::string& who,
                                         std::ostringstream& rep) {
  const Params& p = ctx.params();
  const std::vector<std::string>& paths = p.strings("paths");
  Inputs in = resolve_inputs(paths);
  if (holds_nothing(in)) {
    const int64_t n = p.integer("synthetic");
    // Paths the user gave that hold nothing are a mistake to report, never a reason to train on
    // generated games instead.
    if (n <= 0 || !paths.empty())
      throw ConfigError(
          {{p.mark("paths"),
            "stage '" + ctx.name() + "': no replays in paths" +
                (paths.empty() ? std::string(" []; set paths, or synthetic: N to train on N "
                                             "generated games")
                               : ": " + describe_empty_paths(paths) +
                                     "; point paths at .slp files, folders, globs or a corpus")}});
    bool generated = false;
    const fs::path dir = synthetic_games(p.string("synthetic_dir"), ctx.run().seed, n, generated);
    synthetic_dir_used_ = dir.string();
    rep << who << ": no replays in paths " << paths_str(paths) << "; using " << n
        << " synthetic games in " << dir.string() << (generated ? " (generated)" : " (cached)")
        << "\n";
    in = resolve_inputs({dir.string()});
  }
  return in;
}

void ReplaysStage::count_batches(StageContext& ctx, bool by_games, const std::string& who) {
  const uint64_t B = static_cast<uint64_t>(batch_);
  if (validation_) {
    batches_per_epoch_ = (windows_.size() + B - 1) / B;  // last batch padded, mask 0
    total_batches_ = batches_per_epoch_;
    // Each rank validates on its own games: the runner takes each rank's first batches.
    if (by_games) ctx.declare_validation_per_rank();
  } else {
    // shard: windows: rank r takes rows r·B.. of each world·B of the one shuffled order; shard:
    // games: every row of its own order, as many batches as the rank with the fewest has.
    rank_ = by_games ? 0 : static_cast<uint64_t>(ctx.run().rank);
    world_ = by_games ? 1 : static_cast<uint64_t>(ctx.run().world_size);
    batches_per_epoch_ = windows_.size() / (B * world_);
    if (by_games) {
      double fewest = static_cast<double>(batches_per_epoch_);
      ctx.run().reduce_over_ranks(std::span<double>(&fewest, 1), RankReduce::min,
                                  who + ": the ranks' batches per epoch");
      batches_per_epoch_ = static_cast<uint64_t>(fewest);
    }
    // run.steps set: the run stops there, so epochs repeat until it does (run.epochs bounds only
    // runs without a step count).
    total_batches_ = ctx.run().total_steps > 0
                         ? std::numeric_limits<uint64_t>::max()
                         : batches_per_epoch_ * static_cast<uint64_t>(epochs_);
  }
}

void ReplaysStage::set_order() {
  order_.reset(windows_.size(), static_cast<uint64_t>(batch_), batches_per_epoch_, validation_,
               shuffle_, keyed_order_, seed_, rank_, world_);
  wanted_pools_.clear();
  const std::vector<uint64_t>& by_perspective = windows_.first();
  if (!data_->resident && !streams_) {
    // Windows grouped by game (perspectives in game order); games without windows left out.
    std::vector<uint64_t> first;
    order_games_.clear();
    for (size_t p = 0; p < perspectives_.size(); ++p) {
      const uint32_t g = perspectives_[p].game;
      if (by_perspective[p + 1] == by_perspective[p]) continue;
      if (order_games_.empty() || order_games_.back() != g) {
        order_games_.push_back(g);
        first.push_back(by_perspective[p]);
      }
    }
    first.push_back(windows_.size());
    order_.set_pools(std::move(first), pool_games());
  }
  if (streams_) order_.set_streams(by_perspective, whole_games_);
}

void ReplaysStage::setup(StageContext& ctx) {
  const Params& p = ctx.params();
  validation_ = forced_split_.value_or(ctx.split()) == StageContext::Split::validation;
  batch_ = p.integer("batch_size");
  window_ = p.integer("window");
  delay_ = p.integer("delay");
  shuffle_ = p.boolean("shuffle");
  stride_ = p.integer("stride") == 0 ? window_ : p.integer("stride");
  streams_ = p.string("rows") == "streams";
  // rows: streams has stride = window (the schema's rule)
  keyed_order_ = p.string("shuffle_order") == "keyed";
  epochs_ = std::max<int64_t>(1, ctx.run().epochs);
  seed_ = ctx.seed();
  const int64_t threads = p.integer("threads");
  arena_ = std::make_unique<tbb::task_arena>(threads > 0 ? static_cast<int>(threads)
                                                         : tbb::task_arena::automatic);
  const std::string who = "slippi_replays '" + ctx.name() + "'";
  // shard: games with several ranks: each rank decodes only its own games, and the ranks agree
  // on the step count through the run's rank reduction.
  const bool by_games = p.string("shard") == "games" && ctx.run().world_size > 1;
  const Filters f = filters(ctx, by_games);
  std::ostringstream rep;
  const Inputs in = inputs_or_synthetic(ctx, who, rep);
  // The validation copy reads the training copy's dataset, resident or not; alone (eval), it
  // loads its own within the memory settings as training would.
  std::string given = f.key() + "|synthetic " + std::to_string(p.integer("synthetic")) + " " +
                      p.string("synthetic_dir");
  for (const auto& path : p.strings("paths")) given += "|" + path;
  std::shared_ptr<const ReplayDataset> shared = validation_ ? live_dataset(given) : nullptr;
  const uint64_t on_demand =
      shared ? 0 : resident_games(ctx, in, by_games ? ctx.run().world_size : 1);

  // Pinned validation games: their own dataset. The validation copy reads only it; the training
  // copy leaves out any game it also holds.
  const std::vector<std::string>& vpaths = p.strings("validation_paths");
  std::shared_ptr<const ReplayDataset> pinned;
  bool fresh_pinned = false;
  if (!vpaths.empty()) {
    Inputs vin = resolve_inputs(vpaths);
    if (holds_nothing(vin))
      throw ConfigError({{p.mark("validation_paths"), "stage '" + ctx.name() +
                                                          "': validation_paths hold no replays: " +
                                                          describe_empty_paths(vpaths)}});
    bool vfresh = false;
    pinned = cached_dataset(vin, f, *arena_, vfresh);
    if (validation_) fresh_pinned = vfresh;
  }

  bool fresh = fresh_pinned;
  data_ = validation_ && pinned ? pinned
          : shared              ? shared
                                : cached_dataset(in, f, *arena_, fresh, on_demand, given);
  const ReplayDataset& ds = *data_;

  // Split: whole games (replay_split.h); both sides' windows are counted for the report, the
  // stage keeps its own side's.
  const double frac = p.number("validation_fraction");
  const int stride = static_cast<int>(stride_);
  GameSplit split = split_games(ds, pinned.get(), validation_, frac, seed_,
                                static_cast<int>(window_), stride, static_cast<int>(delay_));
  const std::array<size_t, 2> ngames = {split.games[0].size(), split.games[1].size()};
  const std::array<size_t, 2>& nwin = split.windows;
  const size_t overlap = split.overlap;
  const int mine = validation_ ? 1 : 0;
  perspectives_ = std::move(split.perspectives[mine]);
  split_games_ = std::move(split.games[mine]);
  windows_ = WindowIndex(ds.games, perspectives_, static_cast<int>(window_), stride,
                         static_cast<int>(delay_));
  whole_games_ = validation_ && streams_ && p.string("validation_rows") == "whole_games";
  if (whole_games_) {
    // A row a perspective at most: rows past them would be padding for the whole pass.
    const std::vector<uint64_t>& first = windows_.first();
    int64_t with_windows = 0;
    for (size_t i = 0; i + 1 < first.size(); ++i) with_windows += first[i + 1] > first[i];
    batch_ = std::max<int64_t>(1, std::min(batch_, with_windows));
  }

  const uint64_t B = static_cast<uint64_t>(batch_);
  count_batches(ctx, by_games, who);

  // The report: once per loaded dataset (the validation copy reuses the training copy's).
  ReportFacts facts;
  facts.who = who;
  facts.shard_rank = by_games ? ctx.run().rank : -1;
  facts.validation_copy = validation_;
  facts.pinned = pinned.get();
  facts.batch = B;
  facts.world = world_;
  facts.games = ngames;
  facts.windows = nwin;
  facts.overlap = overlap;
  // Every skipped file, listed in the run directory by the training copy (the report names a
  // few of each kind): tens of thousands of replays skip more than a console shows.
  size_t skips = ds.damaged;
  for (const auto& s : ds.skips) skips += s.count;
  if (!validation_ && ctx.run().writes_outputs()) {  // none: an earlier start's list goes
    if (skips > 0)
      facts.skipped_file = (fs::path(ctx.run().run_dir) / (ctx.name() + ".skipped.txt")).string();
    skipped_ = skips > 0 ? skipped_list(ds) : std::string();
  }
  rep << dataset_report(ds, facts);
  for (const auto& line : in.ignored) rep << "  warning: " << line << "\n";
  report_ = rep.str();
  // Through the run's console, the stage's name in front of each line: once (rank 0), or by
  // every rank when each holds its own games (shard: games).
  if (fresh) {
    std::istringstream lines(report_);
    const std::string self = who + ": ";
    for (std::string line; std::getline(lines, line);)
      ctx.log(line.starts_with(self) ? line.substr(self.size()) : line, /*every_rank=*/by_games);
  }

  if (!validation_) {
    if (windows_.empty()) throw std::runtime_error(no_windows_error(ds, who, ngames[1], frac));
    if (ctx.run().writes_outputs())  // which games trained and which validated, for audits
      splits_ = splits_json(ds, split_games_, split.games[1], pinned.get(),
                            by_games ? ctx.run().world_size : 1);
    if (batches_per_epoch_ == 0 && by_games)
      throw std::runtime_error(
          who + ": the rank whose share of the games holds the fewest training windows has " +
          "fewer than batch_size=" + std::to_string(B) + " (every rank takes as many batches " +
          "as that one; this rank holds " + std::to_string(windows_.size()) +
          "); fewer ranks, a lower batch_size, more replays, or shard: windows");
    if (batches_per_epoch_ == 0)
      throw std::runtime_error(who + ": only " + std::to_string(windows_.size()) +
                               " training windows, fewer than batch_size=" + std::to_string(B) +
                               "; lower batch_size or stride, or add replays");
    // The run's length when run.steps is not set (the graph divides by rebatching and
    // accumulation); unbounded when it is.
    ctx.declare_source_batches(
        total_batches_ == std::numeric_limits<uint64_t>::max() ? 0 : total_batches_);
  }

  uint64_t fp = mix64(windows_.size() ^ mix64(static_cast<uint64_t>(window_) << 32 | delay_));
  fp = mix64(fp ^ B ^ (static_cast<uint64_t>(stride_) << 20));
  if (streams_) fp = mix64(fp ^ 0x57AE);
  if (!ds.resident) fp = mix64(fp ^ 0xB0DED ^ ds.resident_games);
  for (uint32_t g : split_games_) fp = mix64(fp ^ ds.games[g].identity);
  fingerprint_ = hex64(fp);
  // Ranks that each read the whole data set (shard: windows) must have read the same one.
  if (ctx.run().world_size > 1 && ctx.run().reduce_over_ranks)
    check_ranks_agree(ctx.run(), in, ds, by_games, fp, who);

  WindowBatch::declare(ctx, static_cast<int64_t>(B), window_);
  if (streams_) ctx.run().rows_continue = true;
  set_order();
  // Validation's rows hold whole perspectives: as many batches as its longest row.
  if (whole_games_) batches_per_epoch_ = total_batches_ = order_.validation_stream_batches();
  if (!ds.resident) read_on_demand(ctx, by_games);
}

// Bounded memory: the games read as the order reaches them (ResidentGames).
void ReplaysStage::read_on_demand(StageContext& ctx, bool by_games) {
  const Params& p = ctx.params();
  const uint64_t B = static_cast<uint64_t>(batch_), n = data_->resident_games;
  if (streams_ && n < 2 * B)
    throw ConfigError(
        {{p.mark("resident_games"),
          "stage '" + ctx.name() + "': rows: streams walks batch_size=" + std::to_string(B) +
              " games at once; resident_games must be at " + "least 2 x batch_size (" +
              std::to_string(2 * B) + "), got " + std::to_string(n)}});
  resident_ = std::make_unique<ResidentGames>(data_);
  if (!validation_)
    ctx.log("memory: games read on demand, at most " + std::to_string(n) +
                (streams_ ? " resident (each row's game and the next ones read ahead)"
                          : " resident (pools of " + std::to_string(pool_games()) +
                                " games, the next pool read ahead)") +
                "; " + format_bytes(data_->bytes) + " of features in all",
            by_games);
}

// Pools of N/3 games (a batch's one or two and the next); the validation copy, which reads a
// few batches a pass, a third of that, so both copies together hold at most 4N/3 games.
uint64_t ReplaysStage::pool_games() const {
  return std::max<uint64_t>(1, data_->resident_games / (validation_ ? 9 : 3));
}

// Bounded memory: the games the next batch reads, and those read ahead — the pool after the
// batch's (pools), or the games of the next few batches (streams). Unchanged pools ask nothing.
void ReplaysStage::want_games(uint64_t k) {
  std::vector<uint32_t> now, ahead;
  auto dataset_games = [&](const std::vector<uint32_t>& split_games, std::vector<uint32_t>& out) {
    for (uint32_t i : split_games) out.push_back(order_games_[i]);
  };
  if (order_.pooled()) {
    const std::vector<WindowOrder::Pool> pools = order_.pools_of(k);
    if (pools.empty() || pools == wanted_pools_) return;
    wanted_pools_ = pools;
    for (const auto& q : pools) dataset_games(order_.pool_games(q), now);
    dataset_games(order_.pool_games(order_.pool_after(pools.back())), ahead);
  } else {
    constexpr uint64_t kAhead = 8;  // batches
    std::unordered_set<uint32_t> seen;
    for (uint64_t b = k; b <= k + kAhead && b < total_batches_; ++b)
      for (uint64_t r = 0; r < static_cast<uint64_t>(batch_); ++r) {
        const size_t w = order_.window_at(b, r);
        if (w == WindowOrder::kPadding) continue;
        const uint32_t g = perspectives_[windows_[w].perspective].game;
        if (seen.insert(g).second) (b == k ? now : ahead).push_back(g);
      }
    // At most resident_games in all: the games needed soonest are read ahead first.
    const uint64_t room = data_->resident_games - std::min(data_->resident_games, now.size());
    if (ahead.size() > room) ahead.resize(room);
  }
  resident_->want(now, ahead);
}

const GameFeatures& ReplaysStage::game_of(const WindowRef& w) const {
  return data_->games[perspectives_[w.perspective].game];
}

void ReplaysStage::seek(uint64_t next_index, StageContext& ctx) {
  (void)ctx;
  next_ = next_index;
}

bool ReplaysStage::produce(Batch& out, StageContext& ctx) {
  const uint64_t k = out.index;
  next_ = k + 1;
  if (k >= total_batches_) return false;
  const uint64_t B = static_cast<uint64_t>(batch_);
  std::vector<std::optional<WindowRef>> rows(B);
  std::vector<uint8_t> continues(B, 0);
  uint64_t real = 0;
  for (uint64_t r = 0; r < B; ++r) {
    bool cont = false;
    const size_t w = order_.window_at(k, r, &cont);
    if (w == WindowOrder::kPadding) continue;  // validation's last batches: padding
    rows[r] = windows_[w];
    continues[r] = cont;
    ++real;
  }

  // Bounded memory: each row's game, resident or read now, held until the batch is filled. A
  // game that cannot be read now (its source damaged or changed since setup) leaves its rows
  // out, as padding, in this batch and every later one: a run goes on (and resumes) past it.
  std::vector<std::shared_ptr<const GameFeatures>> held(B);
  if (resident_) {
    want_games(k);
    for (uint64_t r = 0; r < B; ++r) {
      if (!rows[r]) continue;
      const uint32_t g = perspectives_[rows[r]->perspective].game;
      std::string failure;
      held[r] = resident_->get(g, &failure);
      if (held[r]) continue;
      if (!failure.empty())
        ctx.log("warning: " + data_->games[g].source + " could not be read at batch " +
                    std::to_string(k) + " (" + failure + "): its windows are left out of " +
                    (validation_ ? "validation" : "training") + " from now on (" +
                    std::to_string(resident_->stats().unreadable) +
                    " game(s) so far); mend or rebuild the source to use them again",
                /*every_rank=*/true);
      rows[r].reset();
      continues[r] = 0;
      --real;
    }
  }
  const WindowBatch t = WindowBatch::allocate(static_cast<int64_t>(B), window_, "slippi_replays");
  fill(rows, held, t.view);
  for (uint64_t r = 0; r < B; ++r) t.view.continues[r] = continues[r] ? 1.0f : 0.0f;
  t.publish(out, ctx);
  out.epoch = order_.epoch_of(k);
  out.samples = real;
  return true;
}

void ReplaysStage::fill(const std::vector<std::optional<WindowRef>>& rows,
                        const std::vector<std::shared_ptr<const GameFeatures>>& held,
                        const BatchView& view) const {
  const int delay = static_cast<int>(delay_);
  arena_->execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, rows.size(), 8), [&](const auto& r) {
      for (size_t i = r.begin(); i != r.end(); ++i) {
        if (!rows[i]) {
          zero_window(view, static_cast<int64_t>(i));
          continue;
        }
        const WindowRef& w = *rows[i];
        fill_window(held[i] ? *held[i] : game_of(w), perspectives_[w.perspective], w.start, delay,
                    view, static_cast<int64_t>(i));
      }
    });
  });
}

ReplaysStage::WindowInfo ReplaysStage::window(uint64_t batch, int64_t row) const {
  if (batch >= total_batches_ || row < 0 || row >= batch_)
    throw std::out_of_range("slippi_replays: no batch " + std::to_string(batch) + " row " +
                            std::to_string(row));
  WindowInfo info;
  const size_t idx = order_.window_at(batch, static_cast<uint64_t>(row), &info.continues);
  if (idx == WindowOrder::kPadding) {
    info.padding = true;
    return info;
  }
  const WindowRef w = windows_[idx];
  const Perspective& p = perspectives_[w.perspective];
  std::optional<GameFeatures> read;  // bounded memory: read for the question
  if (!data_->resident) read = data_->read_game(p.game);
  const GameFeatures& g = read ? *read : data_->games[p.game];
  info.source = g.source;
  info.player_port = g.players[p.player].port;
  info.opponent_port = g.players[p.opponent].port;
  info.has_follower = g.players[p.player].has_follower;
  info.start = w.start;
  info.recorded_row = g.recorded_row[w.start];
  info.frame = g.frame[w.start];
  return info;
}

std::vector<std::string> ReplaysStage::sources() const {
  std::vector<std::string> out;
  for (uint32_t g : split_games_) out.push_back(data_->games[g].source);
  return out;
}

std::vector<uint64_t> ReplaysStage::same_games() const {
  std::vector<uint64_t> out;
  for (uint32_t g : split_games_) out.push_back(data_->games[g].same_game);
  return out;
}

std::vector<std::pair<std::string, size_t>> ReplaysStage::skipped() const {
  std::vector<std::pair<std::string, size_t>> out;
  for (size_t r = 0; r < kSkipReasons; ++r)
    if (data_->skips[r].count) out.emplace_back(kSkipNames[r], data_->skips[r].count);
  return out;
}

size_t ReplaysStage::damaged() const {
  return data_->damaged;
}

std::optional<ResidentGames::Stats> ReplaysStage::resident_stats() const {
  if (!resident_) return std::nullopt;
  return resident_->stats();
}

void ReplaysStage::save(StateWriter& w) const {
  // The position is the runner's batch index; the fingerprint detects a changed data set.
  w.text("fingerprint", fingerprint_);
  w.integer("windows", static_cast<int64_t>(windows_.size()));
  w.integer("batch_size", batch_);
}

void ReplaysStage::load(StateReader& r) {
  load_warning_.clear();
  if (!r.has("fingerprint") || r.text("fingerprint") == fingerprint_) return;
  // What changed, where the checkpoint says: the windows (the games, their split, the window
  // settings) and the batch size; else the games themselves (same count, others).
  std::string what;
  auto differs = [&](const char* key, int64_t now) {
    if (!r.has(key) || r.integer(key) == now) return;
    what += (what.empty() ? "" : ", ") + std::string(key) + ": " + std::to_string(r.integer(key)) +
            " then, " + std::to_string(now) + " now";
  };
  differs("windows", static_cast<int64_t>(windows_.size()));
  differs("batch_size", batch_);
  if (what.empty()) what = "the same number of windows, from other games or another order";
  load_warning_ =
      "warning: the replays, split, window or batch settings differ from the "
      "checkpoint's (" +
      what + "); batches after the resume point will not match the original run" +
      (streams_ ? ", and the rows' carried state starts again from zero" : "");
}

// The splits file is written here, once the run has started (a resume that fails to load its
// checkpoint writes nothing). A resumed run's file keeps the games it trained on before.
void ReplaysStage::start(StageContext& ctx) {
  if (!load_warning_.empty()) ctx.log(load_warning_);
  if (skipped_) {
    const fs::path list = fs::path(ctx.run().run_dir) / (ctx.name() + ".skipped.txt");
    std::error_code ec;
    if (skipped_->empty())
      fs::remove(list, ec);
    else
      write_file_atomically(list.string(), *skipped_);
    skipped_.reset();
  }
  if (splits_.empty()) return;
  const fs::path file = fs::path(ctx.run().run_dir) / (ctx.name() + ".splits.json");
  std::string text = std::exchange(splits_, {});
  std::ifstream in(file);
  if (in) {
    const std::string previous((std::istreambuf_iterator<char>(in)), {});
    std::vector<std::string> trained_then_validating;
    text = merged_splits_json(text, previous, trained_then_validating);
    if (!trained_then_validating.empty()) {
      std::string names;
      for (size_t i = 0; i < trained_then_validating.size() && i < 3; ++i)
        names += (i ? ", " : "") + trained_then_validating[i];
      if (trained_then_validating.size() > 3) names += ", ...";
      ctx.log("warning: " + std::to_string(trained_then_validating.size()) +
              " validation game(s) were training games before this resume (" + names +
              "): the validation figures are not held out. The split moved with a changed " +
              "seed, validation_fraction or validation_paths");
    }
  }
  write_file_atomically(file.string(), text);
}

}  // namespace slipstream::melee

namespace slipstream::melee {
using SlippiReplaysStage = ReplaysStage;
SLIPSTREAM_REGISTER_STAGE(SlippiReplaysStage);
}  // namespace slipstream::melee

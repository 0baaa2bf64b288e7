// The replay loader's games: see replay_dataset.h.
#include "stages/melee/replay_dataset.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "stages/melee/feature_corpus.h"
#include "stages/melee/slp/corpus.h"
#include "stages/melee/slp/names.h"
#include "stages/melee/slp/parser.h"

namespace fs = std::filesystem;

namespace slipstream::melee {

namespace {

// Cache key: what was read (paths, sizes, times) and how it was filtered.
std::string dataset_key(const Inputs& in, const Filters& f) {
  std::ostringstream k;
  auto stamp = [&](const fs::path& p) {
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    const auto time = fs::last_write_time(p, ec);
    k << fs::absolute(p, ec).lexically_normal().string() << ':' << size << ':'
      << time.time_since_epoch().count() << '\n';
  };
  for (const auto& p : in.files) stamp(p);
  for (const auto& c : in.corpora) stamp(c / "manifest.json");
  for (const auto& c : in.feature_corpora) stamp(c / kFeatureManifestName);
  for (const auto& m : in.missing) k << "missing:" << m << '\n';
  for (const auto& u : in.unreadable) k << "unreadable:" << u << '\n';
  k << f.key();
  return k.str();
}

// ---- decoding and filtering one game ----

struct Outcome {
  std::optional<GameFeatures> game;
  uint64_t same_game = 0;  // equal for two recordings of one game (same_game_key)
  std::vector<uint8_t> players;
  int reason = -1;
  std::string detail;  // the name shown in the report
  bool damaged = false;
  std::string damage;  // the parser's note on a damaged file (with the byte offset)
  size_t bytes = 0;    // the game's arrays, resident or not
};

// Two files of one game — a copy, or the same game saved by two consoles' recorders — share the
// game's random seed, stage, players (port, character, type) and length; different games do not.
uint64_t same_game_key(const slp::GameStart& start, size_t rows) {
  uint64_t h = mix64(0x5a3e5a3e5a3eull ^ start.random_seed);
  h = mix64(h ^ start.stage);
  for (const auto& p : start.players)
    h = mix64(h ^ (uint64_t{p.port} << 16 | uint64_t{p.character} << 8 | p.type));
  return mix64(h ^ rows);
}

// The checks on Game Start alone: players, humans_only, min_version, stages. False (with the
// reason in `o`) when the game is left out.
bool check_start(const slp::GameStart& start, const Filters& f, Outcome& o) {
  const size_t np = start.players.size();
  if (f.one_vs_one ? np != 2 : np < 2) {
    o.reason = kSkipPlayers;
    o.detail += " (" + std::to_string(np) + (np == 1 ? " player)" : " players)");
    return false;
  }
  if (f.humans_only)
    for (const auto& p : start.players)
      if (p.type != 0) {
        o.reason = kSkipNotHuman;
        o.detail +=
            " (port " + std::to_string(p.port + 1) + ": " + (p.type == 1 ? "CPU" : "demo") + ")";
        return false;
      }
  if (f.min_version && start.version < *f.min_version) {
    o.reason = kSkipVersion;
    o.detail += " (Slippi " + start.version.str() + ")";
    return false;
  }
  if (!f.stages.empty() &&
      std::find(f.stages.begin(), f.stages.end(), int64_t{start.stage}) == f.stages.end()) {
    o.reason = kSkipStage;
    const auto name = slp::stage_name(start.stage);
    o.detail +=
        " (stage " + std::to_string(start.stage) + (name ? " " + std::string(*name) : "") + ")";
    return false;
  }
  return true;
}

// The checks on the extracted features (a player without frames, length, perspectives and
// characters); `feat` may be a header without its arrays. Keeps it in `o` when it passes.
void check_features(const slp::GameStart& start, GameFeatures feat, const Filters& f, Outcome& o) {
  const size_t np = start.players.size();
  if (feat.players.size() != np) {
    o.reason = kSkipNoFrames;
    return;
  }
  if (static_cast<int64_t>(feat.rows) < f.min_rows) {
    o.reason = kSkipShort;
    o.detail += " (" + std::to_string(feat.rows) + " frames)";
    return;
  }
  o.same_game = same_game_key(start, feat.rows);
  feat.same_game = o.same_game;
  for (size_t i = 0; i < np; ++i) {
    if (f.perspectives == "first" && i != 0) continue;
    if (f.perspectives == "second" && i != 1) continue;
    // portN: the player at that port (1-based, as the game shows it).
    if (f.perspectives.starts_with("port") &&
        feat.players[i].port + 1 != f.perspectives.back() - '0')
      continue;
    const int64_t ch = feat.players[i].character;
    if (!f.characters.empty() &&
        std::find(f.characters.begin(), f.characters.end(), ch) == f.characters.end())
      continue;
    o.players.push_back(static_cast<uint8_t>(i));
  }
  if (o.players.empty()) {
    o.reason = kSkipCharacters;
    return;
  }
  o.game = std::move(feat);
}

Outcome process_view(const slp::GameView& g, const Filters& f, std::string name) {
  Outcome o;
  o.detail = std::move(name);
  o.damaged = g.info.partial;
  if (o.damaged) o.damage = o.detail + " (" + g.info.error + ")";
  if (!check_start(g.info.start, f, o)) return o;
  check_features(g.info.start, extract_features(g, f.rollback, f.fields), f, o);
  return o;
}

// A feature corpus's game: filtered on its record, its arrays read only when it is kept and
// the dataset is resident.
Outcome process_entry(const FeatureCorpus& c, size_t index, const Filters& f, bool resident) {
  const FeatureEntry& e = c.entry(index);
  Outcome o;
  o.detail = (c.dir() / fs::path(e.source).filename()).string();
  o.damaged = e.damaged;
  if (o.damaged) o.damage = o.detail + " (" + e.damage + ")";
  if (!check_start(e.start, f, o)) return o;
  check_features(e.start, c.header(index), f, o);
  if (o.game && resident) {
    try {
      o.game = c.load(index);
      o.game->same_game = o.same_game;  // the record's facts, as check_features set them
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {  // a byte flipped on disk: this game alone, named
      o.game.reset();
      o.reason = kSkipUnreadable;
      o.detail += " (" + std::string(e.what()) + ")";
    }
  }
  o.bytes = e.feature_bytes;
  return o;
}

Outcome process_file(const fs::path& path, const Filters& f) {
  try {
    slp::ParseOptions opt;
    opt.rollbacks =
        f.rollback == RollbackMode::last ? slp::Rollbacks::kLastCopy : slp::Rollbacks::kKeepAll;
    opt.items = false;
    // One Game per decoding thread, parsed into again and again: after the first few files
    // its columns are large enough and parsing allocates nothing (about 2x faster per file).
    thread_local slp::Game game;
    const std::vector<uint8_t> bytes = slp::read_file_bytes(path);
    slp::parse_slp_into(game, bytes, path.string(), opt);
    return process_view(slp::view_of(game), f, path.string());
  } catch (const slp::ParseError& e) {
    Outcome o;
    o.reason = kSkipUnreadable;
    o.detail = path.string() + " (offset " + std::to_string(e.offset()) + ": " + e.message() + ")";
    return o;
  } catch (const std::bad_alloc&) {
    // Out of memory is this machine's state, not the file's: training on what happened to fit
    // would be a silently smaller dataset.
    throw LoadOutOfMemory(
        "out of memory while loading " + path.string() +
        ": the games' features must fit in RAM (a memory limit, ulimit -v or the container's, "
        "is lower than the dataset needs); give the run more memory, or fewer replays in "
        "replays.paths (or shard: games over several ranks)");
  } catch (const std::exception& e) {
    Outcome o;
    o.reason = kSkipUnreadable;
    o.detail = path.string() + " (" + e.what() + ")";
    return o;
  }
}

// One item of the work list: decoded (or, from a feature corpus, its record read) and
// filtered; its arrays dropped unless `resident`, its size kept either way.
Outcome process_item(const GameItem& it, const ReplayDataset::Sources& s, bool resident);

}  // namespace

// What a dataset needs to read its games again: the inputs it was loaded from, the corpora it
// opened, and where each kept game is.
struct ReplayDataset::Sources {
  Inputs in;
  Filters filters;
  std::vector<slp::Corpus> corpora;
  std::vector<FeatureCorpus> feature_corpora;
  std::vector<GameItem> items;  // per kept game
};

GameFeatures ReplayDataset::read_game(size_t g) const {
  Outcome o = process_item(sources->items.at(g), *sources, /*resident=*/true);
  if (!o.game && o.reason == kSkipUnreadable) throw std::runtime_error(o.detail);
  // A file replaced since setup read it would train on other rows under the same windows.
  const bool same = o.game && o.game->identity == games.at(g).identity &&
                    o.game->rows == games[g].rows &&
                    o.game->players.size() == games[g].players.size();
  if (!same)
    throw std::runtime_error(o.detail + ": no longer the game the run's setup read (" +
                             (o.reason >= 0
                                  ? std::string(kSkipNames[o.reason])
                                  : std::string(o.game ? "another length or identity" : "?")) +
                             "); replays must not change during a run");
  return std::move(*o.game);
}

namespace {

Outcome process_item(const GameItem& it, const ReplayDataset::Sources& s, bool resident) {
  Outcome o;
  if (it.kind == GameItem::kFile) {
    o = process_file(s.in.files[it.index], s.filters);
  } else if (it.kind == GameItem::kCorpus) {
    const slp::Corpus& c = s.corpora[static_cast<size_t>(it.corpus)];
    try {
      // A --zstd corpus decodes this game alone here, freed once its features are out.
      const slp::CorpusGame game = c.game(it.index);
      const slp::GameView& v = game.view();
      o = process_view(v, s.filters, (c.dir() / fs::path(v.info.source).filename()).string());
    } catch (const slp::CorpusError& e) {  // its bytes damaged on disk: this game alone, named
      o.reason = kSkipUnreadable;
      o.detail = e.what();
      return o;
    }
  } else {
    return process_entry(s.feature_corpora[static_cast<size_t>(it.corpus)], it.index, s.filters,
                         resident);
  }
  if (o.game) o.bytes = o.game->bytes();
  // Not resident: the facts the window index needs stay, the arrays go now.
  if (!resident && o.game) *o.game = without_arrays(*o.game);
  return o;
}

// A skip counted under `reason`, named as kSkipListed says (the report shows the first few,
// RUN/NAME.skipped.txt the named ones).
void note_skip(ReplayDataset& ds, int reason, std::string example) {
  auto& s = ds.skips[static_cast<size_t>(reason)];
  ++s.count;
  if (s.examples.size() < (skip_is_problem(reason) ? kSkipListed : kSkipExamples))
    s.examples.push_back(std::move(example));
}

std::array<std::string, kSkipReasons> reason_texts(const Filters& f) {
  return {
      "not found",
      "unreadable",
      f.one_vs_one ? "not 1v1 (one_vs_one: true keeps 2-player games)" : "fewer than 2 players",
      "stage not in stages=" + list_str(f.stages),
      "a player without frames",
      "shorter than min_frames=" + std::to_string(f.min_frames) +
          (f.min_rows > f.min_frames ? " or one window (" + std::to_string(f.min_rows) + " rows)"
                                     : ""),
      "no perspective left by characters=" + list_str(f.characters) +
          " / perspectives=" + f.perspectives,
      "a player not human (humans_only: true)",
      "recorded before Slippi " + (f.min_version ? f.min_version->str() : std::string("-")) +
          " (min_version)",
      "the same game as another file (skip_duplicates: true keeps the first by identity)",
  };
}

// A corpus that cannot be opened (cut short, or not this build's format) stops the setup: its
// games are many, and a run that skipped them all would train on a smaller dataset than asked,
// where one unreadable .slp is one game.
std::string unopenable(const fs::path& dir, const std::exception& e) {
  return dir.string() + ": the corpus cannot be opened (" + e.what() +
         "); to train without it, leave it out of replays.paths";
}

// The work list: each file, then each game of each corpus and feature corpus (opened into `s`:
// a memory map each, or an index). A corpus that cannot be opened, or was built or extracted
// under other settings, is refused.
std::vector<GameItem> open_inputs(ReplayDataset::Sources& s, ReplayDataset& ds) {
  const Inputs& in = s.in;
  const Filters& f = s.filters;
  std::vector<GameItem> items;
  for (size_t i = 0; i < in.files.size(); ++i) items.push_back({GameItem::kFile, -1, i});
  for (const auto& dir : in.corpora) {
    std::optional<slp::Corpus> c;
    try {
      c.emplace(slp::Corpus::open(dir));
    } catch (const std::exception& e) {
      throw std::runtime_error(unopenable(dir, e));
    }
    // Games built keeping other rollback frames are other rows: never mixed in silently.
    const bool keeps_all = c->rollbacks() == slp::Rollbacks::kKeepAll;
    if (keeps_all != (f.rollback == RollbackMode::all))
      throw std::runtime_error(
          dir.string() + ": a game corpus built " +
          (keeps_all ? "keeping every rolled-back frame (--keep-rollbacks)"
                     : "keeping the last copy of rolled-back frames") +
          "; this run reads rollback: " + (f.rollback == RollbackMode::all ? "all" : "last") +
          ". Set replays.rollback to " + (keeps_all ? "all" : "last") +
          ", or build another corpus with `slipstream corpus build" +
          (keeps_all ? "`" : " --keep-rollbacks`"));
    s.corpora.push_back(std::move(*c));
    for (size_t g = 0; g < s.corpora.back().size(); ++g)
      items.push_back({GameItem::kCorpus, static_cast<int>(s.corpora.size() - 1), g});
    ds.corpus_games += s.corpora.back().size();
  }
  for (const auto& dir : in.feature_corpora) {
    std::optional<FeatureCorpus> c;
    try {
      c.emplace(FeatureCorpus::open(dir));
    } catch (const std::exception& e) {
      throw std::runtime_error(unopenable(dir, e));
    }
    // Features extracted under other settings are other features: never mixed in silently.
    auto name = [](RollbackMode m, FieldReading r) {
      return std::string("rollback: ") + (m == RollbackMode::last ? "last" : "all") +
             ", fields: " + (r == FieldReading::slippi ? "slippi" : "libmelee");
    };
    if (c->rollback() != f.rollback || c->fields() != f.fields)
      throw std::runtime_error(
          dir.string() + ": a feature corpus extracted with " + name(c->rollback(), c->fields()) +
          "; this run reads " + name(f.rollback, f.fields) +
          ". Set those parameters to the corpus's, or build another with `slipstream corpus build "
          "--features [--keep-rollbacks] [--fields libmelee]`");
    s.feature_corpora.push_back(std::move(*c));
    for (size_t g = 0; g < s.feature_corpora.back().size(); ++g)
      items.push_back({GameItem::kFeatures, static_cast<int>(s.feature_corpora.size() - 1), g});
    ds.corpus_games += s.feature_corpora.back().size();
  }
  ds.files = in.files.size();
  return items;
}

// shard: games with several ranks: this rank's whole games, the same on every rank whatever the
// order or path prefix each one sees the files under (keyed by file name and size, or corpus
// and index).
void keep_this_ranks_share(std::vector<GameItem>& items, const ReplayDataset::Sources& s,
                           ReplayDataset& ds) {
  const Filters& f = s.filters;
  // `padded`: the corpus index zero-padded, so that keys sort in index order.
  auto name = [&](const GameItem& it, bool padded) {
    if (it.kind != GameItem::kFile) {
      char index[24];
      std::snprintf(index, sizeof index, padded ? "#%020zu" : "#%zu", it.index);
      const fs::path& dir = it.kind == GameItem::kCorpus
                                ? s.corpora[static_cast<size_t>(it.corpus)].dir()
                                : s.feature_corpora[static_cast<size_t>(it.corpus)].dir();
      return dir.filename().string() + index;
    }
    std::error_code ec;
    return s.in.files[it.index].filename().string() + ":" +
           std::to_string(fs::file_size(s.in.files[it.index], ec));
  };
  ds.shard_of = items.size();
  const uint64_t world = static_cast<uint64_t>(f.shard_world);
  const uint64_t rank = static_cast<uint64_t>(f.shard_rank);
  if (f.shard_ranges) {
    // Contiguous ranges of the inputs in key order: a rank reads one stretch of each corpus
    // (its pages, nobody else's), and holds 1/world of the games to within one.
    std::vector<std::pair<std::string, GameItem>> keyed;
    for (const GameItem& it : items) keyed.emplace_back(name(it, true), it);
    std::stable_sort(keyed.begin(), keyed.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    const size_t n = keyed.size();
    const size_t begin = static_cast<size_t>(n * rank / world),
                 end = static_cast<size_t>(n * (rank + 1) / world);
    items.clear();
    for (size_t i = begin; i < end; ++i) items.push_back(keyed[i].second);
  } else {  // runs from before shard_order: a draw from (seed, key), spread over the inputs
    std::erase_if(items, [&](const GameItem& it) {
      uint64_t h = f.shard_seed ^ 0x5ca1ab1e5eedull;
      for (unsigned char c : name(it, false)) h = mix64(h ^ c);
      return h % world != rank;
    });
  }
  ds.files = 0;
  ds.corpus_games = 0;
  for (const GameItem& it : items) (it.kind == GameItem::kFile ? ds.files : ds.corpus_games)++;
}

// The games that passed, in identity order (independent of path spelling, argument order and
// parse-vs-corpus), without a second recording of one game when skip_duplicates asks.
std::vector<size_t> kept_in_identity_order(std::vector<Outcome>& out, const Filters& f,
                                           ReplayDataset& ds) {
  std::vector<size_t> kept;
  for (size_t i = 0; i < out.size(); ++i) {
    Outcome& o = out[i];
    if (o.damaged && ds.damaged++ < kSkipListed) ds.damaged_examples.push_back(o.damage);
    if (o.reason >= 0)
      note_skip(ds, o.reason, o.detail);
    else
      kept.push_back(i);
  }
  std::stable_sort(kept.begin(), kept.end(), [&](size_t a, size_t b) {
    return out[a].game->identity < out[b].game->identity;
  });
  if (!f.skip_duplicates) return kept;
  // The first copy in identity order stays, whatever the file order.
  std::unordered_map<uint64_t, size_t> first;
  std::vector<size_t> unique;
  for (size_t i : kept) {
    const auto [at, fresh] = first.emplace(out[i].same_game, i);
    if (fresh)
      unique.push_back(i);
    else
      note_skip(ds, kSkipDuplicate,
                out[i].detail + " (the same game as " + out[at->second].detail + ")");
  }
  return unique;
}

std::shared_ptr<ReplayDataset> load_dataset(const Inputs& in, const Filters& f,
                                            tbb::task_arena& arena, bool resident) {
  const auto t0 = std::chrono::steady_clock::now();
  auto ds = std::make_shared<ReplayDataset>();
  ds->reason_text = reason_texts(f);
  for (const auto& m : in.missing) note_skip(*ds, kSkipNotFound, m);
  for (const auto& u : in.unreadable) note_skip(*ds, kSkipUnreadable, u);
  auto src = std::make_shared<ReplayDataset::Sources>();
  src->in = in;
  src->filters = f;
  std::vector<GameItem> items = open_inputs(*src, *ds);
  if (f.shard_world > 1) keep_this_ranks_share(items, *src, *ds);

  std::vector<Outcome> out(items.size());
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, items.size(), 1), [&](const auto& r) {
      for (size_t i = r.begin(); i != r.end(); ++i) out[i] = process_item(items[i], *src, resident);
    });
  });
  for (size_t i : kept_in_identity_order(out, f, *ds)) {
    ds->bytes += out[i].bytes;
    ds->game_bytes.push_back(out[i].bytes);
    ds->frames += out[i].game->rows;
    ds->games.push_back(std::move(*out[i].game));
    ds->players.push_back(std::move(out[i].players));
    src->items.push_back(items[i]);
  }
  ds->resident = resident;
  ds->sources = std::move(src);
  ds->threads = arena.max_concurrency();
  ds->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return ds;
}

}  // namespace

namespace {

std::mutex g_cache_mu;
// Loaded datasets while they live, by their inputs' stamps and filters, and by the paths and
// filters a stage was given (live_dataset).
std::map<std::string, std::weak_ptr<const ReplayDataset>> g_by_stamps, g_by_given;

}  // namespace

std::shared_ptr<const ReplayDataset> live_dataset(const std::string& given) {
  std::lock_guard lock(g_cache_mu);
  auto it = g_by_given.find(given);
  return it == g_by_given.end() ? nullptr : it->second.lock();
}

std::shared_ptr<const ReplayDataset> cached_dataset(const Inputs& in, const Filters& f,
                                                    tbb::task_arena& arena, bool& fresh,
                                                    uint64_t on_demand, const std::string& given) {
  const std::string key = dataset_key(in, f) + "|resident " + std::to_string(on_demand);
  std::lock_guard lock(g_cache_mu);
  std::shared_ptr<const ReplayDataset> ds;
  if (auto it = g_by_stamps.find(key); it != g_by_stamps.end()) ds = it->second.lock();
  fresh = !ds;
  if (!ds) {
    ds = load_dataset(in, f, arena, on_demand == 0);
    std::const_pointer_cast<ReplayDataset>(ds)->resident_games = on_demand;
    g_by_stamps[key] = ds;
  }
  if (!given.empty()) g_by_given[given] = ds;
  return ds;
}

}  // namespace slipstream::melee

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

Outcome process_view(const slp::GameView& g, const Filters& f, std::string name) {
  Outcome o;
  o.detail = std::move(name);
  o.damaged = g.info.partial;
  if (o.damaged) o.damage = o.detail + " (" + g.info.error + ")";
  const auto& start = g.info.start;
  const size_t np = start.players.size();
  if (f.one_vs_one ? np != 2 : np < 2) {
    o.reason = kSkipPlayers;
    o.detail += " (" + std::to_string(np) + " players)";
    return o;
  }
  if (f.humans_only)
    for (const auto& p : start.players)
      if (p.type != 0) {
        o.reason = kSkipNotHuman;
        o.detail +=
            " (port " + std::to_string(p.port + 1) + ": " + (p.type == 1 ? "CPU" : "demo") + ")";
        return o;
      }
  if (f.min_version && start.version < *f.min_version) {
    o.reason = kSkipVersion;
    o.detail += " (Slippi " + start.version.str() + ")";
    return o;
  }
  if (!f.stages.empty() &&
      std::find(f.stages.begin(), f.stages.end(), int64_t{start.stage}) == f.stages.end()) {
    o.reason = kSkipStage;
    const auto name = slp::stage_name(start.stage);
    o.detail +=
        " (stage " + std::to_string(start.stage) + (name ? " " + std::string(*name) : "") + ")";
    return o;
  }
  GameFeatures feat = extract_features(g, f.rollback, f.fields);
  if (feat.players.size() != np) {
    o.reason = kSkipNoFrames;
    return o;
  }
  if (static_cast<int64_t>(feat.rows) < f.min_rows) {
    o.reason = kSkipShort;
    o.detail += " (" + std::to_string(feat.rows) + " frames)";
    return o;
  }
  o.same_game = same_game_key(start, feat.rows);
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
    return o;
  }
  o.game = std::move(feat);
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
    throw std::runtime_error(
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

std::shared_ptr<ReplayDataset> load_dataset(const Inputs& in, const Filters& f,
                                            tbb::task_arena& arena) {
  const auto t0 = std::chrono::steady_clock::now();
  auto ds = std::make_shared<ReplayDataset>();
  ds->reason_text = {
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
  for (const auto& m : in.missing) {
    auto& s = ds->skips[kSkipNotFound];
    if (s.count++ < kSkipExamples) s.examples.push_back(m);
  }
  for (const auto& u : in.unreadable) {
    auto& s = ds->skips[kSkipUnreadable];
    if (s.count++ < kSkipExamples) s.examples.push_back(u);
  }

  // Open corpora first (a memory map each); their games join the work list after the files.
  std::vector<slp::Corpus> corpora;
  struct Item {
    int corpus = -1;  // -1: the file
    size_t index = 0;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < in.files.size(); ++i) items.push_back({-1, i});
  for (const auto& dir : in.corpora) {
    try {
      corpora.push_back(slp::Corpus::open(dir));
      for (size_t g = 0; g < corpora.back().size(); ++g)
        items.push_back({static_cast<int>(corpora.size() - 1), g});
      ds->corpus_games += corpora.back().size();
    } catch (const std::exception& e) {
      auto& s = ds->skips[kSkipUnreadable];
      if (s.count++ < kSkipExamples) s.examples.push_back(dir.string() + " (" + e.what() + ")");
    }
  }
  ds->files = in.files.size();
  if (f.shard_world > 1) {
    // Whole games to ranks, the same on every rank whatever the order or path prefix each one
    // sees the files under: keyed by file name and size, or corpus and index.
    // `padded`: the corpus index zero-padded, so that keys sort in index order.
    auto name = [&](const Item& it, bool padded) {
      if (it.corpus >= 0) {
        char index[24];
        std::snprintf(index, sizeof index, padded ? "#%020zu" : "#%zu", it.index);
        return corpora[static_cast<size_t>(it.corpus)].dir().filename().string() + index;
      }
      std::error_code ec;
      return in.files[it.index].filename().string() + ":" +
             std::to_string(fs::file_size(in.files[it.index], ec));
    };
    ds->shard_of = items.size();
    const uint64_t world = static_cast<uint64_t>(f.shard_world);
    const uint64_t rank = static_cast<uint64_t>(f.shard_rank);
    if (f.shard_ranges) {
      // Contiguous ranges of the inputs in key order: a rank reads one stretch of each corpus
      // (its pages, nobody else's), and holds 1/world of the games to within one.
      std::vector<std::pair<std::string, Item>> keyed;
      for (const Item& it : items) keyed.emplace_back(name(it, true), it);
      std::stable_sort(keyed.begin(), keyed.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      const size_t n = keyed.size();
      const size_t begin = static_cast<size_t>(n * rank / world),
                   end = static_cast<size_t>(n * (rank + 1) / world);
      items.clear();
      for (size_t i = begin; i < end; ++i) items.push_back(keyed[i].second);
    } else {  // runs from before shard_order: a draw from (seed, key), spread over the inputs
      std::erase_if(items, [&](const Item& it) {
        uint64_t h = f.shard_seed ^ 0x5ca1ab1e5eedull;
        for (unsigned char c : name(it, false)) h = mix64(h ^ c);
        return h % world != rank;
      });
    }
    ds->files = 0;
    ds->corpus_games = 0;
    for (const Item& it : items) (it.corpus < 0 ? ds->files : ds->corpus_games)++;
  }

  std::vector<Outcome> out(items.size());
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, items.size(), 1), [&](const auto& r) {
      for (size_t i = r.begin(); i != r.end(); ++i) {
        const Item& it = items[i];
        if (it.corpus < 0) {
          out[i] = process_file(in.files[it.index], f);
        } else {
          const slp::Corpus& c = corpora[static_cast<size_t>(it.corpus)];
          // A --zstd corpus decodes this game alone here, freed once its features are out.
          const slp::CorpusGame game = c.game(it.index);
          const slp::GameView& v = game.view();
          out[i] = process_view(v, f, (c.dir() / fs::path(v.info.source).filename()).string());
        }
      }
    });
  });

  std::vector<size_t> kept;
  for (size_t i = 0; i < out.size(); ++i) {
    Outcome& o = out[i];
    if (o.damaged && ds->damaged++ < kSkipExamples) ds->damaged_examples.push_back(o.damage);
    if (o.reason >= 0) {
      auto& s = ds->skips[static_cast<size_t>(o.reason)];
      if (s.count++ < kSkipExamples) s.examples.push_back(o.detail);
    } else {
      kept.push_back(i);
    }
  }
  // Identity order: independent of path spelling, argument order and parse-vs-corpus.
  std::stable_sort(kept.begin(), kept.end(), [&](size_t a, size_t b) {
    return out[a].game->identity < out[b].game->identity;
  });
  if (f.skip_duplicates) {  // the first copy in identity order stays, whatever the file order
    std::unordered_map<uint64_t, size_t> first;
    std::vector<size_t> unique;
    for (size_t i : kept) {
      const auto [at, fresh] = first.emplace(out[i].same_game, i);
      if (fresh) {
        unique.push_back(i);
        continue;
      }
      auto& s = ds->skips[kSkipDuplicate];
      if (s.count++ < kSkipExamples)
        s.examples.push_back(out[i].detail + " (the same game as " + out[at->second].detail + ")");
    }
    kept = std::move(unique);
  }
  for (size_t i : kept) {
    ds->bytes += out[i].game->bytes();
    ds->frames += out[i].game->rows;
    ds->games.push_back(std::move(*out[i].game));
    ds->players.push_back(std::move(out[i].players));
  }
  ds->threads = arena.max_concurrency();
  ds->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return ds;
}

}  // namespace

// Training and validation copies load the same inputs: the second reuses the first's games.
std::shared_ptr<const ReplayDataset> cached_dataset(const Inputs& in, const Filters& f,
                                                    tbb::task_arena& arena, bool& fresh) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const ReplayDataset>> cache;
  const std::string key = dataset_key(in, f);
  std::lock_guard lock(mu);
  if (auto it = cache.find(key); it != cache.end())
    if (auto ds = it->second.lock()) {
      fresh = false;
      return ds;
    }
  std::shared_ptr<const ReplayDataset> ds = load_dataset(in, f, arena);
  cache[key] = ds;
  fresh = true;
  return ds;
}

}  // namespace slipstream::melee

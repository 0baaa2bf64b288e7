// slippi_replays: see replays.h and docs/loader.md.
#include "stages/melee/replays.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <variant>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <nlohmann/json.hpp>

#include "engine/config.h"
#include "engine/registry.h"
#include "engine/text_match.h"
#include "stages/melee/slp/corpus.h"
#include "stages/melee/slp/names.h"
#include "stages/melee/slp/parser.h"
#include "stages/melee/slp/synth.h"
#include "stages/melee/window_batch.h"

namespace fs = std::filesystem;

namespace slipstream::melee {

namespace {

enum Reason { kNotFound, kUnreadable, kPlayers, kStage, kNoFrames, kShort, kCharacters, kReasons };
constexpr size_t kExamples = 3;  // file names shown per reason

struct Filters {
  RollbackMode rollback = RollbackMode::last;
  bool one_vs_one = true;
  std::vector<int64_t> stages, characters;
  int64_t min_frames = 0, min_rows = 0;
  std::string perspectives;
  // shard: games with several ranks: this rank decodes only the games whose draw from (seed,
  // name) falls to it.
  int shard_rank = 0, shard_world = 1;
  uint64_t shard_seed = 0;

  std::string key() const {
    std::ostringstream k;
    k << (rollback == RollbackMode::last ? "last" : "all") << '|' << one_vs_one << '|' << min_rows
      << '|' << perspectives << '|' << shard_rank << '/' << shard_world << '/' << shard_seed
      << "|s";
    for (auto s : stages) k << ',' << s;
    k << "|c";
    for (auto c : characters) k << ',' << c;
    return k.str();
  }
};

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

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

}  // namespace

struct ReplayDataset {
  std::vector<GameFeatures> games;            // sorted by identity
  std::vector<std::vector<uint8_t>> players;  // per game: players whose perspective is used
  struct Skip {
    size_t count = 0;
    std::vector<std::string> examples;
  };
  std::array<Skip, kReasons> skips;
  std::array<std::string, kReasons> reason_text;
  size_t files = 0, corpus_games = 0, damaged = 0;
  size_t shard_of = 0;  // with shard: games, the files and corpus games of every rank together
  std::vector<std::string> damaged_examples;
  size_t bytes = 0, frames = 0;
  double seconds = 0;
  int threads = 1;
};

namespace {

// ---- inputs ----

struct Inputs {
  std::vector<fs::path> files;    // .slp files, in the order found
  std::vector<fs::path> corpora;  // corpus directories
  std::vector<std::string> missing;
  std::vector<std::string> unreadable;  // what folder scans passed over, with why
  std::vector<std::string> ignored;     // replays the inputs hold but are not read, with why
};

bool is_corpus(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "manifest.json", ec);
}

Inputs resolve_inputs(const std::vector<std::string>& paths) {
  Inputs in;
  for (const std::string& p : paths) {
    std::vector<fs::path> expanded;
    const bool pattern = p.find_first_of("*?[") != std::string::npos;
    if (pattern) {
      glob_t g{};
      if (glob(p.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) expanded.emplace_back(g.gl_pathv[i]);
      globfree(&g);
      if (expanded.empty()) in.missing.push_back(p);
    } else {
      expanded.emplace_back(p);
    }
    for (const fs::path& e : expanded) {
      std::error_code ec;
      if (fs::is_directory(e, ec)) {
        if (is_corpus(e)) {
          in.corpora.push_back(e);
          // A corpus folder is read through its manifest: replays put beside it are not in it.
          size_t beside = 0;
          for (const auto& f : fs::directory_iterator(e, ec))
            beside += f.path().extension() == ".slp";
          if (beside)
            in.ignored.push_back(
                e.string() + ": " + std::to_string(beside) +
                " .slp file(s) beside its manifest.json are not in the corpus and are not read; "
                "rebuild it with `slipstream corpus build` to include them");
        } else {
          const fs::path dirs[] = {e};
          slp::ReplayScan scan = slp::scan_replays(dirs);
          in.files.insert(in.files.end(), scan.files.begin(), scan.files.end());
          for (const slp::SkippedPath& s : scan.skipped)
            in.unreadable.push_back(s.path.string() + " (" + s.reason + ")");
        }
      } else if (fs::is_regular_file(e, ec)) {
        // A glob may sweep in READMEs; a file named explicitly is taken as a replay.
        if (!pattern || e.extension() == ".slp") in.files.push_back(e);
      } else if (fs::exists(e, ec)) {
        // A FIFO or device would block or never end: never opened, only reported.
        if (!pattern || e.extension() == ".slp")
          in.unreadable.push_back(e.string() + " (not a regular file)");
      } else if (!pattern) {
        in.missing.push_back(p);
      }
    }
  }
  return in;
}

// What each of `paths` (which together hold no replays) is, for the error that says so.
std::string describe_empty_paths(const std::vector<std::string>& paths) {
  std::string out;
  for (const std::string& p : paths) {
    std::error_code ec;
    std::string what;
    if (p.find_first_of("*?[") != std::string::npos)
      what = "matches no .slp file";
    else if (!fs::exists(p, ec))
      what = "not found";
    else if (fs::is_directory(p, ec))
      what = "a folder with no .slp files";
    else
      what = "not a replay file";
    out += (out.empty() ? "" : ", ") + p + " (" + what + ")";
  }
  return out;
}

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
  std::vector<uint8_t> players;
  int reason = -1;
  std::string detail;  // the name shown in the report
  bool damaged = false;
  std::string damage;  // the parser's note on a damaged file (with the byte offset)
};

Outcome process_view(const slp::GameView& g, const Filters& f, std::string name) {
  Outcome o;
  o.detail = std::move(name);
  o.damaged = g.info.partial;
  if (o.damaged) o.damage = o.detail + " (" + g.info.error + ")";
  const auto& start = g.info.start;
  const size_t np = start.players.size();
  if (f.one_vs_one ? np != 2 : np < 2) {
    o.reason = kPlayers;
    o.detail += " (" + std::to_string(np) + " players)";
    return o;
  }
  if (!f.stages.empty() &&
      std::find(f.stages.begin(), f.stages.end(), int64_t{start.stage}) == f.stages.end()) {
    o.reason = kStage;
    const auto name = slp::stage_name(start.stage);
    o.detail +=
        " (stage " + std::to_string(start.stage) + (name ? " " + std::string(*name) : "") + ")";
    return o;
  }
  GameFeatures feat = extract_features(g, f.rollback);
  if (feat.players.size() != np) {
    o.reason = kNoFrames;
    return o;
  }
  if (static_cast<int64_t>(feat.rows) < f.min_rows) {
    o.reason = kShort;
    o.detail += " (" + std::to_string(feat.rows) + " frames)";
    return o;
  }
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
    o.reason = kCharacters;
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
    o.reason = kUnreadable;
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
    o.reason = kUnreadable;
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
  };
  for (const auto& m : in.missing) {
    auto& s = ds->skips[kNotFound];
    if (s.count++ < kExamples) s.examples.push_back(m);
  }
  for (const auto& u : in.unreadable) {
    auto& s = ds->skips[kUnreadable];
    if (s.count++ < kExamples) s.examples.push_back(u);
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
      auto& s = ds->skips[kUnreadable];
      if (s.count++ < kExamples) s.examples.push_back(dir.string() + " (" + e.what() + ")");
    }
  }
  ds->files = in.files.size();
  if (f.shard_world > 1) {
    // Whole games to ranks by a draw from (seed, file name and size; corpus and index): the
    // same on every rank whatever the order or path prefix each one sees the files under.
    auto key = [&](const Item& it) {
      std::string k;
      if (it.corpus < 0) {
        std::error_code ec;
        k = in.files[it.index].filename().string() + ":" +
            std::to_string(fs::file_size(in.files[it.index], ec));
      } else {
        k = corpora[static_cast<size_t>(it.corpus)].dir().filename().string() + "#" +
            std::to_string(it.index);
      }
      uint64_t h = f.shard_seed ^ 0x5ca1ab1e5eedull;
      for (unsigned char c : k) h = mix64(h ^ c);
      return h;
    };
    ds->shard_of = items.size();
    std::erase_if(items, [&](const Item& it) {
      return key(it) % static_cast<uint64_t>(f.shard_world) != static_cast<uint64_t>(f.shard_rank);
    });
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
          const slp::GameView v = c.game(it.index);
          out[i] = process_view(v, f, (c.dir() / fs::path(v.info.source).filename()).string());
        }
      }
    });
  });

  std::vector<size_t> kept;
  for (size_t i = 0; i < out.size(); ++i) {
    Outcome& o = out[i];
    if (o.damaged && ds->damaged++ < kExamples) ds->damaged_examples.push_back(o.damage);
    if (o.reason >= 0) {
      auto& s = ds->skips[static_cast<size_t>(o.reason)];
      if (s.count++ < kExamples) s.examples.push_back(o.detail);
    } else {
      kept.push_back(i);
    }
  }
  // Identity order: independent of path spelling, argument order and parse-vs-corpus.
  std::stable_sort(kept.begin(), kept.end(), [&](size_t a, size_t b) {
    return out[a].game->identity < out[b].game->identity;
  });
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

// ---- synthetic fallback ----

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

size_t count_slp(const fs::path& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".slp") ++n;
  return n;
}

// Returns the directory holding `games` synthetic games for `seed`, writing them when absent.
// Several processes (the ranks of one run) may get here at once: a lock file beside the set
// lets one write it (aside, then renamed into place) while the others wait and then read it.
fs::path synthetic_games(const fs::path& root, uint64_t seed, int64_t games, bool& generated) {
  const std::string name = std::to_string(seed) + "-" + std::to_string(games);
  const fs::path dir = root / name;
  auto complete = [&] {
    std::error_code ec;
    return fs::is_directory(dir, ec) && count_slp(dir) == static_cast<size_t>(games);
  };
  generated = false;
  if (complete()) return dir;
  fs::create_directories(root);
  const fs::path lock_path = root / (name + ".lock");
  const int lock = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock < 0)
    throw std::runtime_error("cannot create " + lock_path.string() + ": " + std::strerror(errno));
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // closing releases the flock
  } unlock{lock};
  while (::flock(lock, LOCK_EX) != 0)
    if (errno != EINTR)
      throw std::runtime_error("cannot lock " + lock_path.string() + ": " + std::strerror(errno));
  if (complete()) return dir;  // another process wrote it while this one waited
  std::error_code ec;
  fs::remove_all(dir, ec);  // a damaged set: ours only ever appear whole
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  slp::write_synthetic_games(tmp, static_cast<int>(games), seed, slp::SynthOptions{}.frames);
  fs::rename(tmp, dir);
  generated = true;
  return dir;
}

std::string paths_str(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s + "]";
}

}  // namespace

ReplaysStage::ReplaysStage() = default;
ReplaysStage::~ReplaysStage() = default;

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
      .param("validation_paths", S{},
             "games for validation (same forms as paths): all of them validate, none of them "
             "trains, and validation_fraction is not applied")
      .path(/*must_exist=*/true)
      // Upper bounds: 2^20 frames is ~4.8 hours of play, far past any game, and keeps the window
      // arithmetic in 32-bit ints (window_index.h) and the batch's byte counts in range.
      .param("batch_size", int64_t{256},
             "windows per batch (an epoch's last partial batch is dropped); auto: the largest "
             "that fits the device's memory (run.device_memory)")
      .range(1, 1 << 20)
      .batch_size()
      .param("window", int64_t{60}, "frames per window")
      .range(1, 1 << 20)
      .param("stride", int64_t{5}, "frames between window starts")
      .range(1, 1 << 20)
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
      .param("validation_fraction", 0.1,
             "fraction of whole games held out, by seed and game identity (1: all of them)")
      .range(0, 1)
      .param("shuffle", true, "shuffle windows each epoch (permutation from seed and epoch)")
      .param("shard", std::string("windows"),
             "with several ranks, windows: every rank loads every game and trains on its rows of "
             "each global batch (the batches of one process at world x batch_size); games: each "
             "rank decodes only its own share of the games, drawn from the seed (for corpora "
             "too big for one process's memory; needs MPI)")
      .choices({"windows", "games"})
      .param("perspectives", std::string("both"),
             "both: every player's view; first/second: the lower/higher port's; port1..port4: "
             "that port's")
      .choices({"both", "first", "second", "port1", "port2", "port3", "port4"})
      .param("rollback", std::string("last"), "last: the last copy of each frame; all: as recorded")
      .choices({"last", "all"})
      .param("threads", int64_t{0}, "decode/assembly threads (0: TBB default)")
      .range(0, 1024)
      .param("synthetic", int64_t{0},
             "games to generate and train on when paths is empty (0: none; a given path that "
             "holds no replays is always an error)")
      .range(0, 1000000)
      .param("synthetic_dir", std::string("data/synth"),
             "where synthetic games are cached (<dir>/<seed>-<n>)")
      .path();
}

void ReplaysStage::setup(StageContext& ctx) {
  const Params& p = ctx.params();
  validation_ = forced_split_.value_or(ctx.split()) == StageContext::Split::validation;
  batch_ = p.integer("batch_size");
  window_ = p.integer("window");
  delay_ = p.integer("delay");
  shuffle_ = p.boolean("shuffle");
  epochs_ = std::max<int64_t>(1, ctx.run().epochs);
  seed_ = ctx.seed();
  const int64_t threads = p.integer("threads");
  arena_ = std::make_unique<tbb::task_arena>(threads > 0 ? static_cast<int>(threads)
                                                         : tbb::task_arena::automatic);
  const std::string who = "slippi_replays '" + ctx.name() + "'";

  Filters f;
  f.rollback = p.string("rollback") == "all" ? RollbackMode::all : RollbackMode::last;
  f.one_vs_one = p.boolean("one_vs_one");
  std::string problem;  // none: the schema's checks passed at validation
  f.stages = resolve_ids(p.strings("stages"), "stages", kStageNames, problem);
  f.characters = resolve_ids(p.strings("characters"), "characters", kCharacterNames, problem);
  if (!problem.empty()) throw ConfigError({{p.mark("characters"), problem}});
  f.min_frames = p.integer("min_frames");
  f.min_rows = std::max(f.min_frames, window_ + delay_ + 1);
  f.perspectives = p.string("perspectives");
  // shard: games with several ranks: each rank decodes only its own games, and the ranks agree
  // on the step count through the run's rank reduction.
  const bool by_games = p.string("shard") == "games" && ctx.run().world_size > 1;
  if (by_games) {
    if (!ctx.run().reduce_over_ranks)
      throw ConfigError({{p.mark("shard"), "stage '" + ctx.name() +
                                               "': shard: games with several ranks needs MPI "
                                               "(this build has none); use shard: windows"}});
    f.shard_rank = ctx.run().rank;
    f.shard_world = ctx.run().world_size;
    f.shard_seed = ctx.run().seed;
  }

  const std::vector<std::string>& paths = p.strings("paths");
  Inputs in = resolve_inputs(paths);
  std::ostringstream rep;
  if (in.files.empty() && in.corpora.empty()) {
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

  // Pinned validation games: their own dataset. The validation copy reads only it; the training
  // copy leaves out any game it also holds.
  const std::vector<std::string>& vpaths = p.strings("validation_paths");
  std::shared_ptr<const ReplayDataset> pinned;
  bool fresh_pinned = false;
  if (!vpaths.empty()) {
    Inputs vin = resolve_inputs(vpaths);
    if (vin.files.empty() && vin.corpora.empty())
      throw ConfigError({{p.mark("validation_paths"), "stage '" + ctx.name() +
                                                          "': validation_paths hold no replays: " +
                                                          describe_empty_paths(vpaths)}});
    bool vfresh = false;
    pinned = cached_dataset(vin, f, *arena_, vfresh);
    if (validation_) fresh_pinned = vfresh;
  }

  bool fresh = fresh_pinned;
  data_ = validation_ && pinned ? pinned : cached_dataset(in, f, *arena_, fresh);
  const ReplayDataset& ds = *data_;

  // Split: whole games, by a draw from (seed, identity); never leave a side empty by chance
  // when there are games enough for both, unless the fraction is 0 or 1. With pinned games the
  // validation side is exactly those.
  const double frac = p.number("validation_fraction");
  const size_t ng = ds.games.size();
  std::vector<char> is_val(ng, 0);
  size_t overlap = 0;  // games in both paths and validation_paths (validated, not trained)
  if (pinned) {
    std::set<uint64_t> ids;
    for (const auto& g : pinned->games) ids.insert(g.identity);
    for (size_t g = 0; g < ng; ++g) is_val[g] = validation_ || ids.count(ds.games[g].identity);
    if (!validation_) overlap = static_cast<size_t>(std::count(is_val.begin(), is_val.end(), 1));
  } else {
    std::vector<double> draw(ng);
    for (size_t g = 0; g < ng; ++g) {
      draw[g] = split_draw(seed_, ds.games[g].identity);
      is_val[g] = frac >= 1 || draw[g] < frac;
    }
    const size_t nval = static_cast<size_t>(std::count(is_val.begin(), is_val.end(), 1));
    if (ng >= 2 && frac > 0 && nval == 0)
      is_val[static_cast<size_t>(std::min_element(draw.begin(), draw.end()) - draw.begin())] = 1;
    if (ng >= 2 && frac < 1 && nval == ng)
      is_val[static_cast<size_t>(std::max_element(draw.begin(), draw.end()) - draw.begin())] = 0;
  }

  // Both splits' windows (the report shows both; the stage keeps its own).
  std::array<std::vector<Perspective>, 2> persp;
  std::array<std::vector<uint32_t>, 2> games_of;
  for (size_t g = 0; g < ng; ++g) {
    const int s = is_val[g] ? 1 : 0;
    games_of[s].push_back(static_cast<uint32_t>(g));
    const auto& players = ds.games[g].players;
    for (uint8_t pl : ds.players[g])
      persp[s].push_back(
          {static_cast<uint32_t>(g), pl, static_cast<uint8_t>((pl + 1) % players.size())});
  }
  std::array<size_t, 2> nwin{};
  for (int s = 0; s < 2; ++s)
    nwin[s] = build_windows(ds.games, persp[s], static_cast<int>(window_),
                            static_cast<int>(p.integer("stride")), static_cast<int>(delay_))
                  .size();
  const std::array<size_t, 2> ngames = {games_of[0].size(), games_of[1].size()};
  const int mine = validation_ ? 1 : 0;
  perspectives_ = std::move(persp[mine]);
  split_games_ = std::move(games_of[mine]);
  windows_ = build_windows(ds.games, perspectives_, static_cast<int>(window_),
                           static_cast<int>(p.integer("stride")), static_cast<int>(delay_));

  const uint64_t B = static_cast<uint64_t>(batch_);
  if (validation_) {
    batches_per_epoch_ = (windows_.size() + B - 1) / B;  // last batch padded, mask 0
    total_batches_ = batches_per_epoch_;
    // Each rank validates on its own games: the runner takes each rank's first batches.
    if (by_games) ctx.run().validation_per_rank = true;
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

  // The report: once per loaded dataset (the validation copy reuses the training copy's).
  size_t skipped = 0;
  for (const auto& s : ds.skips) skipped += s.count;
  rep << who << ": " << ds.files << " files" << (ds.corpus_games ? " + " : "")
      << (ds.corpus_games ? std::to_string(ds.corpus_games) + " corpus games" : "")
      << (by_games ? " (rank " + std::to_string(ctx.run().rank) + "'s share of " +
                         std::to_string(ds.shard_of) + ")"
                   : std::string())
      << " -> " << ng << " games, " << ds.frames << " frames, " << (ds.bytes >> 20)
      << " MiB of features in " << static_cast<int>(ds.seconds * 1000) << " ms on " << ds.threads
      << " threads; " << skipped << " skipped\n";
  for (size_t r = 0; r < kReasons; ++r) {
    const auto& s = ds.skips[r];
    if (!s.count) continue;
    rep << "  skipped " << s.count << ' ' << ds.reason_text[r] << ": ";
    for (size_t i = 0; i < s.examples.size(); ++i) rep << (i ? ", " : "") << s.examples[i];
    rep << (s.count > s.examples.size() ? ", ..." : "") << "\n";
  }
  if (ds.damaged) {
    rep << "  note: " << ds.damaged << " damaged (rows before the damage used): ";
    for (size_t i = 0; i < ds.damaged_examples.size(); ++i)
      rep << (i ? ", " : "") << ds.damaged_examples[i];
    rep << (ds.damaged > ds.damaged_examples.size() ? ", ..." : "") << "\n";
  }
  if (pinned && validation_) {
    rep << "  validation (validation_paths): " << ngames[1] << " games, " << nwin[1]
        << " windows\n";
  } else {
    rep << "  train: " << ngames[0] << " games, " << nwin[0] << " windows (" << nwin[0] / B
        << " batches of " << B << " per epoch); validation: ";
    if (pinned)
      rep << pinned->games.size() << " games from validation_paths"
          << (overlap ? " (" + std::to_string(overlap) + " of them also in paths: not trained)"
                      : std::string());
    else
      rep << ngames[1] << " games, " << nwin[1] << " windows";
    rep << "\n";
  }
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
    if (windows_.empty()) {
      std::ostringstream e;
      e << who << ": no training windows: " << ds.files << " files";
      if (ds.corpus_games) e << " + " << ds.corpus_games << " corpus games";
      for (size_t r = 0; r < kReasons; ++r)
        if (ds.skips[r].count) e << ", " << ds.skips[r].count << ' ' << ds.reason_text[r];
      e << ", " << ng << " games kept (" << ngames[1]
        << " of them in validation, validation_fraction=" << frac << ")";
      throw std::runtime_error(e.str());
    }
    if (ctx.run().writes_outputs()) {
      // Which games trained and which validated, so a run can be audited and repeated.
      nlohmann::json splits;
      if (by_games)  // the games of rank 0's share (each rank draws its own)
        splits["shard"] = {{"by", "games"}, {"rank", 0}, {"world", ctx.run().world_size}};
      splits["train"] = nlohmann::json::array();
      splits["validation"] = nlohmann::json::array();
      for (uint32_t g : split_games_) splits["train"].push_back(ds.games[g].source);
      if (pinned)
        for (const GameFeatures& g : pinned->games) splits["validation"].push_back(g.source);
      else
        for (uint32_t g : games_of[1]) splits["validation"].push_back(ds.games[g].source);
      std::ofstream(fs::path(ctx.run().run_dir) / (ctx.name() + ".splits.json"))
          << splits.dump(1) << "\n";
    }
    if (batches_per_epoch_ == 0 && by_games)
      throw std::runtime_error(who + ": a rank's share of the games holds fewer than " +
                               "batch_size=" + std::to_string(B) + " training windows (this " +
                               "rank's: " + std::to_string(windows_.size()) + "); fewer ranks, " +
                               "a lower batch_size, more replays, or shard: windows");
    if (batches_per_epoch_ == 0)
      throw std::runtime_error(who + ": only " + std::to_string(windows_.size()) +
                               " training windows, fewer than batch_size=" + std::to_string(B) +
                               "; lower batch_size or stride, or add replays");
    // The run's length when run.steps is not set (the graph divides by rebatching and
    // accumulation); unbounded when it is.
    ctx.run().source_batches =
        total_batches_ == std::numeric_limits<uint64_t>::max() ? 0 : total_batches_;
  }

  uint64_t fp = mix64(windows_.size() ^ mix64(static_cast<uint64_t>(window_) << 32 | delay_));
  fp = mix64(fp ^ B ^ (static_cast<uint64_t>(p.integer("stride")) << 20));
  for (uint32_t g : split_games_) fp = mix64(fp ^ ds.games[g].identity);
  fingerprint_ = hex64(fp);
  // Ranks that each read the whole data set (shard: windows) must have read the same one: a
  // rank whose node lacks some files, or cannot read them, would train on another order of
  // other windows while the run goes on as one. With shard: games each rank holds its own games
  // by design, and the ranks compare what they found to share out instead.
  if (ctx.run().world_size > 1 && ctx.run().reduce_over_ranks) {
    uint64_t found = mix64(in.files.size() ^ (in.corpora.size() << 40));
    for (const auto& file : in.files) {
      std::error_code ec;
      const std::string key =
          file.filename().string() + ":" + std::to_string(fs::file_size(file, ec));
      for (unsigned char c : key) found = mix64(found ^ c);
    }
    const uint64_t agreed = by_games ? found : fp;
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
    ctx.run().reduce_over_ranks(std::span<double>(v), RankReduce::min,
                                who + ": the ranks' data fingerprints");
    if (v[0] != -v[4] || v[1] != -v[5]) {
      auto range = [](double lo, double hi) {
        return lo == hi ? std::to_string(static_cast<int64_t>(lo))
                        : std::to_string(static_cast<int64_t>(lo)) + " to " +
                              std::to_string(static_cast<int64_t>(hi));
      };
      throw std::runtime_error(
          who + ": the ranks did not find the same data (replay files found: " +
          range(v[3], -v[7]) + (by_games ? "" : ", games kept: " + range(v[2], -v[6])) +
          "; this rank: " + std::to_string(in.files.size()) + " files, " +
          std::to_string(ds.games.size()) + " games kept). Every rank must see the same " +
          "replays.paths, readable on its node; each rank's report says what it skipped");
    }
  }

  WindowBatch::declare(ctx, static_cast<int64_t>(B), window_);
  perm_.clear();
  perm_epoch_ = -1;
}

const GameFeatures& ReplaysStage::game_of(const WindowRef& w) const {
  return data_->games[perspectives_[w.perspective].game];
}

void ReplaysStage::seek(uint64_t next_index, StageContext& ctx) {
  (void)ctx;
  next_ = next_index;
}

// Validation passes read one fixed shuffled order (the same every pass), so a pass of a few
// batches samples every validation game instead of the first game's opening frames.
constexpr uint64_t kValidationOrder = uint64_t{1} << 40;

bool ReplaysStage::produce(Batch& out, StageContext& ctx) {
  const uint64_t k = out.index;
  next_ = k + 1;
  if (k >= total_batches_) return false;
  const uint64_t B = static_cast<uint64_t>(batch_);
  const uint64_t epoch = validation_ ? kValidationOrder : k / batches_per_epoch_;
  const uint64_t j = validation_ ? k : k % batches_per_epoch_;
  if (shuffle_ && perm_epoch_ != static_cast<int64_t>(epoch)) {
    perm_ = epoch_permutation(windows_.size(), seed_, epoch);
    perm_epoch_ = static_cast<int64_t>(epoch);
  }
  std::vector<const WindowRef*> rows(B, nullptr);
  uint64_t real = 0;
  for (uint64_t r = 0; r < B; ++r) {
    const uint64_t pos = (j * world_ + rank_) * B + r;
    if (pos >= windows_.size()) break;  // validation's last batch: padding
    rows[r] = &windows_[shuffle_ ? perm_[pos] : pos];
    ++real;
  }

  const WindowBatch t = WindowBatch::allocate(static_cast<int64_t>(B), window_, "slippi_replays");
  fill(rows, t.view);
  t.publish(out, ctx);
  out.epoch = epoch;
  out.samples = real;
  return true;
}

void ReplaysStage::fill(const std::vector<const WindowRef*>& rows, const BatchView& view) const {
  const int delay = static_cast<int>(delay_);
  arena_->execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, rows.size(), 8), [&](const auto& r) {
      for (size_t i = r.begin(); i != r.end(); ++i) {
        if (!rows[i]) {
          zero_window(view, static_cast<int64_t>(i));
          continue;
        }
        const WindowRef& w = *rows[i];
        fill_window(game_of(w), perspectives_[w.perspective], w.start, delay, view,
                    static_cast<int64_t>(i));
      }
    });
  });
}

ReplaysStage::WindowInfo ReplaysStage::window(uint64_t batch, int64_t row) const {
  if (batch >= total_batches_ || row < 0 || row >= batch_)
    throw std::out_of_range("slippi_replays: no batch " + std::to_string(batch) + " row " +
                            std::to_string(row));
  const uint64_t B = static_cast<uint64_t>(batch_);
  const uint64_t epoch = validation_ ? kValidationOrder : batch / batches_per_epoch_;
  const uint64_t j = validation_ ? batch : batch % batches_per_epoch_;
  const uint64_t pos = (j * world_ + rank_) * B + static_cast<uint64_t>(row);
  WindowInfo info;
  if (pos >= windows_.size()) {
    info.padding = true;
    return info;
  }
  size_t idx = pos;
  if (shuffle_) {
    if (perm_epoch_ != static_cast<int64_t>(epoch)) {
      perm_ = epoch_permutation(windows_.size(), seed_, epoch);
      perm_epoch_ = static_cast<int64_t>(epoch);
    }
    idx = perm_[pos];
  }
  const WindowRef& w = windows_[idx];
  const Perspective& p = perspectives_[w.perspective];
  const GameFeatures& g = data_->games[p.game];
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

std::vector<std::pair<std::string, size_t>> ReplaysStage::skipped() const {
  static const char* kNames[kReasons] = {"not found", "unreadable", "players",   "stage",
                                         "no frames", "too short",  "characters"};
  std::vector<std::pair<std::string, size_t>> out;
  for (size_t r = 0; r < kReasons; ++r)
    if (data_->skips[r].count) out.emplace_back(kNames[r], data_->skips[r].count);
  return out;
}

size_t ReplaysStage::damaged() const {
  return data_->damaged;
}

void ReplaysStage::save(StateWriter& w) const {
  // The position is the runner's batch index; the fingerprint detects a changed data set.
  w.text("fingerprint", fingerprint_);
  w.integer("windows", static_cast<int64_t>(windows_.size()));
}

void ReplaysStage::load(StateReader& r) {
  load_warning_.clear();
  if (r.has("fingerprint") && r.text("fingerprint") != fingerprint_)
    load_warning_ =
        "warning: the replays, split or window settings differ from the checkpoint's "
        "(windows: " +
        (r.has("windows") ? std::to_string(r.integer("windows")) : "?") + " then, " +
        std::to_string(windows_.size()) +
        " now); batches after the resume point will not match the original run";
}

void ReplaysStage::start(StageContext& ctx) {
  if (!load_warning_.empty()) ctx.log(load_warning_);
}

}  // namespace slipstream::melee

namespace slipstream::melee {
using SlippiReplaysStage = ReplaysStage;
SLIPSTREAM_REGISTER_STAGE(SlippiReplaysStage);
}  // namespace slipstream::melee

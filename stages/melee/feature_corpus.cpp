// A feature corpus: see feature_corpus.h.
#include "stages/melee/feature_corpus.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <nlohmann/json.hpp>

#include "engine/atomic_file.h"
#include "engine/crc32c.h"
#include "engine/run_directory.h"
#include "stages/melee/replay_inputs.h"
#include "stages/melee/slp/corpus.h"
#include "stages/melee/slp/parser.h"

namespace fs = std::filesystem;

namespace slipstream::melee {

namespace {

constexpr const char* kIndexName = "features.index";
constexpr const char* kArraysName = "features.bin";
constexpr char kIndexMagic[8] = {'S', 'S', 'F', 'E', 'A', 'T', 'I', 'X'};
constexpr size_t kHeaderBytes = 40;  // magic, version, reserved, games, build id, names bytes
constexpr size_t kRecordBytes = 80;
constexpr size_t kChunkGames = 256;  // games extracted at once while building
constexpr size_t kSkipExamplesShown = 5;

// ---- little-endian fields ----

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));  // the hosts we build for are little-endian
}

class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, std::string what) : b_(bytes), what_(std::move(what)) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string text(size_t n) {
    need(n);
    std::string s(reinterpret_cast<const char*>(b_.data() + at_), n);
    at_ += n;
    return s;
  }
  template <typename T>
  void array(std::vector<T>& v, size_t n) {
    need(n * sizeof(T));
    v.resize(n);
    if (n) std::memcpy(v.data(), b_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
  }
  size_t at() const { return at_; }
  size_t left() const { return b_.size() - at_; }

 private:
  void need(size_t n) const {
    if (b_.size() - at_ < n)
      throw FeatureCorpusError(what_ + ": cut short at byte " + std::to_string(at_) + " (needs " +
                               std::to_string(n) + " more, " + std::to_string(b_.size() - at_) +
                               " left); rebuild it with `slipstream corpus build --features`");
  }
  std::span<const uint8_t> b_;
  std::string what_;
  size_t at_ = 0;
};

// ---- a game's arrays, in a fixed order whose sizes follow from rows and the players ----

template <typename T>
void put_array(std::vector<uint8_t>& out, const std::vector<T>& v, size_t expected,
               const char* what) {
  if (v.size() != expected)
    throw FeatureCorpusError(std::string("feature array ") + what + " holds " +
                             std::to_string(v.size()) + " values, not " + std::to_string(expected));
  const size_t at = out.size();
  out.resize(at + v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(T));
}

void put_track(std::vector<uint8_t>& out, const TrackFeatures& t, size_t rows) {
  put_array(out, t.numeric, rows * kNumericFeatures, "numeric");
  put_array(out, t.action, rows, "action");
  put_array(out, t.character, rows, "character");
}

std::vector<uint8_t> arrays_of(const GameFeatures& g) {
  std::vector<uint8_t> out;
  out.reserve(g.bytes());
  put_array(out, g.frame, g.rows, "frame");
  put_array(out, g.recorded_row, g.rows, "recorded_row");
  for (const PlayerFeatures& p : g.players) {
    put_track(out, p.leader, g.rows);
    if (p.has_follower) put_track(out, p.follower, g.rows);
    put_array(out, p.controller.buttons, g.rows, "buttons");
    put_array(out, p.controller.analog, g.rows * kAnalogInputs, "analog");
  }
  return out;
}

void read_track(Reader& r, TrackFeatures& t, size_t rows) {
  r.array(t.numeric, rows * kNumericFeatures);
  r.array(t.action, rows);
  r.array(t.character, rows);
}

void read_arrays(Reader& r, GameFeatures& g) {
  r.array(g.frame, g.rows);
  r.array(g.recorded_row, g.rows);
  for (PlayerFeatures& p : g.players) {
    read_track(r, p.leader, g.rows);
    if (p.has_follower) read_track(r, p.follower, g.rows);
    r.array(p.controller.buttons, g.rows);
    r.array(p.controller.analog, g.rows * kAnalogInputs);
  }
}

const char* rollback_name(RollbackMode m) {
  return m == RollbackMode::last ? "last" : "all";
}
const char* fields_name(FieldReading f) {
  return f == FieldReading::slippi ? "slippi" : "libmelee";
}

// ---- building ----

struct Extracted {
  std::optional<FeatureEntry> entry;
  std::vector<uint8_t> stored;  // the zstd frame
  uint64_t source_bytes = 0;
  std::string skip;  // "path (why)" when skipped
};

Extracted extract_one(const slp::GameView& g, const std::string& name,
                      const FeatureCorpusOptions& o, ZSTD_CCtx* cctx) {
  Extracted x;
  const auto& start = g.info.start;
  if (start.players.size() < 2) {
    x.skip = name + (start.players.size() == 1 ? " (1 player)" : " (no players)");
    return x;
  }
  GameFeatures feat = extract_features(g, o.rollback, o.fields);
  if (feat.players.size() != start.players.size()) {
    x.skip = name + " (a player without frames)";
    return x;
  }
  FeatureEntry e;
  e.identity = feat.identity;
  e.rows = feat.rows;
  e.start.version = start.version;
  e.start.stage = start.stage;
  e.start.random_seed = start.random_seed;
  for (const auto& p : start.players) {
    slp::Player q;
    q.port = p.port;
    q.character = p.character;
    q.type = p.type;
    e.start.players.push_back(q);
  }
  for (const auto& p : feat.players) e.players.push_back({p.port, p.character, p.has_follower});
  e.damaged = g.info.partial;
  e.damage = g.info.partial ? g.info.error : "";
  e.source = feat.source;
  const std::vector<uint8_t> raw = arrays_of(feat);
  e.feature_bytes = raw.size();
  x.stored.resize(ZSTD_compressBound(raw.size()));
  // With zstd's content checksum: a flipped byte is refused when read, not trained on.
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, o.zstd_level);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  const size_t n = ZSTD_compress2(cctx, x.stored.data(), x.stored.size(), raw.data(), raw.size());
  if (ZSTD_isError(n)) throw FeatureCorpusError(std::string("zstd: ") + ZSTD_getErrorName(n));
  x.stored.resize(n);
  x.entry = std::move(e);
  return x;
}

struct BuildItem {
  int corpus = -1;  // -1: the file
  size_t index = 0;
};

// One file or corpus game, parsed (or decoded), extracted and compressed; skipped with why.
Extracted extract_item(const BuildItem& it, const Inputs& in,
                       const std::vector<slp::Corpus>& corpora, const FeatureCorpusOptions& o) {
  thread_local std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(),
                                                                         &ZSTD_freeCCtx);
  Extracted x;
  std::string name;
  try {
    if (it.corpus < 0) {
      const fs::path& path = in.files[it.index];
      name = path.string();
      slp::ParseOptions opt;
      opt.rollbacks =
          o.rollback == RollbackMode::last ? slp::Rollbacks::kLastCopy : slp::Rollbacks::kKeepAll;
      opt.items = false;
      thread_local slp::Game game;  // parsed into again and again: no allocation per file
      const std::vector<uint8_t> bytes = slp::read_file_bytes(path);
      slp::parse_slp_into(game, bytes, path.string(), opt);
      x = extract_one(slp::view_of(game), name, o, cctx.get());
      x.source_bytes = bytes.size();
    } else {
      const slp::Corpus& c = corpora[static_cast<size_t>(it.corpus)];
      name = (c.dir() / ("game " + std::to_string(it.index))).string();  // until it is read
      const slp::CorpusGame game = c.game(it.index);
      name = (c.dir() / fs::path(game.view().info.source).filename()).string();
      x = extract_one(game.view(), name, o, cctx.get());
    }
  } catch (const slp::ParseError& e) {
    x.skip = name + " (offset " + std::to_string(e.offset()) + ": " + e.message() + ")";
  } catch (const FeatureCorpusError&) {
    throw;
  } catch (const std::exception& e) {
    x.skip = name + " (" + e.what() + ")";
  }
  return x;
}

void put_record(std::vector<uint8_t>& out, const FeatureEntry& e, uint64_t offset,
                uint64_t stored) {
  const size_t at = out.size();
  put<uint64_t>(out, e.identity);
  put<uint64_t>(out, offset);
  put<uint64_t>(out, stored);
  put<uint64_t>(out, e.feature_bytes);
  put<uint32_t>(out, e.rows);
  put<uint32_t>(out, e.start.random_seed);
  put<uint16_t>(out, e.start.stage);
  put<uint8_t>(out, e.start.version.major);
  put<uint8_t>(out, e.start.version.minor);
  put<uint8_t>(out, e.start.version.build);
  put<uint8_t>(out, e.damaged ? 1 : 0);
  put<uint8_t>(out, static_cast<uint8_t>(e.start.players.size()));
  put<uint8_t>(out, static_cast<uint8_t>(e.players.size()));
  for (size_t i = 0; i < 4; ++i) {
    const bool has = i < e.start.players.size();
    put<uint8_t>(out, has ? e.start.players[i].port : 0);
    put<uint8_t>(out, has ? e.start.players[i].character : 0);
    put<uint8_t>(out, has ? e.start.players[i].type : 0);
  }
  for (size_t i = 0; i < 4; ++i) {
    const bool has = i < e.players.size();
    put<uint8_t>(out, has ? e.players[i].port : 0);
    put<uint8_t>(out, has ? e.players[i].character : 0);
    put<uint8_t>(out, has && e.players[i].has_follower ? 1 : 0);
  }
  put<uint32_t>(out, static_cast<uint32_t>(e.source.size()));
  put<uint32_t>(out, static_cast<uint32_t>(e.damage.size()));
  if (out.size() - at != kRecordBytes) throw std::logic_error("feature index record size");
}

}  // namespace

bool is_feature_corpus(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kFeatureManifestName, ec);
}

FeatureBuildReport build_feature_corpus(const std::vector<std::string>& inputs,
                                        const fs::path& out_dir,
                                        const FeatureCorpusOptions& options) {
  fs::create_directories(out_dir);
  const DirectoryLock lock(out_dir.string(), "run corpus build --features",
                           "the corpus's games and index");
  const Inputs in = resolve_inputs(inputs);
  FeatureBuildReport report;
  std::vector<std::string> skipped;
  auto skip = [&](std::string what) {
    ++report.skipped;
    if (skipped.size() < 100000) skipped.push_back(std::move(what));
  };
  for (const auto& m : in.missing) skip(m + " (not found)");
  for (const auto& u : in.unreadable) skip(u);
  for (const auto& f : in.feature_corpora)
    skip(f.string() + " (already a feature corpus: name the replays or game corpus it came from)");

  // Work items: each file, then each game of each game corpus.
  std::vector<slp::Corpus> corpora;
  std::vector<BuildItem> items;
  for (size_t i = 0; i < in.files.size(); ++i) items.push_back({-1, i});
  for (const auto& dir : in.corpora) {
    try {
      corpora.push_back(slp::Corpus::open(dir));
      report.source_bytes += slp::corpus_footprint(dir).source_bytes;
      for (size_t g = 0; g < corpora.back().size(); ++g)
        items.push_back({static_cast<int>(corpora.size() - 1), g});
    } catch (const std::exception& e) {
      skip(dir.string() + " (" + e.what() + ")");
    }
  }

  AtomicFile arrays((out_dir / kArraysName).string());
  std::vector<uint8_t> records, names;
  uint64_t offset = 0;
  tbb::task_arena arena(options.threads > 0 ? options.threads : tbb::task_arena::automatic);
  for (size_t c0 = 0; c0 < items.size(); c0 += kChunkGames) {
    const size_t c1 = std::min(items.size(), c0 + kChunkGames);
    std::vector<Extracted> done(c1 - c0);
    arena.execute([&] {
      tbb::parallel_for(tbb::blocked_range<size_t>(c0, c1, 1), [&](const auto& r) {
        for (size_t i = r.begin(); i != r.end(); ++i)
          done[i - c0] = extract_item(items[i], in, corpora, options);
      });
    });
    for (Extracted& x : done) {
      report.source_bytes += x.source_bytes;
      if (!x.entry) {
        skip(std::move(x.skip));
        continue;
      }
      arrays.write(x.stored.data(), x.stored.size());
      put_record(records, *x.entry, offset, x.stored.size());
      names.insert(names.end(), x.entry->source.begin(), x.entry->source.end());
      names.insert(names.end(), x.entry->damage.begin(), x.entry->damage.end());
      offset += x.stored.size();
      ++report.games;
      report.frames += x.entry->rows;
      report.feature_bytes += x.entry->feature_bytes;
    }
  }
  report.stored_bytes = offset;

  std::random_device rd;
  const uint64_t build_id = (uint64_t{rd()} << 32) ^ rd();
  std::vector<uint8_t> index;
  index.insert(index.end(), kIndexMagic, kIndexMagic + 8);
  put<uint32_t>(index, kFeatureCorpusVersion);
  put<uint32_t>(index, 0);
  put<uint64_t>(index, report.games);
  put<uint64_t>(index, build_id);
  put<uint64_t>(index, names.size());
  index.insert(index.end(), records.begin(), records.end());
  index.insert(index.end(), names.begin(), names.end());

  nlohmann::json m;
  m["format"] = "slipstream feature corpus";
  m["version"] = kFeatureCorpusVersion;
  m["build_id"] = build_id;
  m["rollback"] = rollback_name(options.rollback);
  m["fields"] = fields_name(options.fields);
  m["games"] = report.games;
  m["frames"] = report.frames;
  m["feature_bytes"] = report.feature_bytes;
  m["stored_bytes"] = report.stored_bytes;
  m["source_bytes"] = report.source_bytes;
  m["skipped"] = skipped;
  // The index's records and names (sources, identities, sizes) have no checksum of their own
  // as each game's zstd frame has: a byte flipped there is found at open by this one.
  m["index_crc32c"] = crc32c(index.data(), index.size());
  // The arrays and the index first; the manifest, which makes the folder a corpus, last.
  arrays.commit();
  AtomicFile index_file((out_dir / kIndexName).string());
  index_file.write(index.data(), index.size());
  index_file.commit();
  write_file_atomically((out_dir / kFeatureManifestName).string(), m.dump(1) + "\n");
  for (size_t i = 0; i < std::min(kSkipExamplesShown, skipped.size()); ++i)
    report.skipped_examples.push_back(skipped[i]);
  return report;
}

// ---- reading ----

struct FeatureCorpus::State {
  fs::path dir;
  RollbackMode rollback = RollbackMode::last;
  FieldReading fields = FieldReading::slippi;
  uint64_t feature_bytes = 0, source_bytes = 0;
  std::vector<FeatureEntry> entries;
  std::vector<uint64_t> offset, stored;
  int fd = -1;
  ~State() {
    if (fd >= 0) ::close(fd);
  }
};

namespace {

nlohmann::json read_manifest(const fs::path& dir) {
  const fs::path path = dir / kFeatureManifestName;
  std::ifstream f(path);
  if (!f) throw FeatureCorpusError(path.string() + ": cannot open (" + errno_text(errno) + ")");
  nlohmann::json m;
  try {
    f >> m;
  } catch (const std::exception& e) {
    throw FeatureCorpusError(path.string() + ": not JSON (" + e.what() +
                             "); rebuild it with `slipstream corpus build --features`");
  }
  if (!m.is_object() || m.value("version", 0) != kFeatureCorpusVersion)
    throw FeatureCorpusError(path.string() + ": feature corpus format " +
                             (m.is_object() && m.contains("version") ? m["version"].dump() : "?") +
                             ", this build reads " + std::to_string(kFeatureCorpusVersion) +
                             "; rebuild it with `slipstream corpus build --features`");
  return m;
}

// One game's record (put_record's layout); its names from `names`.
FeatureEntry read_record(Reader& r, Reader& names, uint64_t& offset, uint64_t& stored) {
  FeatureEntry e;
  e.identity = r.get<uint64_t>();
  offset = r.get<uint64_t>();
  stored = r.get<uint64_t>();
  e.feature_bytes = r.get<uint64_t>();
  e.rows = r.get<uint32_t>();
  e.start.random_seed = r.get<uint32_t>();
  e.start.stage = r.get<uint16_t>();
  e.start.version.major = r.get<uint8_t>();
  e.start.version.minor = r.get<uint8_t>();
  e.start.version.build = r.get<uint8_t>();
  e.damaged = r.get<uint8_t>() != 0;
  const size_t start_players = std::min<size_t>(4, r.get<uint8_t>());
  const size_t players = std::min<size_t>(4, r.get<uint8_t>());
  for (size_t i = 0; i < 4; ++i) {
    slp::Player p;
    p.port = r.get<uint8_t>();
    p.character = r.get<uint8_t>();
    p.type = r.get<uint8_t>();
    if (i < start_players) e.start.players.push_back(p);
  }
  for (size_t i = 0; i < 4; ++i) {
    FeatureEntry::Player p;
    p.port = r.get<uint8_t>();
    p.character = r.get<uint8_t>();
    p.has_follower = r.get<uint8_t>() != 0;
    if (i < players) e.players.push_back(p);
  }
  const auto source_len = r.get<uint32_t>();
  const auto damage_len = r.get<uint32_t>();
  e.source = names.text(source_len);
  e.damage = names.text(damage_len);
  return e;
}

}  // namespace

namespace {

// A manifest that lacks a field or holds the wrong type: what, and the way out.
std::string malformed_manifest(const fs::path& dir, const std::exception& e) {
  return (dir / kFeatureManifestName).string() + ": malformed (" + e.what() +
         "); rebuild the corpus with `slipstream corpus build --features`";
}

}  // namespace

FeatureFootprint feature_footprint(const fs::path& dir) {
  const nlohmann::json m = read_manifest(dir);
  FeatureFootprint f;
  try {
    f.games = m.at("games").get<size_t>();
    f.feature_bytes = m.at("feature_bytes").get<uint64_t>();
    f.source_bytes = m.at("source_bytes").get<uint64_t>();
  } catch (const std::exception& e) {
    throw FeatureCorpusError(malformed_manifest(dir, e));
  }
  return f;
}

FeatureCorpus FeatureCorpus::open(const fs::path& dir) {
  auto s = std::make_unique<State>();
  s->dir = dir;
  const nlohmann::json m = read_manifest(dir);
  uint64_t build_id = 0, games = 0, stored_bytes = 0;
  std::optional<uint32_t> index_crc;  // corpora built before it was kept have none
  try {
    if (m.contains("index_crc32c")) index_crc = m.at("index_crc32c").get<uint32_t>();
    s->rollback =
        m.at("rollback").get<std::string>() == "all" ? RollbackMode::all : RollbackMode::last;
    s->fields = m.at("fields").get<std::string>() == "libmelee" ? FieldReading::libmelee
                                                                : FieldReading::slippi;
    build_id = m.at("build_id").get<uint64_t>();
    games = m.at("games").get<uint64_t>();
    stored_bytes = m.at("stored_bytes").get<uint64_t>();
    s->feature_bytes = m.at("feature_bytes").get<uint64_t>();
    s->source_bytes = m.at("source_bytes").get<uint64_t>();
  } catch (const std::exception& e) {
    throw FeatureCorpusError(malformed_manifest(dir, e));
  }
  const fs::path index_path = dir / kIndexName;
  std::vector<uint8_t> index;
  {
    std::ifstream f(index_path, std::ios::binary);
    if (!f)
      throw FeatureCorpusError(index_path.string() + ": cannot open (" + errno_text(errno) + ")");
    index.assign(std::istreambuf_iterator<char>(f), {});
  }
  if (index_crc && crc32c(index.data(), index.size()) != *index_crc)
    throw FeatureCorpusError(index_path.string() + ": damaged (its CRC-32C is not the one " +
                             kFeatureManifestName + " keeps); rebuild the corpus");
  Reader r(index, index_path.string());
  if (r.text(8) != std::string(kIndexMagic, 8))
    throw FeatureCorpusError(index_path.string() + ": not a feature index");
  const auto version = r.get<uint32_t>();
  r.get<uint32_t>();
  const auto n = r.get<uint64_t>();
  const auto id = r.get<uint64_t>();
  const auto names_bytes = r.get<uint64_t>();
  if (version != kFeatureCorpusVersion || n != games || id != build_id)
    throw FeatureCorpusError(index_path.string() + ": does not belong to its features.json (" +
                             std::to_string(n) + " games against " + std::to_string(games) +
                             "; a build was interrupted?); rebuild the corpus");
  if (r.left() != n * kRecordBytes + names_bytes)
    throw FeatureCorpusError(index_path.string() + ": " + std::to_string(r.left()) +
                             " bytes of records and names, expected " +
                             std::to_string(n * kRecordBytes + names_bytes) + "; rebuild it");
  Reader names(std::span<const uint8_t>(index).subspan(kHeaderBytes + n * kRecordBytes),
               index_path.string());
  s->entries.resize(n);
  s->offset.resize(n);
  s->stored.resize(n);
  for (size_t g = 0; g < n; ++g) {
    s->entries[g] = read_record(r, names, s->offset[g], s->stored[g]);
    if (s->offset[g] + s->stored[g] > stored_bytes)
      throw FeatureCorpusError(index_path.string() + ": game " + std::to_string(g) +
                               " lies past the end of " + kArraysName + "; rebuild the corpus");
  }
  const fs::path arrays = dir / kArraysName;
  s->fd = ::open(arrays.c_str(), O_RDONLY | O_CLOEXEC);
  if (s->fd < 0)
    throw FeatureCorpusError(arrays.string() + ": cannot open (" + errno_text(errno) + ")");
  std::error_code ec;
  if (fs::file_size(arrays, ec) != stored_bytes)
    throw FeatureCorpusError(arrays.string() + ": " + std::to_string(fs::file_size(arrays, ec)) +
                             " bytes, its manifest says " + std::to_string(stored_bytes) +
                             "; rebuild the corpus");
  return FeatureCorpus(std::move(s));
}

FeatureCorpus::FeatureCorpus(std::unique_ptr<State> s) : state_(std::move(s)) {}
FeatureCorpus::FeatureCorpus(FeatureCorpus&&) noexcept = default;
FeatureCorpus& FeatureCorpus::operator=(FeatureCorpus&&) noexcept = default;
FeatureCorpus::~FeatureCorpus() = default;

size_t FeatureCorpus::size() const {
  return state_->entries.size();
}
const FeatureEntry& FeatureCorpus::entry(size_t game) const {
  return state_->entries.at(game);
}
RollbackMode FeatureCorpus::rollback() const {
  return state_->rollback;
}
FieldReading FeatureCorpus::fields() const {
  return state_->fields;
}
const fs::path& FeatureCorpus::dir() const {
  return state_->dir;
}
uint64_t FeatureCorpus::feature_bytes() const {
  return state_->feature_bytes;
}
uint64_t FeatureCorpus::source_bytes() const {
  return state_->source_bytes;
}

GameFeatures FeatureCorpus::header(size_t game) const {
  const FeatureEntry& e = entry(game);
  GameFeatures g;
  g.source = e.source;
  g.identity = e.identity;
  g.stage = std::min<int32_t>(e.start.stage, kStages - 1);
  g.rows = e.rows;
  for (const auto& p : e.players) add_player_facts(g, p.port, p.character, p.has_follower);
  return g;
}

GameFeatures FeatureCorpus::load(size_t game) const {
  GameFeatures g = header(game);
  const uint64_t offset = state_->offset[game], stored = state_->stored[game];
  const std::string where = (state_->dir / kArraysName).string() + " (game " +
                            std::to_string(game) + ", byte offset " + std::to_string(offset) + ")";
  thread_local std::vector<uint8_t> packed, raw;
  packed.resize(stored);
  for (size_t got = 0; got < stored;) {
    const ssize_t n =
        ::pread(state_->fd, packed.data() + got, stored - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw FeatureCorpusError(where + ": cannot read (" +
                               (n < 0 ? errno_text(errno) : std::string("end of file")) + ")");
    got += static_cast<size_t>(n);
  }
  const uint64_t expected = state_->entries[game].feature_bytes;
  raw.resize(expected);
  thread_local std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> dctx(ZSTD_createDCtx(),
                                                                         &ZSTD_freeDCtx);
  const size_t n = ZSTD_decompressDCtx(dctx.get(), raw.data(), raw.size(), packed.data(), stored);
  if (ZSTD_isError(n) || n != expected)
    throw FeatureCorpusError(
        where + ": damaged (" +
        (ZSTD_isError(n) ? std::string(ZSTD_getErrorName(n))
                         : std::to_string(n) + " bytes, expected " + std::to_string(expected)) +
        "); rebuild the corpus");
  Reader r(raw, where);
  read_arrays(r, g);
  if (r.left() != 0) throw FeatureCorpusError(where + ": arrays of another shape; rebuild it");
  return g;
}

}  // namespace slipstream::melee

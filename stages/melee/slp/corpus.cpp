#include "stages/melee/slp/corpus.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string_view>

#include <nlohmann/json.hpp>

#include "stages/melee/slp/game_json.h"
#include "stages/melee/slp/inspect.h"

namespace slipstream::slp {
namespace {

constexpr const char* kFormatName = "slipstream-slp-corpus";
constexpr const char* kManifestName = "manifest.json";
constexpr const char* kColumnsName = "columns.bin";
constexpr size_t kAlign = 64;
// columns.bin ends with these 8 bytes and the build's id (manifest.json's `build_id`).
constexpr char kTrailerMagic[9] = "SSCOLEND";
constexpr size_t kTrailerBytes = 16;

enum class Group { kFrame, kTrack, kItem };
const char* group_name(Group g) {
  return g == Group::kFrame ? "frame" : g == Group::kTrack ? "track" : "item";
}

template <class T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, uint8_t>) return "u8";
  if constexpr (std::is_same_v<T, int8_t>) return "i8";
  if constexpr (std::is_same_v<T, uint16_t>) return "u16";
  if constexpr (std::is_same_v<T, uint32_t>) return "u32";
  if constexpr (std::is_same_v<T, int32_t>) return "i32";
  if constexpr (std::is_same_v<T, float>) return "f32";
}

// Which presence bit governs a column; `member == nullptr` means always present.
struct Presence {
  uint64_t FieldPresence::*member = nullptr;
  uint8_t bit = 0;
  bool in(const FieldPresence& f) const { return !member || ((f.*member >> bit) & 1); }
};

// Visitors over one group's columns in catalog order, as fn(name, column, presence).
template <class FramesX, class F>
void visit_frame_group(FramesX& f, F&& fn) {
  fn(std::string("frame"), f.frame, Presence{});
  std::remove_cvref_t<decltype(f.start)>::visit(f.start, [&](FieldDesc d, auto& col) {
    fn(std::string("start.") + d.name, col, Presence{&FieldPresence::frame_start, d.index});
  });
  std::remove_cvref_t<decltype(f.bookend)>::visit(f.bookend, [&](FieldDesc d, auto& col) {
    fn(std::string("bookend.") + d.name, col, Presence{&FieldPresence::frame_bookend, d.index});
  });
}
template <class Character, class F>
void visit_track_group(Character& ch, F&& fn) {
  fn(std::string("present"), ch.present, Presence{});
  std::remove_cvref_t<decltype(ch.pre)>::visit(ch.pre, [&](FieldDesc d, auto& col) {
    fn(std::string("pre.") + d.name, col, Presence{&FieldPresence::pre, d.index});
  });
  std::remove_cvref_t<decltype(ch.post)>::visit(ch.post, [&](FieldDesc d, auto& col) {
    fn(std::string("post.") + d.name, col, Presence{&FieldPresence::post, d.index});
  });
}
template <class Items, class F>
void visit_item_group(Items& items, F&& fn) {
  fn(std::string("row"), items.row, Presence{});
  std::remove_cvref_t<decltype(items.fields)>::visit(items.fields, [&](FieldDesc d, auto& col) {
    fn(std::string(d.name), col, Presence{&FieldPresence::item, d.index});
  });
}

struct ColumnSpec {
  std::string name;
  Group group;
  std::string dtype;
  size_t elem_size;
};

const std::vector<ColumnSpec>& catalog() {
  static const std::vector<ColumnSpec> specs = [] {
    std::vector<ColumnSpec> out;
    Frames proto;
    auto add = [&](Group g) {
      return [&out, g](const std::string& name, auto& col, Presence) {
        using T = typename std::remove_cvref_t<decltype(col)>::value_type;
        out.push_back({name, g, dtype_name<T>(), sizeof(T)});
      };
    };
    visit_frame_group(proto, add(Group::kFrame));
    CharacterFrames ch;
    visit_track_group(ch, add(Group::kTrack));
    visit_item_group(proto.items, add(Group::kItem));
    return out;
  }();
  return specs;
}

constexpr size_t kTrackColumns = 1 + detail::kPreFieldCount + detail::kPostFieldCount;

size_t align_up(size_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<FILE, FileCloser>;

File open_file(const std::filesystem::path& p, const char* mode) {
  File f(std::fopen(p.c_str(), mode));
  if (!f) throw CorpusError("cannot open " + p.string() + ": " + std::strerror(errno));
  return f;
}

void write_all(FILE* f, const void* data, size_t n, const std::filesystem::path& p) {
  if (n && std::fwrite(data, 1, n, f) != n)
    throw CorpusError("cannot write " + p.string() + ": " + std::strerror(errno));
}

// One build at a time into an output folder: an advisory lock on OUT/.build.lock, refused with
// the holder's PID (two builds would share .build/ and one would report a corpus that does not
// load). What a build leaves half made (.build/, the .tmp files) goes when it fails.
class BuildGuard {
 public:
  explicit BuildGuard(const std::filesystem::path& out_dir) : out_dir_(out_dir) {
    const std::string path = (out_dir / ".build.lock").string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ < 0) throw CorpusError("cannot open " + path + ": " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char holder[64] = {};
      const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
      ::close(fd_);
      throw CorpusError(out_dir.string() + ": another corpus build (process " +
                        (n > 0 ? std::string(holder, static_cast<size_t>(n)) : "?") +
                        ") is writing there; wait for it, or build into another --out");
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
      // The lock holds without the note; only a refusal's message is poorer.
    }
  }
  BuildGuard(const BuildGuard&) = delete;
  BuildGuard& operator=(const BuildGuard&) = delete;
  ~BuildGuard() {
    if (!done_) {
      std::error_code ec;
      std::filesystem::remove_all(out_dir_ / ".build", ec);
      std::filesystem::remove(out_dir_ / (std::string(kColumnsName) + ".tmp"), ec);
      std::filesystem::remove(out_dir_ / (std::string(kManifestName) + ".tmp"), ec);
    }
    ::close(fd_);
  }
  void done() { done_ = true; }

 private:
  std::filesystem::path out_dir_;
  int fd_ = -1;
  bool done_ = false;
};

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// "mix64:" and 16 hex digits, as hex64 writes them; nothing for anything else.
std::optional<uint64_t> parse_mix64(const std::string& s) {
  constexpr std::string_view kPrefix = "mix64:";
  uint64_t v = 0;
  const char* end = s.data() + s.size();
  if (s.size() != kPrefix.size() + 16 || !s.starts_with(kPrefix) ||
      std::from_chars(s.data() + kPrefix.size(), end, v, 16).ptr != end)
    return std::nullopt;
  return v;
}

}  // namespace

CorpusFootprint corpus_footprint(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kManifestName;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CorpusError("cannot read " + path.string() + ": " + std::strerror(errno));
  // Everything but the per-game entries and the skipped list: what the sums below read.
  const nlohmann::json::parser_callback_t keep = [](int depth, nlohmann::json::parse_event_t e,
                                                    nlohmann::json& parsed) {
    return !(depth == 1 && e == nlohmann::json::parse_event_t::key &&
             (parsed == "games" || parsed == "skipped"));
  };
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(in, keep);
  } catch (const nlohmann::json::exception& e) {
    throw CorpusError("corpus manifest " + path.string() + " is malformed (" + e.what() +
                      "): rebuild it with `slipstream corpus build`");
  }
  CorpusFootprint f;
  try {
    for (const auto& s : m.at("sources")) f.source_bytes += s.at("size").get<uint64_t>();
    f.games = m.at("sources").size();
    // Whole-column zstd (format version 1) is unpacked at open; per-game zstd ("zstd_games")
    // one game at a time, as the game is read.
    for (const auto& c : m.at("columns"))
      if (c.value("compression", std::string("none")) == "zstd")
        f.decompressed_bytes += c.at("bytes").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw CorpusError("corpus manifest " + path.string() + " lacks what it should hold (" +
                      e.what() + "): rebuild it with `slipstream corpus build`");
  }
  std::error_code ec;
  const auto mapped = std::filesystem::file_size(dir / kColumnsName, ec);
  if (!ec) f.mapped_bytes = mapped;
  return f;
}

uint64_t content_hash(std::span<const uint8_t> bytes) {
  // 8 bytes per step, multiply-xorshift mixing; plenty to notice a changed replay.
  uint64_t h = 0x9E3779B97F4A7C15ull ^ bytes.size();
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  uint64_t tail = 0;
  if (i < bytes.size()) std::memcpy(&tail, bytes.data() + i, bytes.size() - i);
  h = (h ^ tail) * 0x94D049BB133111EBull;
  return h ^ (h >> 29);
}

namespace {

// A game's hash (the manifest's `game_hash`): content_hash of its stored bytes in each column,
// in catalog order, folded together. It is checked each time the game is read, so a byte
// damaged on disk leaves that game out, not the corpus, and opening reads no column whole.
struct GameHash {
  uint64_t value = 0x2545F4914F6CDD1Dull;
  void add(std::span<const uint8_t> bytes) {
    value = (value ^ content_hash(bytes)) * 0xBF58476D1CE4E5B9ull;
    value ^= value >> 31;
  }
};

// One folder tree, without recursion or exceptions: a folder that cannot be listed is skipped,
// not fatal, and only real folders (never symlinks to them) are entered, so a link back up
// the tree cannot loop.
void scan_folder(const std::filesystem::path& root, ReplayScan& scan,
                 std::vector<std::filesystem::path>& found) {
  namespace fs = std::filesystem;
  std::vector<fs::path> todo = {root};
  while (!todo.empty()) {
    const fs::path dir = std::move(todo.back());
    todo.pop_back();
    std::error_code ec;
    fs::directory_iterator it(dir, ec);
    if (ec) {
      scan.skipped.push_back({dir, "cannot read folder: " + ec.message()});
      continue;
    }
    for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const fs::directory_entry& e = *it;
      std::error_code sec;
      const fs::file_status link = e.symlink_status(sec);
      if (sec) {
        scan.skipped.push_back({e.path(), sec.message()});
        continue;
      }
      if (fs::is_directory(link)) {
        todo.push_back(e.path());
        continue;
      }
      const bool slp = e.path().extension() == ".slp";
      if (!slp && !fs::is_symlink(link)) continue;
      const fs::file_status target = e.status(sec);  // follows links
      if (sec) {
        // A link cycle is worth reporting whatever its name; a dangling link only as a replay.
        if (sec == std::errc::too_many_symbolic_link_levels)
          scan.skipped.push_back({e.path(), "symlink loop"});
        else if (slp)
          scan.skipped.push_back({e.path(), sec.message()});
        continue;
      }
      if (!slp) continue;
      if (fs::is_regular_file(target))
        found.push_back(e.path());
      else
        scan.skipped.push_back(
            {e.path(), fs::is_directory(target) ? "is a directory" : "not a regular file"});
    }
    if (ec) scan.skipped.push_back({dir, "cannot list folder: " + ec.message()});
  }
}

}  // namespace

ReplayScan scan_replays(std::span<const std::filesystem::path> inputs) {
  ReplayScan scan;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (std::filesystem::is_directory(in, ec)) {
      std::vector<std::filesystem::path> found;
      scan_folder(in, scan, found);
      std::sort(found.begin(), found.end());
      scan.files.insert(scan.files.end(), found.begin(), found.end());
    } else {
      scan.files.push_back(in);  // the reader says what is wrong with it
    }
  }
  std::sort(scan.skipped.begin(), scan.skipped.end(),
            [](const SkippedPath& a, const SkippedPath& b) { return a.path < b.path; });
  return scan;
}

std::vector<std::filesystem::path> find_replays(std::span<const std::filesystem::path> inputs) {
  return scan_replays(inputs).files;
}

namespace {

// The build's columns, a temporary file each: each game's slice of a column held until
// end_game() writes it, raw or (--zstd) as a zstd frame of its own so a reader decodes one game
// without the rest, and returns the game's hash over the bytes it stored (game_hash()).
// assemble() writes columns.bin, each column at a 64-byte boundary (a zstd column: a table of
// games + 1 little-endian u64 offsets, from the table's end, then the frames) and returns the
// manifest's column entries.
class ColumnFiles {
 public:
  ColumnFiles(const std::filesystem::path& dir, const CorpusOptions& options)
      : options_(options), cctx_(options.zstd ? ZSTD_createCCtx() : nullptr, &ZSTD_freeCCtx) {
    const size_t n = catalog().size();
    for (size_t i = 0; i < n; ++i) {
      paths_.push_back(dir / (std::to_string(i) + ".col"));
      files_.push_back(open_file(paths_.back(), "wb"));
    }
    game_bytes_.resize(n);
    if (options.zstd) chunks_.resize(n);
  }

  void write(size_t k, const void* data, size_t n) {
    const auto* b = static_cast<const uint8_t*>(data);
    game_bytes_[k].insert(game_bytes_[k].end(), b, b + n);
  }

  uint64_t end_game() {
    GameHash hash;
    for (size_t k = 0; k < game_bytes_.size(); ++k) {
      const std::vector<uint8_t>& raw = game_bytes_[k];
      std::span<const uint8_t> stored(raw);
      if (options_.zstd) {
        size_t packed = 0;
        if (!raw.empty()) {
          packed_.resize(ZSTD_compressBound(raw.size()));
          packed = ZSTD_compressCCtx(cctx_.get(), packed_.data(), packed_.size(), raw.data(),
                                     raw.size(), options_.zstd_level);
          if (ZSTD_isError(packed))
            throw CorpusError(std::string("zstd: ") + ZSTD_getErrorName(packed));
        }
        stored = std::span<const uint8_t>(packed_.data(), packed);
        chunks_[k].push_back(packed);
      }
      write_all(files_[k].get(), stored.data(), stored.size(), paths_[k]);
      hash.add(stored);
      game_bytes_[k].clear();
    }
    return hash.value;
  }

  // Every column into `out`; rows_of: the frame, track and item groups' row counts. `bytes`
  // gets columns.bin's size.
  nlohmann::json assemble(const std::filesystem::path& out_path, const size_t rows_of[3],
                          uint64_t build_id, size_t& bytes) {
    for (size_t i = 0; i < files_.size(); ++i) {
      if (std::fflush(files_[i].get()) != 0)
        throw CorpusError("cannot write " + paths_[i].string() + ": " + std::strerror(errno));
      files_[i].reset();
    }
    const auto& specs = catalog();
    File out = open_file(out_path, "wb");
    nlohmann::json columns = nlohmann::json::array();
    size_t offset = 0;
    std::vector<uint8_t> data, zeros;
    for (size_t i = 0; i < specs.size(); ++i) {
      const ColumnSpec& spec = specs[i];
      size_t head = 0;
      data.clear();
      if (options_.zstd) {
        std::vector<uint64_t> table(1, 0);
        for (uint64_t c : chunks_[i]) table.push_back(table.back() + c);
        head = table.size() * sizeof(uint64_t);
        data.resize(head);
        std::memcpy(data.data(), table.data(), head);
      }
      data.resize(head + std::filesystem::file_size(paths_[i]));
      File in = open_file(paths_[i], "rb");
      if (data.size() > head &&
          std::fread(data.data() + head, 1, data.size() - head, in.get()) != data.size() - head)
        throw CorpusError("cannot read " + paths_[i].string());
      const size_t aligned = align_up(offset);
      zeros.assign(aligned - offset, 0);
      write_all(out.get(), zeros.data(), zeros.size(), out_path);
      write_all(out.get(), data.data(), data.size(), out_path);
      const size_t rows = rows_of[static_cast<int>(spec.group)];
      columns.push_back({{"name", spec.name},
                         {"group", group_name(spec.group)},
                         {"dtype", spec.dtype},
                         {"rows", rows},
                         {"offset", aligned},
                         {"bytes", rows * spec.elem_size},
                         {"stored_bytes", data.size()},
                         {"hash", "mix64:" + hex64(content_hash(data))},
                         {"compression", options_.zstd ? "zstd_games" : "none"}});
      offset = aligned + data.size();
    }
    // The build's id after the last column: a columns.bin of another build, or one cut short,
    // is told at open without reading any column whole (readers before it ignore it).
    uint8_t trailer[kTrailerBytes];
    std::memcpy(trailer, kTrailerMagic, 8);
    std::memcpy(trailer + 8, &build_id, 8);
    write_all(out.get(), trailer, sizeof trailer, out_path);
    if (std::fflush(out.get()) != 0)
      throw CorpusError("cannot write " + out_path.string() + ": " + std::strerror(errno));
    bytes = offset + kTrailerBytes;
    return columns;
  }

 private:
  const CorpusOptions& options_;
  std::vector<File> files_;
  std::vector<std::filesystem::path> paths_;
  std::vector<std::vector<uint8_t>> game_bytes_;  // this game's slice of each column
  std::vector<std::vector<uint64_t>> chunks_;     // --zstd: each column's frame sizes
  std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx_;
  std::vector<uint8_t> packed_;
};

}  // namespace

CorpusBuildReport build_corpus(std::span<const std::filesystem::path> inputs,
                               const std::filesystem::path& out_dir, const CorpusOptions& options) {
  namespace fs = std::filesystem;
  fs::create_directories(out_dir);
  BuildGuard guard(out_dir);
  const fs::path tmp_dir = out_dir / ".build";
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  ColumnFiles columns_out(tmp_dir, options);

  CorpusBuildReport report;
  nlohmann::json sources = nlohmann::json::array(), skipped = nlohmann::json::array(),
                 games = nlohmann::json::array();
  size_t frame_rows = 0, track_rows = 0, item_rows = 0;
  std::vector<uint8_t> zeros;
  ParseOptions parse_options;
  parse_options.rollbacks = options.rollbacks;
  parse_options.items = options.items;

  const ReplayScan scan = scan_replays(inputs);
  if (scan.files.empty() && scan.skipped.empty()) {
    std::string given;
    for (const fs::path& p : inputs) given += (given.empty() ? "" : ", ") + p.string();
    throw std::runtime_error("no .slp files in " + given + ": nothing to build a corpus of");
  }
  constexpr size_t kExamples = 5;
  auto example = [&](const std::string& what) {
    if (report.examples.size() < kExamples) report.examples.push_back(what);
  };
  for (const SkippedPath& s : scan.skipped) {
    skipped.push_back({{"path", s.path.string()}, {"reason", s.reason}});
    ++report.skipped;
    example("skipped " + s.path.string() + " (" + s.reason + ")");
  }
  for (const fs::path& path : scan.files) {
    Game game;
    std::vector<uint8_t> bytes;
    try {
      bytes = read_file_bytes(path);
      report.input_bytes += bytes.size();
      game = parse_slp(bytes, path.string(), parse_options);
    } catch (const std::exception& e) {
      skipped.push_back({{"path", path.string()}, {"reason", e.what()}});
      ++report.skipped;
      example(std::string("skipped ") + e.what());
      continue;
    }
    if (game.info.partial) {
      ++report.damaged;
      example("damaged, its rows before the damage kept: " + path.string() + " (" +
              game.info.error + ")");
    }
    std::error_code ec;
    const auto mtime = fs::last_write_time(path, ec);
    sources.push_back({{"path", path.string()},
                       {"size", bytes.size()},
                       {"mtime", ec ? 0 : static_cast<int64_t>(mtime.time_since_epoch().count())},
                       {"hash", "mix64:" + hex64(content_hash(bytes))}});

    const Frames& f = game.frames;
    const size_t n = f.size();
    size_t k = 0;
    auto append = [&](size_t rows) {
      return [&, rows](const std::string&, const auto& col, Presence) {
        using T = typename std::remove_cvref_t<decltype(col)>::value_type;
        if (col.size() == rows) {
          columns_out.write(k, col.data(), rows * sizeof(T));
        } else {  // absent field: zeros keep the tracks aligned
          zeros.assign(rows * sizeof(T), 0);
          columns_out.write(k, zeros.data(), zeros.size());
        }
        ++k;
      };
    };
    visit_frame_group(f, append(n));
    const size_t track_begin = k;
    nlohmann::json tracks = nlohmann::json::array();
    auto add_track = [&](const CharacterFrames& ch, uint8_t port, bool follower) {
      k = track_begin;
      visit_track_group(ch, append(n));
      tracks.push_back({{"port", port}, {"follower", follower}, {"offset", track_rows}});
      track_rows += n;
    };
    for (const PortFrames& pf : f.ports) {
      add_track(pf.leader, pf.port, false);
      if (pf.follower) add_track(*pf.follower, pf.port, true);
    }
    k = track_begin + kTrackColumns;
    visit_item_group(f.items, append(f.items.size()));
    const uint64_t game_hash = columns_out.end_game();

    games.push_back({{"source", sources.size() - 1},
                     {"game_hash", "mix64:" + hex64(game_hash)},
                     {"frames", n},
                     {"frame_offset", frame_rows},
                     {"items", f.items.size()},
                     {"item_offset", item_rows},
                     {"tracks", tracks},
                     {"info", to_json(game.info)}});
    frame_rows += n;
    item_rows += f.items.size();
    ++report.games;
    report.frames += n;
  }
  if (report.games == 0) {
    fs::remove_all(tmp_dir);
    throw std::runtime_error("no input is a readable replay (" + report.examples.front() +
                             "): no corpus written");
  }
  const fs::path columns_path = out_dir / kColumnsName;
  const fs::path columns_tmp = out_dir / (std::string(kColumnsName) + ".tmp");
  const size_t rows_of[3] = {frame_rows, track_rows, item_rows};
  std::random_device entropy;
  const uint64_t build_id =
      (uint64_t{entropy()} << 32 | entropy()) ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const nlohmann::json columns =
      columns_out.assemble(columns_tmp, rows_of, build_id, report.output_bytes);

  const nlohmann::json manifest = {
      {"format", kFormatName},
      {"format_version", kCorpusFormatVersion},
      {"rollbacks", options.rollbacks == Rollbacks::kLastCopy ? "last_copy" : "keep_all"},
      {"items", options.items},
      {"compression", options.zstd ? "zstd" : "none"},
      {"frame_rows", frame_rows},
      {"track_rows", track_rows},
      {"item_rows", item_rows},
      {"build_id", "mix64:" + hex64(build_id)},
      {"sources", sources},
      {"skipped", skipped},
      {"games", games},
      {"columns", columns}};
  const fs::path manifest_tmp = out_dir / (std::string(kManifestName) + ".tmp");
  {
    std::ofstream m(manifest_tmp);
    m << dump_json(manifest, 1) << "\n";
    m.flush();
    if (!m)
      throw CorpusError("cannot write " + manifest_tmp.string() + ": " + std::strerror(errno));
  }
  fs::rename(columns_tmp, columns_path);
  fs::rename(manifest_tmp, out_dir / kManifestName);
  fs::remove_all(tmp_dir);
  guard.done();
  return report;
}

// ---- reading -------------------------------------------------------------------------------

struct Corpus::State {
  std::filesystem::path dir;
  void* map = nullptr;
  size_t map_size = 0;
  std::vector<const uint8_t*> base;  // per catalog column; null for per-game zstd
  std::vector<std::unique_ptr<uint8_t, decltype(&std::free)>> owned;
  // Per-game zstd columns: the offsets table (games + 1) and the frames after it.
  std::vector<const uint64_t*> chunk_table;
  std::vector<const uint8_t*> chunk_data;
  struct Track {
    uint8_t port;
    bool follower;
    size_t offset;
  };
  struct GameEntry {
    GameInfo info;
    size_t frames, frame_offset, items, item_offset;
    std::vector<Track> tracks;
    std::optional<uint64_t> hash;  // game_hash; corpora built before it have none
  };
  std::vector<GameEntry> games;
  size_t frame_rows = 0;
  Rollbacks rollbacks = Rollbacks::kLastCopy;

  ~State() {
    if (map) munmap(map, map_size);
  }

  void map_columns();
  // columns.bin's size and trailer against the manifest's columns and `build_id`.
  void check_trailer(const std::string& build_id, const nlohmann::json& columns) const;
  // Game `index`'s stored bytes in column k: its rows of the mapping or its zstd frame.
  std::span<const uint8_t> stored_bytes(size_t k, size_t index) const;
  // Throws CorpusError when game `index` has a hash and its stored bytes do not give it.
  void check_game(size_t index) const;
  // Column i of the manifest (`c`) against the mapping: checked (layout, bounds and, when the
  // games have no hashes of their own, the column's hash) and bound (a view into the mapping, a
  // version-1 zstd column unpacked, a per-game zstd column's table).
  void bind_column(size_t i, const nlohmann::json& c, const size_t rows_of[3], bool hash_column);
  // The per-game zstd columns' tables, once the games are counted: sizes and order.
  void check_game_tables(const nlohmann::json& columns, size_t n_games);
  void read_games(const nlohmann::json& games, const size_t rows_of[3]);
};

void Corpus::State::map_columns() {
  const auto columns_path = dir / kColumnsName;
  const int fd = ::open(columns_path.c_str(), O_RDONLY);
  if (fd < 0)
    throw CorpusError("cannot open " + columns_path.string() + ": " + std::strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    ::close(fd);
    throw CorpusError("cannot stat " + columns_path.string());
  }
  map_size = static_cast<size_t>(sb.st_size);
  if (map_size > 0) {
    map = mmap(nullptr, map_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      map = nullptr;
      ::close(fd);
      throw CorpusError("cannot map " + columns_path.string());
    }
  }
  ::close(fd);
}

void Corpus::State::bind_column(size_t i, const nlohmann::json& c, const size_t rows_of[3],
                                bool hash_column) {
  const ColumnSpec& spec = catalog()[i];
  const auto* bytes = static_cast<const uint8_t*>(map);
  if (c.at("name") != spec.name || c.at("dtype") != spec.dtype ||
      c.at("group") != group_name(spec.group))
    throw CorpusError("corpus " + dir.string() + " column " + std::to_string(i) +
                      " differs from this build's layout: rebuild it with `slipstream corpus "
                      "build`");
  const size_t offset = c.at("offset"), stored = c.at("stored_bytes"), size = c.at("bytes");
  const size_t rows = c.at("rows");
  if (rows != rows_of[static_cast<int>(spec.group)] || size != rows * spec.elem_size ||
      offset % kAlign != 0 || offset > map_size || stored > map_size - offset)
    throw CorpusError("corpus " + dir.string() + " column '" + spec.name +
                      "' is inconsistent with columns.bin" +
                      (offset + stored > map_size
                           ? " (its bytes end at " + std::to_string(offset + stored) +
                                 ", columns.bin has " + std::to_string(map_size) + ": cut short)"
                           : std::string()) +
                      ": rebuild it with `slipstream corpus build`");
  // The stored bytes' hash: a flipped bit, or a columns.bin of another build beside this
  // manifest, is an error naming the column, never other training data. Corpora whose games
  // have hashes check each game when it is read instead (check_game).
  if (hash_column && c.contains("hash") && bytes) {
    const std::string got =
        "mix64:" + hex64(content_hash(std::span<const uint8_t>(bytes + offset, stored)));
    if (got != c.at("hash").get<std::string>())
      throw CorpusError("corpus " + dir.string() + " column '" + spec.name +
                        "' does not match its hash in " + kManifestName +
                        " (damaged, or columns.bin of another build): rebuild it with "
                        "`slipstream corpus build`");
  }
  const std::string compression = c.at("compression");
  chunk_table.push_back(nullptr);
  chunk_data.push_back(nullptr);
  if (compression == "zstd_games") {
    if (bytes) {  // checked by check_game_tables
      chunk_table.back() = reinterpret_cast<const uint64_t*>(bytes + offset);
      chunk_data.back() = bytes + offset;  // the table's end is added there
    }
    base.push_back(nullptr);
  } else if (compression == "zstd") {
    const size_t alloc = align_up(std::max<size_t>(size, 1));
    owned.emplace_back(static_cast<uint8_t*>(std::aligned_alloc(kAlign, alloc)), &std::free);
    if (!owned.back()) throw std::bad_alloc();
    const size_t r = ZSTD_decompress(owned.back().get(), size, bytes + offset, stored);
    if (ZSTD_isError(r) || r != size)
      throw CorpusError("corpus " + dir.string() + " column '" + spec.name +
                        "' does not decompress");
    base.push_back(owned.back().get());
  } else {
    if (stored != size) throw CorpusError("corpus column '" + spec.name + "' has a wrong size");
    base.push_back(bytes ? bytes + offset : nullptr);
  }
}

void Corpus::State::check_game_tables(const nlohmann::json& columns, size_t n_games) {
  for (size_t i = 0; i < chunk_table.size(); ++i) {
    if (!chunk_table[i]) continue;
    const size_t stored = columns[i].at("stored_bytes"), head = (n_games + 1) * sizeof(uint64_t);
    const uint64_t* t = chunk_table[i];
    bool ok = stored >= head && t[0] == 0;
    for (size_t g = 0; ok && g < n_games; ++g) ok = t[g] <= t[g + 1];
    if (!ok || t[n_games] > stored - head)
      throw CorpusError("corpus " + dir.string() + " column '" + catalog()[i].name +
                        "' has a damaged table of games: rebuild it with `slipstream corpus "
                        "build`");
    chunk_data[i] += head;
  }
}

void Corpus::State::read_games(const nlohmann::json& entries, const size_t rows_of[3]) {
  for (const auto& g : entries) {
    GameEntry e;
    e.info = game_info_from_json(g.at("info"));
    e.frames = g.at("frames");
    e.frame_offset = g.at("frame_offset");
    e.items = g.at("items");
    e.item_offset = g.at("item_offset");
    if (g.contains("game_hash")) {
      e.hash = parse_mix64(g.at("game_hash").get<std::string>());
      if (!e.hash)
        throw CorpusError("corpus " + dir.string() + " has a malformed game_hash in its " +
                          kManifestName + ": rebuild it with `slipstream corpus build`");
    }
    if (e.frame_offset > rows_of[0] || e.frames > rows_of[0] - e.frame_offset ||
        e.item_offset > rows_of[2] || e.items > rows_of[2] - e.item_offset)
      throw CorpusError("corpus " + dir.string() + " has a game outside its columns");
    for (const auto& t : g.at("tracks")) {
      Track tr{t.at("port"), t.at("follower"), t.at("offset")};
      if (tr.offset > rows_of[1] || e.frames > rows_of[1] - tr.offset)
        throw CorpusError("corpus " + dir.string() + " has a track outside its columns");
      // A game's tracks follow each other: its slice of a track column is one range.
      if (!e.tracks.empty() && tr.offset != e.tracks.back().offset + e.frames)
        throw CorpusError("corpus " + dir.string() + " has a game whose tracks are apart");
      e.tracks.push_back(tr);
    }
    games.push_back(std::move(e));
  }
}

Corpus::Corpus(std::unique_ptr<State> state) : state_(std::move(state)) {}
Corpus::Corpus(Corpus&&) noexcept = default;
Corpus& Corpus::operator=(Corpus&&) noexcept = default;
Corpus::~Corpus() = default;

size_t Corpus::size() const {
  return state_->games.size();
}
size_t Corpus::total_frames() const {
  return state_->frame_rows;
}
const std::filesystem::path& Corpus::dir() const {
  return state_->dir;
}
Rollbacks Corpus::rollbacks() const {
  return state_->rollbacks;
}

Corpus Corpus::open(const std::filesystem::path& dir) {
  auto st = std::make_unique<State>();
  st->dir = dir;
  const auto manifest_path = dir / kManifestName;
  nlohmann::json m;
  {
    std::ifstream in(manifest_path);
    if (!in) throw CorpusError("no corpus at " + dir.string() + " (missing " + kManifestName + ")");
    m = nlohmann::json::parse(in, nullptr, false);
    if (m.is_discarded() || !m.is_object())
      throw CorpusError(manifest_path.string() + " is not valid JSON");
  }
  if (m.value("format", std::string()) != kFormatName)
    throw CorpusError(manifest_path.string() + " is not a slipstream slp corpus manifest");
  const int version = m.value("format_version", -1);
  if (version != 1 && version != kCorpusFormatVersion)
    throw CorpusError("corpus " + dir.string() + " has format version " + std::to_string(version) +
                      " but this build reads versions 1 to " +
                      std::to_string(kCorpusFormatVersion) +
                      ": rebuild it with `slipstream corpus build`");
  try {
    const auto& specs = catalog();
    const auto& columns = m.at("columns");
    if (columns.size() != specs.size())
      throw CorpusError("corpus " + dir.string() +
                        " has a different column set: rebuild it with `slipstream corpus build`");
    const size_t rows_of[3] = {m.at("frame_rows"), m.at("track_rows"), m.at("item_rows")};
    st->frame_rows = rows_of[0];
    st->rollbacks = m.value("rollbacks", std::string("last_copy")) == "keep_all"
                        ? Rollbacks::kKeepAll
                        : Rollbacks::kLastCopy;

    st->map_columns();
    const auto& games = m.at("games");
    const bool game_hashes = std::all_of(games.begin(), games.end(), [](const nlohmann::json& g) {
      return g.contains("game_hash");
    });
    // With a hash for every game and the build's id, no column is read whole here: each game
    // is checked when it is read, and columns.bin's trailer tells another build's.
    const bool per_game = game_hashes && m.contains("build_id");
    if (per_game) st->check_trailer(m.at("build_id").get<std::string>(), columns);
    for (size_t i = 0; i < specs.size(); ++i) st->bind_column(i, columns[i], rows_of, !per_game);
    st->check_game_tables(columns, m.at("games").size());
    st->read_games(m.at("games"), rows_of);
  } catch (const nlohmann::json::exception& e) {
    throw CorpusError(manifest_path.string() + " is malformed: " + e.what());
  }
  return Corpus(std::move(st));
}

void Corpus::State::check_trailer(const std::string& build_id,
                                  const nlohmann::json& columns) const {
  size_t end = 0;
  for (const auto& c : columns)
    end = std::max<size_t>(end, c.at("offset").get<size_t>() + c.at("stored_bytes").get<size_t>());
  const std::optional<uint64_t> id = parse_mix64(build_id);
  bool ok = id && map_size == end + kTrailerBytes;
  if (ok) {
    const auto* t = static_cast<const uint8_t*>(map) + end;
    ok = std::memcmp(t, kTrailerMagic, 8) == 0 && std::memcmp(t + 8, &*id, 8) == 0;
  }
  if (!ok)
    throw CorpusError("corpus " + dir.string() + ": " + kColumnsName + " is not the one its " +
                      kManifestName + " was written with (" +
                      (map_size < end + kTrailerBytes ? "cut short" : "another build's") +
                      "): rebuild it with `slipstream corpus build`");
}

std::span<const uint8_t> Corpus::State::stored_bytes(size_t k, size_t index) const {
  const GameEntry& g = games[index];
  if (chunk_table[k]) {
    const uint64_t* t = chunk_table[k];
    return {chunk_data[k] + t[index], static_cast<size_t>(t[index + 1] - t[index])};
  }
  if (!base[k]) return {};
  const ColumnSpec& spec = catalog()[k];
  size_t first = g.item_offset, rows = g.items;
  if (spec.group == Group::kFrame) {
    first = g.frame_offset, rows = g.frames;
  } else if (spec.group == Group::kTrack) {
    first = g.tracks.empty() ? 0 : g.tracks.front().offset, rows = g.tracks.size() * g.frames;
  }
  return {base[k] + first * spec.elem_size, rows * spec.elem_size};
}

void Corpus::State::check_game(size_t index) const {
  const GameEntry& g = games[index];
  if (!g.hash) return;
  GameHash h;
  for (size_t k = 0; k < base.size(); ++k) h.add(stored_bytes(k, index));
  if (h.value != *g.hash)
    throw CorpusError("corpus " + dir.string() + ": game " + std::to_string(index) + " (" +
                      g.info.source + ") does not match its hash in " + kManifestName +
                      ": its bytes in " + kColumnsName +
                      " are damaged; the game is left out (rebuild the corpus to read it again)");
}

CorpusGame Corpus::game(size_t index) const {
  const State& st = *state_;
  const State::GameEntry& g = st.games.at(index);
  st.check_game(index);
  CorpusGame out;
  GameView& v = out.view_;
  v.info = g.info;
  // Column k's rows from `offset` on: in the mapping, or in this game's decoded slice of a
  // per-game zstd column (slice_begin: the slice's first row; decoded once per column).
  std::vector<const uint8_t*> decoded(st.base.size(), nullptr);
  const auto& specs = catalog();
  auto rows_at = [&](size_t k, size_t offset, size_t slice_begin,
                     size_t slice_rows) -> const uint8_t* {
    const size_t elem = specs[k].elem_size;
    if (st.base[k]) return st.base[k] + offset * elem;
    if (!st.chunk_table[k]) return nullptr;
    if (!decoded[k]) {
      const uint64_t* t = st.chunk_table[k];
      const size_t size = slice_rows * elem;
      out.owned_.emplace_back(
          static_cast<uint8_t*>(std::aligned_alloc(kAlign, align_up(std::max<size_t>(size, 1)))),
          &std::free);
      if (!out.owned_.back()) throw std::bad_alloc();
      const size_t r = size ? ZSTD_decompress(out.owned_.back().get(), size,
                                              st.chunk_data[k] + t[index], t[index + 1] - t[index])
                            : 0;
      if (ZSTD_isError(r) || r != size)
        throw CorpusError("corpus " + st.dir.string() + " column '" + specs[k].name + "' of game " +
                          std::to_string(index) + " does not decompress");
      out.decoded_bytes_ += size;
      decoded[k] = out.owned_.back().get();
    }
    return decoded[k] + (offset - slice_begin) * elem;
  };
  size_t k = 0;
  auto bind = [&](size_t offset, size_t rows, size_t slice_begin, size_t slice_rows) {
    return [&, offset, rows, slice_begin, slice_rows](const std::string&, auto& view,
                                                      Presence presence) {
      using T = typename std::remove_cvref_t<decltype(view)>::value_type;
      const size_t col = k++;
      const uint8_t* p =
          presence.in(g.info.fields) ? rows_at(col, offset, slice_begin, slice_rows) : nullptr;
      view = p ? View<T>(reinterpret_cast<const T*>(p), rows) : View<T>();
    };
  };
  visit_frame_group(v.frames, bind(g.frame_offset, g.frames, g.frame_offset, g.frames));
  const size_t track_begin = k;
  const size_t tracks_begin = g.tracks.empty() ? 0 : g.tracks.front().offset;
  const size_t tracks_rows = g.tracks.size() * g.frames;
  for (const State::Track& t : g.tracks) {
    if (v.frames.ports.empty() || v.frames.ports.back().port != t.port) {
      v.frames.ports.emplace_back();
      v.frames.ports.back().port = t.port;
    }
    auto& pf = v.frames.ports.back();
    CharacterFramesT<View>& ch = t.follower ? pf.follower.emplace() : pf.leader;
    k = track_begin;
    visit_track_group(ch, bind(t.offset, g.frames, tracks_begin, tracks_rows));
  }
  k = track_begin + kTrackColumns;
  visit_item_group(v.frames.items, bind(g.item_offset, g.items, g.item_offset, g.items));
  return out;
}

}  // namespace slipstream::slp

#include "stages/melee/slp/parser.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "stages/melee/slp/byte_order.h"
#include "stages/melee/slp/event_codes.h"
#include "stages/melee/slp/shift_jis.h"
#include "stages/melee/slp/ubjson.h"

namespace slipstream::slp {

ParseError::ParseError(std::string file, uint64_t offset, const std::string& message)
    : std::runtime_error(file + ": byte offset " + std::to_string(offset) + ": " + message),
      file_(std::move(file)),
      offset_(offset),
      message_(message) {}

namespace {

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", b);
  return buf;
}

// Presence mask of a field table for an event whose payload (after the command byte) is
// `payload` bytes long.
#define SLP_PRESENCE_BIT(name, type, offset) \
  mask |= (offset + sizeof(type) <= 1 + size_t(payload) ? 1ull : 0ull) << bit++;
#define SLP_PRESENCE_FN(fn, TABLE) \
  uint64_t fn(size_t payload) {    \
    uint64_t mask = 0;             \
    int bit = 0;                   \
    TABLE(SLP_PRESENCE_BIT)        \
    return mask;                   \
  }
SLP_PRESENCE_FN(pre_presence, SLP_PRE_FRAME_FIELDS)
SLP_PRESENCE_FN(post_presence, SLP_POST_FRAME_FIELDS)
SLP_PRESENCE_FN(item_presence, SLP_ITEM_FIELDS)
SLP_PRESENCE_FN(frame_start_presence, SLP_FRAME_START_FIELDS)
SLP_PRESENCE_FN(frame_bookend_presence, SLP_FRAME_BOOKEND_FIELDS)
#undef SLP_PRESENCE_FN
#undef SLP_PRESENCE_BIT

// Resizes every column of a character or of the frame table.
template <class Columns>
void resize_all(Columns& cols, size_t n) {
  Columns::visit(cols, [n](FieldDesc, auto& col) { col.resize(n); });
}
void resize_character(CharacterFrames& ch, size_t n) {
  ch.present.resize(n);
  resize_all(ch.pre, n);
  resize_all(ch.post, n);
}
template <class Columns>
void clear_absent(Columns& cols, uint64_t presence) {
  Columns::visit(cols, [presence](FieldDesc d, auto& col) {
    if (!((presence >> d.index) & 1)) col.clear();
  });
}

class StreamParser {
 public:
  StreamParser(std::string_view source, const ParseOptions& options, Game& game)
      : source_(source), options_(options), game_(game), info_(game.info) {
    recycle_columns();
    info_ = GameInfo{};
    info_.source = std::string(source);
  }

  void parse(std::span<const uint8_t> bytes) {
    bytes_ = bytes;
    size_t pos = 0;
    if (bytes.empty() || bytes[0] != '{')
      fail(0, "not a .slp file: expected a UBJSON object ('{')");
    pos = 1;
    bool have_raw = false;
    while (pos < bytes.size()) {
      const uint8_t marker = bytes[pos];
      if (marker == '}') break;
      if (marker == 'N') {
        ++pos;
        continue;
      }
      std::string key;
      try {
        const int64_t n = read_ubjson_length(bytes, pos);
        if (static_cast<uint64_t>(n) > bytes.size() - pos)
          throw UbjsonError(pos, "key runs past the end");
        key.assign(reinterpret_cast<const char*>(bytes.data() + pos), static_cast<size_t>(n));
        pos += static_cast<size_t>(n);
      } catch (const UbjsonError& e) {
        container_damage(e.offset, std::string("container: ") + e.what(), have_raw);
        break;
      }
      if (key == "raw" && !have_raw) {
        pos = parse_raw_element(pos);
        have_raw = true;
        if (stopped_) break;
      } else {
        try {
          nlohmann::json value = read_ubjson(bytes, pos);
          if (key == "metadata") read_metadata(value);
        } catch (const UbjsonError& e) {
          container_damage(e.offset, "element '" + printable(key) + "': " + e.what(), have_raw);
          break;
        }
      }
    }
    if (!have_raw) fail(pos, "no 'raw' element");
    finish();
  }

 private:
  [[noreturn]] void fail(uint64_t offset, const std::string& message) const {
    throw ParseError(std::string(source_), offset, message);
  }

  static std::string printable(const std::string& s) {
    std::string out;
    for (char c : s.substr(0, 32)) out.push_back(c >= 0x20 && c < 0x7F ? c : '?');
    return out;
  }

  // Damage after the frames were read keeps them; before, the file is unreadable.
  void container_damage(uint64_t offset, const std::string& message, bool have_raw) {
    if (!have_raw || !game_started_) fail(offset, message);
    record_error(offset, message);
  }

  void record_error(uint64_t offset, const std::string& message) {
    if (options_.strict) fail(offset, message);
    if (info_.error.empty()) {
      info_.partial = true;
      info_.error = "byte offset " + std::to_string(offset) + ": " + message;
    }
  }

  // `pos` is just after the "raw" key. Returns where the next key starts.
  size_t parse_raw_element(size_t pos) {
    const auto& b = bytes_;
    if (b.size() - pos < 4 || b[pos] != '[' || b[pos + 1] != '$' || b[pos + 2] != 'U' ||
        b[pos + 3] != '#')
      fail(pos, "'raw' is not an optimized uint8 array ([$U#)");
    pos += 4;
    int64_t length;
    try {
      length = read_ubjson_length(b, pos);
    } catch (const UbjsonError& e) {
      fail(e.offset, std::string("'raw' length: ") + e.what());
    }
    const size_t raw_begin = pos;
    size_t raw_end;
    bool truncated = false;
    if (length == 0) {
      // Written while the game was in progress and never finalised.
      info_.severed = true;
      raw_end = b.size();
    } else if (static_cast<uint64_t>(length) > b.size() - pos) {
      truncated = true;
      raw_end = b.size();
    } else {
      raw_end = pos + static_cast<size_t>(length);
    }
    const size_t consumed = parse_events(raw_begin, raw_end);
    if (truncated && info_.error.empty())
      record_error(b.size(), "'raw' declares " + std::to_string(length) +
                                 " bytes but the file ends after " +
                                 std::to_string(b.size() - raw_begin));
    // Past a truncated or severed raw element there is no reliable place to resume.
    if (truncated || (info_.severed && !info_.error.empty())) stopped_ = true;
    return info_.severed ? consumed : raw_end;
  }

  // ---- events -------------------------------------------------------------------------------

  size_t parse_events(size_t begin, size_t end) {
    const uint8_t* const base = bytes_.data();
    size_t p = begin;
    if (p >= end) fail(p, "'raw' is empty");
    if (base[p] != event::kEventPayloads)
      fail(p, "expected Event Payloads (0x35), found " + hex_byte(base[p]));
    if (end - p < 2) fail(p, "truncated Event Payloads");
    const size_t table_size = base[p + 1];  // counts itself
    if (table_size < 1 || (table_size - 1) % 3 != 0)
      fail(p + 1, "Event Payloads size " + std::to_string(table_size) + " is not 3n+1");
    if (table_size + 1 > end - p) fail(p + 1, "Event Payloads table runs past the end of 'raw'");
    for (size_t i = 0; i + 1 < table_size; i += 3) {
      const uint8_t cmd = base[p + 2 + i];
      const uint16_t size = load_be<uint16_t>(base + p + 3 + i);
      size_[cmd] = size;
      known_[cmd] = true;
      info_.payload_sizes.emplace_back(cmd, size);
    }
    p += 1 + table_size;
    check_sizes(begin);

    try {
      p = event_loop(p, end);
    } catch (const ParseError& e) {
      if (!game_started_ || options_.strict) throw;
      record_error(e.offset(), e.message());
    }
    return p;
  }

  void check_sizes(size_t at) {
    auto need = [&](uint8_t cmd, size_t min_payload) {
      if (known_[cmd] && size_[cmd] < min_payload)
        fail(at, std::string(event::name(cmd)) + " payload size " + std::to_string(size_[cmd]) +
                     " is too small (needs " + std::to_string(min_payload) + ")");
    };
    need(event::kGameStart, 4);
    need(event::kPreFrame, event::kIsFollowerOffset);
    need(event::kPostFrame, event::kIsFollowerOffset);
    need(event::kFrameStart, 4);
    need(event::kItem, 4);
    need(event::kFrameBookend, 4);
    need(event::kGameEnd, 1);
    need(event::kMessageSplitter, event::kSplitterPayload);
    if (!known_[event::kGameStart]) fail(at, "Event Payloads table has no Game Start");
    if (known_[event::kPreFrame]) info_.fields.pre = pre_presence(size_[event::kPreFrame]);
    if (known_[event::kPostFrame]) info_.fields.post = post_presence(size_[event::kPostFrame]);
    if (known_[event::kItem]) info_.fields.item = item_presence(size_[event::kItem]);
    if (known_[event::kFrameStart])
      info_.fields.frame_start = frame_start_presence(size_[event::kFrameStart]);
    if (known_[event::kFrameBookend])
      info_.fields.frame_bookend = frame_bookend_presence(size_[event::kFrameBookend]);
    // Short (older) payloads are decoded from a zero-padded copy, so one decoder serves all.
    pre_short_ = size_[event::kPreFrame] + 1u < event::kPreFrameSize;
    post_short_ = size_[event::kPostFrame] + 1u < event::kPostFrameSize;
    item_short_ = size_[event::kItem] + 1u < event::kItemSize;
    start_short_ = size_[event::kFrameStart] + 1u < event::kFrameStartSize;
    bookend_short_ = size_[event::kFrameBookend] + 1u < event::kFrameBookendSize;
  }

  static bool is_metadata_key(const uint8_t* p, size_t left) {
    static constexpr uint8_t kKey[] = {'U', 8, 'm', 'e', 't', 'a', 'd', 'a', 't', 'a'};
    return left >= sizeof kKey && std::memcmp(p, kKey, sizeof kKey) == 0;
  }

  // Returns where it stopped: `end`, or the metadata key of a severed file.
  size_t event_loop(size_t p, size_t end) {
    const uint8_t* const base = bytes_.data();
    while (p < end) {
      const uint8_t cmd = base[p];
      if (!known_[cmd]) {
        // A severed file whose writer still appended metadata: raw ends where it starts.
        if (info_.severed && is_metadata_key(base + p, end - p)) return p;
        fail(p, "unknown event " + hex_byte(cmd) + " (not in the Event Payloads table)");
      }
      const size_t n = 1 + size_t(size_[cmd]);
      if (end - p < n) {
        fail(p, "truncated " + std::string(event::name(cmd)) + " event: needs " +
                    std::to_string(n) + " bytes, " + std::to_string(end - p) + " left");
      }
      const uint8_t* e = base + p;
      switch (cmd) {
        case event::kPreFrame:
          on_pre(e, p);
          break;
        case event::kPostFrame:
          on_post(e, p);
          break;
        case event::kFrameStart:
          on_frame_start(e, p);
          break;
        case event::kFrameBookend:
          on_bookend(e, p);
          break;
        case event::kItem:
          on_item(e, p);
          break;
        case event::kGameStart:
          on_game_start(e, n, p);
          break;
        case event::kGameEnd:
          on_game_end(e, n, p);
          break;
        case event::kMessageSplitter:
          on_splitter(e, p);
          break;
        default:
          ++info_.skipped_events;
          break;
      }
      p += n;
    }
    return p;
  }

  void require_start(size_t at, uint8_t cmd) {
    if (!game_started_) fail(at, std::string(event::name(cmd)) + " before Game Start");
  }

  // Returns a pointer to the event, or to a zero-padded copy when the file's payload is shorter
  // than the current one.
  static const uint8_t* padded(const uint8_t* e, bool is_short, uint8_t* scratch, size_t n) {
    if (!is_short) return e;
    std::memcpy(scratch, e, n);
    return scratch;
  }

  void begin_row(int32_t frame) {
    const size_t row = n_rows_++;
    if (row == capacity_) grow(std::max<size_t>(capacity_ * 2, 256));
    frames().frame[row] = frame;
    cur_frame_ = frame;
  }

  void grow(size_t capacity) {
    capacity_ = capacity;
    Frames& f = frames();
    f.frame.resize(capacity);
    resize_all(f.start, capacity);
    resize_all(f.bookend, capacity);
    for (auto& slot : slots_)
      if (slot) resize_character(*slot, capacity);
  }

  CharacterFrames& slot(uint8_t port, bool follower) {
    const size_t i = port * 2 + (follower ? 1 : 0);
    auto& s = slots_[i];
    if (!s) {
      s = spare_[i] ? std::move(spare_[i]) : std::make_unique<CharacterFrames>();
      resize_character(*s, 0);
      resize_character(*s, capacity_);
    }
    return *s;
  }

  // Keeps the buffers of the game being overwritten: parsing file after file into one Game then
  // allocates (and page-faults) nothing once the buffers are large enough.
  void recycle_columns() {
    Frames& f = frames();
    for (auto& pf : f.ports) {
      spare_[pf.port * 2] = std::make_unique<CharacterFrames>(std::move(pf.leader));
      if (pf.follower)
        spare_[pf.port * 2 + 1] = std::make_unique<CharacterFrames>(std::move(*pf.follower));
    }
    f.ports.clear();
    f.frame.clear();
    resize_all(f.start, 0);
    resize_all(f.bookend, 0);
    visit_item_columns(f.items, [](const std::string&, auto& col) { col.clear(); });
  }

  // Frame events whose frame number differs from the current row's open a new row; so do
  // repeats of a character's event (files before Frame Start existed).
  size_t row_for(int32_t frame) {
    if (n_rows_ == 0 || frame != cur_frame_) begin_row(frame);
    return n_rows_ - 1;
  }

  CharacterFrames& character_for(const uint8_t* e, size_t at, uint8_t has_bit, size_t& row) {
    const int32_t frame = load_be<int32_t>(e + event::kFrameNumberOffset);
    const uint8_t port = e[event::kPlayerIndexOffset];
    if (port > 3)
      fail(at + event::kPlayerIndexOffset,
           "player index " + std::to_string(port) +
               ": a game mode with more than four characters (multi-man modes), which is not "
               "read (ports 0-3 only)");
    CharacterFrames& ch = slot(port, e[event::kIsFollowerOffset] != 0);
    row = row_for(frame);
    if (ch.present[row] & has_bit) {
      begin_row(frame);
      row = n_rows_ - 1;
    }
    ch.present[row] |= has_bit;
    return ch;
  }

  void on_pre(const uint8_t* e, size_t at) {
    require_start(at, event::kPreFrame);
    e = padded(e, pre_short_, pre_scratch_.data(), 1 + size_t(size_[event::kPreFrame]));
    size_t row;
    CharacterFrames& ch = character_for(e, at, kHasPre, row);
#define SLP_DECODE(name, type, offset) ch.pre.name[row] = load_be<type>(e + offset);
    SLP_PRE_FRAME_FIELDS(SLP_DECODE)
#undef SLP_DECODE
  }

  void on_post(const uint8_t* e, size_t at) {
    require_start(at, event::kPostFrame);
    e = padded(e, post_short_, post_scratch_.data(), 1 + size_t(size_[event::kPostFrame]));
    size_t row;
    CharacterFrames& ch = character_for(e, at, kHasPost, row);
#define SLP_DECODE(name, type, offset) ch.post.name[row] = load_be<type>(e + offset);
    SLP_POST_FRAME_FIELDS(SLP_DECODE)
#undef SLP_DECODE
  }

  void on_frame_start(const uint8_t* e, size_t at) {
    require_start(at, event::kFrameStart);
    e = padded(e, start_short_, start_scratch_.data(), 1 + size_t(size_[event::kFrameStart]));
    begin_row(load_be<int32_t>(e + event::kFrameNumberOffset));
    const size_t row = n_rows_ - 1;
    auto& s = frames().start;
#define SLP_DECODE(name, type, offset) s.name[row] = load_be<type>(e + offset);
    SLP_FRAME_START_FIELDS(SLP_DECODE)
#undef SLP_DECODE
  }

  void on_bookend(const uint8_t* e, size_t at) {
    require_start(at, event::kFrameBookend);
    e = padded(e, bookend_short_, bookend_scratch_.data(), 1 + size_t(size_[event::kFrameBookend]));
    const size_t row = row_for(load_be<int32_t>(e + event::kFrameNumberOffset));
    auto& s = frames().bookend;
#define SLP_DECODE(name, type, offset) s.name[row] = load_be<type>(e + offset);
    SLP_FRAME_BOOKEND_FIELDS(SLP_DECODE)
#undef SLP_DECODE
    last_bookend_row_ = static_cast<int64_t>(row);
  }

  void on_item(const uint8_t* e, size_t at) {
    require_start(at, event::kItem);
    if (!options_.items) {
      ++info_.skipped_events;
      return;
    }
    e = padded(e, item_short_, item_scratch_.data(), 1 + size_t(size_[event::kItem]));
    const size_t row = row_for(load_be<int32_t>(e + event::kFrameNumberOffset));
    auto& items = frames().items;
    items.row.push_back(static_cast<uint32_t>(row));
#define SLP_DECODE(name, type, offset) items.fields.name.push_back(load_be<type>(e + offset));
    SLP_ITEM_FIELDS(SLP_DECODE)
#undef SLP_DECODE
  }

  void on_game_end(const uint8_t* e, size_t n, size_t at) {
    require_start(at, event::kGameEnd);
    if (info_.game_end_events++ > 0) return;  // keep the first of duplicated Game Ends
    GameEnd end;
    end.method = e[event::kGameEndMethod];
    if (n > event::kGameEndLras) end.lras_initiator = static_cast<int8_t>(e[event::kGameEndLras]);
    if (n >= event::kGameEndPlacements + 4) {
      std::array<int8_t, 4> placements;
      for (int i = 0; i < 4; ++i)
        placements[i] = static_cast<int8_t>(e[event::kGameEndPlacements + i]);
      end.placements = placements;
    }
    info_.end = end;
  }

  void on_splitter(const uint8_t* e, size_t at) {
    const uint16_t actual = load_be<uint16_t>(e + event::kSplitterActualSize);
    if (actual > event::kSplitterBlockSize)
      fail(at + event::kSplitterActualSize,
           "Message Splitter claims " + std::to_string(actual) + " bytes of a 512-byte block");
    if (e[event::kSplitterInternalCommand] == event::kGeckoList) info_.gecko_codes_bytes += actual;
  }

  void on_game_start(const uint8_t* e, size_t n, size_t at) {
    if (game_started_) fail(at, "second Game Start");
    game_started_ = true;
    GameStart& s = info_.start;
    auto has = [n](size_t offset, size_t size) { return offset + size <= n; };
    auto u8 = [&](size_t o) -> uint8_t { return has(o, 1) ? e[o] : 0; };
    auto u16 = [&](size_t o) -> uint16_t { return has(o, 2) ? load_be<uint16_t>(e + o) : 0; };
    auto u32 = [&](size_t o) -> uint32_t { return has(o, 4) ? load_be<uint32_t>(e + o) : 0; };
    auto f32 = [&](size_t o) -> float { return has(o, 4) ? load_be<float>(e + o) : 0.0f; };
    auto text = [&](size_t o, size_t size) -> std::string {
      if (!has(o, size)) return {};
      return decode_shift_jis(std::span<const uint8_t>(e + o, size));
    };
    namespace gs = event::start;
    s.version = {u8(gs::kVersion), u8(gs::kVersion + 1), u8(gs::kVersion + 2)};
    for (size_t i = 0; i < 4; ++i) s.bitfield[i] = u8(gs::kBitfield + i);
    s.bomb_rain = u8(gs::kBombRain);
    s.is_teams = u8(gs::kIsTeams) != 0;
    s.item_spawn_behavior = static_cast<int8_t>(u8(gs::kItemSpawnBehavior));
    s.self_destruct_score = static_cast<int8_t>(u8(gs::kSelfDestructScore));
    s.stage = u16(gs::kStage);
    s.timer = u32(gs::kTimer);
    for (size_t i = 0; i < 5; ++i) s.item_spawn_bitfield[i] = u8(gs::kItemSpawnBitfield + i);
    s.damage_ratio = f32(gs::kDamageRatio);
    s.random_seed = u32(gs::kRandomSeed);
    if (has(gs::kIsPal, 1)) s.is_pal = e[gs::kIsPal] != 0;
    if (has(gs::kIsFrozenPs, 1)) s.is_frozen_ps = e[gs::kIsFrozenPs] != 0;
    if (has(gs::kMajorScene, 1)) {
      s.minor_scene = e[gs::kMinorScene];
      s.major_scene = e[gs::kMajorScene];
    }
    if (has(gs::kLanguage, 1)) s.language = e[gs::kLanguage];
    s.match_id = text(gs::kMatchId, gs::kMatchIdSize);
    s.game_number = u32(gs::kGameNumber);
    s.tiebreaker_number = u32(gs::kTiebreakerNumber);

    for (uint8_t port = 0; port < 4; ++port) {
      const size_t b = gs::kPlayerBlock + gs::kPlayerStride * port;
      if (!has(b + gs::kType, 1)) break;
      const uint8_t type = e[b + gs::kType];
      if (type == 3) continue;  // empty
      Player pl;
      pl.port = port;
      pl.type = type;
      pl.character = u8(b + gs::kCharacter);
      pl.stocks = u8(b + gs::kStocks);
      pl.costume = u8(b + gs::kCostume);
      pl.team_shade = u8(b + gs::kTeamShade);
      pl.handicap = u8(b + gs::kHandicap);
      pl.team = u8(b + gs::kTeam);
      pl.bitfield = u8(b + gs::kPlayerBitfield);
      pl.cpu_level = u8(b + gs::kCpuLevel);
      pl.damage_start = u16(b + gs::kDamageStart);
      pl.damage_spawn = u16(b + gs::kDamageSpawn);
      pl.offense_ratio = f32(b + gs::kOffenseRatio);
      pl.defense_ratio = f32(b + gs::kDefenseRatio);
      pl.model_scale = f32(b + gs::kModelScale);
      pl.dashback_fix = u32(gs::kDashbackFix + 8 * port);
      pl.shield_drop_fix = u32(gs::kShieldDropFix + 8 * port);
      pl.nametag = text(gs::kNametag + gs::kNametagSize * port, gs::kNametagSize);
      pl.display_name = text(gs::kDisplayName + gs::kDisplayNameSize * port, gs::kDisplayNameSize);
      pl.connect_code = text(gs::kConnectCode + gs::kConnectCodeSize * port, gs::kConnectCodeSize);
      pl.slippi_uid = text(gs::kSlippiUid + gs::kSlippiUidSize * port, gs::kSlippiUidSize);
      s.players.push_back(std::move(pl));
    }
    reserve_rows(at + n);
  }

  // Sizes the columns from the bytes left and the bytes one frame takes, so a normal game never
  // reallocates.
  void reserve_rows(size_t stream_pos) {
    size_t per_row = 0;
    auto add = [&](uint8_t cmd) {
      if (known_[cmd]) per_row += 1 + size_t(size_[cmd]);
    };
    add(event::kFrameStart);
    add(event::kFrameBookend);
    for (const Player& pl : info_.start.players) {
      const int characters = pl.character == kIceClimbers ? 2 : 1;
      for (int i = 0; i < characters; ++i) {
        add(event::kPreFrame);
        add(event::kPostFrame);
      }
      slot(pl.port, false);
      if (characters == 2) slot(pl.port, true);
    }
    per_row = std::max<size_t>(per_row, 16);
    const size_t left = bytes_.size() - std::min(bytes_.size(), stream_pos);
    // Bounded so a hostile table cannot make us allocate far more than the file can fill.
    const size_t estimate =
        std::min<size_t>(left / per_row + left / per_row / 32 + 64, size_t(1) << 22);
    grow(estimate);
  }

  static constexpr uint8_t kIceClimbers = 0x0E;

  // ---- metadata -----------------------------------------------------------------------------

  void read_metadata(const nlohmann::json& j) {
    Metadata& m = info_.metadata;
    if (!j.is_object()) return;
    m.present = true;
    auto str = [&](const char* key) -> std::string {
      auto it = j.find(key);
      return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    m.start_at = str("startAt");
    m.played_on = str("playedOn");
    m.console_nick = str("consoleNick");
    if (auto it = j.find("lastFrame"); it != j.end() && it->is_number_integer()) {
      const int64_t v = it->get<int64_t>();
      if (v >= INT32_MIN && v <= INT32_MAX) m.last_frame = static_cast<int32_t>(v);
    }
    auto players = j.find("players");
    if (players == j.end() || !players->is_object()) return;
    for (auto it = players->begin(); it != players->end(); ++it) {
      const std::string& key = it.key();
      if (key.size() != 1 || key[0] < '0' || key[0] > '3' || !it->is_object()) continue;
      MetadataPlayer p;
      p.port = static_cast<uint8_t>(key[0] - '0');
      if (auto names = it->find("names"); names != it->end() && names->is_object()) {
        if (auto v = names->find("netplay"); v != names->end() && v->is_string())
          p.netplay = v->get<std::string>();
        if (auto v = names->find("code"); v != names->end() && v->is_string())
          p.code = v->get<std::string>();
      }
      if (auto chars = it->find("characters"); chars != it->end() && chars->is_object()) {
        for (auto c = chars->begin(); c != chars->end(); ++c) {
          char* endp = nullptr;
          const unsigned long id = std::strtoul(c.key().c_str(), &endp, 10);
          if (c.key().empty() || *endp != '\0' || id > 0xFFFF || !c->is_number_integer()) continue;
          const int64_t frames = c->get<int64_t>();
          if (frames < 0 || frames > INT32_MAX) continue;
          p.characters.emplace_back(static_cast<uint32_t>(id), static_cast<uint32_t>(frames));
        }
        std::sort(p.characters.begin(), p.characters.end());
      }
      m.players.push_back(std::move(p));
    }
    std::sort(m.players.begin(), m.players.end(),
              [](const MetadataPlayer& a, const MetadataPlayer& b) { return a.port < b.port; });
  }

  // ---- finishing ----------------------------------------------------------------------------

  void finish() {
    if (!game_started_) fail(bytes_.size(), "no Game Start event");
    Frames& f = frames();
    // A cut-off recording usually ends inside a frame: without its bookend the row is incomplete.
    if ((info_.severed || info_.partial) && known_[event::kFrameBookend] && n_rows_ > 0 &&
        last_bookend_row_ != static_cast<int64_t>(n_rows_) - 1)
      --n_rows_;
    if (f.items.size() > 0) {
      size_t keep = 0;
      while (keep < f.items.size() && f.items.row[keep] < n_rows_) ++keep;
      visit_item_columns(f.items, [keep](const std::string&, auto& col) { col.resize(keep); });
    }
    grow(n_rows_);
    for (uint8_t port = 0; port < 4; ++port) {
      if (!slots_[port * 2] && !slots_[port * 2 + 1]) continue;
      PortFrames pf;
      pf.port = port;
      if (slots_[port * 2]) {
        pf.leader = std::move(*slots_[port * 2]);
      } else {
        resize_character(pf.leader, n_rows_);
      }
      if (slots_[port * 2 + 1]) pf.follower = std::move(*slots_[port * 2 + 1]);
      f.ports.push_back(std::move(pf));
    }
    const FieldPresence& fp = info_.fields;
    clear_absent(f.start, fp.frame_start);
    clear_absent(f.bookend, fp.frame_bookend);
    clear_absent(f.items.fields, fp.item);
    for (auto& pf : f.ports) {
      clear_absent(pf.leader.pre, fp.pre);
      clear_absent(pf.leader.post, fp.post);
      if (pf.follower) {
        clear_absent(pf.follower->pre, fp.pre);
        clear_absent(pf.follower->post, fp.post);
      }
    }
    resolve_characters();
    if (options_.rollbacks == Rollbacks::kLastCopy) keep_last_copies();
  }

  static uint8_t first_character(const CharacterFrames& ch) {
    if (ch.post.character.empty()) return kNoCharacter;
    for (size_t r = 0; r < ch.present.size(); ++r)
      if (ch.present[r] & kHasPost) return ch.post.character[r];
    return kNoCharacter;
  }

  void resolve_characters() {
    const Frames& f = frames();
    for (Player& pl : info_.start.players) {
      const PortFrames* pf = f.port(pl.port);
      if (!pf) continue;
      pl.internal_character = first_character(pf->leader);
      if (pf->follower) pl.follower_internal_character = first_character(*pf->follower);
      // Before 1.6.0 Game Start says Zelda even when the player started as Sheik; the first
      // frame's internal character tells (slippi-js does the same).
      if (info_.start.version < Version{1, 6, 0} && !f.frame.empty() && f.frame[0] <= kFirstFrame &&
          (pf->leader.present[0] & kHasPost) && !pf->leader.post.character.empty()) {
        const uint8_t internal = pf->leader.post.character[0];
        if (internal == kInternalSheik) pl.character = kExternalSheik;
        if (internal == kInternalZelda) pl.character = kExternalZelda;
      }
    }
  }
  static constexpr int32_t kFirstFrame = -123;
  static constexpr uint8_t kInternalSheik = 0x07;
  static constexpr uint8_t kInternalZelda = 0x13;
  static constexpr uint8_t kExternalZelda = 0x12;
  static constexpr uint8_t kExternalSheik = 0x13;

  void keep_last_copies() {
    Frames& f = frames();
    const std::vector<uint32_t> keep = last_copy_rows(f.frame);
    if (keep.size() == f.frame.size()) return;
    std::vector<int64_t> new_row(f.frame.size(), -1);
    for (size_t i = 0; i < keep.size(); ++i) new_row[keep[i]] = static_cast<int64_t>(i);
    visit_frame_columns(f, [&](const std::string&, auto& col) {
      if (col.empty()) return;
      for (size_t i = 0; i < keep.size(); ++i) col[i] = col[keep[i]];
      col.resize(keep.size());
    });
    // Items of dropped rows go with them.
    std::vector<uint32_t> kept_items;
    for (size_t i = 0; i < f.items.size(); ++i)
      if (new_row[f.items.row[i]] >= 0) kept_items.push_back(static_cast<uint32_t>(i));
    visit_item_columns(f.items, [&](const std::string&, auto& col) {
      if (col.empty()) return;
      for (size_t i = 0; i < kept_items.size(); ++i) col[i] = col[kept_items[i]];
      col.resize(kept_items.size());
    });
    for (auto& r : f.items.row) r = static_cast<uint32_t>(new_row[r]);
  }

  Frames& frames() {
    return game_.frames;
  }

  std::string_view source_;
  const ParseOptions& options_;
  Game& game_;
  GameInfo& info_;
  std::span<const uint8_t> bytes_;
  std::array<uint16_t, 256> size_{};
  std::array<bool, 256> known_{};
  bool game_started_ = false;
  bool stopped_ = false;
  bool pre_short_ = false, post_short_ = false, item_short_ = false;
  bool start_short_ = false, bookend_short_ = false;
  // Only used for payloads shorter than the current version's, so 128 bytes cover them all.
  std::array<uint8_t, 128> pre_scratch_{};
  std::array<uint8_t, 128> post_scratch_{};
  std::array<uint8_t, 128> item_scratch_{};
  std::array<uint8_t, 128> start_scratch_{};
  std::array<uint8_t, 128> bookend_scratch_{};
  std::array<std::unique_ptr<CharacterFrames>, 8> slots_;  // port * 2 + follower
  std::array<std::unique_ptr<CharacterFrames>, 8> spare_;
  size_t n_rows_ = 0;
  size_t capacity_ = 0;
  int32_t cur_frame_ = 0;
  int64_t last_bookend_row_ = -1;
};

}  // namespace

void parse_slp_into(Game& game, std::span<const uint8_t> bytes, std::string_view source,
                    const ParseOptions& options) {
  StreamParser parser(source, options, game);
  parser.parse(bytes);
}

Game parse_slp(std::span<const uint8_t> bytes, std::string_view source,
               const ParseOptions& options) {
  Game game;
  parse_slp_into(game, bytes, source, options);
  return game;
}

namespace {

// Replays are regular files: a directory, FIFO or device would fail oddly, block forever
// (FIFO) or never end (/dev/zero).
void require_regular_file(const struct stat& st, const std::string& name) {
  if (S_ISREG(st.st_mode)) return;
  const char* what = S_ISDIR(st.st_mode)    ? "is a directory"
                     : S_ISFIFO(st.st_mode) ? "not a regular file (a FIFO)"
                     : S_ISCHR(st.st_mode)  ? "not a regular file (a character device)"
                     : S_ISBLK(st.st_mode)  ? "not a regular file (a block device)"
                     : S_ISSOCK(st.st_mode) ? "not a regular file (a socket)"
                                            : "not a regular file";
  throw ParseError(name, 0, what);
}

// Rejects `head` (the first bytes of a file) when it already shows the parser would refuse
// the file, so junk is refused without reading it all. Only conclusive damage counts: running
// out of `head` accepts. Mirrors StreamParser::parse up to the start of 'raw's events.
void check_slp_header(std::span<const uint8_t> head, const std::string& name) {
  auto fail = [&](size_t offset, const std::string& message) {
    throw ParseError(name, offset, message);
  };
  if (head.empty()) return;
  if (head[0] != '{') fail(0, "not a .slp file: expected a UBJSON object ('{')");
  size_t pos = 1;
  while (pos < head.size() && head[pos] == 'N') ++pos;
  if (pos >= head.size()) return;
  if (head[pos] == '}') fail(pos, "no 'raw' element");
  // Key or array length: UBJSON integer marker then a big-endian integer.
  auto length = [&](size_t& p) -> std::optional<int64_t> {
    static constexpr std::string_view kMarkers = "iUIlL";
    if (p >= head.size()) return std::nullopt;
    if (kMarkers.find(static_cast<char>(head[p])) == std::string_view::npos)
      fail(p, "expected a UBJSON integer marker, found " + hex_byte(head[p]));
    const size_t width = head[p] == 'i' || head[p] == 'U' ? 1
                         : head[p] == 'I'                 ? 2
                         : head[p] == 'l'                 ? 4
                                                          : 8;
    if (head.size() - p - 1 < width) return std::nullopt;
    size_t q = p;
    const int64_t n = read_ubjson_length(head, q);  // complete, so only a negative one throws
    p = q;
    return n;
  };
  std::optional<int64_t> key_length;
  try {
    key_length = length(pos);
  } catch (const UbjsonError& e) {
    fail(e.offset, std::string("container: ") + e.what());
  }
  if (!key_length || *key_length != 3 || head.size() - pos < 3 ||
      std::memcmp(head.data() + pos, "raw", 3) != 0)
    return;  // another first key ('metadata' first is allowed): the parser decides
  pos += 3;
  if (head.size() - pos < 4) return;
  if (head[pos] != '[' || head[pos + 1] != '$' || head[pos + 2] != 'U' || head[pos + 3] != '#')
    fail(pos, "'raw' is not an optimized uint8 array ([$U#)");
  pos += 4;
  try {
    if (!length(pos)) return;
  } catch (const UbjsonError& e) {
    fail(e.offset, std::string("'raw' length: ") + e.what());
  }
  if (pos >= head.size()) return;
  if (head[pos] != event::kEventPayloads)
    fail(pos, "expected Event Payloads (0x35), found " + hex_byte(head[pos]));
  if (pos + 1 >= head.size()) return;
  const size_t table_size = head[pos + 1];
  if (table_size < 1 || (table_size - 1) % 3 != 0)
    fail(pos + 1, "Event Payloads size " + std::to_string(table_size) + " is not 3n+1");
}

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

// read() until `n` bytes or the end; returns how many were read.
size_t read_fully(int fd, uint8_t* dst, size_t n, const std::string& name, uint64_t at) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, dst + got, n - got);
    if (r == 0) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      throw ParseError(name, at + got, std::string("read error: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(r);
  }
  return got;
}

}  // namespace

std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path) {
  const std::string name = path.string();
  struct stat st;
  // Checked before opening: opening a FIFO for reading blocks until a writer comes.
  if (::stat(path.c_str(), &st) != 0)
    throw ParseError(name, 0, std::string("cannot open: ") + std::strerror(errno));
  require_regular_file(st, name);
  // O_NONBLOCK: should the path have become a FIFO since the stat, open does not block on it
  // (it has no effect on a regular file's reads).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw ParseError(name, 0, std::string("cannot open: ") + std::strerror(errno));
  FdCloser closer{fd};
  if (::fstat(fd, &st) != 0)
    throw ParseError(name, 0, std::string("cannot stat: ") + std::strerror(errno));
  require_regular_file(st, name);

  // The header first: a large junk file is refused before the rest is read (or allocated).
  constexpr size_t kHead = 256;
  std::vector<uint8_t> bytes(kHead);
  bytes.resize(read_fully(fd, bytes.data(), kHead, name, 0));
  check_slp_header(bytes, name);
  if (bytes.size() < kHead) return bytes;
  if (st.st_size > 0) bytes.reserve(static_cast<size_t>(st.st_size));
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = read_fully(fd, buf, sizeof buf, name, bytes.size())) > 0) {
    bytes.insert(bytes.end(), buf, buf + n);
    if (n < sizeof buf) break;
  }
  return bytes;
}

Game parse_slp_file(const std::filesystem::path& path, const ParseOptions& options) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  return parse_slp(bytes, path.string(), options);
}

}  // namespace slipstream::slp

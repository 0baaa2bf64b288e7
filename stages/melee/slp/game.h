// The columnar form of one Slippi game: one array per field over the recorded frames (rows), per
// port and per follower (Ice Climbers' Nana), plus game-level information. The same templates
// give owning columns (std::vector, from the parser) and views (std::span, from the corpus).
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "stages/melee/slp/fields.h"

namespace slipstream::slp {

template <class T>
using Vec = std::vector<T>;
template <class T>
using View = std::span<const T>;

// A field's name, offset from the command byte and index in its table.
struct FieldDesc {
  const char* name;
  uint16_t offset;
  uint8_t index;
};

namespace detail {
#define SLP_COUNT_FIELD(name, type, offset) +1
inline constexpr int kPreFieldCount = 0 SLP_PRE_FRAME_FIELDS(SLP_COUNT_FIELD);
inline constexpr int kPostFieldCount = 0 SLP_POST_FRAME_FIELDS(SLP_COUNT_FIELD);
inline constexpr int kItemFieldCount = 0 SLP_ITEM_FIELDS(SLP_COUNT_FIELD);
inline constexpr int kFrameStartFieldCount = 0 SLP_FRAME_START_FIELDS(SLP_COUNT_FIELD);
inline constexpr int kFrameBookendFieldCount = 0 SLP_FRAME_BOOKEND_FIELDS(SLP_COUNT_FIELD);
#undef SLP_COUNT_FIELD
}  // namespace detail

// Declares one column per table entry plus visit(self, f), which calls f(FieldDesc, column) for
// each, in table order; `self` may be const.
#define SLP_DECLARE_COLUMN(name, type, offset) C<type> name;
#define SLP_VISIT_COLUMN(name, type, offset) \
  f(FieldDesc{#name, offset, static_cast<uint8_t>(index++)}, self.name);
#define SLP_COLUMN_STRUCT(Struct, TABLE)   \
  template <template <class> class C>      \
  struct Struct {                          \
    TABLE(SLP_DECLARE_COLUMN)              \
    template <class Self, class F>         \
    static void visit(Self& self, F&& f) { \
      int index = 0;                       \
      TABLE(SLP_VISIT_COLUMN)              \
      (void)index;                         \
    }                                      \
  };

SLP_COLUMN_STRUCT(PreFrameT, SLP_PRE_FRAME_FIELDS)
SLP_COLUMN_STRUCT(PostFrameT, SLP_POST_FRAME_FIELDS)
SLP_COLUMN_STRUCT(ItemFieldsT, SLP_ITEM_FIELDS)
SLP_COLUMN_STRUCT(FrameStartT, SLP_FRAME_START_FIELDS)
SLP_COLUMN_STRUCT(FrameBookendT, SLP_FRAME_BOOKEND_FIELDS)

#undef SLP_COLUMN_STRUCT
#undef SLP_VISIT_COLUMN
#undef SLP_DECLARE_COLUMN

// Bits of CharacterFramesT::present.
inline constexpr uint8_t kHasPre = 1;
inline constexpr uint8_t kHasPost = 2;

// One character (a port's leader, or its follower) over all rows. Rows where the character sent
// no event hold zeros, with `present` saying which events arrived.
template <template <class> class C>
struct CharacterFramesT {
  C<uint8_t> present;
  PreFrameT<C> pre;
  PostFrameT<C> post;
};

template <template <class> class C>
struct PortFramesT {
  uint8_t port = 0;  // 0-based: port 1 is 0
  CharacterFramesT<C> leader;
  std::optional<CharacterFramesT<C>> follower;
};

// All item updates of the game as one flat table; `row` indexes the frame table.
template <template <class> class C>
struct ItemsT {
  C<uint32_t> row;
  ItemFieldsT<C> fields;
  size_t size() const { return row.size(); }
};

// Frame-aligned columns. A row is one recorded frame: with rollbacks the same frame number can
// occur more than once (see ParseOptions::rollbacks).
template <template <class> class C>
struct FramesT {
  C<int32_t> frame;
  FrameStartT<C> start;
  FrameBookendT<C> bookend;
  std::vector<PortFramesT<C>> ports;  // sorted by port
  ItemsT<C> items;

  size_t size() const { return frame.size(); }
  const PortFramesT<C>* port(uint8_t p) const {
    for (const auto& pf : ports)
      if (pf.port == p) return &pf;
    return nullptr;
  }
};

using Frames = FramesT<Vec>;
using FramesView = FramesT<View>;
using CharacterFrames = CharacterFramesT<Vec>;
using PortFrames = PortFramesT<Vec>;

// Which fields the file's payload sizes cover (bit i = field i of the table). A column whose
// field is absent is empty.
struct FieldPresence {
  uint64_t pre = 0;
  uint64_t post = 0;
  uint64_t item = 0;
  uint64_t frame_start = 0;
  uint64_t frame_bookend = 0;
  bool operator==(const FieldPresence&) const = default;
};

struct Version {
  uint8_t major = 0;
  uint8_t minor = 0;
  uint8_t build = 0;
  auto operator<=>(const Version&) const = default;
  std::string str() const;
  // "3", "3.14" or "3.14.0" (missing parts 0); nothing for anything else.
  static std::optional<Version> parse(const std::string& text);
};

inline constexpr uint8_t kNoCharacter = 0xFF;

// One occupied port of Game Start (player type != 3), with the internal characters the
// Post-Frame events report.
struct Player {
  uint8_t port = 0;
  uint8_t character = 0;  // external id; Zelda/Sheik corrected for files before 1.6.0
  uint8_t type = 0;       // 0 human, 1 CPU, 2 demo
  uint8_t stocks = 0;
  uint8_t costume = 0;
  uint8_t team_shade = 0;
  uint8_t handicap = 0;
  uint8_t team = 0;
  uint8_t bitfield = 0;
  uint8_t cpu_level = 0;
  uint16_t damage_start = 0;
  uint16_t damage_spawn = 0;
  float offense_ratio = 0;
  float defense_ratio = 0;
  float model_scale = 0;
  uint32_t dashback_fix = 0;                  // 1.0
  uint32_t shield_drop_fix = 0;               // 1.0
  std::string nametag;                        // 1.3, Shift JIS folded to ASCII where possible
  std::string display_name;                   // 3.9
  std::string connect_code;                   // 3.9
  std::string slippi_uid;                     // 3.11
  uint8_t internal_character = kNoCharacter;  // first Post-Frame of the leader
  uint8_t follower_internal_character = kNoCharacter;  // first Post-Frame of the follower
  bool operator==(const Player&) const = default;
};

struct GameStart {
  Version version;
  std::array<uint8_t, 4> bitfield{};
  uint8_t bomb_rain = 0;
  bool is_teams = false;
  int8_t item_spawn_behavior = 0;
  int8_t self_destruct_score = 0;
  uint16_t stage = 0;
  uint32_t timer = 0;
  std::array<uint8_t, 5> item_spawn_bitfield{};
  float damage_ratio = 0;
  uint32_t random_seed = 0;
  std::optional<bool> is_pal;        // 1.5
  std::optional<bool> is_frozen_ps;  // 2.0
  std::optional<uint8_t> minor_scene;
  std::optional<uint8_t> major_scene;  // 3.7
  std::optional<uint8_t> language;     // 3.12
  std::string match_id;                // 3.14 session id, empty when absent
  uint32_t game_number = 0;
  uint32_t tiebreaker_number = 0;
  std::vector<Player> players;
  bool operator==(const GameStart&) const = default;
};

struct GameEnd {
  uint8_t method = 0;                    // 0.1: 0 unresolved, 3 resolved; 2.0: 1 TIME, 2 GAME, 7 NC
  std::optional<int8_t> lras_initiator;  // 2.0, -1 when nobody
  std::optional<std::array<int8_t, 4>> placements;  // 3.13, per port, -1 when absent
  bool operator==(const GameEnd&) const = default;
};

struct MetadataPlayer {
  uint8_t port = 0;
  std::string netplay;
  std::string code;
  std::vector<std::pair<uint32_t, uint32_t>> characters;  // internal id -> frames
  bool operator==(const MetadataPlayer&) const = default;
};

struct Metadata {
  bool present = false;
  std::string start_at;
  std::optional<int32_t> last_frame;
  std::string played_on;
  std::string console_nick;
  std::vector<MetadataPlayer> players;  // sorted by port
  bool operator==(const Metadata&) const = default;
};

// Everything about a game except its frame columns.
struct GameInfo {
  std::string source;  // file path or a caller-chosen name
  GameStart start;
  std::optional<GameEnd> end;
  uint32_t game_end_events = 0;  // > 1 in damaged recordings
  Metadata metadata;
  FieldPresence fields;
  std::vector<std::pair<uint8_t, uint16_t>> payload_sizes;  // the Event Payloads table
  uint32_t gecko_codes_bytes = 0;                           // size of the reassembled Gecko List
  uint64_t skipped_events = 0;                              // events we do not decode
  bool severed = false;  // raw length 0: the recording was cut off while being written
  bool partial = false;  // an error stopped the parse; rows before it are sound
  std::string error;     // why, with the byte offset
  bool operator==(const GameInfo&) const = default;
};

struct Game {
  GameInfo info;
  Frames frames;
};

struct GameView {
  GameInfo info;
  FramesView frames;
};

// Spans over a parsed game's columns.
GameView view_of(const Game& game);

struct FrameCounts {
  size_t frames = 0;           // rows as recorded
  size_t unique_frames = 0;    // distinct frame numbers
  size_t rollback_frames = 0;  // frames - unique_frames
};
FrameCounts count_frames(std::span<const int32_t> frame_numbers);

// Row indexes that hold the last recorded copy of their frame number, in order.
std::vector<uint32_t> last_copy_rows(std::span<const int32_t> frame_numbers);

// Visits every frame-aligned column (frame number, frame start/bookend, each character's
// present/pre/post) as f(name, column) with names like "frame", "p0.leader.post.x".
template <template <class> class C, class F>
void visit_frame_columns(FramesT<C>& frames, F&& f);
template <template <class> class C, class F>
void visit_frame_columns(const FramesT<C>& frames, F&& f);

// Visits the columns of one character as f(name, column), names relative ("pre.x", "present").
template <class Character, class F>
void visit_character_columns(Character& ch, F&& f) {
  f(std::string("present"), ch.present);
  std::remove_cvref_t<decltype(ch.pre)>::visit(
      ch.pre, [&](FieldDesc d, auto& col) { f(std::string("pre.") + d.name, col); });
  std::remove_cvref_t<decltype(ch.post)>::visit(
      ch.post, [&](FieldDesc d, auto& col) { f(std::string("post.") + d.name, col); });
}

namespace detail {
template <class Frames, class F>
void visit_frame_columns_impl(Frames& frames, F&& f) {
  f(std::string("frame"), frames.frame);
  std::remove_cvref_t<decltype(frames.start)>::visit(
      frames.start, [&](FieldDesc d, auto& col) { f(std::string("start.") + d.name, col); });
  std::remove_cvref_t<decltype(frames.bookend)>::visit(
      frames.bookend, [&](FieldDesc d, auto& col) { f(std::string("bookend.") + d.name, col); });
  for (auto& pf : frames.ports) {
    const std::string base = "p" + std::to_string(pf.port);
    visit_character_columns(
        pf.leader, [&](const std::string& n, auto& col) { f(base + ".leader." + n, col); });
    if (pf.follower)
      visit_character_columns(
          *pf.follower, [&](const std::string& n, auto& col) { f(base + ".follower." + n, col); });
  }
}
}  // namespace detail

template <template <class> class C, class F>
void visit_frame_columns(FramesT<C>& frames, F&& f) {
  detail::visit_frame_columns_impl(frames, f);
}
template <template <class> class C, class F>
void visit_frame_columns(const FramesT<C>& frames, F&& f) {
  detail::visit_frame_columns_impl(frames, f);
}

// Visits the item columns as f(name, column): "row", then "type", "x", ...
template <class Items, class F>
void visit_item_columns(Items& items, F&& f) {
  f(std::string("row"), items.row);
  std::remove_cvref_t<decltype(items.fields)>::visit(
      items.fields, [&](FieldDesc d, auto& col) { f(std::string(d.name), col); });
}

}  // namespace slipstream::slp

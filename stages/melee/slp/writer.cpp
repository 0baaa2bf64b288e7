#include "stages/melee/slp/writer.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "stages/melee/slp/byte_order.h"
#include "stages/melee/slp/event_codes.h"
#include "stages/melee/slp/shift_jis.h"
#include "stages/melee/slp/ubjson.h"

namespace slipstream::slp {
namespace {

class EventWriter {
 public:
  explicit EventWriter(std::vector<uint8_t>& out) : out_(out) {}

  // Appends a zeroed event of `size` bytes (command byte included) and returns its start.
  uint8_t* begin(uint8_t command, size_t size) {
    const size_t at = out_.size();
    out_.resize(at + size, 0);
    out_[at] = command;
    return out_.data() + at;
  }

 private:
  std::vector<uint8_t>& out_;
};

template <class T>
T at_or_zero(const std::vector<T>& col, size_t row) {
  return row < col.size() ? col[row] : T{};
}

void put_text(uint8_t* e, size_t offset, size_t size, const std::vector<uint8_t>& text) {
  // Keep a NUL terminator inside the field.
  if (!text.empty()) std::memcpy(e + offset, text.data(), std::min(text.size(), size - 1));
}

void write_game_start(EventWriter& w, const GameStart& s) {
  namespace gs = event::start;
  uint8_t* e = w.begin(event::kGameStart, 1 + size_t(gs::kPayloadSize_3_18));
  e[gs::kVersion] = s.version.major;
  e[gs::kVersion + 1] = s.version.minor;
  e[gs::kVersion + 2] = s.version.build;
  for (size_t i = 0; i < 4; ++i) e[gs::kBitfield + i] = s.bitfield[i];
  e[gs::kBombRain] = s.bomb_rain;
  e[gs::kIsTeams] = s.is_teams ? 1 : 0;
  e[gs::kItemSpawnBehavior] = static_cast<uint8_t>(s.item_spawn_behavior);
  e[gs::kSelfDestructScore] = static_cast<uint8_t>(s.self_destruct_score);
  store_be(e + gs::kStage, s.stage);
  store_be(e + gs::kTimer, s.timer);
  for (size_t i = 0; i < 5; ++i) e[gs::kItemSpawnBitfield + i] = s.item_spawn_bitfield[i];
  store_be(e + gs::kDamageRatio, s.damage_ratio);
  store_be(e + gs::kRandomSeed, s.random_seed);
  e[gs::kIsPal] = s.is_pal.value_or(false) ? 1 : 0;
  e[gs::kIsFrozenPs] = s.is_frozen_ps.value_or(false) ? 1 : 0;
  e[gs::kMinorScene] = s.minor_scene.value_or(0);
  e[gs::kMajorScene] = s.major_scene.value_or(0);
  e[gs::kLanguage] = s.language.value_or(0);
  put_text(e, gs::kMatchId, gs::kMatchIdSize, encode_shift_jis_ascii(s.match_id, false, false));
  store_be(e + gs::kGameNumber, s.game_number);
  store_be(e + gs::kTiebreakerNumber, s.tiebreaker_number);
  for (uint8_t port = 0; port < 4; ++port)
    e[gs::kPlayerBlock + gs::kPlayerStride * port + gs::kType] = 3;
  for (const Player& p : s.players) {
    if (p.port > 3) continue;
    const size_t b = gs::kPlayerBlock + gs::kPlayerStride * p.port;
    e[b + gs::kCharacter] = p.character;
    e[b + gs::kType] = p.type;
    e[b + gs::kStocks] = p.stocks;
    e[b + gs::kCostume] = p.costume;
    e[b + gs::kTeamShade] = p.team_shade;
    e[b + gs::kHandicap] = p.handicap;
    e[b + gs::kTeam] = p.team;
    e[b + gs::kPlayerBitfield] = p.bitfield;
    e[b + gs::kCpuLevel] = p.cpu_level;
    store_be(e + b + gs::kDamageStart, p.damage_start);
    store_be(e + b + gs::kDamageSpawn, p.damage_spawn);
    store_be(e + b + gs::kOffenseRatio, p.offense_ratio);
    store_be(e + b + gs::kDefenseRatio, p.defense_ratio);
    store_be(e + b + gs::kModelScale, p.model_scale);
    store_be(e + gs::kDashbackFix + 8 * p.port, p.dashback_fix);
    store_be(e + gs::kShieldDropFix + 8 * p.port, p.shield_drop_fix);
    // Nametags are full-width Shift JIS and fill all 16 bytes without a terminator.
    const auto tag = encode_shift_jis_ascii(p.nametag, true, true);
    if (!tag.empty())
      std::memcpy(e + gs::kNametag + gs::kNametagSize * p.port, tag.data(),
                  std::min(tag.size(), gs::kNametagSize));
    put_text(e, gs::kDisplayName + gs::kDisplayNameSize * p.port, gs::kDisplayNameSize,
             encode_shift_jis_ascii(p.display_name, false, false));
    put_text(e, gs::kConnectCode + gs::kConnectCodeSize * p.port, gs::kConnectCodeSize,
             encode_shift_jis_ascii(p.connect_code, false, true));
    put_text(e, gs::kSlippiUid + gs::kSlippiUidSize * p.port, gs::kSlippiUidSize,
             encode_shift_jis_ascii(p.slippi_uid, false, false));
  }
}

void write_character(EventWriter& w, const CharacterFrames& ch, uint8_t port, bool follower,
                     int32_t frame, size_t row, bool pre) {
  if (row >= ch.present.size() || !(ch.present[row] & (pre ? kHasPre : kHasPost))) return;
  uint8_t* e = w.begin(pre ? event::kPreFrame : event::kPostFrame,
                       pre ? event::kPreFrameSize : event::kPostFrameSize);
  store_be(e + event::kFrameNumberOffset, frame);
  e[event::kPlayerIndexOffset] = port;
  e[event::kIsFollowerOffset] = follower ? 1 : 0;
#define SLP_ENCODE(name, type, offset) store_be(e + offset, at_or_zero(cols.name, row));
  if (pre) {
    const auto& cols = ch.pre;
    SLP_PRE_FRAME_FIELDS(SLP_ENCODE)
  } else {
    const auto& cols = ch.post;
    SLP_POST_FRAME_FIELDS(SLP_ENCODE)
  }
#undef SLP_ENCODE
}

nlohmann::json metadata_json(const Metadata& m) {
  nlohmann::json j = nlohmann::json::object();
  if (!m.start_at.empty()) j["startAt"] = m.start_at;
  if (m.last_frame) j["lastFrame"] = *m.last_frame;
  if (!m.players.empty()) {
    nlohmann::json players = nlohmann::json::object();
    for (const MetadataPlayer& p : m.players) {
      nlohmann::json pj = nlohmann::json::object();
      nlohmann::json chars = nlohmann::json::object();
      for (const auto& [id, frames] : p.characters) chars[std::to_string(id)] = frames;
      pj["characters"] = chars;
      if (!p.netplay.empty() || !p.code.empty())
        pj["names"] = {{"netplay", p.netplay}, {"code", p.code}};
      players[std::to_string(p.port)] = pj;
    }
    j["players"] = players;
  }
  if (!m.played_on.empty()) j["playedOn"] = m.played_on;
  if (!m.console_nick.empty()) j["consoleNick"] = m.console_nick;
  return j;
}

}  // namespace

std::vector<uint8_t> write_slp(const Game& game) {
  const Frames& f = game.frames;
  std::vector<uint8_t> raw;
  raw.reserve(1024 + f.size() * (event::kFrameStartSize + event::kFrameBookendSize +
                                 f.ports.size() * (event::kPreFrameSize + event::kPostFrameSize)));
  EventWriter w(raw);

  const std::pair<uint8_t, uint16_t> sizes[] = {
      {event::kGameStart, event::start::kPayloadSize_3_18},
      {event::kPreFrame, event::kPreFrameSize - 1},
      {event::kPostFrame, event::kPostFrameSize - 1},
      {event::kGameEnd, event::kGameEndSize - 1},
      {event::kFrameStart, event::kFrameStartSize - 1},
      {event::kItem, event::kItemSize - 1},
      {event::kFrameBookend, event::kFrameBookendSize - 1},
  };
  uint8_t* table = w.begin(event::kEventPayloads, 2 + 3 * std::size(sizes));
  table[1] = static_cast<uint8_t>(1 + 3 * std::size(sizes));
  for (size_t i = 0; i < std::size(sizes); ++i) {
    table[2 + 3 * i] = sizes[i].first;
    store_be(table + 3 + 3 * i, sizes[i].second);
  }
  write_game_start(w, game.info.start);

  size_t item = 0;
  for (size_t row = 0; row < f.size(); ++row) {
    const int32_t frame = f.frame[row];
    uint8_t* e = w.begin(event::kFrameStart, event::kFrameStartSize);
    store_be(e + event::kFrameNumberOffset, frame);
#define SLP_ENCODE(name, type, offset) store_be(e + offset, at_or_zero(f.start.name, row));
    SLP_FRAME_START_FIELDS(SLP_ENCODE)
#undef SLP_ENCODE
    for (const bool pre : {true, false}) {
      for (const PortFrames& pf : f.ports) {
        write_character(w, pf.leader, pf.port, false, frame, row, pre);
        if (pf.follower) write_character(w, *pf.follower, pf.port, true, frame, row, pre);
      }
    }
    for (; item < f.items.size() && f.items.row[item] <= row; ++item) {
      if (f.items.row[item] < row) continue;
      e = w.begin(event::kItem, event::kItemSize);
      store_be(e + event::kFrameNumberOffset, frame);
#define SLP_ENCODE(name, type, offset) store_be(e + offset, at_or_zero(f.items.fields.name, item));
      SLP_ITEM_FIELDS(SLP_ENCODE)
#undef SLP_ENCODE
    }
    e = w.begin(event::kFrameBookend, event::kFrameBookendSize);
    store_be(e + event::kFrameNumberOffset, frame);
#define SLP_ENCODE(name, type, offset) store_be(e + offset, at_or_zero(f.bookend.name, row));
    SLP_FRAME_BOOKEND_FIELDS(SLP_ENCODE)
#undef SLP_ENCODE
  }
  if (game.info.end) {
    const GameEnd& end = *game.info.end;
    uint8_t* e = w.begin(event::kGameEnd, event::kGameEndSize);
    e[event::kGameEndMethod] = end.method;
    e[event::kGameEndLras] = static_cast<uint8_t>(end.lras_initiator.value_or(-1));
    const std::array<int8_t, 4> none{-1, -1, -1, -1};
    const auto& placements = end.placements.value_or(none);
    for (int i = 0; i < 4; ++i)
      e[event::kGameEndPlacements + i] = static_cast<uint8_t>(placements[i]);
  }

  std::vector<uint8_t> out;
  out.reserve(raw.size() + 1024);
  out.push_back('{');
  write_ubjson_key("raw", out);
  out.insert(out.end(), {'[', '$', 'U', '#', 'l', 0, 0, 0, 0});
  if (raw.size() > 0x7FFFFFFF)
    throw std::runtime_error("write_slp: game too large for a .slp file");
  store_be(out.data() + out.size() - 4, static_cast<int32_t>(raw.size()));
  out.insert(out.end(), raw.begin(), raw.end());
  write_ubjson_key("metadata", out);
  nlohmann::json::to_ubjson(metadata_json(game.info.metadata), out);
  out.push_back('}');
  return out;
}

void write_slp_file(const Game& game, const std::filesystem::path& path) {
  const std::vector<uint8_t> bytes = write_slp(game);
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
    throw std::runtime_error("cannot write " + path.string());
}

}  // namespace slipstream::slp

#include "stages/melee/slp/game_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace slipstream::slp {

nlohmann::json float_json(float v) {
  if (!std::isfinite(v)) return nullptr;
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

namespace {

template <class T>
nlohmann::json opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
template <class T>
std::optional<T> get_opt(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return it->get<T>();
}
float get_float(const nlohmann::json& j, const char* key) {
  const auto& v = j.at(key);
  return v.is_null() ? NAN : v.get<float>();
}

nlohmann::json player_json(const Player& p) {
  return {{"port", p.port},
          {"character", p.character},
          {"type", p.type},
          {"stocks", p.stocks},
          {"costume", p.costume},
          {"team_shade", p.team_shade},
          {"handicap", p.handicap},
          {"team", p.team},
          {"bitfield", p.bitfield},
          {"cpu_level", p.cpu_level},
          {"damage_start", p.damage_start},
          {"damage_spawn", p.damage_spawn},
          {"offense_ratio", float_json(p.offense_ratio)},
          {"defense_ratio", float_json(p.defense_ratio)},
          {"model_scale", float_json(p.model_scale)},
          {"dashback_fix", p.dashback_fix},
          {"shield_drop_fix", p.shield_drop_fix},
          {"nametag", p.nametag},
          {"display_name", p.display_name},
          {"connect_code", p.connect_code},
          {"slippi_uid", p.slippi_uid},
          {"internal_character", p.internal_character},
          {"follower_internal_character", p.follower_internal_character}};
}

Player player_from_json(const nlohmann::json& j) {
  Player p;
  p.port = j.at("port");
  p.character = j.at("character");
  p.type = j.at("type");
  p.stocks = j.at("stocks");
  p.costume = j.at("costume");
  p.team_shade = j.at("team_shade");
  p.handicap = j.at("handicap");
  p.team = j.at("team");
  p.bitfield = j.at("bitfield");
  p.cpu_level = j.at("cpu_level");
  p.damage_start = j.at("damage_start");
  p.damage_spawn = j.at("damage_spawn");
  p.offense_ratio = get_float(j, "offense_ratio");
  p.defense_ratio = get_float(j, "defense_ratio");
  p.model_scale = get_float(j, "model_scale");
  p.dashback_fix = j.at("dashback_fix");
  p.shield_drop_fix = j.at("shield_drop_fix");
  p.nametag = j.at("nametag");
  p.display_name = j.at("display_name");
  p.connect_code = j.at("connect_code");
  p.slippi_uid = j.at("slippi_uid");
  p.internal_character = j.at("internal_character");
  p.follower_internal_character = j.at("follower_internal_character");
  return p;
}

}  // namespace

nlohmann::json to_json(const GameInfo& info) {
  const GameStart& s = info.start;
  nlohmann::json players = nlohmann::json::array();
  for (const Player& p : s.players) players.push_back(player_json(p));
  nlohmann::json start = {{"version", {s.version.major, s.version.minor, s.version.build}},
                          {"bitfield", s.bitfield},
                          {"bomb_rain", s.bomb_rain},
                          {"is_teams", s.is_teams},
                          {"item_spawn_behavior", s.item_spawn_behavior},
                          {"self_destruct_score", s.self_destruct_score},
                          {"stage", s.stage},
                          {"timer", s.timer},
                          {"item_spawn_bitfield", s.item_spawn_bitfield},
                          {"damage_ratio", float_json(s.damage_ratio)},
                          {"random_seed", s.random_seed},
                          {"is_pal", opt(s.is_pal)},
                          {"is_frozen_ps", opt(s.is_frozen_ps)},
                          {"minor_scene", opt(s.minor_scene)},
                          {"major_scene", opt(s.major_scene)},
                          {"language", opt(s.language)},
                          {"match_id", s.match_id},
                          {"game_number", s.game_number},
                          {"tiebreaker_number", s.tiebreaker_number},
                          {"players", players}};
  nlohmann::json end = nullptr;
  if (info.end) {
    end = {{"method", info.end->method},
           {"lras_initiator", opt(info.end->lras_initiator)},
           {"placements", opt(info.end->placements)}};
  }
  const Metadata& m = info.metadata;
  nlohmann::json meta_players = nlohmann::json::array();
  for (const MetadataPlayer& p : m.players)
    meta_players.push_back(
        {{"port", p.port}, {"netplay", p.netplay}, {"code", p.code}, {"characters", p.characters}});
  nlohmann::json metadata = {{"present", m.present},
                             {"start_at", m.start_at},
                             {"last_frame", opt(m.last_frame)},
                             {"played_on", m.played_on},
                             {"console_nick", m.console_nick},
                             {"players", meta_players}};
  const FieldPresence& f = info.fields;
  return {{"source", info.source},
          {"start", start},
          {"end", end},
          {"game_end_events", info.game_end_events},
          {"metadata", metadata},
          {"fields",
           {{"pre", f.pre},
            {"post", f.post},
            {"item", f.item},
            {"frame_start", f.frame_start},
            {"frame_bookend", f.frame_bookend}}},
          {"payload_sizes", info.payload_sizes},
          {"gecko_codes_bytes", info.gecko_codes_bytes},
          {"skipped_events", info.skipped_events},
          {"severed", info.severed},
          {"partial", info.partial},
          {"error", info.error}};
}

GameInfo game_info_from_json(const nlohmann::json& j) {
  GameInfo info;
  info.source = j.at("source");
  const auto& s = j.at("start");
  GameStart& st = info.start;
  const auto& v = s.at("version");
  st.version = {v.at(0).get<uint8_t>(), v.at(1).get<uint8_t>(), v.at(2).get<uint8_t>()};
  st.bitfield = s.at("bitfield");
  st.bomb_rain = s.at("bomb_rain");
  st.is_teams = s.at("is_teams");
  st.item_spawn_behavior = s.at("item_spawn_behavior");
  st.self_destruct_score = s.at("self_destruct_score");
  st.stage = s.at("stage");
  st.timer = s.at("timer");
  st.item_spawn_bitfield = s.at("item_spawn_bitfield");
  st.damage_ratio = get_float(s, "damage_ratio");
  st.random_seed = s.at("random_seed");
  st.is_pal = get_opt<bool>(s, "is_pal");
  st.is_frozen_ps = get_opt<bool>(s, "is_frozen_ps");
  st.minor_scene = get_opt<uint8_t>(s, "minor_scene");
  st.major_scene = get_opt<uint8_t>(s, "major_scene");
  st.language = get_opt<uint8_t>(s, "language");
  st.match_id = s.at("match_id");
  st.game_number = s.at("game_number");
  st.tiebreaker_number = s.at("tiebreaker_number");
  for (const auto& p : s.at("players")) st.players.push_back(player_from_json(p));
  const auto& e = j.at("end");
  if (!e.is_null()) {
    GameEnd end;
    end.method = e.at("method");
    end.lras_initiator = get_opt<int8_t>(e, "lras_initiator");
    end.placements = get_opt<std::array<int8_t, 4>>(e, "placements");
    info.end = end;
  }
  info.game_end_events = j.at("game_end_events");
  const auto& m = j.at("metadata");
  info.metadata.present = m.at("present");
  info.metadata.start_at = m.at("start_at");
  info.metadata.last_frame = get_opt<int32_t>(m, "last_frame");
  info.metadata.played_on = m.at("played_on");
  info.metadata.console_nick = m.at("console_nick");
  for (const auto& p : m.at("players")) {
    MetadataPlayer mp;
    mp.port = p.at("port");
    mp.netplay = p.at("netplay");
    mp.code = p.at("code");
    mp.characters = p.at("characters").get<std::vector<std::pair<uint32_t, uint32_t>>>();
    info.metadata.players.push_back(std::move(mp));
  }
  const auto& f = j.at("fields");
  info.fields = {f.at("pre"), f.at("post"), f.at("item"), f.at("frame_start"),
                 f.at("frame_bookend")};
  info.payload_sizes = j.at("payload_sizes").get<std::vector<std::pair<uint8_t, uint16_t>>>();
  info.gecko_codes_bytes = j.at("gecko_codes_bytes");
  info.skipped_events = j.at("skipped_events");
  info.severed = j.at("severed");
  info.partial = j.at("partial");
  info.error = j.at("error");
  return info;
}

}  // namespace slipstream::slp

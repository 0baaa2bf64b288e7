#include "stages/melee/slp/inspect.h"

#include <sstream>
#include <stdexcept>

#include "stages/melee/slp/game_json.h"
#include "stages/melee/slp/names.h"
#include "stages/melee/slp/parser.h"

namespace slipstream::slp {
namespace {

template <class T>
nlohmann::json value_json(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return float_json(v);
  else
    return v;
}

template <class Columns>
nlohmann::json row_json(const Columns& cols, size_t row) {
  nlohmann::json j = nlohmann::json::object();
  Columns::visit(cols, [&](FieldDesc d, const auto& col) {
    if (row < col.size()) j[d.name] = value_json(col[row]);
  });
  return j;
}

nlohmann::json character_json(const CharacterFrames& ch, size_t row) {
  const uint8_t present = ch.present[row];
  return {{"pre", (present & kHasPre) ? row_json(ch.pre, row) : nlohmann::json(nullptr)},
          {"post", (present & kHasPost) ? row_json(ch.post, row) : nlohmann::json(nullptr)}};
}

std::string scalar_text(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : dump_json(v, -1);
}

// The name for an id, or null when the id is absent or unknown (ids past the table are kept).
nlohmann::json name_json(const nlohmann::json& id,
                         std::optional<std::string_view> (*name_of)(int)) {
  if (!id.is_number_integer()) return nullptr;
  const auto n = name_of(id.get<int>());
  return n ? nlohmann::json(std::string(*n)) : nlohmann::json(nullptr);
}

// "Fox" when the summary has a name for it, else "character 2".
std::string named(const nlohmann::json& j, const char* name_key, const char* id_key,
                  const char* what) {
  if (j.contains(name_key) && j[name_key].is_string()) return j[name_key].get<std::string>();
  return std::string(what) + " " + scalar_text(j.value(id_key, nlohmann::json(nullptr)));
}

std::string ordinal(int64_t n) {
  const int64_t tens = n % 100;
  const char* suffix = (tens >= 11 && tens <= 13) ? "th"
                       : n % 10 == 1              ? "st"
                       : n % 10 == 2              ? "nd"
                       : n % 10 == 3              ? "rd"
                                                  : "th";
  return std::to_string(n) + suffix;
}

std::string player_text(const nlohmann::json& p) {
  std::ostringstream out;
  out << "player " << scalar_text(p["port"]) << ": "
      << named(p, "external_character_name", "external_character", "character") << " (id "
      << scalar_text(p.value("external_character", nlohmann::json(nullptr))) << ", internal "
      << scalar_text(p.value("character", nlohmann::json(nullptr))) << ")";
  if (p.contains("follower") && !p["follower"].is_null())
    out << " + " << named(p, "follower_name", "follower", "follower") << " (internal "
        << scalar_text(p["follower"]) << ")";
  if (p.value("type", 0) == 1) out << ", CPU";
  if (p.contains("nametag")) out << ", nametag '" << scalar_text(p["nametag"]) << "'";
  if (p.contains("display_name")) out << ", " << scalar_text(p["display_name"]);
  if (p.contains("connect_code")) out << " (" << scalar_text(p["connect_code"]) << ")";
  return out.str();
}

// Flattens nested objects into "a.b: value" lines.
void flatten(const nlohmann::json& j, const std::string& prefix, std::ostringstream& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else if (j.is_array() && !j.empty() && j.front().is_object()) {
    for (size_t i = 0; i < j.size(); ++i) flatten(j[i], prefix + "." + std::to_string(i), out);
  } else {
    out << prefix << ": " << scalar_text(j) << "\n";
  }
}

}  // namespace

std::string dump_json(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json replay_info_json(const Game& game) {
  const GameInfo& info = game.info;
  const GameStart& s = info.start;
  nlohmann::json j;
  j["file"] = info.source;
  j["version"] = s.version.str();
  j["stage"] = s.stage;
  j["stage_name"] = name_json(s.stage, stage_name);
  nlohmann::json players = nlohmann::json::array();
  for (const Player& p : s.players) {
    nlohmann::json pj = {
        {"port", p.port + 1},
        {"character", p.internal_character == kNoCharacter ? nlohmann::json(nullptr)
                                                           : nlohmann::json(p.internal_character)},
        {"follower", p.follower_internal_character == kNoCharacter
                         ? nlohmann::json(nullptr)
                         : nlohmann::json(p.follower_internal_character)},
        {"external_character", p.character},
        {"type", p.type}};
    pj["character_name"] = name_json(pj["character"], internal_character_name);
    pj["follower_name"] = name_json(pj["follower"], internal_character_name);
    pj["external_character_name"] = name_json(pj["external_character"], external_character_name);
    players.push_back(std::move(pj));
    if (!p.nametag.empty()) players.back()["nametag"] = p.nametag;
    if (!p.display_name.empty()) players.back()["display_name"] = p.display_name;
    if (!p.connect_code.empty()) players.back()["connect_code"] = p.connect_code;
  }
  j["players"] = players;
  const FrameCounts counts = count_frames(game.frames.frame);
  j["frames"] = counts.frames;
  j["unique_frames"] = counts.unique_frames;
  j["rollback_frames"] = counts.rollback_frames;
  j["first_frame"] = game.frames.frame.empty() ? nlohmann::json(nullptr)
                                               : nlohmann::json(game.frames.frame.front());
  j["last_frame"] = game.frames.frame.empty() ? nlohmann::json(nullptr)
                                              : nlohmann::json(game.frames.frame.back());
  j["end_method"] = info.end ? nlohmann::json(info.end->method) : nlohmann::json(nullptr);
  if (info.end && info.end->placements) {
    nlohmann::json placements = nlohmann::json::object();
    for (int port = 0; port < 4; ++port) {
      const int8_t place = (*info.end->placements)[port];
      if (place >= 0) placements[std::to_string(port + 1)] = place;
    }
    j["placements"] = placements;
  }
  if (!s.match_id.empty()) {
    j["match_id"] = s.match_id;
    j["game_number"] = s.game_number;
    j["tiebreaker_number"] = s.tiebreaker_number;
  }
  j["random_seed"] = s.random_seed;
  if (info.metadata.present) {
    const Metadata& m = info.metadata;
    nlohmann::json meta = nlohmann::json::object();
    if (!m.start_at.empty()) meta["startAt"] = m.start_at;
    if (!m.played_on.empty()) meta["playedOn"] = m.played_on;
    if (!m.console_nick.empty()) meta["consoleNick"] = m.console_nick;
    if (m.last_frame) meta["lastFrame"] = *m.last_frame;
    nlohmann::json names = nlohmann::json::object();
    for (const MetadataPlayer& p : m.players)
      if (!p.netplay.empty() || !p.code.empty())
        names[std::to_string(p.port + 1)] = {{"netplay", p.netplay}, {"code", p.code}};
    if (!names.empty()) meta["names"] = names;
    j["metadata"] = meta;
  }
  if (info.severed) j["severed"] = true;
  if (info.game_end_events > 1) j["game_end_events"] = info.game_end_events;
  if (!info.error.empty()) {
    j["partial"] = info.partial;
    j["error"] = info.error;
  }
  return j;
}

nlohmann::json replay_info_json(const std::filesystem::path& path) {
  try {
    return replay_info_json(parse_slp_file(path));
  } catch (const ParseError& e) {
    return {{"file", path.string()}, {"error", e.what()}};
  } catch (const std::exception& e) {
    return {{"file", path.string()}, {"error", std::string("internal error: ") + e.what()}};
  }
}

bool replay_info_has_error(const nlohmann::json& info) {
  return info.contains("error");
}

std::string replay_info_text(const nlohmann::json& info) {
  std::ostringstream out;
  out << info.value("file", std::string("?")) << "\n";
  for (auto it = info.begin(); it != info.end(); ++it) {
    if (it.key() == "file") continue;
    if (it.key() == "stage_name") continue;  // on the stage line
    if (it.key() == "stage") {
      out << "  stage: " << named(info, "stage_name", "stage", "stage") << " (id "
          << scalar_text(it.value()) << ")\n";
      continue;
    }
    if (it.key() == "players") {
      for (const auto& p : it.value()) out << "  " << player_text(p) << "\n";
      continue;
    }
    if (it.key() == "placements" && it.value().is_object()) {
      // 0-based places per port in the file; people read "port 1: 1st".
      out << "  placements:";
      const char* sep = " ";
      for (auto pl = it.value().begin(); pl != it.value().end(); ++pl, sep = ", ") {
        out << sep << "port " << pl.key() << ": ";
        if (pl.value().is_number_integer())
          out << ordinal(pl.value().get<int64_t>() + 1);
        else
          out << scalar_text(pl.value());
      }
      out << "\n";
      continue;
    }
    std::ostringstream sub;
    flatten(it.value(), it.key(), sub);
    std::istringstream lines(sub.str());
    for (std::string line; std::getline(lines, line);) out << "  " << line << "\n";
  }
  return out.str();
}

nlohmann::json replay_dump_json(const Game& game, size_t frame_index, std::optional<int> port) {
  const Frames& f = game.frames;
  if (frame_index >= f.size())
    throw std::out_of_range("frame index " + std::to_string(frame_index) +
                            " out of range (the game has " + std::to_string(f.size()) +
                            " recorded frames)");
  nlohmann::json j;
  j["file"] = game.info.source;
  j["frame_index"] = frame_index;
  j["frame"] = f.frame[frame_index];
  if (game.info.fields.frame_start) j["start"] = row_json(f.start, frame_index);
  if (game.info.fields.frame_bookend) j["bookend"] = row_json(f.bookend, frame_index);
  nlohmann::json ports = nlohmann::json::array();
  for (const PortFrames& pf : f.ports) {
    if (port && *port != pf.port + 1) continue;
    nlohmann::json pj = character_json(pf.leader, frame_index);
    pj["port"] = pf.port + 1;
    if (pf.follower) pj["follower"] = character_json(*pf.follower, frame_index);
    ports.push_back(pj);
  }
  if (port && ports.empty())
    throw std::out_of_range("port " + std::to_string(*port) + " is not in the game");
  if (port) {
    for (auto it = ports[0].begin(); it != ports[0].end(); ++it) j[it.key()] = it.value();
  } else {
    j["ports"] = ports;
  }
  nlohmann::json items = nlohmann::json::array();
  const auto& rows = f.items.row;
  for (size_t i = std::lower_bound(rows.begin(), rows.end(), frame_index) - rows.begin();
       i < rows.size() && rows[i] == frame_index; ++i)
    items.push_back(row_json(f.items.fields, i));
  if (!items.empty()) j["items"] = items;
  return j;
}

std::string replay_dump_text(const nlohmann::json& dump) {
  std::ostringstream out;
  flatten(dump, "", out);
  return out.str();
}

}  // namespace slipstream::slp

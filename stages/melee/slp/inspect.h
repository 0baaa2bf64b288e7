// What `slipstream replay info` and `replay dump` print, as library functions so they can be
// tested without the CLI. Ports in this output are 1-based (port 1 = index 0), as players see them.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "stages/melee/slp/game.h"

namespace slipstream::slp {

// Summary of one parsed game (see docs/slp_format.md for the keys).
nlohmann::json replay_info_json(const Game& game);
// Parses `path` and summarises it; never throws: an unreadable file gives {"file", "error"}.
nlohmann::json replay_info_json(const std::filesystem::path& path);
std::string replay_info_text(const nlohmann::json& info);
// True when the summary has an "error" (unreadable, or damaged partway).
bool replay_info_has_error(const nlohmann::json& info);

// Every field of the frame at row `frame_index`, for all ports or one (1-based). Throws
// std::out_of_range when the row or port does not exist.
nlohmann::json replay_dump_json(const Game& game, size_t frame_index,
                                std::optional<int> port = std::nullopt);
std::string replay_dump_text(const nlohmann::json& dump);

// JSON text that never throws on invalid UTF-8 from untrusted files (bad bytes become U+FFFD).
std::string dump_json(const nlohmann::json& j, int indent = 2);

}  // namespace slipstream::slp

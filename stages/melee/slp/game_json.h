// JSON form of the game-level information (GameInfo), lossless both ways: the corpus manifest
// stores it, and the inspection commands print it.
#pragma once

#include <nlohmann/json.hpp>

#include "stages/melee/slp/game.h"

namespace slipstream::slp {

nlohmann::json to_json(const GameInfo& info);
// Throws nlohmann::json::exception on a malformed document.
GameInfo game_info_from_json(const nlohmann::json& j);

// A float as the JSON number with the shortest decimal form that reads back to the same float
// (so 56.81875f prints as 56.81875, not 56.818748474121094).
nlohmann::json float_json(float v);

}  // namespace slipstream::slp

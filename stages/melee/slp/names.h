// Names of Melee's characters and stages, both ways: id -> the name the game shows, and a name
// someone types (any case, punctuation ignored, common short forms) -> id.
//
// Melee numbers characters twice: Game Start holds the EXTERNAL id (character select order,
// 0 Captain Falcon, 2 Fox), Post-Frames the INTERNAL id (0 Mario, 1 Fox). Ids from
// project-slippi/slippi-js src/melee (characters.json, stages.json, types.ts) and the in-game
// ids documented with the Slippi spec (SPEC.md "Melee IDs").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace slipstream::slp {

std::optional<std::string_view> external_character_name(int id);  // 0..32
std::optional<std::string_view> internal_character_name(int id);  // 0..32
std::optional<std::string_view> stage_name(int id);

// Name -> id. Case, spaces and punctuation are ignored ("Dr. Mario" = "dr mario" = "drmario")
// and common short forms are accepted ("falcon", "dk", "puff", "fd", "bf", "ps", "fod"). "Ice
// Climbers" (and "ics") is internal id 10, Popo: the leader, the character a player plays as.
std::optional<int> external_character_id(std::string_view name);
std::optional<int> internal_character_id(std::string_view name);
std::optional<int> stage_id(std::string_view name);

// The names that have an internal character id (and "Ice Climbers", after Popo) / a stage id,
// in id order, as the game shows them (for error messages).
std::vector<std::string> internal_character_names();
std::vector<std::string> stage_names();
// Every accepted spelling, lower case (names and short forms): candidates for "did you mean".
std::vector<std::string> character_spellings();
std::vector<std::string> stage_spellings();

}  // namespace slipstream::slp

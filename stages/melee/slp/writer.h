// Writes a columnar Game as a current-version (3.18.0 layout) .slp file: UBJSON container with
// raw + metadata, Event Payloads, Game Start, per row Frame Start / Pre / Post / Items / Frame
// Bookend, Game End. Absent columns are written as zeros.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "stages/melee/slp/game.h"

namespace slipstream::slp {

std::vector<uint8_t> write_slp(const Game& game);
// Throws std::runtime_error when the file cannot be written.
void write_slp_file(const Game& game, const std::filesystem::path& path);

}  // namespace slipstream::slp

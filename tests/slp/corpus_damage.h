// Damage to one game of a game corpus, as a failing disk would do it, and corpora as they were
// built before each game had a hash: for the tests of what a damaged corpus does.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tests/support/flip_bits.h"

namespace slipstream::slp::testing {

// Flips a byte of game `game`'s stored bytes in the corpus's first column (`frame`): inside its
// rows, or inside its zstd frame for a corpus built with --zstd.
inline void damage_game(const std::filesystem::path& dir, size_t game) {
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(dir / "manifest.json"));
  const auto& column = m.at("columns").at(0);
  const auto& g = m.at("games").at(game);
  const size_t offset = column.at("offset");
  size_t at = 0;
  if (column.at("compression") == "zstd_games") {
    const size_t games = m.at("games").size();
    uint64_t table[2];
    std::ifstream in(dir / "columns.bin", std::ios::binary);
    in.seekg(static_cast<std::streamoff>(offset + game * sizeof(uint64_t)));
    in.read(reinterpret_cast<char*>(table), sizeof table);
    if (table[1] - table[0] < 8) throw std::logic_error("game's frame too short to damage");
    at = offset + (games + 1) * sizeof(uint64_t) + table[0] + (table[1] - table[0]) / 2;
  } else {
    const size_t frames = g.at("frames"), first = g.at("frame_offset");
    if (frames < 4) throw std::logic_error("game too short to damage");
    at = offset + (first + frames / 2) * sizeof(int32_t);
  }
  slipstream::testing::flip_bits(dir / "columns.bin", static_cast<std::streamoff>(at), 0x10);
}

// The manifest as builds before per-game hashes wrote it: each column's hash, checked whole at
// open.
inline void drop_game_hashes(const std::filesystem::path& dir) {
  nlohmann::json m = nlohmann::json::parse(std::ifstream(dir / "manifest.json"));
  for (auto& g : m.at("games")) g.erase("game_hash");
  std::ofstream(dir / "manifest.json") << m.dump(1);
}

}  // namespace slipstream::slp::testing

// Synthetic two-player games for pipeline tests and training smoke runs. Each player's
// controller inputs are a pure function of the game state visible in the frame (both players'
// previous Post-Frame state); toy physics integrates positions from those inputs. Everything is
// deterministic from the seed, and every output head (buttons, stick, c-stick, shoulder) varies.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "stages/melee/slp/game.h"

namespace slipstream::slp {

struct SynthOptions {
  uint64_t seed = 1;
  int frames =
      3600;  // rows from frame -123; the game may end earlier when a player runs out of stocks
};

// A 3.18.0 game, ready for write_slp.
Game synthesize_game(const SynthOptions& options);

// Writes `games` files synth_00000.slp ... into `dir` (created if needed); game i uses a seed
// derived from (seed, i). Returns the paths.
std::vector<std::filesystem::path> write_synthetic_games(const std::filesystem::path& dir,
                                                         int games, uint64_t seed, int frames);

// The 17 values an analog stick axis is bucketed to: k/8 for k in -8..8.
float bucket_stick_axis(float v);

}  // namespace slipstream::slp

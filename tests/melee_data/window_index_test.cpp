// The loader's pure pieces: windows, permutations, split draws, game identity.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "stages/melee/window_index.h"

namespace slipstream::melee {
namespace {

TEST(WindowIndex, WindowsLeaveRoomForTheLastLabel) {
  std::vector<GameFeatures> games(2);
  games[0].rows = 100;
  games[1].rows = 10;  // shorter than one window with its label: no windows
  const std::vector<Perspective> ps = {{0, 0, 1}, {0, 1, 0}, {1, 0, 1}};
  for (int delay : {0, 2}) {
    const auto w = build_windows(games, ps, 20, 5, delay);
    // Last start s must satisfy s + 20 + delay + 1 <= 100.
    const uint32_t last = static_cast<uint32_t>((100 - 21 - delay) / 5 * 5);
    ASSERT_FALSE(w.empty());
    EXPECT_EQ(w.size(), 2u * (last / 5 + 1));
    uint32_t max_start = 0;
    for (const auto& x : w) {
      EXPECT_NE(x.perspective, 2u);
      max_start = std::max(max_start, x.start);
    }
    EXPECT_EQ(max_start, last);
  }
}

TEST(WindowIndex, EpochPermutationIsAPermutationAndDependsOnSeedAndEpoch) {
  const auto a = epoch_permutation(1000, 1, 0);
  std::vector<uint32_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint32_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0u);
  EXPECT_EQ(sorted, iota);
  EXPECT_EQ(a, epoch_permutation(1000, 1, 0));
  EXPECT_NE(a, epoch_permutation(1000, 1, 1));
  EXPECT_NE(a, epoch_permutation(1000, 2, 0));
  EXPECT_TRUE(epoch_permutation(0, 1, 0).empty());
  EXPECT_EQ(epoch_permutation(1, 1, 0), std::vector<uint32_t>{0});
}

TEST(WindowIndex, SplitDrawIsUniformEnough) {
  int below = 0;
  for (uint64_t id = 0; id < 10000; ++id) below += split_draw(5, mix64(id)) < 0.1;
  EXPECT_NEAR(below, 1000, 120);
}

TEST(WindowIndex, IdentityUsesTheFileNameNotTheDirectory) {
  slp::GameInfo a, b;
  a.source = "/data/replays/x.slp";
  b.source = "relative/x.slp";
  a.start.random_seed = b.start.random_seed = 77;
  EXPECT_EQ(game_identity(a, 5000), game_identity(b, 5000));
  EXPECT_NE(game_identity(a, 5000), game_identity(a, 5001));
  b.source = "relative/y.slp";
  EXPECT_NE(game_identity(a, 5000), game_identity(b, 5000));
}

TEST(WindowIndex, KeptRowsDropEarlierCopiesOfRolledBackFrames) {
  const std::vector<int32_t> frames = {-123, -122, -121, -122, -121, -120};
  EXPECT_EQ(kept_rows(frames, RollbackMode::last), (std::vector<uint32_t>{0, 3, 4, 5}));
  EXPECT_EQ(kept_rows(frames, RollbackMode::all).size(), 6u);
}

}  // namespace
}  // namespace slipstream::melee

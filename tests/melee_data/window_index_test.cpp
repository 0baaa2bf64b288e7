// The loader's pure pieces: windows, permutations, split draws, game identity.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "stages/melee/replay_split.h"
#include "stages/melee/window_index.h"

namespace slipstream::melee {
namespace {

// The windows listed, as the loader kept them before WindowIndex: the reference it must equal.
std::vector<WindowRef> build_windows(const std::vector<GameFeatures>& games,
                                     const std::vector<Perspective>& perspectives, int window,
                                     int stride, int delay) {
  std::vector<WindowRef> out;
  const size_t need = static_cast<size_t>(window) + static_cast<size_t>(delay) + 1;
  for (size_t pi = 0; pi < perspectives.size(); ++pi) {
    const size_t n = games[perspectives[pi].game].rows;
    for (size_t s = 0; s + need <= n; s += static_cast<size_t>(stride))
      out.push_back({static_cast<uint32_t>(pi), static_cast<uint32_t>(s)});
  }
  return out;
}

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
  // Counting them, or computing each from its index, lists none, and agrees at every length,
  // stride and delay (perspectives without windows between others included).
  const std::vector<Perspective> more = {{1, 0, 1}, {0, 0, 1}, {1, 1, 0}, {0, 1, 0}, {1, 0, 1}};
  for (uint32_t rows = 0; rows < 60; ++rows)
    for (int stride : {1, 3, 7})
      for (int delay : {0, 2}) {
        games[0].rows = rows;
        const auto listed = build_windows(games, more, 20, stride, delay);
        EXPECT_EQ(count_windows(games, more, 20, stride, delay), listed.size());
        const WindowIndex index(games, more, 20, stride, delay);
        ASSERT_EQ(index.size(), listed.size()) << rows << " " << stride << " " << delay;
        for (size_t w = 0; w < listed.size(); ++w) {
          EXPECT_EQ(index[w].perspective, listed[w].perspective) << w;
          EXPECT_EQ(index[w].start, listed[w].start) << w;
        }
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

// Every size from 1 to 300 and a few past powers of four (where the Feistel domain grows): a
// bijection of [0, n), its inverse undoing it, depending on seed and epoch.
TEST(WindowIndex, KeyedPermutationIsAPermutationOfEverySize) {
  std::vector<uint64_t> sizes;
  for (uint64_t n = 1; n <= 300; ++n) sizes.push_back(n);
  for (uint64_t n : {1023ull, 1024ull, 1025ull, 4097ull, 65537ull}) sizes.push_back(n);
  for (uint64_t n : sizes) {
    const KeyedPermutation p(n, 3, 1);
    std::vector<uint64_t> seen(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = p(i);
      ASSERT_LT(v, n) << "n " << n;
      ++seen[v];
      EXPECT_EQ(p.inverse(v), i) << "n " << n;
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1u), static_cast<std::ptrdiff_t>(n)) << n;
  }
  auto order = [](uint64_t seed, uint64_t epoch) {
    const KeyedPermutation p(1000, seed, epoch);
    std::vector<uint64_t> v;
    for (uint64_t i = 0; i < 1000; ++i) v.push_back(p(i));
    return v;
  };
  EXPECT_EQ(order(1, 0), order(1, 0));
  EXPECT_NE(order(1, 0), order(1, 1));
  EXPECT_NE(order(1, 0), order(2, 0));
  // Shuffled, not shifted: neighbours land far apart, a position rarely stays.
  const auto o = order(5, 2);
  size_t fixed = 0, near = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    fixed += o[i] == i;
    if (i && (o[i] > o[i - 1] ? o[i] - o[i - 1] : o[i - 1] - o[i]) < 10) ++near;
  }
  EXPECT_LT(fixed, 8u);
  EXPECT_LT(near, 60u);  // about 20 expected for a random order
}

// More windows than a 32-bit index holds (no data: the order alone). A table of them would need
// 40 GB; the keyed order answers each position, lands past 2^32 as often as the size says, and
// is a bijection on every position sampled (its inverse gives the position back).
TEST(WindowIndex, OrderOfMoreThan2To32Windows) {
  const uint64_t n = (uint64_t{1} << 32) * 5 / 4 + 12345;  // 5.37 G windows
  WindowOrder order;
  order.reset(n, 256, n / 256, false, true, true, 9, 0, 1);
  const KeyedPermutation p(n, 9, 0);
  std::mt19937_64 rng(4);
  size_t high = 0;
  const size_t samples = 200000;
  std::set<uint64_t> positions, values;
  for (size_t s = 0; s < samples; ++s) {
    const uint64_t k = rng() % (n / 256), r = rng() % 256;
    const uint64_t w = order.window_at(k, r);
    ASSERT_LT(w, n);
    ASSERT_EQ(p.inverse(w), k * 256 + r);
    high += w >= (uint64_t{1} << 32);
    positions.insert(k * 256 + r);
    values.insert(w);
  }
  EXPECT_EQ(values.size(), positions.size());  // distinct positions give distinct windows
  const double share = static_cast<double>(n - (uint64_t{1} << 32)) / static_cast<double>(n);
  EXPECT_NEAR(static_cast<double>(high) / samples, share, 0.01);
  // The table form refuses that many windows instead of wrapping its indices.
  WindowOrder table;
  EXPECT_THROW(table.reset(n, 256, n / 256, false, true, false, 9, 0, 1), std::runtime_error);
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

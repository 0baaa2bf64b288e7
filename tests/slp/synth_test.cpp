#include <gtest/gtest.h>

#include <set>

#include "stages/melee/slp/parser.h"
#include "stages/melee/slp/synth.h"
#include "stages/melee/slp/writer.h"
#include "tests/slp/replay_files.h"

namespace slipstream::slp {
namespace {

using testing::expect_same_columns;

Game synth(uint64_t seed, int frames = 3600) {
  SynthOptions o;
  o.seed = seed;
  o.frames = frames;
  return synthesize_game(o);
}

TEST(SlpSynth, DeterministicFromSeed) {
  EXPECT_EQ(write_slp(synth(7)), write_slp(synth(7)));
  EXPECT_NE(write_slp(synth(7)), write_slp(synth(8)));
}

TEST(SlpSynth, RoundTripThroughTheParser) {
  for (uint64_t seed : {1ull, 2ull, 3ull, 42ull, 1234567ull}) {
    SCOPED_TRACE(seed);
    const Game written = synth(seed);
    const std::vector<uint8_t> bytes = write_slp(written);
    const Game parsed = parse_slp(bytes, "synth");
    EXPECT_TRUE(parsed.info.error.empty()) << parsed.info.error;
    EXPECT_EQ(parsed.info.start.version, (Version{3, 18, 0}));
    EXPECT_EQ(parsed.info.start, written.info.start);
    EXPECT_EQ(parsed.info.end, written.info.end);
    EXPECT_EQ(parsed.info.metadata, written.info.metadata);
    EXPECT_EQ(parsed.info.fields, written.info.fields);
    ASSERT_EQ(parsed.frames.size(), written.frames.size());
    expect_same_columns(view_of(parsed), view_of(written), "synth round trip");
  }
}

TEST(SlpSynth, EveryOutputHeadVaries) {
  const Game g = synth(99, 6000);
  std::set<float> stick_x, stick_y, cstick_x, cstick_y, triggers;
  uint16_t buttons_seen = 0;
  std::set<uint16_t> actions;
  for (const auto& pf : g.frames.ports) {
    const auto& pre = pf.leader.pre;
    for (size_t i = 0; i < g.frames.size(); ++i) {
      stick_x.insert(pre.joystick_x[i]);
      stick_y.insert(pre.joystick_y[i]);
      cstick_x.insert(pre.cstick_x[i]);
      cstick_y.insert(pre.cstick_y[i]);
      triggers.insert(pre.trigger[i]);
      buttons_seen |= pre.buttons_physical[i];
      actions.insert(pf.leader.post.action_state[i]);
      // Sticks sit on the 17-value grid.
      EXPECT_EQ(pre.joystick_x[i], bucket_stick_axis(pre.joystick_x[i]));
      EXPECT_EQ(pre.cstick_y[i], bucket_stick_axis(pre.cstick_y[i]));
    }
  }
  for (const uint16_t bit : {0x0100, 0x0200, 0x0400, 0x0800, 0x0010, 0x0040, 0x0020, 0x0008})
    EXPECT_TRUE(buttons_seen & bit) << "button bit " << bit << " never pressed";
  EXPECT_GE(stick_x.size(), 8u);
  EXPECT_GE(stick_y.size(), 5u);
  EXPECT_GE(cstick_x.size(), 2u);
  EXPECT_GE(cstick_y.size(), 2u);
  EXPECT_GE(triggers.size(), 4u);  // analog shoulder pressure varies
  EXPECT_GE(actions.size(), 6u);
  EXPECT_FALSE(g.frames.items.row.empty());
}

TEST(SlpSynth, InputsAreAFunctionOfVisibleState) {
  // Same visible state (both players' previous post-frame) => same inputs, across the game.
  const Game g = synth(5, 4000);
  std::map<std::vector<float>, std::vector<float>> seen;
  const auto& a = g.frames.ports[0].leader;
  const auto& b = g.frames.ports[1].leader;
  size_t repeats = 0;
  for (size_t i = 1; i < g.frames.size(); ++i) {
    if (g.frames.frame[i] < -39) continue;
    const std::vector<float> state = {a.post.x[i - 1],
                                      a.post.y[i - 1],
                                      b.post.x[i - 1],
                                      b.post.y[i - 1],
                                      a.post.percent[i - 1],
                                      b.post.percent[i - 1],
                                      float(a.post.action_state[i - 1]),
                                      float(b.post.action_state[i - 1]),
                                      float(a.post.jumps_remaining[i - 1]),
                                      a.post.self_y_speed[i - 1],
                                      float(a.post.stocks[i - 1]),
                                      a.post.misc_as[i - 1],
                                      float(a.post.airborne[i - 1])};
    const std::vector<float> inputs = {a.pre.joystick_x[i], a.pre.joystick_y[i],
                                       a.pre.cstick_x[i],   a.pre.cstick_y[i],
                                       a.pre.trigger[i],    float(a.pre.buttons_physical[i])};
    auto [it, inserted] = seen.emplace(state, inputs);
    if (!inserted) {
      ++repeats;
      EXPECT_EQ(it->second, inputs) << "row " << i;
    }
  }
  EXPECT_GT(repeats, 0u);
}

TEST(SlpSynth, WritesFilesThatParse) {
  const auto dir = std::filesystem::temp_directory_path() / "slp_synth_test";
  std::filesystem::remove_all(dir);
  const auto paths = write_synthetic_games(dir, 3, 11, 500);
  ASSERT_EQ(paths.size(), 3u);
  for (const auto& p : paths) {
    const Game g = parse_slp_file(p);
    EXPECT_TRUE(g.info.error.empty());
    EXPECT_GT(g.frames.size(), 0u);
    EXPECT_LE(g.frames.size(), 500u);
  }
  std::filesystem::remove_all(dir);
}

// The writer also round-trips real games: every row and every field the file has.
TEST(SlpWriter, RealReplaysRoundTrip) {
  SLP_REQUIRE_REPLAYS();
  for (const auto& path : testing::all_replays()) {
    SCOPED_TRACE(path.string());
    const Game g = parse_slp_file(path);
    const Game again = parse_slp(write_slp(g), path.string());
    EXPECT_TRUE(again.info.error.empty());
    EXPECT_EQ(again.frames.frame, g.frames.frame);
    ASSERT_EQ(again.frames.ports.size(), g.frames.ports.size());
    EXPECT_EQ(again.info.start.players.size(), g.info.start.players.size());
    // The rewritten file has every field; compare the ones the original had.
    const auto a = testing::column_bytes(view_of(g));
    const auto b = testing::column_bytes(view_of(again));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      if (!a[i].second.empty()) {
        EXPECT_TRUE(a[i].second == b[i].second) << a[i].first;
      }
  }
}

}  // namespace
}  // namespace slipstream::slp

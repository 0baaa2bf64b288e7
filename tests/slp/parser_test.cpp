// Values from real replays, checked against SPEC.md and against what peppi (tests/peppi.rs) and
// slippi-js (test/game.spec.ts) assert about the same files.
#include <gtest/gtest.h>

#include <set>

#include "stages/melee/slp/parser.h"
#include "tests/slp/replay_files.h"

namespace slipstream::slp {
namespace {

using testing::all_replays;
using testing::replay;

Game parse(const std::string& name, Rollbacks rollbacks = Rollbacks::kKeepAll) {
  ParseOptions o;
  o.rollbacks = rollbacks;
  return parse_slp_file(replay(name), o);
}

TEST(SlpParser, EveryRealReplayParses) {
  SLP_REQUIRE_REPLAYS();
  const auto files = all_replays();
  EXPECT_EQ(files.size(), 74u);
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    const Game g = parse_slp_file(path);
    const bool corrupt = path.filename() == "corrupt.slp";
    EXPECT_EQ(g.info.error.empty(), !corrupt) << g.info.error;
    EXPECT_EQ(g.info.partial, corrupt);
    EXPECT_EQ(g.info.severed, corrupt || path.filename() == "incomplete.slp");
    if (!corrupt) {
      EXPECT_GT(g.frames.size(), 0u);
    }
    const size_t n = g.frames.size();
    visit_frame_columns(g.frames, [&](const std::string& name, const auto& col) {
      EXPECT_TRUE(col.empty() || col.size() == n) << name;
    });
    for (const auto& r : g.frames.items.row) ASSERT_LT(r, n);
  }
}

TEST(SlpParser, Versions) {
  SLP_REQUIRE_REPLAYS();
  EXPECT_EQ(parse("peppi/v0.1.slp").info.start.version.str(), "0.1.0");
  EXPECT_EQ(parse("peppi/v2.0.slp").info.start.version.str(), "2.0.1");  // peppi: Version(2, 0, 1)
  EXPECT_EQ(parse("peppi/v3.12.slp").info.start.version.str(), "3.12.0");
  EXPECT_EQ(parse("peppi/v3.18.slp").info.start.version.str(), "3.18.0");
  EXPECT_EQ(parse("slippi-js/sheik_vs_ics_yoshis.slp").info.start.version.str(), "0.1.0");
}

// peppi basic_game(): game.slp, frame index 1000.
TEST(SlpParser, BasicGameMatchesPeppi) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("peppi/game.slp");
  const GameStart& s = g.info.start;
  EXPECT_EQ(s.version, (Version{1, 0, 0}));
  EXPECT_EQ(s.stage, 8);  // Yoshi's Story
  EXPECT_EQ(s.timer, 480u);
  EXPECT_EQ(s.random_seed, 3803194226u);
  EXPECT_EQ(s.bitfield, (std::array<uint8_t, 4>{50, 1, 134, 76}));
  EXPECT_EQ(s.item_spawn_behavior, -1);
  EXPECT_EQ(s.self_destruct_score, -1);
  EXPECT_FLOAT_EQ(s.damage_ratio, 1.0f);
  EXPECT_FALSE(s.is_pal.has_value());  // 1.5
  ASSERT_EQ(s.players.size(), 2u);
  EXPECT_EQ(s.players[0].character, 9);  // Marth
  EXPECT_EQ(s.players[0].type, 0);
  EXPECT_EQ(s.players[0].costume, 3);
  EXPECT_EQ(s.players[0].handicap, 9);
  EXPECT_EQ(s.players[0].bitfield, 192);
  EXPECT_EQ(s.players[1].character, 2);  // Fox
  EXPECT_EQ(s.players[1].type, 1);       // CPU
  EXPECT_EQ(s.players[1].cpu_level, 1);
  EXPECT_EQ(s.players[0].internal_character, 18);
  EXPECT_EQ(s.players[1].internal_character, 1);
  ASSERT_TRUE(g.info.end);
  EXPECT_EQ(g.info.end->method, 3);
  EXPECT_FALSE(g.info.end->lras_initiator);

  const Metadata& m = g.info.metadata;
  EXPECT_EQ(m.start_at, "2018-06-22T07:52:59Z");
  EXPECT_EQ(m.last_frame, 5085);
  EXPECT_EQ(m.played_on, "dolphin");
  ASSERT_EQ(m.players.size(), 2u);
  EXPECT_EQ(m.players[0].characters, (std::vector<std::pair<uint32_t, uint32_t>>{{18, 5209}}));
  EXPECT_EQ(m.players[1].characters, (std::vector<std::pair<uint32_t, uint32_t>>{{1, 5209}}));

  ASSERT_EQ(g.frames.size(), 5209u);
  EXPECT_EQ(g.frames.frame[0], -123);
  const size_t r = 1000;
  EXPECT_EQ(g.frames.frame[r], 877);
  const auto& p1 = g.frames.ports[0].leader;
  EXPECT_EQ(p1.present[r], kHasPre | kHasPost);
  EXPECT_EQ(p1.pre.random_seed[r], 1046068084u);
  EXPECT_EQ(p1.pre.action_state[r], 27);  // JumpAerialF
  EXPECT_FLOAT_EQ(p1.pre.x[r], 56.81875f);
  EXPECT_FLOAT_EQ(p1.pre.y[r], -18.63733f);
  EXPECT_FLOAT_EQ(p1.pre.facing[r], -1.0f);
  EXPECT_FLOAT_EQ(p1.pre.joystick_x[r], 0.0f);
  EXPECT_FLOAT_EQ(p1.pre.trigger_physical_r[r], 3.7793343e22f);
  EXPECT_EQ(p1.pre.buttons[r], 0u);
  EXPECT_EQ(p1.post.character[r], 18);
  EXPECT_EQ(p1.post.action_state[r], 27);
  EXPECT_FLOAT_EQ(p1.post.x[r], 57.292168f);
  EXPECT_FLOAT_EQ(p1.post.y[r], -17.290329f);
  EXPECT_FLOAT_EQ(p1.post.percent[r], 0.0f);
  EXPECT_FLOAT_EQ(p1.post.shield[r], 60.0f);
  EXPECT_EQ(p1.post.last_attack_landed[r], 15);
  EXPECT_EQ(p1.post.combo_count[r], 1);
  EXPECT_EQ(p1.post.last_hit_by[r], 6);
  EXPECT_EQ(p1.post.stocks[r], 4);
  EXPECT_FLOAT_EQ(p1.post.state_age[r], 8.0f);
  const auto& p2 = g.frames.ports[1].leader;
  EXPECT_FLOAT_EQ(p2.pre.x[r], 42.195168f);
  EXPECT_FLOAT_EQ(p2.pre.joystick_x[r], -0.6875f);
  EXPECT_FLOAT_EQ(p2.pre.joystick_y[r], 0.6929134f);
  EXPECT_EQ(p2.pre.action_state[r], p2.post.action_state[r]);  // FireFoxAir in both
  EXPECT_EQ(p2.post.character[r], 1);
  EXPECT_FLOAT_EQ(p2.post.x[r], 40.50478f);
  EXPECT_FLOAT_EQ(p2.post.y[r], 10.990714f);
  EXPECT_FLOAT_EQ(p2.post.percent[r], 85.6f);
  EXPECT_FLOAT_EQ(p2.post.state_age[r], 18.0f);
  EXPECT_FALSE(g.frames.ports[0].follower);
}

// Fields appended by version are absent (empty columns) in older files.
TEST(SlpParser, FieldPresenceFollowsPayloadSizes) {
  SLP_REQUIRE_REPLAYS();
  const Game v01 = parse("peppi/v0.1.slp");
  const auto& a = v01.frames.ports[0].leader;
  EXPECT_TRUE(a.post.state_age.empty());      // 0.2
  EXPECT_TRUE(a.pre.raw_joystick_x.empty());  // 1.2
  EXPECT_TRUE(a.pre.percent.empty());         // 1.4
  EXPECT_FALSE(a.post.stocks.empty());
  EXPECT_TRUE(v01.frames.start.random_seed.empty());  // Frame Start is 2.2
  EXPECT_EQ(v01.info.fields.frame_start, 0u);

  const Game v20 = parse("peppi/v2.0.slp");
  const auto& b = v20.frames.ports[0].leader;
  EXPECT_FALSE(b.post.state_flags_5.empty());
  EXPECT_FALSE(b.post.l_cancel.empty());
  EXPECT_TRUE(b.post.hurtbox_state.empty());  // 2.1
  ASSERT_TRUE(v20.info.end->lras_initiator);  // 2.0

  const Game v318 = parse("peppi/v3.18.slp");
  const auto& c = v318.frames.ports[0].leader;
  EXPECT_EQ(v318.info.fields.pre, (1ull << detail::kPreFieldCount) - 1);
  EXPECT_EQ(v318.info.fields.post, (1ull << detail::kPostFieldCount) - 1);
  EXPECT_EQ(c.pre.raw_cstick_y.size(), v318.frames.size());
  EXPECT_EQ(c.post.instance_id.size(), v318.frames.size());
  EXPECT_EQ(v318.frames.start.scene_frame_counter.size(), v318.frames.size());

  const Game v316 = parse("peppi/v3.16.slp");
  EXPECT_TRUE(v316.frames.ports[0].leader.pre.raw_cstick_x.empty());  // 3.17
  EXPECT_FALSE(v316.frames.ports[0].leader.post.instance_hit_by.empty());
}

TEST(SlpParser, IceClimbersFollower) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("peppi/ics.slp");  // peppi ics()
  EXPECT_EQ(g.info.start.players[0].character, 14);
  ASSERT_TRUE(g.frames.ports[0].follower);
  EXPECT_FALSE(g.frames.ports[1].follower);
  EXPECT_EQ(g.info.start.players[0].internal_character, 10);           // Popo
  EXPECT_EQ(g.info.start.players[0].follower_internal_character, 11);  // Nana
  EXPECT_EQ(g.frames.size(), 344u);
  const auto& nana = *g.frames.ports[0].follower;
  EXPECT_EQ(nana.present[0], kHasPre | kHasPost);
  EXPECT_EQ(nana.post.character[0], 11);
  EXPECT_EQ(g.info.metadata.players[0].characters,
            (std::vector<std::pair<uint32_t, uint32_t>>{{10, 344}, {11, 344}}));
  EXPECT_EQ(g.info.metadata.players[1].characters,
            (std::vector<std::pair<uint32_t, uint32_t>>{{15, 344}}));

  // Nana can die while Popo lives: rows without her events are flagged, not shifted.
  const Game g2 = parse("peppi/ics2.slp");
  const auto& nana2 = *g2.frames.ports[0].follower;
  size_t without = 0;
  for (uint8_t p : nana2.present) without += (p == 0);
  EXPECT_GT(without, 0u);
  EXPECT_LT(without, g2.frames.size());
}

// peppi rollback(): frame ids around index 473 of ics2.slp.
TEST(SlpParser, RollbacksKeptAsRecordedOrLastCopy) {
  SLP_REQUIRE_REPLAYS();
  const Game all = parse("peppi/ics2.slp");
  ASSERT_EQ(all.frames.size(), 9530u);
  EXPECT_EQ(std::vector<int32_t>(all.frames.frame.begin() + 473, all.frames.frame.begin() + 477),
            (std::vector<int32_t>{350, 351, 351, 352}));
  const Game last = parse("peppi/ics2.slp", Rollbacks::kLastCopy);
  const FrameCounts c = count_frames(all.frames.frame);
  EXPECT_EQ(last.frames.size(), c.unique_frames);
  for (size_t i = 1; i < last.frames.size(); ++i)
    ASSERT_EQ(last.frames.frame[i], last.frames.frame[i - 1] + 1);
  // Frame 351 is kept from its second (final) copy, row 475.
  const size_t r = 351 + 123;
  ASSERT_EQ(last.frames.frame[r], 351);
  EXPECT_EQ(last.frames.ports[0].leader.post.x[r], all.frames.ports[0].leader.post.x[475]);
  EXPECT_EQ(last.frames.ports[0].leader.pre.buttons[r],
            all.frames.ports[0].leader.pre.buttons[475]);
  EXPECT_EQ(last.frames.start.random_seed[r], all.frames.start.random_seed[475]);
  for (const auto& row : last.frames.items.row) ASSERT_LT(row, last.frames.size());
  EXPECT_LE(last.frames.items.size(), all.frames.items.size());
}

// slippi-js "should count rollback frames properly".
TEST(SlpParser, RollbackFrameCountMatchesSlippiJs) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("slippi-js/rollbackFrameTest.slp");
  const FrameCounts c = count_frames(g.frames.frame);
  EXPECT_EQ(c.rollback_frames, 4292u);
  EXPECT_EQ(c.frames, 13569u);
}

// peppi v3_13(): placements P1 = 1, P3 = 0.
TEST(SlpParser, GameEndPlacements) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("peppi/v3.13.slp");
  ASSERT_TRUE(g.info.end);
  EXPECT_EQ(g.info.end->method, 2);
  EXPECT_EQ(g.info.end->lras_initiator, -1);
  EXPECT_EQ(g.info.end->placements, (std::array<int8_t, 4>{1, -1, 0, -1}));
  const Game teams =
      parse("slippi-js/placementsTest/teams_time_p3_redVSp1p2_blueVSp4_green_winner_blue.slp");
  EXPECT_EQ(teams.info.end->method, 1);  // TIME!
  EXPECT_EQ(teams.frames.ports.size(), 4u);
  EXPECT_TRUE(teams.info.start.is_teams);
}

// peppi v3_12().
TEST(SlpParser, NetplayGameStartFields) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("peppi/v3.12.slp");
  const GameStart& s = g.info.start;
  EXPECT_EQ(s.stage, 3);  // Pokemon Stadium
  EXPECT_EQ(s.random_seed, 39656u);
  EXPECT_EQ(s.is_pal, false);
  EXPECT_EQ(s.is_frozen_ps, false);
  EXPECT_EQ(s.minor_scene, 2);
  EXPECT_EQ(s.major_scene, 8);
  EXPECT_EQ(s.language, 1);         // English
  EXPECT_TRUE(s.match_id.empty());  // 3.14
  ASSERT_EQ(s.players.size(), 2u);
  EXPECT_EQ(s.players[0].display_name, "xxxxxx");
  EXPECT_EQ(s.players[0].connect_code, "XX#111");  // full-width '#' folded
  EXPECT_EQ(s.players[0].slippi_uid, std::string(28, 'a'));
  EXPECT_EQ(s.players[1].display_name, "yyyyyyyyyy");
  EXPECT_EQ(s.players[1].connect_code, "YYYY#222");
  EXPECT_EQ(s.players[0].dashback_fix, 1u);
  EXPECT_EQ(s.players[0].shield_drop_fix, 1u);

  const Game ranked = parse("slippi-js/ranked_game1_tiebreak.slp");
  EXPECT_FALSE(ranked.info.start.match_id.empty());
  EXPECT_EQ(ranked.info.start.match_id.rfind("mode.ranked", 0), 0u) << ranked.info.start.match_id;
}

// slippi-js "should be able to read nametags".
TEST(SlpParser, Nametags) {
  SLP_REQUIRE_REPLAYS();
  const Game a = parse("slippi-js/nametags.slp");
  EXPECT_EQ(a.info.start.players[0].nametag, "AMNイ");
  EXPECT_EQ(a.info.start.players[1].nametag, "");
  const Game b = parse("slippi-js/nametags2.slp");
  EXPECT_EQ(b.info.start.players[0].nametag, "A1=$");
  EXPECT_EQ(b.info.start.players[1].nametag, "か、9@");
  const Game c = parse("slippi-js/nametags3.slp");
  EXPECT_EQ(c.info.start.players[0].nametag, "B  R");
  EXPECT_EQ(c.info.start.players[1].nametag, ".  。");
}

// slippi-js game settings tests: Sheik corrected from Zelda before 1.6.0, PAL, controller fixes.
TEST(SlpParser, GameSettingsMatchSlippiJs) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("slippi-js/sheik_vs_ics_yoshis.slp");
  EXPECT_EQ(g.info.start.stage, 8);
  EXPECT_EQ(g.info.start.players.front().character, 0x13);  // Sheik, Game Start said Zelda
  EXPECT_EQ(g.info.start.players.front().internal_character, 0x07);
  EXPECT_EQ(g.info.start.players.back().character, 0x0E);
  EXPECT_TRUE(g.frames.ports.back().follower);

  EXPECT_EQ(parse("slippi-js/pal.slp").info.start.is_pal, true);
  EXPECT_EQ(parse("slippi-js/ntsc.slp").info.start.is_pal, false);

  const Game fixes = parse("slippi-js/controllerFixes.slp");
  ASSERT_EQ(fixes.info.start.players.size(), 3u);
  EXPECT_EQ(fixes.info.start.players[0].dashback_fix, 2u);  // Dween
  EXPECT_EQ(fixes.info.start.players[1].dashback_fix, 1u);  // UCF
  EXPECT_EQ(fixes.info.start.players[2].dashback_fix, 0u);

  const Game test = parse("slippi-js/test.slp");
  EXPECT_EQ(test.info.metadata.start_at, "2017-12-18T21:14:14Z");
  EXPECT_EQ(test.info.metadata.played_on, "dolphin");
  EXPECT_EQ(test.frames.frame.back(), 3694);  // stats.lastFrame
  EXPECT_EQ(test.info.end->method, 3);
  EXPECT_FALSE(test.info.end->lras_initiator);

  const Game rt = parse("slippi-js/realtimeTest.slp");
  EXPECT_EQ(rt.frames.size(), 2306u);
  EXPECT_EQ(rt.frames.frame.back(), 2182);
  EXPECT_EQ(rt.info.end->method, 7);
  EXPECT_EQ(rt.info.metadata.console_nick, "Day 1");
  EXPECT_EQ(rt.info.metadata.played_on, "network");
}

TEST(SlpParser, ZeldaSheikTransformChangesInternalCharacter) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("peppi/transform.slp");
  std::set<uint8_t> characters(g.frames.ports[1].leader.post.character.begin(),
                               g.frames.ports[1].leader.post.character.end());
  EXPECT_TRUE(characters.count(0x07) && characters.count(0x13));
}

TEST(SlpParser, Metadata) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("peppi/netplay.slp");  // peppi netplay()
  const auto& p = g.info.metadata.players;
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].netplay, "abcdefghijk");
  EXPECT_EQ(p[0].code, "ABCD#123");
  EXPECT_EQ(p[0].characters, (std::vector<std::pair<uint32_t, uint32_t>>{{13, 128}}));
  EXPECT_EQ(p[1].netplay, "nobody");
  EXPECT_EQ(p[1].code, "XX#000");
  EXPECT_EQ(parse("peppi/console_name.slp").info.metadata.console_nick, "Station 1");
  EXPECT_EQ(parse("peppi/nintendont.slp").info.metadata.played_on, "nintendont");
  const Game v01 = parse("peppi/v0.1.slp");
  EXPECT_EQ(v01.info.metadata.start_at, "2018-01-24T06:19:54Z");
  EXPECT_FALSE(v01.info.metadata.last_frame);
  EXPECT_TRUE(v01.info.metadata.players.empty());
}

// peppi buttons_*(): the sequence of distinct non-zero (processed, physical) button states of P1.
std::vector<std::pair<uint32_t, uint16_t>> button_seq(const Game& g) {
  std::vector<std::pair<uint32_t, uint16_t>> seq;
  const auto& pre = g.frames.ports[0].leader.pre;
  for (size_t i = 0; i < g.frames.size(); ++i) {
    const std::pair<uint32_t, uint16_t> b{pre.buttons[i], pre.buttons_physical[i]};
    if ((b.first || b.second) && (seq.empty() || seq.back() != b)) seq.push_back(b);
  }
  return seq;
}

TEST(SlpParser, ButtonsMatchPeppi) {
  SLP_REQUIRE_REPLAYS();
  using Seq = std::vector<std::pair<uint32_t, uint16_t>>;
  EXPECT_EQ(button_seq(parse("peppi/buttons_abxy.slp")),
            (Seq{{256, 256}, {512, 512}, {1024, 1024}, {2048, 2048}}));
  EXPECT_EQ(button_seq(parse("peppi/buttons_lrzs.slp")), (Seq{{2147483648u, 0},
                                                              {2147483712u, 64},
                                                              {2147483648u, 0},
                                                              {2147483680u, 32},
                                                              {2147483920u, 16},
                                                              {4096, 4096}}));
  EXPECT_EQ(button_seq(parse("peppi/dpad_udlr.slp")), (Seq{{8, 8}, {4, 4}, {1, 1}, {2, 2}}));
  EXPECT_EQ(button_seq(parse("peppi/cstick_udlr.slp")),
            (Seq{{1048576, 0}, {2097152, 0}, {4194304, 0}, {8388608, 0}}));
  EXPECT_EQ(button_seq(parse("peppi/joystick_udlr.slp")),
            (Seq{{65536, 0}, {131072, 0}, {262144, 0}, {524288, 0}}));
}

// peppi items(): Peach turnips at frame indexes 121, 275, 503 of items.slp.
TEST(SlpParser, ItemsMatchPeppi) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("peppi/items.slp");
  const auto& it = g.frames.items;
  auto only_item_at = [&](size_t row) {
    std::vector<size_t> found;
    for (size_t i = 0; i < it.size(); ++i)
      if (it.row[i] == row) found.push_back(i);
    EXPECT_EQ(found.size(), 1u) << "row " << row;
    return found.empty() ? size_t(0) : found[0];
  };
  struct Expect {
    size_t row;
    uint32_t spawn;
    float x;
    float facing;
    uint8_t misc_2;
  };
  for (const Expect e : {Expect{121, 0, -62.709606f, 1.0f, 5}, Expect{275, 1, 20.39556f, -1.0f, 0},
                         Expect{503, 2, -3.9825392f, 1.0f, 0}}) {
    const size_t i = only_item_at(e.row);
    EXPECT_EQ(it.fields.spawn_id[i], e.spawn);
    EXPECT_EQ(it.fields.type[i], 99);  // Peach turnip
    EXPECT_FLOAT_EQ(it.fields.x[i], e.x);
    EXPECT_FLOAT_EQ(it.fields.y[i], -1.4932749f);
    EXPECT_FLOAT_EQ(it.fields.facing[i], e.facing);
    EXPECT_FLOAT_EQ(it.fields.timer[i], 140.0f);
    EXPECT_FLOAT_EQ(it.fields.velocity_x[i], 0.0f);
    EXPECT_EQ(it.fields.misc_1[i], 5);
    EXPECT_EQ(it.fields.misc_2[i], e.misc_2);
    EXPECT_EQ(it.fields.owner[i], 0);
    EXPECT_EQ(it.fields.damage[i], 0);
    EXPECT_EQ(it.fields.state[i], 0);
  }
  EXPECT_TRUE(it.fields.instance_id.empty());  // 3.16, the file is 3.7
}

TEST(SlpParser, UnknownEventIsSkippedBySize) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("peppi/unknown_event.slp");
  EXPECT_TRUE(g.info.error.empty());
  EXPECT_EQ(g.info.skipped_events, 1u);
  const Game base = parse("peppi/game.slp");
  EXPECT_EQ(g.frames.frame, base.frames.frame);
  EXPECT_EQ(g.frames.ports[1].leader.post.x, base.frames.ports[1].leader.post.x);
}

TEST(SlpParser, DuplicateGameEndKeepsTheFirst) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("peppi/duplicate_game_end.slp");
  EXPECT_TRUE(g.info.error.empty());
  EXPECT_EQ(g.info.game_end_events, 2u);
  ASSERT_TRUE(g.info.end);
  EXPECT_EQ(g.frames.size(), 6517u);
}

TEST(SlpParser, GeckoCodesAndMissingGameEnd) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("slippi-js/geckoCodes.slp");
  EXPECT_FALSE(g.info.end);
  EXPECT_GT(g.info.gecko_codes_bytes, 0u);
  EXPECT_EQ(g.frames.size(), 301u);
}

TEST(SlpParser, SeveredRecordingParsesToLastWholeEvent) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("slippi-js/incomplete.slp");  // raw length 0
  EXPECT_TRUE(g.info.severed);
  EXPECT_FALSE(g.info.partial);
  EXPECT_TRUE(g.info.error.empty());
  EXPECT_EQ(g.info.start.players.size(), 2u);  // slippi-js reads settings too
  EXPECT_EQ(g.frames.size(), 7780u);
  EXPECT_FALSE(g.info.end);
  EXPECT_FALSE(g.info.metadata.present);
}

TEST(SlpParser, CorruptFileIsFlaggedWithOffset) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse("peppi/corrupt.slp");
  EXPECT_TRUE(g.info.partial);
  EXPECT_NE(g.info.error.find("byte offset 28383"), std::string::npos) << g.info.error;
  EXPECT_NE(g.info.error.find("truncated Message Splitter"), std::string::npos) << g.info.error;
  EXPECT_EQ(g.frames.size(), 0u);
  ParseOptions strict;
  strict.strict = true;
  try {
    parse_slp_file(replay("peppi/corrupt.slp"), strict);
    FAIL() << "strict parse of corrupt.slp succeeded";
  } catch (const ParseError& e) {
    EXPECT_EQ(e.offset(), 28383u);
    EXPECT_NE(std::string(e.what()).find("corrupt.slp"), std::string::npos);
  }
}

TEST(SlpParser, ParseIntoReusesAGame) {
  SLP_REQUIRE_REPLAYS();
  Game reused;
  for (const char* name : {"peppi/ics2.slp", "peppi/v0.1.slp", "slippi-js/doubles.slp",
                           "peppi/v3.18.slp", "slippi-js/BTTDK.slp"}) {
    SCOPED_TRACE(name);
    const auto bytes = read_file_bytes(replay(name));
    parse_slp_into(reused, bytes, name);
    const Game fresh = parse_slp(bytes, name);
    EXPECT_EQ(reused.info, fresh.info);
    testing::expect_same_columns(view_of(reused), view_of(fresh), name);
  }
}

TEST(SlpParser, MultiCharacterGames) {
  SLP_REQUIRE_REPLAYS();
  const Game doubles = parse("slippi-js/doubles.slp");
  EXPECT_EQ(doubles.frames.ports.size(), 4u);
  EXPECT_EQ(doubles.info.start.players.size(), 4u);
  const Game pichu = parse("slippi-js/consistencyTest/PichuVSelf-All-22.slp");
  int characters = 0;
  for (const auto& p : pichu.frames.ports) characters += 1 + (p.follower ? 1 : 0);
  EXPECT_EQ(characters, 3);  // 4470 pre-frames over 1490 frames
  const Game bttdk = parse("slippi-js/BTTDK.slp");
  EXPECT_EQ(bttdk.frames.ports.size(), 1u);
}

}  // namespace
}  // namespace slipstream::slp

#include <gtest/gtest.h>

#include "stages/melee/slp/inspect.h"
#include "stages/melee/slp/parser.h"
#include "stages/melee/slp/synth.h"
#include "tests/slp/replay_files.h"

namespace slipstream::slp {
namespace {

using testing::replay;

TEST(SlpInspect, InfoCountsRollbacks) {
  SLP_REQUIRE_REPLAYS();
  const auto j = replay_info_json(replay("slippi-js/rollbackFrameTest.slp"));
  EXPECT_FALSE(replay_info_has_error(j));
  EXPECT_EQ(j["version"], "3.9.0");
  EXPECT_EQ(j["frames"], 13569);
  EXPECT_EQ(j["unique_frames"], 9277);
  EXPECT_EQ(j["rollback_frames"], 4292);
  EXPECT_EQ(j["first_frame"], -123);
  EXPECT_EQ(j["end_method"], 2);
  EXPECT_EQ(j["metadata"]["playedOn"], "dolphin");
}

TEST(SlpInspect, InfoPlayersUseInternalCharacters) {
  SLP_REQUIRE_REPLAYS();
  const auto j = replay_info_json(replay("peppi/ics.slp"));
  ASSERT_EQ(j["players"].size(), 2u);
  EXPECT_EQ(j["players"][0]["port"], 1);
  EXPECT_EQ(j["players"][0]["character"], 10);  // Popo
  EXPECT_EQ(j["players"][0]["follower"], 11);   // Nana
  EXPECT_EQ(j["players"][1]["port"], 2);
  EXPECT_EQ(j["players"][1]["character"], 15);  // Jigglypuff
  EXPECT_TRUE(j["players"][1]["follower"].is_null());
  EXPECT_EQ(j["stage"], j["stage"].get<int>());
}

TEST(SlpInspect, InfoPlacementsMatchIdAndMetadata) {
  SLP_REQUIRE_REPLAYS();
  const auto v313 = replay_info_json(replay("peppi/v3.13.slp"));
  EXPECT_EQ(v313["placements"], (nlohmann::json{{"1", 1}, {"3", 0}}));
  const auto ranked = replay_info_json(replay("slippi-js/ranked_game1_tiebreak.slp"));
  EXPECT_TRUE(ranked.contains("match_id"));
  const auto netplay = replay_info_json(replay("peppi/netplay.slp"));
  EXPECT_EQ(netplay["metadata"]["names"]["1"]["code"], "ABCD#123");
  const auto game = replay_info_json(replay("peppi/game.slp"));
  EXPECT_EQ(game["random_seed"], 3803194226u);
  EXPECT_EQ(game["metadata"]["startAt"], "2018-06-22T07:52:59Z");
  EXPECT_FALSE(game.contains("placements"));
  EXPECT_FALSE(replay_info_text(game).empty());
}

TEST(SlpInspect, InfoNamesCharactersStagesAndNametags) {
  const Game g = synthesize_game({.seed = 3, .frames = 400});
  const auto j = replay_info_json(g);
  ASSERT_EQ(j["players"].size(), 2u);
  for (const auto& p : j["players"]) {
    EXPECT_TRUE(p["character_name"].is_string()) << p;
    EXPECT_EQ(p["character_name"], p["external_character_name"]) << p;  // ids differ, not names
    EXPECT_TRUE(p["follower_name"].is_null()) << p;
  }
  EXPECT_EQ(j["players"][0]["nametag"], "SYN");
  EXPECT_TRUE(j["stage_name"].is_string());
  const std::string text = replay_info_text(j);
  const std::string name = j["players"][0]["external_character_name"];
  const std::string ext = std::to_string(j["players"][0]["external_character"].get<int>());
  const std::string in = std::to_string(j["players"][0]["character"].get<int>());
  EXPECT_NE(
      text.find("player 1: " + name + " (id " + ext + ", internal " + in + "), nametag 'SYN'"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("stage: " + j["stage_name"].get<std::string>() + " (id " +
                      std::to_string(j["stage"].get<int>()) + ")"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("placements: port 1: "), std::string::npos) << text;
  EXPECT_EQ(text.find("stage_name"), std::string::npos) << text;

  // An id past the tables keeps its number and has a null name.
  Game odd = g;
  odd.info.start.stage = 999;
  odd.info.start.players[0].character = 200;
  const auto oj = replay_info_json(odd);
  EXPECT_TRUE(oj["stage_name"].is_null());
  EXPECT_TRUE(oj["players"][0]["external_character_name"].is_null());
  EXPECT_NE(replay_info_text(oj).find("stage: stage 999 (id 999)"), std::string::npos);
  EXPECT_NE(replay_info_text(oj).find("player 1: character 200 (id 200"), std::string::npos);
}

TEST(SlpInspect, InfoTextOfRealGames) {
  SLP_REQUIRE_REPLAYS();
  const auto ics = replay_info_json(replay("peppi/ics.slp"));
  EXPECT_EQ(ics["players"][0]["character_name"], "Popo");
  EXPECT_EQ(ics["players"][0]["follower_name"], "Nana");
  EXPECT_EQ(ics["players"][0]["external_character_name"], "Ice Climbers");
  EXPECT_EQ(ics["players"][1]["character_name"], "Jigglypuff");
  const std::string text = replay_info_text(ics);
  EXPECT_NE(text.find("player 1: Ice Climbers (id 14, internal 10) + Nana (internal 11)"),
            std::string::npos)
      << text;
  // Placements are 0-based in the file ({"1": 1, "3": 0}).
  const std::string v313 = replay_info_text(replay_info_json(replay("peppi/v3.13.slp")));
  EXPECT_NE(v313.find("placements: port 1: 2nd, port 3: 1st\n"), std::string::npos) << v313;
}

TEST(SlpInspect, InfoReportsErrors) {
  SLP_REQUIRE_REPLAYS();
  const auto corrupt = replay_info_json(replay("peppi/corrupt.slp"));
  EXPECT_TRUE(replay_info_has_error(corrupt));
  EXPECT_NE(corrupt["error"].get<std::string>().find("byte offset"), std::string::npos);
  const auto missing = replay_info_json(replay("no/such/file.slp"));
  EXPECT_TRUE(replay_info_has_error(missing));
  const auto severed = replay_info_json(replay("slippi-js/incomplete.slp"));
  EXPECT_FALSE(replay_info_has_error(severed));
  EXPECT_EQ(severed["severed"], true);
}

TEST(SlpInspect, DumpFrame) {
  SLP_REQUIRE_REPLAYS();
  const Game g = parse_slp_file(replay("peppi/game.slp"));
  const auto j = replay_dump_json(g, 1000, 1);
  EXPECT_EQ(j["frame"], 877);
  EXPECT_EQ(j["port"], 1);
  EXPECT_EQ(j["post"]["x"], 57.292168);  // shortest float text
  EXPECT_EQ(j["post"]["percent"], 0.0);
  EXPECT_EQ(j["post"]["action_state"], 27);
  EXPECT_EQ(j["pre"]["random_seed"], 1046068084u);
  EXPECT_EQ(j["pre"]["x"], 56.81875);
  EXPECT_FALSE(j["post"].contains("instance_id"));  // not in a 1.0 file
  const auto all = replay_dump_json(g, 0);
  EXPECT_EQ(all["ports"].size(), 2u);
  EXPECT_EQ(all["frame"], -123);
  EXPECT_THROW(replay_dump_json(g, g.frames.size()), std::out_of_range);
  EXPECT_THROW(replay_dump_json(g, 0, 4), std::out_of_range);
  EXPECT_NE(replay_dump_text(j).find("post.x: 57.292168"), std::string::npos)
      << replay_dump_text(j);
}

TEST(SlpInspect, DumpItemsAndFollower) {
  SLP_REQUIRE_REPLAYS();
  const Game items = parse_slp_file(replay("peppi/items.slp"));
  const auto j = replay_dump_json(items, 121);
  ASSERT_EQ(j["items"].size(), 1u);
  EXPECT_EQ(j["items"][0]["type"], 99);
  const Game ics = parse_slp_file(replay("peppi/ics.slp"));
  const auto k = replay_dump_json(ics, 10, 1);
  EXPECT_EQ(k["follower"]["post"]["character"], 11);
}

}  // namespace
}  // namespace slipstream::slp

// Character and stage names (stages/melee/slp/names.h): known ids, both directions, short forms.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "stages/melee/slp/names.h"
#include "stages/melee/slp/synth.h"

namespace slipstream::slp {
namespace {

TEST(SlpNames, KnownIds) {
  // External ids (Game Start) follow the character select screen; internal ids (Post-Frames)
  // do not.
  EXPECT_EQ(external_character_name(0), "Captain Falcon");
  EXPECT_EQ(external_character_name(2), "Fox");
  EXPECT_EQ(external_character_name(14), "Ice Climbers");
  EXPECT_EQ(external_character_name(23), "Roy");
  EXPECT_EQ(external_character_name(25), "Ganondorf");
  EXPECT_EQ(external_character_name(32), "Popo");
  EXPECT_EQ(internal_character_name(0), "Mario");
  EXPECT_EQ(internal_character_name(1), "Fox");
  EXPECT_EQ(internal_character_name(2), "Captain Falcon");
  EXPECT_EQ(internal_character_name(7), "Sheik");
  EXPECT_EQ(internal_character_name(10), "Popo");
  EXPECT_EQ(internal_character_name(11), "Nana");
  EXPECT_EQ(internal_character_name(18), "Marth");  // the spec's metadata example
  EXPECT_EQ(internal_character_name(32), "Sandbag");
  EXPECT_EQ(stage_name(2), "Fountain of Dreams");
  EXPECT_EQ(stage_name(3), "Pokémon Stadium");
  EXPECT_EQ(stage_name(8), "Yoshi's Story");
  EXPECT_EQ(stage_name(28), "Dream Land N64");
  EXPECT_EQ(stage_name(31), "Battlefield");
  EXPECT_EQ(stage_name(32), "Final Destination");
  for (int unknown : {-1, 33, 255}) {
    EXPECT_FALSE(external_character_name(unknown)) << unknown;
    EXPECT_FALSE(internal_character_name(unknown)) << unknown;
  }
  EXPECT_FALSE(stage_name(0));
  EXPECT_FALSE(stage_name(21));
}

TEST(SlpNames, EveryPlayableCharacterHasANameAndEveryIdRoundTrips) {
  std::set<std::string> seen;
  for (int id = 0; id <= 25; ++id) {
    const auto name = external_character_name(id);
    ASSERT_TRUE(name) << id;
    EXPECT_TRUE(seen.insert(std::string(*name)).second) << *name;
  }
  for (int id = 0; id <= 32; ++id) {
    const auto ext = external_character_name(id);
    ASSERT_TRUE(ext) << id;
    EXPECT_EQ(external_character_id(*ext), id) << *ext;
    const auto in = internal_character_name(id);
    ASSERT_TRUE(in) << id;
    EXPECT_EQ(internal_character_id(*in), id) << *in;
  }
  for (int id = 0; id < 256; ++id) {
    if (const auto name = stage_name(id)) {
      EXPECT_EQ(stage_id(*name), id) << *name;
    }
  }
  EXPECT_EQ(internal_character_names().size(), 34u);  // 0..32 and Ice Climbers
}

TEST(SlpNames, SpellingsAndShortForms) {
  EXPECT_EQ(internal_character_id("fox"), 1);
  EXPECT_EQ(internal_character_id("FOX"), 1);
  EXPECT_EQ(external_character_id("fox"), 2);
  EXPECT_EQ(internal_character_id("falcon"), 2);
  EXPECT_EQ(internal_character_id("Captain Falcon"), 2);
  EXPECT_EQ(internal_character_id("captain_falcon"), 2);
  EXPECT_EQ(internal_character_id("dr mario"), 21);
  EXPECT_EQ(internal_character_id("doc"), 21);
  EXPECT_EQ(internal_character_id("puff"), 15);
  EXPECT_EQ(internal_character_id("g&w"), 24);
  EXPECT_EQ(internal_character_id("ice climbers"), 10);  // the leader, Popo
  EXPECT_EQ(internal_character_id("ics"), 10);
  EXPECT_EQ(external_character_id("ics"), 14);
  EXPECT_FALSE(external_character_id("nana"));  // never on the select screen
  EXPECT_EQ(stage_id("fd"), 32);
  EXPECT_EQ(stage_id("final destination"), 32);
  EXPECT_EQ(stage_id("Battlefield"), 31);
  EXPECT_EQ(stage_id("bf"), 31);
  EXPECT_EQ(stage_id("yoshis story"), 8);
  EXPECT_EQ(stage_id("Yoshi's Story"), 8);
  EXPECT_EQ(stage_id("dreamland"), 28);
  EXPECT_EQ(stage_id("fod"), 2);
  EXPECT_EQ(stage_id("ps"), 3);
  EXPECT_EQ(stage_id("pokemon stadium"), 3);
  for (const char* bad : {"", "  ", "foxx", "32", "final"}) {
    EXPECT_FALSE(internal_character_id(bad)) << bad;
    EXPECT_FALSE(stage_id(bad)) << bad;
  }
  // Every advertised spelling names exactly one entry (two entries sharing one would resolve to
  // nothing).
  for (const std::string& s : character_spellings())
    EXPECT_TRUE(external_character_id(s) || internal_character_id(s)) << s;
  for (const std::string& s : stage_spellings()) EXPECT_TRUE(stage_id(s)) << s;
}

TEST(SlpNames, SyntheticGamesUseNamedCharactersAndStages) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const Game g = synthesize_game({.seed = seed, .frames = 10});
    EXPECT_TRUE(stage_name(g.info.start.stage)) << g.info.start.stage;
    for (const Player& p : g.info.start.players) {
      const auto ext = external_character_name(p.character);
      ASSERT_TRUE(ext) << int{p.character};
      // Both ids of one player name the same character.
      EXPECT_EQ(internal_character_name(p.internal_character), ext) << *ext;
    }
  }
}

}  // namespace
}  // namespace slipstream::slp

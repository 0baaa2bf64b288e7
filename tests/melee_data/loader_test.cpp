// slippi_replays: window/label alignment against the raw parsed columns, perspectives, split,
// determinism, resume, epochs, skipped files, corpus input, synthetic fallback, Nana's slot.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "engine/config.h"
#include "engine/graph.h"
#include "stages/melee/slp/corpus.h"
#include "stages/melee/slp/names.h"
#include "stages/melee/slp/parser.h"
#include "stages/melee/slp/synth.h"
#include "stages/melee/slp/writer.h"
#include "tests/melee_data/loader_fixture.h"
#include "tests/slp/corpus_v1.h"

namespace slipstream::melee::testing {
namespace {

std::string paths_of(const fs::path& p) {
  return "paths=[\"" + p.string() + "\"]";
}

// Element helpers over the (B, W, ...) tensors.
float num(const Tensors& t, int64_t b, int64_t w, int slot, int f) {
  const Tensor& x = t.at("numeric");
  return x.data<float>()[((b * x.dim(1) + w) * kSlots + slot) * kNumericFeatures + f];
}
int32_t at3(const Tensors& t, const char* port, int64_t b, int64_t w, int k) {
  const Tensor& x = t.at(port);
  return x.data<int32_t>()[(b * x.dim(1) + w) * x.dim(2) + k];
}
float f3(const Tensors& t, const char* port, int64_t b, int64_t w, int k) {
  const Tensor& x = t.at(port);
  return x.data<float>()[(b * x.dim(1) + w) * x.dim(2) + k];
}

// Checks rows of batch `k` against the parsed replay (every recorded row, rollbacks included).
void expect_aligned(Loader& L, uint64_t k, const Tensors& t, int64_t delay, int rows_to_check) {
  std::map<std::string, slp::Game> parsed;
  const int64_t W = t.at("mask").dim(1);
  for (int row = 0; row < rows_to_check; ++row) {
    const auto info = L.stage().window(k, row);
    SCOPED_TRACE(info.source + " port " + std::to_string(info.player_port) + " start " +
                 std::to_string(info.start));
    if (!parsed.count(info.source)) parsed.emplace(info.source, slp::parse_slp_file(info.source));
    const slp::Game& g = parsed.at(info.source);
    const std::vector<uint32_t> kept = slp::last_copy_rows(g.frames.frame);
    const auto& me = g.frames.port(static_cast<uint8_t>(info.player_port))->leader;
    const auto& op = g.frames.port(static_cast<uint8_t>(info.opponent_port))->leader;
    for (int64_t i = 0; i < W; i += 7) {
      const size_t r = kept[info.start + i];              // features: post-frame of t_i
      const size_t c = kept[info.start + i + delay];      // prev_controller: t_i + D
      const size_t l = kept[info.start + i + delay + 1];  // label: t_i + D + 1
      ASSERT_LT(g.frames.frame[r], g.frames.frame[l]);
      EXPECT_EQ(num(t, row, i, 0, kPercent), me.post.percent[r]);
      EXPECT_EQ(num(t, row, i, 0, kPosX), me.post.x[r]);
      EXPECT_EQ(num(t, row, i, 0, kPosY), me.post.y[r]);
      EXPECT_EQ(num(t, row, i, 0, kFacing), me.post.facing[r]);
      EXPECT_EQ(num(t, row, i, 0, kStocks), me.post.stocks[r]);
      EXPECT_EQ(num(t, row, i, 0, kExists), 1.0f);
      EXPECT_EQ(num(t, row, i, 1, kPosX), op.post.x[r]);
      EXPECT_EQ(num(t, row, i, 1, kPercent), op.post.percent[r]);
      if (!me.post.airborne.empty()) {
        EXPECT_EQ(num(t, row, i, 0, kOnGround), me.post.airborne[r] ? 0.0f : 1.0f);
      }
      EXPECT_EQ(at3(t, "action", row, i, 0),
                std::min<int>(me.post.action_state[r], kActionStates - 1));
      EXPECT_EQ(at3(t, "character", row, i, 1),
                std::min<int>(op.post.character[r], kCharacters - 1));
      // prev_controller = the player's pre-frame input of t_i + D.
      EXPECT_EQ(f3(t, "prev_controller", row, i, kA), (me.pre.buttons[c] & 0x0100) ? 1.0f : 0.0f);
      EXPECT_EQ(f3(t, "prev_controller", row, i, kZ), (me.pre.buttons[c] & 0x0010) ? 1.0f : 0.0f);
      EXPECT_EQ(f3(t, "prev_controller", row, i, kButtons + 0), me.pre.joystick_x[c]);
      EXPECT_EQ(f3(t, "prev_controller", row, i, kButtons + 3), me.pre.cstick_y[c]);
      EXPECT_EQ(f3(t, "prev_controller", row, i, kButtons + 4), me.pre.trigger[c]);
      // Targets = the input of t_i + D + 1.
      EXPECT_EQ(f3(t, "target_buttons", row, i, kA), (me.pre.buttons[l] & 0x0100) ? 1.0f : 0.0f);
      EXPECT_EQ(f3(t, "target_buttons", row, i, kB), (me.pre.buttons[l] & 0x0200) ? 1.0f : 0.0f);
      EXPECT_EQ(f3(t, "target_buttons", row, i, kL), (me.pre.buttons[l] & 0x0040) ? 1.0f : 0.0f);
      EXPECT_EQ(at3(t, "target_sticks", row, i, kMainX), stick_class(me.pre.joystick_x[l]));
      EXPECT_EQ(at3(t, "target_sticks", row, i, kMainY), stick_class(me.pre.joystick_y[l]));
      EXPECT_EQ(at3(t, "target_sticks", row, i, kCX), stick_class(me.pre.cstick_x[l]));
      EXPECT_EQ(at3(t, "target_sticks", row, i, kShoulder), shoulder_class(me.pre.trigger[l]));
      EXPECT_EQ(f3(t, "mask", row, i, 0), 1.0f);
    }
  }
}

class Alignment : public ::testing::TestWithParam<int> {};

TEST_P(Alignment, SyntheticWindowsMatchRawColumns) {
  const int D = GetParam();
  Loader L({paths_of(synth_dir()), "batch_size=16", "window=30", "stride=7",
            "delay=" + std::to_string(D), "validation_fraction=0"});
  Batch meta;
  const Tensors t = L.batch(3, &meta);
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(meta.samples, 16u);
  EXPECT_EQ(t.at("numeric").shape(), (Shape{16, 30, kSlots, kNumericFeatures}));
  EXPECT_EQ(t.at("action").shape(), (Shape{16, 30, kSlots}));
  EXPECT_EQ(t.at("stage").shape(), (Shape{16, 30}));
  EXPECT_EQ(t.at("prev_controller").shape(), (Shape{16, 30, kControllerFeatures}));
  EXPECT_EQ(t.at("target_buttons").shape(), (Shape{16, 30, kButtons}));
  EXPECT_EQ(t.at("target_sticks").shape(), (Shape{16, 30, kStickHeads}));
  EXPECT_EQ(t.at("target_sticks").dtype(), DType::i32);
  expect_aligned(L, 3, t, D, 16);
}

TEST_P(Alignment, RealReplaysWithRollbacksMatchRawColumns) {
  LOADER_REQUIRE_REPLAYS();
  const int D = GetParam();
  Loader L({paths_of(replay_dir()), "batch_size=32", "delay=" + std::to_string(D),
            "validation_fraction=0"});
  for (uint64_t k : std::vector<uint64_t>{0, 5, L.stage().batches_per_epoch() - 1}) {
    const Tensors t = L.batch(k);
    ASSERT_FALSE(t.empty());
    expect_aligned(L, k, t, D, 8);
  }
}

INSTANTIATE_TEST_SUITE_P(Delay, Alignment, ::testing::Values(0, 2));

TEST(Loader, ValuesInRange) {
  Loader L({paths_of(synth_dir()), "batch_size=64"});
  const Tensors t = L.batch(0);
  for (int32_t a : t.at("action").span<int32_t>()) ASSERT_TRUE(a >= 0 && a < kActionStates);
  for (int32_t c : t.at("character").span<int32_t>()) ASSERT_TRUE(c >= 0 && c < kCharacters);
  for (int32_t s : t.at("stage").span<int32_t>()) ASSERT_TRUE(s >= 0 && s < kStages);
  const auto sticks = t.at("target_sticks").span<int32_t>();
  for (size_t i = 0; i < sticks.size(); ++i)
    ASSERT_TRUE(sticks[i] >= 0 && sticks[i] < head_classes(static_cast<int>(i % kStickHeads)));
  for (float m : t.at("mask").span<float>()) ASSERT_EQ(m, 1.0f);
  std::set<int> heads_vary;
  for (size_t i = kStickHeads; i < sticks.size(); ++i)
    if (sticks[i] != sticks[i % kStickHeads]) heads_vary.insert(static_cast<int>(i % kStickHeads));
  EXPECT_EQ(heads_vary.size(), static_cast<size_t>(kStickHeads)) << "every head should vary";
}

TEST(Loader, PerspectiveSwapsPlayerAndOpponent) {
  Loader L({paths_of(synth_dir()), "batch_size=8", "shuffle=false", "validation_fraction=0"});
  // Unshuffled, one game's perspectives follow each other: find the same start seen from both.
  std::map<std::tuple<std::string, uint32_t>, std::pair<uint64_t, int>> first_seen;
  bool found = false;
  for (uint64_t k = 0; k < L.stage().batches_per_epoch() && !found; ++k)
    for (int r = 0; r < 8 && !found; ++r) {
      const auto w = L.stage().window(k, r);
      auto key = std::make_tuple(w.source, w.start);
      auto it = first_seen.find(key);
      if (it == first_seen.end()) {
        first_seen[key] = {k, r};
        continue;
      }
      const auto w0 = L.stage().window(it->second.first, it->second.second);
      EXPECT_EQ(w0.player_port, w.opponent_port);
      EXPECT_EQ(w0.opponent_port, w.player_port);
      const Tensors a = L.batch(it->second.first), b = L.batch(k);
      for (int64_t i = 0; i < 60; ++i)
        for (int f = 0; f < kNumericFeatures; ++f) {
          ASSERT_EQ(num(a, it->second.second, i, 0, f), num(b, r, i, 1, f));
          ASSERT_EQ(num(a, it->second.second, i, 1, f), num(b, r, i, 0, f));
        }
      found = true;
    }
  EXPECT_TRUE(found);
}

TEST(Loader, SplitIsDisjointAndCoversAllGames) {
  const std::vector<std::string> o = {paths_of(synth_dir()), "batch_size=16",
                                      "validation_fraction=0.3"};
  Loader train(o), val(o, 1, 1, true);
  auto a = train.stage().sources(), b = val.stage().sources();
  EXPECT_FALSE(a.empty());
  EXPECT_FALSE(b.empty());
  std::set<std::string> sa(a.begin(), a.end()), sb(b.begin(), b.end());
  for (const auto& s : sb) EXPECT_FALSE(sa.count(s)) << s << " is in both splits";
  EXPECT_EQ(sa.size() + sb.size(), 8u);
  // Stable: the same seed splits the same way.
  Loader again(o);
  EXPECT_EQ(again.stage().sources(), a);
}

// validation_paths pin games to validation: all of them validate, none trains (a game in both
// lists is left out of training), and the run directory lists each split's games.
TEST(Loader, ValidationPathsPinGames) {
  TempDir pinned("pinned"), run("run");
  const auto extra = slp::write_synthetic_games(pinned.path(), 3, 7, 1500);
  const std::string vp = "validation_paths=[" + pinned.str() + "]";
  const std::vector<std::string> o = {paths_of(synth_dir()), vp, "batch_size=16"};
  Loader train(o, 1, 1, false, 0, 1, 0, run.str()), val(o, 1, 1, true);
  EXPECT_EQ(train.stage().sources().size(), 8u);  // validation_fraction is not applied
  const auto v = val.stage().sources();
  ASSERT_EQ(v.size(), 3u);
  for (const auto& s : v) EXPECT_EQ(s.rfind(pinned.str(), 0), 0u) << s;
  EXPECT_NE(train.stage().report().find("validation: 3 games from validation_paths"),
            std::string::npos)
      << train.stage().report();
  EXPECT_FALSE(fs::exists(run.path() / "replays.splits.json"));  // written once the run starts
  train.stage().start(train.ctx());
  std::ifstream splits(run.path() / "replays.splits.json");
  ASSERT_TRUE(splits);
  const auto j = nlohmann::json::parse(splits);
  EXPECT_EQ(j["train"].size(), 8u);
  EXPECT_EQ(j["validation"].size(), 3u);

  // A game named in both lists validates and does not train.
  std::vector<fs::path> games;
  for (const auto& e : fs::directory_iterator(synth_dir())) games.push_back(e.path());
  std::sort(games.begin(), games.end());
  Loader both(
      {paths_of(synth_dir()), "validation_paths=[" + games[0].string() + "]", "batch_size=16"});
  EXPECT_EQ(both.stage().sources().size(), 7u);
  EXPECT_NE(both.stage().report().find("1 of them also in paths: not trained"), std::string::npos)
      << both.stage().report();
}

// A resumed run with other replays keeps, in its splits file, the games it trained on before
// (eval's held-out warning reads them), and says so when a game it trained on now validates.
TEST(Loader, AResumeKeepsTheGamesTrainedBeforeInTheSplitsFile) {
  TempDir other("other"), run("run");
  slp::write_synthetic_games(other.path(), 4, 9, 1500);
  auto started = [&](std::vector<std::string> o, std::string* said = nullptr) {
    Loader l(std::move(o), 1, 1, false, 0, 1, 0, run.str());
    if (said)
      l.run().log_sink = [said](const std::string&, const std::string& line, bool) {
        *said += line + "\n";
      };
    l.stage().start(l.ctx());
    std::ifstream in(run.path() / "replays.splits.json");
    return std::pair{nlohmann::json::parse(in), l.stage().sources()};
  };
  auto names = [](const nlohmann::json& list) {
    std::set<std::string> out;
    for (const auto& g : list) out.insert(g.get<std::string>());
    return out;
  };
  const std::vector<std::string> mine = {paths_of(synth_dir()), "batch_size=16",
                                         "validation_fraction=0.3"};
  const std::vector<std::string> others = {paths_of(other.path()), "batch_size=8",
                                           "validation_fraction=0.3"};
  const auto [first, first_train] = started(mine);
  const auto [second, second_train] = started(others);
  std::set<std::string> both(first_train.begin(), first_train.end());
  both.insert(second_train.begin(), second_train.end());
  EXPECT_EQ(names(second["train"]), both);
  // This start's own games come first, in its order; its validation games are its own.
  for (size_t i = 0; i < second_train.size(); ++i) EXPECT_EQ(second["train"][i], second_train[i]);
  for (const auto& g : names(second["validation"])) EXPECT_FALSE(both.count(g)) << g;

  // The first games pinned to validation: those that trained before are named in a warning.
  std::string said;
  const auto [third, third_train] = started(
      {paths_of(other.path()), "validation_paths=[" + synth_dir().string() + "]", "batch_size=8"},
      &said);
  both.insert(third_train.begin(), third_train.end());
  EXPECT_EQ(names(third["train"]), both);
  EXPECT_EQ(third["validation"].size(), 8u);
  EXPECT_NE(said.find("warning: " + std::to_string(first_train.size()) +
                      " validation game(s) were training games before this resume"),
            std::string::npos)
      << said;
}

// validation_fraction 1 puts every game in validation (no game is moved back to training).
TEST(Loader, ValidationFractionOneValidatesEveryGame) {
  Loader val({paths_of(synth_dir()), "batch_size=16", "validation_fraction=1"}, 1, 1, true);
  EXPECT_EQ(val.stage().sources().size(), 8u);
}

TEST(Loader, DeterministicForASeedAndDifferentAcrossSeeds) {
  const std::vector<std::string> o = {paths_of(synth_dir()), "batch_size=32",
                                      "validation_fraction=0"};
  Loader a(o, 7), b(o, 7), c(o, 8);
  bool any_different = false;
  for (uint64_t k = 0; k < 3; ++k) {
    const Tensors ta = a.batch(k), tb = b.batch(k), tc = c.batch(k);
    EXPECT_TRUE(same_batch(ta, tb)) << "batch " << k;
    any_different |= !same_batch(ta, tc);
  }
  EXPECT_TRUE(any_different);
}

TEST(Loader, SeekResumesAtAnyBatch) {
  const std::vector<std::string> o = {paths_of(synth_dir()), "batch_size=64",
                                      "validation_fraction=0"};
  Loader fresh(o, 3, 2);
  const uint64_t bpe = fresh.stage().batches_per_epoch();
  ASSERT_GE(bpe, 3u);
  std::vector<Tensors> all;
  for (uint64_t k = 0; k < 2 * bpe; ++k) all.push_back(fresh.batch(k));
  for (uint64_t k : std::vector<uint64_t>{1, bpe - 1, bpe, bpe + 2}) {
    Loader resumed(o, 3, 2);
    resumed.stage().seek(k, resumed.ctx());
    Batch meta;
    EXPECT_TRUE(same_batch(resumed.batch(k, &meta), all[k])) << "batch " << k;
    EXPECT_EQ(meta.epoch, k / bpe);
    EXPECT_TRUE(same_batch(resumed.batch(k + 1), k + 1 < all.size() ? all[k + 1] : Tensors{}));
  }
}

TEST(Loader, RanksTrainOnDisjointSlicesOfTheSameOrder) {
  const std::vector<std::string> o = {paths_of(synth_dir()), "batch_size=16",
                                      "validation_fraction=0"};
  Loader single(o, 5, 2);
  Loader r0(o, 5, 2, false, 0, 2), r1(o, 5, 2, false, 1, 2);
  const uint64_t bpe = r0.stage().batches_per_epoch();
  ASSERT_GE(bpe, 2u);
  EXPECT_EQ(bpe, single.stage().windows() / (16 * 2));
  EXPECT_EQ(r1.stage().batches_per_epoch(), bpe);  // same step count on every rank
  // Rank r's batch j of an epoch is the single-process batch 2j + r of that epoch's order.
  for (uint64_t j : std::vector<uint64_t>{0, 1, bpe - 1}) {
    EXPECT_TRUE(same_batch(r0.batch(j), single.batch(2 * j))) << j;
    EXPECT_TRUE(same_batch(r1.batch(j), single.batch(2 * j + 1))) << j;
  }
  std::set<std::tuple<std::string, int, uint32_t>> seen;
  for (Loader* L : {&r0, &r1})
    for (uint64_t k = 0; k < bpe; ++k)
      for (int r = 0; r < 16; ++r) {
        const auto w = L->stage().window(k, r);
        EXPECT_TRUE(seen.emplace(w.source, w.player_port, w.start).second) << "window on two ranks";
      }
}

// Two ranks that each read every game (shard: windows) but found different replays (a file
// missing on one node): every rank stops before the first step, saying how they differ. Rank 0's
// reductions are recorded and rank 1's combine with them, as MPI would.
TEST(Loader, RanksThatFoundDifferentDataStopBeforeTheFirstStep) {
  TempDir fewer("fewer");
  for (const auto& e : fs::directory_iterator(synth_dir()))
    if (e.path().filename() != fs::directory_iterator(synth_dir())->path().filename())
      fs::copy(e.path(), fewer.path() / e.path().filename(), fs::copy_options::recursive);
  auto two_ranks = [](const std::string& rank0_paths, const std::string& rank1_paths) {
    std::vector<std::vector<double>> sent;
    size_t call = 0;
    const std::vector<std::string> o = {"batch_size=16", "validation_fraction=0"};
    auto with = [&](const std::string& p) {
      auto v = o;
      v.push_back(p);
      return v;
    };
    Loader r0(with(rank0_paths), 5, 1, false, 0, 2, 0, "",
              [&](std::span<double> v, RankReduce, const std::string&) {
                sent.emplace_back(v.begin(), v.end());
              });
    Loader r1(with(rank1_paths), 5, 1, false, 1, 2, 0, "",
              [&](std::span<double> v, RankReduce how, const std::string&) {
                ASSERT_EQ(how, RankReduce::min);
                for (size_t i = 0; i < v.size(); ++i) v[i] = std::min(v[i], sent.at(call)[i]);
                ++call;
              });
  };
  EXPECT_NO_THROW(two_ranks(paths_of(synth_dir()), paths_of(synth_dir())));
  try {
    two_ranks(paths_of(synth_dir()), paths_of(fewer.path()));
    FAIL() << "ranks with different data must not train as one run";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("the ranks did not find the same data (replay files "
                                         "found: 7 to 8"),
              std::string::npos)
        << e.what();
  }
}

TEST(Loader, EpochsEndAndEachEpochIsAPermutation) {
  const std::vector<std::string> o = {paths_of(synth_dir()), "batch_size=50",
                                      "validation_fraction=0"};
  Loader L(o, 1, 2);
  const uint64_t bpe = L.stage().batches_per_epoch();
  EXPECT_EQ(bpe, L.stage().windows() / 50);
  EXPECT_EQ(L.run().source_batches, 2 * bpe);  // the run's length without run.steps
  std::array<std::vector<std::tuple<std::string, int, uint32_t>>, 2> seen;
  for (uint64_t k = 0; k < 2 * bpe; ++k)
    for (int r = 0; r < 50; ++r) {
      const auto w = L.stage().window(k, r);
      seen[k / bpe].emplace_back(w.source, w.player_port, w.start);
    }
  for (auto& s : seen) {
    std::set<std::tuple<std::string, int, uint32_t>> u(s.begin(), s.end());
    EXPECT_EQ(u.size(), s.size()) << "a window repeats within an epoch";
  }
  EXPECT_NE(seen[0], seen[1]) << "epochs should be shuffled differently";
  EXPECT_TRUE(L.batch(2 * bpe).empty());
  EXPECT_TRUE(L.batch(2 * bpe + 5).empty());
}

// rows: streams: a row walks one perspective's windows in time order (continues = 1 from its
// second window on, 0 where a new game starts), each epoch holds every window at most once and
// leaves out fewer than world·B, and the published tensor says what window() says.
TEST(Loader, StreamsWalkEachGameWindowByWindow) {
  const int W = 20, B = 8;
  const std::vector<std::string> o = {paths_of(synth_dir()), "batch_size=8",
                                      "window=20",           "stride=20",
                                      "rows=streams",        "validation_fraction=0"};
  Loader L(o, 1, 2);
  const uint64_t bpe = L.stage().batches_per_epoch();
  ASSERT_EQ(bpe, L.stage().windows() / B);
  size_t starts = 0, carried = 0;
  std::array<std::set<std::tuple<std::string, int, uint32_t>>, 2> seen;
  std::array<std::vector<std::string>, 2> first_games;
  for (uint64_t k = 0; k < 2 * bpe; ++k) {
    const Tensors t = L.batch(k);
    ASSERT_FALSE(t.empty());
    const auto cont = t.at("continues").span<float>();
    for (int r = 0; r < B; ++r) {
      const auto w = L.stage().window(k, r);
      ASSERT_FALSE(w.padding);
      EXPECT_EQ(cont[size_t(r)], w.continues ? 1.0f : 0.0f);
      EXPECT_TRUE(seen[k / bpe].emplace(w.source, w.player_port, w.start).second)
          << "a window repeats within an epoch";
      if (k % bpe == 0) {
        EXPECT_FALSE(w.continues) << "an epoch's first batch starts every row";
        first_games[k / bpe].push_back(w.source + std::to_string(w.player_port));
      }
      if (!w.continues) {
        ++starts;
        continue;
      }
      ++carried;
      const auto prev = L.stage().window(k - 1, r);
      EXPECT_EQ(w.source, prev.source);
      EXPECT_EQ(w.player_port, prev.player_port);
      EXPECT_EQ(w.start, prev.start + W) << "row " << r << " batch " << k;
    }
  }
  EXPECT_GT(carried, 10 * starts) << "rows should mostly go on with their game";
  EXPECT_GT(seen[0].size() + B, L.stage().windows());
  EXPECT_NE(first_games[0], first_games[1]) << "epochs should order the games differently";
}

// Streams on two ranks (shard: windows): rank r's rows are rows rB.. of the world's 2B streams,
// so the ranks walk different games and never share a window.
TEST(Loader, StreamsOnRanksAreDisjoint) {
  const std::vector<std::string> o = {paths_of(synth_dir()), "batch_size=4",
                                      "window=20",           "stride=20",
                                      "rows=streams",        "validation_fraction=0"};
  Loader r0(o, 5, 1, false, 0, 2), r1(o, 5, 1, false, 1, 2);
  const uint64_t bpe = r0.stage().batches_per_epoch();
  ASSERT_EQ(bpe, r0.stage().windows() / 8);
  std::set<std::tuple<std::string, int, uint32_t>> seen;
  for (Loader* L : {&r0, &r1})
    for (uint64_t k = 0; k < bpe; ++k)
      for (int r = 0; r < 4; ++r) {
        const auto w = L->stage().window(k, r);
        EXPECT_TRUE(seen.emplace(w.source, w.player_port, w.start).second) << "window on two ranks";
      }
  EXPECT_EQ(seen.size(), 8 * bpe);
}

TEST(Loader, StreamsNeedAbuttingWindows) {
  // stride: 0 is the window.
  Loader zero({paths_of(synth_dir()), "window=20", "stride=0", "rows=streams"});
  Loader twenty({paths_of(synth_dir()), "window=20", "stride=20", "rows=streams"});
  EXPECT_EQ(zero.stage().windows(), twenty.stage().windows());
  EXPECT_EQ(zero.stage().window(3, 1).start, twenty.stage().window(3, 1).start);
  try {
    Loader L({paths_of(synth_dir()), "window=20", "stride=5", "rows=streams"});
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("stride = window (20)"), std::string::npos) << e.what();
  }
}

// The validation copy takes the training copy's games even when a file changed on disk since
// (a folder a recorder still writes to): it loaded every game a second time, all resident
// whatever resident_games said, and validated on a split of other games.
TEST(Loader, TheValidationCopyTakesTheTrainingCopysGamesWhenAFileChanged) {
  TempDir d("changing");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(synth_dir())) {
    fs::copy(e.path(), d.path() / e.path().filename());
    files.push_back(d.path() / e.path().filename());
  }
  const std::vector<std::string> o = {paths_of(d.path()), "resident_games=3",
                                      "validation_fraction=0.3"};
  Loader train(o);
  ASSERT_TRUE(train.stage().resident_stats().has_value());  // read on demand
  fs::last_write_time(files[0], fs::last_write_time(files[0]) + std::chrono::seconds(10));
  slp::write_synthetic_games(d.path() / "more", 2, 7, 1500);
  Loader validation(o, 1, 1, true);
  EXPECT_TRUE(validation.stage().resident_stats().has_value());
  std::set<std::string> seen;
  for (Loader* l : {&train, &validation})
    for (const auto& s : l->stage().sources()) {
      EXPECT_EQ(s.find("more"), std::string::npos) << s;
      EXPECT_TRUE(seen.insert(s).second) << s << " in both splits";
    }
  EXPECT_EQ(seen.size(), files.size());
}

// Every file skipped as a problem is listed in the run directory (RUN/NAME.skipped.txt, a line
// each: reason, tab, file); the report names the first few of each kind and the list. With tens
// of thousands of replays no list of the bad ones existed anywhere. A later start without skips
// takes the old list away.
TEST(Loader, EverySkippedFileIsListedInTheRunDirectory) {
  TempDir d("skips"), run("skips-run");
  for (const auto& e : fs::directory_iterator(synth_dir()))
    fs::copy(e.path(), d.path() / e.path().filename());
  for (int i = 0; i < 5; ++i)
    std::ofstream(d.path() / ("junk" + std::to_string(i) + ".slp")) << "not a replay " << i;
  Loader L({paths_of(d.path())}, 1, 1, false, 0, 1, 0, run.str());
  const std::string list_file = (run.path() / "replays.skipped.txt").string();
  EXPECT_NE(L.stage().report().find(", ... (the list: " + list_file + ")"), std::string::npos)
      << L.stage().report();
  L.stage().start(L.ctx());
  std::ifstream in(list_file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    const std::string name = (d.path() / ("junk" + std::to_string(i) + ".slp")).string();
    EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                            [&](const std::string& l) {
                              return l.starts_with("unreadable\t") &&
                                     l.find(name) != std::string::npos;
                            }),
              1)
        << name;
  }
  Loader clean({paths_of(synth_dir())}, 1, 1, false, 0, 1, 0, run.str());
  clean.stage().start(clean.ctx());
  EXPECT_FALSE(fs::exists(list_file));
}

// `slipstream validate` refuses what setup would: the loader's rules between parameters are the
// schema's, named at the value to change (validate said OK and the run failed at setup).
TEST(Loader, ValidationRefusesWhatSetupWould) {
  auto error_of = [](std::vector<std::string> sets) {
    sets.push_back("replays.synthetic=4");
    try {
      plan_graph(load_config(SLIPSTREAM_SOURCE_DIR "/configs/train_bc.yaml", sets));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(valid)");
  };
  const std::string streams = error_of({"replays.rows=streams", "replays.stride=5"});
  EXPECT_NE(streams.find("--set replays.stride=5: stage 'replays' (slippi_replays): rows: streams"),
            std::string::npos)
      << streams;
  EXPECT_NE(streams.find("needs windows that abut"), std::string::npos) << streams;
  EXPECT_EQ(error_of({"replays.rows=streams", "replays.stride=0"}), "(valid)");
  const std::string whole = error_of({"replays.validation_rows=whole_games"});
  EXPECT_NE(
      whole.find("--set replays.validation_rows=whole_games: stage 'replays' (slippi_replays): "
                 "validation_rows: "
                 "whole_games reads the games' windows in order and needs rows: streams (rows is "
                 "shuffled, the default)"),
      std::string::npos)
      << whole;
  for (const char* below : {"step.beta1=1", "step.beta2=1.0", "step.ema=1"}) {
    const std::string e = error_of({below});
    EXPECT_NE(e.find("must be below 1"), std::string::npos) << below << ": " << e;
  }
  EXPECT_NE(error_of({"loss.head_weights=[0, 0, 0, 0, 0, 0]"})
                .find("parameter 'head_weights' are all 0: no head would be trained"),
            std::string::npos);
  EXPECT_NE(error_of({"step.lr=inf"}).find("parameter 'lr' = inf is not a finite number"),
            std::string::npos)
      << error_of({"step.lr=inf"});
  const std::string weights = error_of({"loss.head_weights=[1, 2]"});
  EXPECT_NE(weights.find("parameter 'head_weights' has 2 values; it needs 6"), std::string::npos)
      << weights;
}

// Validation under streams: one pass, every window once, rows padded at the end.
TEST(Loader, StreamsValidationCoversEveryWindowOnce) {
  const std::vector<std::string> o = {paths_of(synth_dir()), "batch_size=7",
                                      "window=20",           "stride=20",
                                      "rows=streams",        "validation_fraction=0.3"};
  Loader V(o, 1, 1, true);
  const uint64_t n = V.stage().windows(), batches = V.stage().total_batches();
  EXPECT_EQ(batches, (n + 6) / 7);
  std::set<std::tuple<std::string, int, uint32_t>> seen;
  size_t real = 0;
  for (uint64_t k = 0; k < batches; ++k)
    for (int r = 0; r < 7; ++r) {
      const auto w = V.stage().window(k, r);
      if (w.padding) continue;
      ++real;
      seen.emplace(w.source, w.player_port, w.start);
    }
  EXPECT_EQ(real, n);
  EXPECT_EQ(seen.size(), n);
}

// validation_rows: whole_games (eval --whole-games): every window once, each row holding whole
// perspectives, each from its first window (continues 0) to its last, so a model carries its
// state through every game whatever the batch size (the stretches above start some rows inside
// a game, from zero state); at most a row a perspective (a larger batch_size is lowered).
TEST(Loader, WholeGamesValidationGivesEachRowWholeGames) {
  for (const int B : {1, 3, 64}) {
    SCOPED_TRACE(B);
    const std::vector<std::string> o = {paths_of(synth_dir()),
                                        "batch_size=" + std::to_string(B),
                                        "window=20",
                                        "stride=20",
                                        "rows=streams",
                                        "validation_rows=whole_games",
                                        "validation_fraction=0.3"};
    Loader V(o, 1, 1, true);
    const uint64_t n = V.stage().windows(), batches = V.stage().total_batches();
    EXPECT_GE(batches, (n + B - 1) / B);
    const int rows = static_cast<int>(V.batch(0).at("mask").dim(0));
    EXPECT_LE(rows, B);
    std::set<std::tuple<std::string, int, uint32_t>> seen;
    std::set<std::pair<std::string, int>> started;
    size_t real = 0;
    for (int r = 0; r < rows; ++r) {
      std::optional<std::tuple<std::string, int, uint32_t>> before;
      for (uint64_t k = 0; k < batches; ++k) {
        const auto w = V.stage().window(k, r);
        if (w.padding) {
          before.reset();
          continue;
        }
        ++real;
        seen.emplace(w.source, w.player_port, w.start);
        if (w.continues) {
          ASSERT_TRUE(before) << k;
          EXPECT_EQ(std::get<0>(*before), w.source) << k;
          EXPECT_EQ(std::get<1>(*before), w.player_port) << k;
          EXPECT_EQ(std::get<2>(*before) + 20, w.start) << k;
        } else {
          // A perspective starts once, at its first window, in one row.
          EXPECT_TRUE(started.emplace(w.source, w.player_port).second) << w.source;
          EXPECT_LT(w.start, 20u) << w.source;
        }
        before.emplace(w.source, w.player_port, w.start);
      }
    }
    EXPECT_EQ(real, n);
    EXPECT_EQ(seen.size(), n);
  }
}

TEST(Loader, ValidationIsOnePassWithAPaddedLastBatch) {
  const std::vector<std::string> o = {paths_of(synth_dir()), "batch_size=100",
                                      "validation_fraction=0.3"};
  Loader V(o, 1, 5, true);
  const uint64_t n = V.stage().windows(), batches = (n + 99) / 100;
  ASSERT_GT(n % 100, 0u) << "pick sizes so the last batch is partial";
  EXPECT_EQ(V.stage().total_batches(), batches);
  Batch meta;
  const Tensors last = V.batch(batches - 1, &meta);
  ASSERT_FALSE(last.empty());
  EXPECT_EQ(meta.samples, n % 100);
  const auto mask = last.at("mask").span<float>();
  const int64_t W = last.at("mask").dim(1);
  for (int64_t r = 0; r < 100; ++r)
    EXPECT_EQ(mask[static_cast<size_t>(r * W)], r < static_cast<int64_t>(n % 100) ? 1.0f : 0.0f);
  EXPECT_TRUE(V.batch(batches).empty());
  // The runner seeks to 0 before each pass: the pass repeats exactly.
  const Tensors first = V.batch(0);
  V.stage().seek(0, V.ctx());
  EXPECT_TRUE(same_batch(V.batch(0), first));
}

TEST(Loader, UnreadableFilesAreCountedNotFatal) {
  TempDir dir("skip");
  const auto games = slp::write_synthetic_games(dir.path() / "ok", 3, 5, 900);
  { std::ofstream(dir.path() / "garbage.slp") << "this is not a replay"; }
  Loader L({paths_of(dir.path()), "batch_size=16", "min_frames=100", "validation_fraction=0"});
  const auto skipped = L.stage().skipped();
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0], (std::pair<std::string, size_t>{"unreadable", 1}));
  EXPECT_NE(L.stage().report().find("garbage.slp (offset"), std::string::npos)
      << L.stage().report();
  EXPECT_EQ(L.stage().sources().size(), 3u);
}

// A symlink loop or a FIFO named *.slp in a replay folder used to abort training setup (or
// hang it): both are counted as unreadable with their paths, the games still load.
TEST(Loader, FolderHazardsAreCountedNotFatal) {
  TempDir dir("hazards");
  slp::write_synthetic_games(dir.path(), 3, 5, 900);
  fs::create_symlink("loop2", dir.path() / "loop1");
  fs::create_symlink("loop1", dir.path() / "loop2");
  ASSERT_EQ(::mkfifo((dir.path() / "fifo.slp").c_str(), 0600), 0);
  ::alarm(60);  // a hang on the FIFO fails the test instead of stalling the suite
  Loader L({paths_of(dir.path()), "batch_size=16", "min_frames=100", "validation_fraction=0"});
  ::alarm(0);
  const auto list = L.stage().skipped();
  std::map<std::string, size_t> skipped(list.begin(), list.end());
  EXPECT_EQ(skipped["unreadable"], 3u) << L.stage().report();
  const std::string& rep = L.stage().report();
  EXPECT_NE(rep.find("loop1 (symlink loop)"), std::string::npos) << rep;
  EXPECT_NE(rep.find("fifo.slp (not a regular file)"), std::string::npos) << rep;
  EXPECT_EQ(L.stage().sources().size(), 3u);
}

TEST(Loader, RealCorpusFolderReportsSkipsAndDamage) {
  LOADER_REQUIRE_REPLAYS();
  Loader L({paths_of(replay_dir()), "batch_size=64"});
  const std::string& rep = L.stage().report();
  EXPECT_NE(rep.find("corrupt.slp"), std::string::npos) << rep;  // damaged: counted, not fatal
  EXPECT_GE(L.stage().damaged(), 1u);
  const auto list = L.stage().skipped();
  std::map<std::string, size_t> skipped(list.begin(), list.end());
  EXPECT_GT(skipped["players"], 0u) << rep;  // doubles, FFA, home-run contest
  EXPECT_GT(L.stage().windows(), 1000u);
}

// A game recorded twice (a copied file here) loads once, the copy counted and named; the copy
// kept is the first in identity order, so the file order does not choose it.
TEST(Loader, DuplicateGamesAreSkippedAndCounted) {
  TempDir dir("dups");
  const auto games = slp::write_synthetic_games(dir.path(), 3, 5, 900);
  fs::copy_file(games[0], dir.path() / "copy_of_first.slp");
  Loader L({paths_of(dir.path()), "batch_size=16", "min_frames=100", "validation_fraction=0"});
  const auto list = L.stage().skipped();
  std::map<std::string, size_t> skipped(list.begin(), list.end());
  EXPECT_EQ(skipped["duplicate"], 1u) << L.stage().report();
  EXPECT_NE(L.stage().report().find("(the same game as "), std::string::npos) << L.stage().report();
  EXPECT_EQ(L.stage().sources().size(), 3u);
  Loader all({paths_of(dir.path()), "batch_size=16", "min_frames=100", "validation_fraction=0",
              "skip_duplicates=false"});
  EXPECT_EQ(all.stage().sources().size(), 4u);
  EXPECT_TRUE(all.stage().skipped().empty());
}

TEST(Loader, MinVersionNeedsAVersion) {
  try {
    Loader L({paths_of(synth_dir()), "min_version=3.x"});
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("is not a version"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slp::Version::parse("3.14.0"), (slp::Version{3, 14, 0}));
  EXPECT_EQ(slp::Version::parse("2"), (slp::Version{2, 0, 0}));
  for (const char* bad : {"", "3.", "3.1.2.4", "a.b", "300", "3..1"})
    EXPECT_FALSE(slp::Version::parse(bad).has_value()) << bad;
}

// On the real replays: games with a CPU and recordings of old Slippi versions are left out when
// asked, each counted with its reason; the shared folder holds one game twice.
TEST(Loader, RealCorpusHumanVersionAndDuplicateFilters) {
  LOADER_REQUIRE_REPLAYS();
  Loader plain({paths_of(replay_dir()), "batch_size=64"});
  auto counts = [](Loader& l) {
    const auto list = l.stage().skipped();
    return std::map<std::string, size_t>(list.begin(), list.end());
  };
  EXPECT_GE(counts(plain)["duplicate"], 1u) << plain.stage().report();
  Loader humans({paths_of(replay_dir()), "batch_size=64", "humans_only=true"});
  EXPECT_GT(counts(humans)["not human"], 0u) << humans.stage().report();
  EXPECT_LT(humans.stage().sources().size(), plain.stage().sources().size());
  Loader recent({paths_of(replay_dir()), "batch_size=64", "min_version=3.0.0"});
  EXPECT_GT(counts(recent)["version"], 0u) << recent.stage().report();
  EXPECT_NE(recent.stage().report().find("(Slippi "), std::string::npos) << recent.stage().report();
}

// Inputs whose features would not fit the memory budget stop setup before any decoding, with
// the figures and the knobs; a budget that is not a number is a config error.
TEST(Loader, FeaturesOverTheMemoryBudgetAreRefusedBeforeLoading) {
  try {
    Loader L({paths_of(synth_dir()), "memory=0.0001"});  // about 100 KiB
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("8 .slp files ("), std::string::npos) << m;
    EXPECT_NE(m.find("of features"), std::string::npos) << m;
    EXPECT_NE(m.find("usable (replays.memory: 0.0001 GiB)"), std::string::npos) << m;
    EXPECT_NE(m.find("shard: games"), std::string::npos) << m;
    // resident_games: auto is the default: it could not read on demand here, and says why
    // rather than suggesting the setting in force.
    EXPECT_EQ(m.find("resident_games: auto"), std::string::npos) << m;
    EXPECT_NE(m.find("Games read on demand need at least 3 in memory and 40 % of this budget "
                     "holds 0"),
              std::string::npos)
        << m;
  }
  try {
    Loader L({paths_of(synth_dir()), "memory=0.0001", "resident_games=all"});
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("Read games on demand (resident_games: auto, or N games "
                                         "at once)"),
              std::string::npos)
        << e.what();
  }
  // Every game's features at 95 % of the budget: too little room for the rest of the run (it
  // ran out of memory in setup, saying nothing of why).
  uint64_t slp_bytes = 0;
  for (const auto& e : fs::directory_iterator(synth_dir())) slp_bytes += fs::file_size(e.path());
  char budget[64];
  std::snprintf(budget, sizeof budget, "memory=%.9f", 0.7 * slp_bytes / 0.95 / 1073741824.0);
  const std::string tight = error_of([&] {
    Loader({paths_of(synth_dir()), budget, "resident_games=all"});
  });
  EXPECT_NE(tight.find("features past 90 % of it leave too little for the rest of the run"),
            std::string::npos)
      << tight;
  EXPECT_THROW(Loader({paths_of(synth_dir()), "memory=lots"}), std::exception);
  Loader ok({paths_of(synth_dir()), "memory=1"});  // 1 GiB is plenty for 8 small games
  EXPECT_GT(ok.stage().windows(), 0u);
}

// A corpus counts in the check too: the .slp bytes it was built from, and a format-version-1
// zstd corpus the columns that opening it unpacks into memory (read from the manifest before
// anything is opened). Today's --zstd corpus decodes one game at a time: nothing more to count.
TEST(Loader, CorpusFootprintIsCheckedBeforeOpening) {
  const std::vector<fs::path> inputs = {synth_dir()};
  uint64_t slp_bytes = 0;
  for (const auto& f : slp::find_replays(inputs)) slp_bytes += fs::file_size(f);
  TempDir plain("fp-plain"), packed("fp-zstd"), whole("fp-zstd-v1");
  slp::build_corpus(inputs, plain.path());
  slp::build_corpus(inputs, whole.path());
  slp::testing::rewrite_as_whole_column_zstd(whole.path());
  slp::CorpusOptions zstd;
  zstd.zstd = true;
  slp::build_corpus(inputs, packed.path(), zstd);
  const slp::CorpusFootprint a = slp::corpus_footprint(plain.path()),
                             b = slp::corpus_footprint(whole.path()),
                             c = slp::corpus_footprint(packed.path());
  EXPECT_EQ(a.games, 8u);
  EXPECT_EQ(a.source_bytes, slp_bytes);
  EXPECT_EQ(a.decompressed_bytes, 0u);
  EXPECT_EQ(b.source_bytes, slp_bytes);
  EXPECT_GT(b.decompressed_bytes, slp_bytes / 4);  // every column, unpacked
  EXPECT_EQ(c.source_bytes, slp_bytes);
  EXPECT_EQ(c.decompressed_bytes, 0u);
  // The columns each maps whole at open, which an address space limit (ulimit -v) counts.
  EXPECT_EQ(a.mapped_bytes, fs::file_size(plain.path() / "columns.bin"));
  EXPECT_EQ(c.mapped_bytes, fs::file_size(packed.path() / "columns.bin"));
  EXPECT_LT(c.mapped_bytes, a.mapped_bytes);
  // The budget between the two: the plain and today's zstd corpus load, the version-1 zstd one
  // is refused, naming both figures.
  const double gib =
      (0.7 * static_cast<double>(slp_bytes) + 0.5 * static_cast<double>(b.decompressed_bytes)) /
      1073741824.0;
  const std::string budget = "memory=" + std::to_string(gib);
  Loader ok({paths_of(plain.path()), budget});
  EXPECT_GT(ok.stage().windows(), 0u);
  Loader ok_zstd({paths_of(packed.path()), budget});
  EXPECT_EQ(ok_zstd.stage().windows(), ok.stage().windows());
  try {
    Loader L({paths_of(whole.path()), budget});
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("1 corpora ("), std::string::npos) << m;
    EXPECT_NE(m.find("of zstd columns to unpack"), std::string::npos) << m;
  }
  // A damaged manifest is named, with what to do.
  { std::ofstream(plain.path() / "manifest.json") << "{\"sources\": ["; }
  try {
    Loader L({paths_of(plain.path()), "memory=1"});
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("manifest.json is malformed"), std::string::npos) << m;
    EXPECT_NE(m.find("slipstream corpus build"), std::string::npos) << m;
  }
}

TEST(Loader, NoWindowsIsAClearError) {
  try {
    Loader L({paths_of(synth_dir()), "min_frames=100000"});
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no training windows"), std::string::npos) << m;
    EXPECT_NE(m.find("8 shorter than min_frames=100000"), std::string::npos) << m;
  }
  EXPECT_THROW(Loader({paths_of(synth_dir()), "stages=[63]"}), std::exception);
  EXPECT_THROW(Loader({"paths=[\"/no/such/dir\"]"}), std::exception);  // and synthetic: 0
}

TEST(Loader, CharacterFilterKeepsOnlyThatPerspective) {
  Loader all({paths_of(synth_dir()), "batch_size=16", "validation_fraction=0", "shuffle=false"});
  const int ch = at3(all.batch(0), "character", 0, 0, 0);
  Loader L({paths_of(synth_dir()), "batch_size=16", "validation_fraction=0",
            "characters=[" + std::to_string(ch) + "]"});
  for (uint64_t k = 0; k < std::min<uint64_t>(5, L.stage().batches_per_epoch()); ++k) {
    const Tensors t = L.batch(k);
    for (int64_t r = 0; r < 16; ++r) ASSERT_EQ(at3(t, "character", r, 0, 0), ch);
  }
}

// `characters` and `stages` take names as well as ids: the same filter, the same batches, and
// the same cached dataset.
TEST(Loader, NamedFiltersEqualIdFilters) {
  Loader all({paths_of(synth_dir()), "batch_size=16", "validation_fraction=0", "shuffle=false"});
  const Tensors first = all.batch(0);
  const int ch = at3(first, "character", 0, 0, 0);
  const int st = at3(first, "stage", 0, 0, 0);
  const auto ch_name = slp::internal_character_name(ch);
  const auto st_name = slp::stage_name(st);
  ASSERT_TRUE(ch_name && st_name) << ch << " " << st;
  const std::vector<std::string> common = {paths_of(synth_dir()), "batch_size=16",
                                           "validation_fraction=0"};
  auto with = [&](std::string chars, std::string stages) {
    auto o = common;
    o.push_back("characters=" + chars);
    o.push_back("stages=" + stages);
    return o;
  };
  Loader by_id(with("[" + std::to_string(ch) + "]", "[" + std::to_string(st) + "]"));
  ::testing::internal::CaptureStderr();
  // Upper case, and the id repeated by name: still the same filter.
  std::string upper(*ch_name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  Loader by_name(with("[\"" + upper + "\", " + std::to_string(ch) + "]",
                      "[\"" + std::string(*st_name) + "\"]"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find(" files -> "), std::string::npos) << "loaded again, not shared:\n" << err;
  ASSERT_GT(by_id.stage().windows(), 0u);
  ASSERT_EQ(by_id.stage().windows(), by_name.stage().windows());
  for (uint64_t k = 0; k < std::min<uint64_t>(3, by_id.stage().batches_per_epoch()); ++k)
    EXPECT_TRUE(same_batch(by_id.batch(k), by_name.batch(k))) << "batch " << k;
  // Names of both players' characters, lower case, against their ids.
  const int op = at3(first, "character", 0, 0, 1);
  const auto op_name = slp::internal_character_name(op);
  ASSERT_TRUE(op_name) << op;
  std::string lower(*op_name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  Loader names({paths_of(synth_dir()), "batch_size=16", "validation_fraction=0",
                "characters=[\"" + lower + "\", \"" + std::string(*ch_name) + "\"]"});
  Loader ids({paths_of(synth_dir()), "batch_size=16", "validation_fraction=0",
              "characters=[" + std::to_string(op) + ", " + std::to_string(ch) + "]"});
  EXPECT_EQ(names.stage().windows(), ids.stage().windows());
  EXPECT_TRUE(same_batch(names.batch(0), ids.batch(0)));
}

TEST(Loader, UnknownNamesInFiltersAreConfigErrors) {
  auto error_of = [](const std::string& filter) -> std::string {
    try {
      Loader L({paths_of(synth_dir()), filter});
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no ConfigError";
  };
  const std::string ch = error_of("characters=[fox, foxx]");
  EXPECT_NE(ch.find("unknown character 'foxx'; did you mean 'fox'?"), std::string::npos) << ch;
  EXPECT_NE(ch.find("Captain Falcon"), std::string::npos) << ch;  // the valid names
  const std::string st = error_of("stages=[battlefeild]");
  EXPECT_NE(st.find("unknown stage 'battlefeild'; did you mean 'battlefield'?"), std::string::npos)
      << st;
  const std::string fd = error_of("stages=[FinalDest]");
  EXPECT_NE(fd.find("unknown stage 'FinalDest'"), std::string::npos) << fd;
  const std::string range = error_of("characters=[300]");
  EXPECT_NE(range.find("character id 300 is out of range [0, 255]"), std::string::npos) << range;
  EXPECT_NE(error_of("stages=[-1]").find("out of range"), std::string::npos);
}

TEST(Loader, CorpusGivesTheSameBatchesAsParsing) {
  TempDir corpus("corpus");
  const fs::path inputs[] = {synth_dir()};
  const auto report = slp::build_corpus(inputs, corpus.path());
  ASSERT_EQ(report.games, 8u);
  const std::vector<std::string> common = {"batch_size=32", "validation_fraction=0.2", "delay=1"};
  auto with = [&](const fs::path& p) {
    auto o = common;
    o.push_back(paths_of(p));
    return o;
  };
  Loader direct(with(synth_dir()), 9, 2), cached(with(corpus.path()), 9, 2);
  ASSERT_EQ(direct.stage().windows(), cached.stage().windows());
  ASSERT_EQ(direct.stage().batches_per_epoch(), cached.stage().batches_per_epoch());
  for (uint64_t k : std::vector<uint64_t>{0, 1, direct.stage().batches_per_epoch() + 1})
    EXPECT_TRUE(same_batch(direct.batch(k), cached.batch(k))) << "batch " << k;
  Loader vd(with(synth_dir()), 9, 1, true), vc(with(corpus.path()), 9, 1, true);
  EXPECT_TRUE(same_batch(vd.batch(0), vc.batch(0)));
}

// Replays dropped into a corpus folder beside its manifest are not in the corpus: the loader's
// report says so and how to include them, instead of ignoring them silently.
TEST(Loader, ReplaysBesideACorpusManifestAreNamedNotSilentlyIgnored) {
  TempDir corpus("corpus_beside");
  const fs::path inputs[] = {synth_dir()};
  slp::build_corpus(inputs, corpus.path());
  fs::copy_file(*fs::directory_iterator(synth_dir()), corpus.path() / "new.slp");
  Loader L({paths_of(corpus.path()), "batch_size=8", "validation_fraction=0"});
  EXPECT_NE(L.stage().report().find("1 .slp file(s) beside its manifest.json are not in the "
                                    "corpus and are not read"),
            std::string::npos)
      << L.stage().report();
}

// A mapping where a list belongs is an error naming the parameter, never an empty list in its
// place (paths: {} would train on synthetic games, characters: {} on every character).
TEST(Loader, AMappingForAListParameterIsRefused) {
  for (const char* set : {"paths={a: 1}", "characters={fox: 1}"}) {
    const std::string m = error_of([&] { Loader L({set}); });
    EXPECT_NE(m.find("expects a list of string, got a mapping"), std::string::npos) << set << m;
  }
}

// A game corpus holds its games' rows as built (rolled-back frames kept or not): a run reading
// the other way is refused with both settings and the fix, not given other rows silently.
TEST(Loader, AGameCorpusBuiltWithOtherRollbacksIsRefused) {
  TempDir corpus("corpus_rollbacks");
  const fs::path inputs[] = {synth_dir()};
  slp::build_corpus(inputs, corpus.path());
  const std::string m = error_of([&] { Loader L({paths_of(corpus.path()), "rollback=all"}); });
  EXPECT_NE(m.find("a game corpus built keeping the last copy of rolled-back frames; this run "
                   "reads rollback: all. Set replays.rollback to last, or build another corpus "
                   "with `slipstream corpus build --keep-rollbacks`"),
            std::string::npos)
      << m;
  Loader L({paths_of(corpus.path()), "rollback=last", "batch_size=8"});  // as built: read
  EXPECT_GT(L.stage().windows(), 0u);
}

// A corpus inside a folder given as a path is not read (the folder gives its .slp files): the
// report names it and how to read it.
TEST(Loader, ACorpusInsideAFolderIsNamedNotSilentlyIgnored) {
  TempDir folder("corpus_inside");
  fs::copy(synth_dir(), folder.path() / "games");
  const fs::path inputs[] = {synth_dir()};
  slp::build_corpus(inputs, folder.path() / "cache" / "corpus");
  Loader L({paths_of(folder.path()), "batch_size=8", "validation_fraction=0"});
  EXPECT_NE(L.stage().report().find((folder.path() / "cache" / "corpus").string() +
                                    ": a corpus inside " + folder.path().string() +
                                    ", which gives its .slp files only, is not read; name it in "
                                    "replays.paths to read it"),
            std::string::npos)
      << L.stage().report();
}

TEST(Loader, RealCorpusGivesTheSameBatchesAsParsing) {
  LOADER_REQUIRE_REPLAYS();
  TempDir corpus("realcorpus");
  const fs::path inputs[] = {replay_dir() / "peppi"};
  slp::CorpusOptions opt;
  opt.zstd = true;
  slp::build_corpus(inputs, corpus.path(), opt);
  Loader direct({paths_of(replay_dir() / "peppi"), "batch_size=32", "min_frames=100"}, 4);
  Loader cached({paths_of(corpus.path()), "batch_size=32", "min_frames=100"}, 4);
  ASSERT_EQ(direct.stage().windows(), cached.stage().windows());
  for (uint64_t k : std::vector<uint64_t>{0, 3})
    EXPECT_TRUE(same_batch(direct.batch(k), cached.batch(k)));
}

// Paths that were given but hold no replays are an error naming each path, even where the
// graph would generate synthetic games for empty paths: training on something else is worse.
TEST(Loader, GivenPathsWithoutReplaysAreAnErrorNotSyntheticData) {
  TempDir empty("empty");
  const std::string dir = empty.str();
  try {
    Loader L({"paths=[\"" + dir + "\", \"" + dir + "/*.slp\"]", "synthetic=4",
              "synthetic_dir=\"" + dir + "/synth\""});
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(
        m.find(dir + " (a folder with no .slp files), " + dir + "/*.slp (matches no .slp file)"),
        std::string::npos)
        << m;
  }
  EXPECT_FALSE(fs::exists(dir + "/synth"));  // nothing generated
}

// `~/` in paths expands to $HOME (also inside a list, where the shell does not expand it).
TEST(Loader, TildeInPathsIsTheHomeDirectory) {
  const char* old = std::getenv("HOME");
  const std::string saved = old ? old : "";
  setenv("HOME", synth_dir().parent_path().c_str(), 1);
  Loader L({"paths=[\"~/" + synth_dir().filename().string() + "\"]", "batch_size=16"});
  if (old) setenv("HOME", saved.c_str(), 1);
  EXPECT_GT(L.stage().windows(), 0u);
}

// run.steps set: epochs repeat until the run stops there (run.epochs = 1 does not end it early).
TEST(Loader, StepsSetRepeatsEpochsUntilReached) {
  Loader one({paths_of(synth_dir()), "batch_size=16"});
  const uint64_t per_epoch = one.stage().batches_per_epoch();
  ASSERT_GT(per_epoch, 0u);
  EXPECT_TRUE(one.batch(per_epoch).empty());  // one epoch, then the end
  Loader L({paths_of(synth_dir()), "batch_size=16"}, 1, 1, false, 0, 1, 3 * per_epoch + 1);
  EXPECT_FALSE(L.batch(per_epoch).empty());
  EXPECT_FALSE(L.batch(3 * per_epoch).empty());
  EXPECT_EQ(L.run().total_steps.load(), 3 * per_epoch + 1);  // the step count stays the user's
}

TEST(Loader, SyntheticFallbackWhenNoPaths) {
  TempDir cache("fallback");
  Loader L({"synthetic=4", "synthetic_dir=\"" + cache.str() + "\"", "batch_size=16"}, 11);
  const fs::path dir = L.stage().synthetic_dir();
  EXPECT_EQ(dir, cache.path() / "11-4");
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.path().extension() == ".slp";
  EXPECT_EQ(files, 4u);
  EXPECT_NE(L.stage().report().find("synthetic"), std::string::npos);
  EXPECT_FALSE(L.batch(0).empty());
  // A second loader reuses the cached games.
  const auto t0 = fs::last_write_time(dir / "synth_00000.slp");
  Loader again({"synthetic=4", "synthetic_dir=\"" + cache.str() + "\"", "batch_size=16"}, 11);
  EXPECT_EQ(fs::last_write_time(dir / "synth_00000.slp"), t0);
  EXPECT_TRUE(same_batch(L.batch(1), again.batch(1)));
}

// A synthetic game of `frames` frames drawn from `seed`, to edit before writing it.
slp::Game synthetic_game(uint64_t seed, int frames) {
  slp::SynthOptions so;
  so.seed = seed;
  so.frames = frames;
  return slp::synthesize_game(so);
}

// A synthetic game whose port 0 has a follower (a copy of the leader, shifted): slot 2 holds it
// in port 0's perspective only.
TEST(Loader, NanaIsSlotTwoForThePlayersPerspective) {
  TempDir dir("nana");
  slp::Game g = synthetic_game(3, 800);
  auto& p0 = g.frames.ports[0];
  p0.follower = p0.leader;
  for (auto& x : p0.follower->post.x) x += 1000.0f;
  for (auto& c : p0.follower->post.character) c = 11;  // Nana
  slp::write_slp_file(g, dir.path() / "ics.slp");
  Loader L({paths_of(dir.path()), "batch_size=4", "min_frames=100", "validation_fraction=0",
            "shuffle=false"});
  const slp::Game parsed = slp::parse_slp_file(dir.path() / "ics.slp");
  const auto& nana = *parsed.frames.ports[0].follower;
  int checked[2] = {0, 0};
  for (uint64_t k = 0; k < L.stage().batches_per_epoch(); ++k) {
    const Tensors t = L.batch(k);
    for (int r = 0; r < 4; ++r) {
      const auto w = L.stage().window(k, r);
      const int who = w.player_port == 0 ? 0 : 1;
      if (checked[who]++ > 3) continue;
      EXPECT_EQ(w.has_follower, who == 0);
      for (int64_t i = 0; i < 60; i += 11) {
        const size_t row = w.start + static_cast<size_t>(i);  // no rollbacks in synthetic games
        if (who == 0) {
          EXPECT_EQ(num(t, r, i, 2, kExists), 1.0f);
          EXPECT_EQ(num(t, r, i, 2, kPosX), nana.post.x[row]);
          EXPECT_EQ(at3(t, "character", r, i, 2), 11);
        } else {
          for (int f = 0; f < kNumericFeatures; ++f) EXPECT_EQ(num(t, r, i, 2, f), 0.0f);
          EXPECT_EQ(num(t, r, i, 1, kPosX), parsed.frames.ports[0].leader.post.x[row]);
        }
      }
    }
  }
  EXPECT_GT(checked[0], 0);
  EXPECT_GT(checked[1], 0);
}

// fields: libmelee reads the Post-Frame fields as libmelee's GameState shows them: frame
// counters truncated (toward zero, NaN as 0), hitstun the Misc AS value in any state,
// invulnerable the hurtbox state; slippi keeps the replay's values.
TEST(Loader, LibmeleeFieldReading) {
  TempDir dir("fields");
  slp::Game g = synthetic_game(4, 400);
  for (auto& port : g.frames.ports) {
    auto& p = port.leader.post;
    for (size_t r = 0; r < p.state_age.size(); ++r) {
      p.state_age[r] = static_cast<float>(r % 7) + 0.75f;
      p.hitlag_remaining[r] = r % 3 == 0 ? -1.5f : 2.25f;
      p.misc_as[r] = r % 5 == 0 ? std::nanf("") : 9.9f;
      p.state_flags_4[r] = 0;                            // never in hitstun
      p.state_flags_2[r] = 0;                            // never flagged invulnerable
      p.hurtbox_state[r] = static_cast<uint8_t>(r % 3);  // 0 vulnerable, 1, 2 not
    }
  }
  slp::write_slp_file(g, dir.path() / "g.slp");
  const std::vector<std::string> base = {paths_of(dir.path()), "batch_size=4", "min_frames=100",
                                         "validation_fraction=0", "shuffle=false"};
  auto with = [&](const char* fields) {
    auto sets = base;
    sets.push_back(std::string("fields=") + fields);
    return sets;
  };
  Loader slippi(with("slippi")), lm(with("libmelee"));
  ASSERT_EQ(slippi.stage().batches_per_epoch(), lm.stage().batches_per_epoch());
  int checked = 0;
  for (uint64_t k = 0; k < lm.stage().batches_per_epoch(); ++k) {
    const Tensors a = slippi.batch(k), b = lm.batch(k);
    for (int r = 0; r < 4; ++r) {
      const auto w = lm.stage().window(k, r);
      const auto& post = g.frames.ports[w.player_port == 0 ? 0 : 1].leader.post;
      for (int64_t i = 0; i < 60; i += 7) {
        const size_t row = w.start + static_cast<size_t>(i);  // no rollbacks in synthetic games
        EXPECT_EQ(num(a, r, i, 0, kActionFrame), post.state_age[row]);
        EXPECT_EQ(num(b, r, i, 0, kActionFrame), std::trunc(post.state_age[row]));
        EXPECT_EQ(num(b, r, i, 0, kHitlag), std::trunc(post.hitlag_remaining[row]));
        EXPECT_EQ(num(a, r, i, 0, kHitstun), 0.0f);  // no hitstun flag
        EXPECT_EQ(num(b, r, i, 0, kHitstun), std::isnan(post.misc_as[row]) ? 0.0f : 9.0f);
        EXPECT_EQ(num(a, r, i, 0, kInvulnerable), 0.0f);
        EXPECT_EQ(num(b, r, i, 0, kInvulnerable), post.hurtbox_state[row] != 0 ? 1.0f : 0.0f);
        EXPECT_EQ(num(b, r, i, 0, kPosX), num(a, r, i, 0, kPosX));
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(Loader, RealIceClimbersFillSlotTwo) {
  LOADER_REQUIRE_REPLAYS();
  Loader L(
      {paths_of(replay_dir() / "peppi" / "ics2.slp"), "batch_size=16", "validation_fraction=0"});
  bool saw_nana = false, saw_without = false;
  for (uint64_t k = 0; k < L.stage().batches_per_epoch(); ++k) {
    const Tensors t = L.batch(k);
    for (int r = 0; r < 16; ++r) {
      const auto w = L.stage().window(k, r);
      const float e = num(t, r, 0, 2, kExists);
      if (w.has_follower) {
        saw_nana |= e == 1.0f && at3(t, "character", r, 0, 2) == 11;
      } else {
        EXPECT_EQ(e, 0.0f);
      }
      saw_without |= !w.has_follower;
    }
  }
  EXPECT_TRUE(saw_nana);
  EXPECT_TRUE(saw_without);
}

TEST(Loader, SharedDatasetBetweenTrainAndValidationCopies) {
  const std::vector<std::string> o = {paths_of(synth_dir()), "batch_size=16"};
  Loader train(o);
  Loader val(o, 1, 1, true);  // finds the training copy's games: no second report
  EXPECT_EQ(train.stage().windows() > 0, true);
  EXPECT_EQ(val.stage().sources().size() + train.stage().sources().size(), 8u);
}

}  // namespace
}  // namespace slipstream::melee::testing

// The feature corpus (stages/melee/feature_corpus.h) and bounded memory (resident_games): what
// a feature corpus stores is what the loader extracts, it gives the batches parsing gives, it
// is refused when damaged or extracted under other settings; with games read on demand an
// epoch still reads every window once, batches stay a function of the index, and no more
// games than asked for are in memory at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/run_directory.h"
#include "stages/melee/feature_corpus.h"
#include "stages/melee/replay_inputs.h"
#include "stages/melee/replay_split.h"
#include "stages/melee/slp/corpus.h"
#include "stages/melee/slp/parser.h"
#include "tests/melee_data/loader_fixture.h"
#include "tests/slp/corpus_damage.h"

namespace slipstream::melee::testing {
namespace {

std::string paths_of(const fs::path& p) {
  return "paths=[\"" + p.string() + "\"]";
}

// A feature corpus of the shared synthetic games, built once per process.
const fs::path& feature_dir() {
  static TempDir dir("features");
  static bool made = [] {
    const FeatureBuildReport r = build_feature_corpus({synth_dir().string()}, dir.path());
    EXPECT_EQ(r.games, 8u);
    EXPECT_EQ(r.skipped, 0u);
    EXPECT_GT(r.feature_bytes, r.stored_bytes);
    return true;
  }();
  (void)made;
  return dir.path();
}

template <typename T>
void expect_same(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_TRUE(a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0) << what;
}

void expect_same_track(const TrackFeatures& a, const TrackFeatures& b, const std::string& what) {
  expect_same(a.numeric, b.numeric, what + " numeric");
  expect_same(a.action, b.action, what + " action");
  expect_same(a.character, b.character, what + " character");
}

TEST(FeatureCorpus, StoresWhatTheLoaderExtracts) {
  const FeatureCorpus c = FeatureCorpus::open(feature_dir());
  ASSERT_EQ(c.size(), 8u);
  std::map<std::string, size_t> by_source;
  for (size_t g = 0; g < c.size(); ++g) by_source[c.entry(g).source] = g;
  for (const fs::path& file : slp::find_replays(std::vector<fs::path>{synth_dir()})) {
    slp::ParseOptions opt;
    opt.items = false;
    const slp::Game game = slp::parse_slp_file(file.string(), opt);
    const GameFeatures want = extract_features(slp::view_of(game), RollbackMode::last);
    ASSERT_TRUE(by_source.count(want.source)) << want.source;
    const size_t g = by_source[want.source];
    const GameFeatures got = c.load(g);
    EXPECT_EQ(got.identity, want.identity);
    EXPECT_EQ(got.stage, want.stage);
    ASSERT_EQ(got.rows, want.rows);
    expect_same(got.frame, want.frame, "frame");
    expect_same(got.recorded_row, want.recorded_row, "recorded_row");
    ASSERT_EQ(got.players.size(), want.players.size());
    for (size_t p = 0; p < got.players.size(); ++p) {
      const PlayerFeatures &a = got.players[p], &b = want.players[p];
      EXPECT_EQ(a.port, b.port);
      EXPECT_EQ(a.character, b.character);
      EXPECT_EQ(a.has_follower, b.has_follower);
      expect_same_track(a.leader, b.leader, "leader");
      expect_same_track(a.follower, b.follower, "follower");
      expect_same(a.controller.buttons, b.controller.buttons, "buttons");
      expect_same(a.controller.analog, b.controller.analog, "analog");
    }
    // The record holds what the filters read.
    const FeatureEntry& e = c.entry(g);
    EXPECT_EQ(e.start.stage, game.info.start.stage);
    EXPECT_EQ(e.start.random_seed, game.info.start.random_seed);
    EXPECT_EQ(e.start.version, game.info.start.version);
    ASSERT_EQ(e.start.players.size(), game.info.start.players.size());
    for (size_t p = 0; p < e.start.players.size(); ++p) {
      EXPECT_EQ(e.start.players[p].port, game.info.start.players[p].port);
      EXPECT_EQ(e.start.players[p].character, game.info.start.players[p].character);
      EXPECT_EQ(e.start.players[p].type, game.info.start.players[p].type);
    }
    EXPECT_EQ(e.feature_bytes, want.bytes());
  }
}

// Training, validation and the filters give the same windows from a feature corpus as from
// the .slp files it was built from.
TEST(FeatureCorpus, GivesTheBatchesParsingGives) {
  const std::vector<std::vector<std::string>> settings = {
      {"batch_size=32", "validation_fraction=0.2", "delay=1"},
      {"batch_size=16", "perspectives=first", "min_frames=1450", "window=20", "stride=3"},
      {"batch_size=16", "characters=[fox]", "humans_only=true", "min_version=3.0.0"}};
  for (const auto& common : settings) {
    auto with = [&](const fs::path& p) {
      auto o = common;
      o.push_back(paths_of(p));
      return o;
    };
    Loader direct(with(synth_dir()), 9, 2), stored(with(feature_dir()), 9, 2);
    ASSERT_EQ(direct.stage().windows(), stored.stage().windows()) << common[1];
    ASSERT_EQ(direct.stage().skipped(), stored.stage().skipped()) << common[1];
    // The same games by their same-game keys too (eval's held-out check reads them from the
    // splits file: a run on the corpus, scored on the .slp files, must find its games).
    EXPECT_EQ(direct.stage().same_games(), stored.stage().same_games()) << common[1];
    for (const uint64_t key : stored.stage().same_games()) EXPECT_NE(key, 0u);
    for (uint64_t k : std::vector<uint64_t>{0, 1, direct.stage().batches_per_epoch() + 1})
      EXPECT_TRUE(same_batch(direct.batch(k), stored.batch(k))) << "batch " << k;
    Loader vd(with(synth_dir()), 9, 1, true), vs(with(feature_dir()), 9, 1, true);
    EXPECT_TRUE(same_batch(vd.batch(0), vs.batch(0)));
  }
}

TEST(FeatureCorpus, OtherExtractionSettingsAreRefused) {
  const std::string m = error_of([] { Loader L({paths_of(feature_dir()), "fields=libmelee"}); });
  EXPECT_NE(m.find("extracted with rollback: last, fields: slippi"), std::string::npos) << m;
  EXPECT_NE(m.find("this run reads rollback: last, fields: libmelee"), std::string::npos) << m;
  EXPECT_NE(m.find("corpus build --features"), std::string::npos) << m;
}

// Damage is named with the file (and, inside a game's frame, the byte offset); a build skips
// what it cannot read, saying why, and keeps the rest.
TEST(FeatureCorpus, DamageIsNamed) {
  TempDir dir("features_damaged");
  fs::copy(synth_dir(), dir.path() / "in");
  { std::ofstream(dir.path() / "in" / "junk.slp") << "not a replay"; }
  const FeatureBuildReport r =
      build_feature_corpus({(dir.path() / "in").string()}, dir.path() / "out");
  EXPECT_EQ(r.games, 8u);
  ASSERT_EQ(r.skipped, 1u);
  EXPECT_NE(r.skipped_examples.at(0).find("junk.slp (offset 0"), std::string::npos)
      << r.skipped_examples[0];
  const fs::path out = dir.path() / "out";
  // One flipped byte in the middle of the arrays: the game whose frame holds it is refused on
  // reading (zstd's checksum), naming the file, game and offset; the others read.
  const FeatureCorpus c = FeatureCorpus::open(out);
  std::vector<char> bytes;
  {
    std::ifstream f(out / "features.bin", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  bytes[bytes.size() / 2] ^= 0x5a;
  { std::ofstream(out / "features.bin", std::ios::binary).write(bytes.data(), bytes.size()); }
  size_t damaged = 0;
  for (size_t g = 0; g < c.size(); ++g) {
    const std::string m = error_of([&] { c.load(g); });
    if (m.empty()) continue;
    ++damaged;
    EXPECT_NE(m.find("features.bin (game " + std::to_string(g) + ", byte offset "),
              std::string::npos)
        << m;
  }
  EXPECT_EQ(damaged, 1u);
  // Cut short: refused at open, naming the file.
  fs::resize_file(out / "features.bin", bytes.size() - 10);
  std::string m = error_of([&] { FeatureCorpus::open(out); });
  EXPECT_NE(m.find("features.bin"), std::string::npos) << m;
  EXPECT_NE(m.find("rebuild"), std::string::npos) << m;
  fs::resize_file(out / "features.index", 100);
  m = error_of([&] { FeatureCorpus::open(out); });
  EXPECT_NE(m.find("features.index"), std::string::npos) << m;
  // The loader refuses a corpus it cannot open, naming it and what to do: skipping its games
  // would train on less than was asked for.
  m = error_of([&] { Loader L({paths_of(out)}); });
  EXPECT_NE(m.find(out.string() + ": the corpus cannot be opened ("), std::string::npos) << m;
  EXPECT_NE(m.find("features.index"), std::string::npos) << m;
  EXPECT_NE(m.find("rebuild"), std::string::npos) << m;
  EXPECT_NE(m.find("to train without it, leave it out of replays.paths"), std::string::npos) << m;
}

// The index's records and names carry no per-game checksum: the manifest's CRC-32C of the whole
// index finds a byte flipped there (a source name garbled, a game's size) at open. A corpus built
// before the CRC was kept opens without the check.
TEST(FeatureCorpus, AFlippedIndexByteIsFoundAtOpen) {
  TempDir dir("features_index");
  fs::copy(feature_dir(), dir.path());
  const fs::path index = dir.path() / "features.index";
  std::vector<char> bytes;
  {
    std::ifstream f(index, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  bytes[bytes.size() - 3] ^= 0x20;  // in the source names
  { std::ofstream(index, std::ios::binary).write(bytes.data(), bytes.size()); }
  const std::string m = error_of([&] { FeatureCorpus::open(dir.path()); });
  EXPECT_NE(m.find("features.index: damaged (its CRC-32C is not the one features.json keeps)"),
            std::string::npos)
      << m;
  bytes[bytes.size() - 3] ^= 0x20;
  { std::ofstream(index, std::ios::binary).write(bytes.data(), bytes.size()); }
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(dir.path() / "features.json"));
  ASSERT_TRUE(manifest.contains("index_crc32c"));
  manifest.erase("index_crc32c");
  std::ofstream(dir.path() / "features.json") << manifest.dump();
  EXPECT_EQ(FeatureCorpus::open(dir.path()).size(), 8u);
}

// ---- bounded memory ----

// A checksum of each row's bytes (every port), over one epoch: equal multisets mean the same
// windows filled the same way, in any order.
std::multiset<uint64_t> epoch_rows(Loader& L) {
  std::multiset<uint64_t> rows;
  for (uint64_t k = 0; k < L.stage().batches_per_epoch(); ++k) {
    const Tensors t = L.batch(k);
    const int64_t B = t.at("mask").dim(0);
    for (int64_t r = 0; r < B; ++r) {
      uint64_t h = 0x1234;
      for (const char* port : kPorts) {
        if (std::string(port) == "continues") continue;
        const Tensor& x = t.at(port);
        const size_t row = x.nbytes() / static_cast<size_t>(B);
        const auto* p = static_cast<const uint8_t*>(x.raw()) + row * static_cast<size_t>(r);
        for (size_t i = 0; i < row; ++i) h = mix64(h ^ p[i]);
      }
      rows.insert(h);
    }
  }
  return rows;
}

TEST(BoundedMemory, AnEpochReadsEveryWindowOnceWithFewGamesResident) {
  for (const fs::path& src : {synth_dir(), feature_dir()}) {
    const std::vector<std::string> common = {paths_of(src), "batch_size=16", "stride=20",
                                             "validation_fraction=0.2"};
    auto with = [&](const std::string& resident) {
      auto o = common;
      o.push_back("resident_games=" + resident);
      return o;
    };
    Loader all(with("all"), 5), bounded(with("3"), 5), again(with("3"), 5);
    ASSERT_EQ(all.stage().windows(), bounded.stage().windows());
    ASSERT_EQ(all.stage().batches_per_epoch(), bounded.stage().batches_per_epoch());
    EXPECT_FALSE(all.stage().resident_stats());
    const std::multiset<uint64_t> a = epoch_rows(all), b = epoch_rows(bounded);
    EXPECT_EQ(a, b) << src;
    // One game a pool: a batch reads at most two, and the next one is read ahead.
    const ResidentGames::Stats s = *bounded.stage().resident_stats();
    EXPECT_LE(s.peak_games, 3u);
    EXPECT_GE(s.reads, 6u);  // every training game at least once
    // A function of the index: another loader, asked in another order, gives the same batches.
    const uint64_t last = bounded.stage().batches_per_epoch() - 1;
    for (uint64_t k : std::vector<uint64_t>{last + 3, 2, last, 0})
      EXPECT_TRUE(same_batch(bounded.batch(k), again.batch(k))) << k;
    // The validation copy reads the training copy's dataset, on demand too, every window once.
    Loader va(with("all"), 5, 1, true), vb(with("3"), 5, 1, true);
    EXPECT_EQ(epoch_rows(va), epoch_rows(vb));
  }
}

// Every row of batch k whose mask is all zeros (padding, or a game left out).
size_t masked_rows(const Tensors& t) {
  const Tensor& mask = t.at("mask");
  const int64_t B = mask.dim(0), W = mask.dim(1);
  size_t n = 0;
  for (int64_t r = 0; r < B; ++r) {
    const float* m = mask.data<float>() + r * W;
    n += std::all_of(m, m + W, [](float v) { return v == 0; });
  }
  return n;
}

// A replay replaced after setup is named when its game is read again, and not trained on: its
// rows are left out (masked) and the run goes on, saying so once a game.
TEST(BoundedMemory, AReplayChangedDuringTheRunIsNamedAndLeftOut) {
  TempDir dir("bounded_changed");
  slp::write_synthetic_games(dir.path() / "games", 4, 11, 600);
  Loader L({paths_of(dir.path() / "games"), "batch_size=8", "resident_games=3"}, 2);
  std::vector<std::string> lines;
  L.run().log_sink = [&](const std::string&, const std::string& line, bool) {
    lines.push_back(line);
  };
  TempDir other("bounded_other");
  slp::write_synthetic_games(other.path(), 4, 12, 700);  // other games under the same names
  for (const auto& f : fs::directory_iterator(other.path()))
    fs::copy_file(f.path(), dir.path() / "games" / f.path().filename(),
                  fs::copy_options::overwrite_existing);
  Batch meta;
  const Tensors t = L.batch(0, &meta);
  EXPECT_EQ(masked_rows(t), 8u);  // every game changed: every row left out
  EXPECT_EQ(meta.samples, 0u);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("no longer the game the run's setup read"), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find("its windows are left out of training from now on"), std::string::npos)
      << lines[0];
  const size_t warned = lines.size();
  L.batch(1);
  EXPECT_EQ(lines.size(), warned) << "one warning a game, not one a batch";
}

// One game damaged, read on demand (`L`, options `o`, the last of them resident_games=N): its
// rows were left out (`left_out` of them, `kept` trained) with one warning holding each of
// `named`; resident, the same damage is found at setup, that game skipped as unreadable and the
// run on the rest. The resident loader's report.
std::string expect_one_game_left_out(Loader& L, std::vector<std::string> o, size_t left_out,
                                     size_t kept, const std::vector<std::string>& lines,
                                     const std::vector<std::string>& named) {
  EXPECT_GT(left_out, 0u);
  EXPECT_GT(kept, left_out);
  EXPECT_EQ(lines.size(), 1u);  // one game, named once
  for (const std::string& n : named)
    EXPECT_NE(lines.empty() ? std::string::npos : lines[0].find(n), std::string::npos)
        << (lines.empty() ? "" : lines[0]) << " lacks " << n;
  EXPECT_EQ(L.stage().resident_stats()->unreadable, 1u);
  o.back() = "resident_games=all";
  Loader R(o, 5);
  EXPECT_EQ(R.stage().skipped(), (std::vector<std::pair<std::string, size_t>>{{"unreadable", 1}}));
  EXPECT_LT(R.stage().windows(), L.stage().windows());
  return R.stage().report();
}

// A feature corpus damaged inside one game, read on demand: that game's rows are left out
// (named with its source, the corpus file and the byte offset), the other games train, and the
// batches are the same however often they are asked for (a resume sees what the run saw).
TEST(BoundedMemory, ADamagedGameReadOnDemandIsLeftOutNotFatal) {
  TempDir dir("bounded_damaged");
  fs::copy(feature_dir(), dir.path() / "features");
  const fs::path bin = dir.path() / "features" / "features.bin";
  std::vector<char> bytes;
  {
    std::ifstream f(bin, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  bytes[bytes.size() / 2] ^= 0x5a;
  { std::ofstream(bin, std::ios::binary).write(bytes.data(), bytes.size()); }
  const std::vector<std::string> o = {paths_of(dir.path() / "features"), "batch_size=8",
                                      "stride=20", "validation_fraction=0", "resident_games=3"};
  Loader L(o, 5), again(o, 5);
  std::vector<std::string> lines;
  L.run().log_sink = [&](const std::string&, const std::string& line, bool) {
    lines.push_back(line);
  };
  size_t left_out = 0, kept = 0;
  for (uint64_t k = 0; k < L.stage().batches_per_epoch(); ++k) {
    Batch meta;
    const Tensors t = L.batch(k, &meta);
    const size_t masked = masked_rows(t);
    left_out += masked;
    kept += meta.samples;
    EXPECT_EQ(meta.samples + masked, 8u) << k;
    EXPECT_TRUE(same_batch(t, again.batch(k))) << k;
  }
  expect_one_game_left_out(
      L, o, left_out, kept, lines,
      {"features.bin (game ", "byte offset", ".slp could not be read at batch"});
}

// A game corpus damaged inside one game: each game has its hash, so that game alone is left
// out (at setup when resident, from the batches when it is damaged after setup and read on
// demand), named with the corpus and its source; the corpus was refused whole before.
TEST(BoundedMemory, ADamagedGameOfAGameCorpusIsLeftOutNotFatal) {
  for (const bool zstd : {false, true}) {
    SCOPED_TRACE(zstd ? "zstd" : "raw");
    TempDir dir(zstd ? "game_corpus_damaged_zstd" : "game_corpus_damaged");
    slp::CorpusOptions options;
    options.zstd = zstd;
    options.items = false;
    const fs::path inputs[] = {synth_dir()};
    slp::build_corpus(inputs, dir.path(), options);
    const std::vector<std::string> o = {paths_of(dir.path()), "batch_size=8", "stride=20",
                                        "validation_fraction=0", "resident_games=3"};
    Loader L(o, 5);
    std::vector<std::string> lines;
    L.run().log_sink = [&](const std::string&, const std::string& line, bool) {
      lines.push_back(line);
    };
    slp::testing::damage_game(dir.path(), 1);  // after setup: found when the game is read
    size_t left_out = 0, kept = 0;
    for (uint64_t k = 0; k < L.stage().batches_per_epoch(); ++k) {
      Batch meta;
      const Tensors t = L.batch(k, &meta);
      left_out += masked_rows(t);
      kept += meta.samples;
    }
    const std::string report = expect_one_game_left_out(L, o, left_out, kept, lines,
                                                        {": game 1 (", "does not match its hash"});
    EXPECT_NE(report.find("game 1 ("), std::string::npos) << report;
  }
}

// A manifest missing a field says it is malformed and how to mend it (a bare JSON exception
// before).
TEST(FeatureCorpus, AMalformedManifestSaysRebuild) {
  TempDir dir("features_malformed");
  std::ofstream(dir.path() / kFeatureManifestName)
      << "{\"version\": " << kFeatureCorpusVersion << "}";  // no games, no sizes
  const std::string m = error_of([&] { feature_footprint(dir.path()); });
  EXPECT_NE(m.find("features.json: malformed ("), std::string::npos) << m;
  EXPECT_NE(m.find("rebuild the corpus with `slipstream corpus build --features`"),
            std::string::npos)
      << m;
}

// One build a folder at a time: a second is refused naming the holder.
TEST(FeatureCorpus, OneBuildAFolderAtATime) {
  TempDir dir("features_locked");
  const DirectoryLock held(dir.str(), "another build");
  const std::string m = error_of([&] { build_feature_corpus({synth_dir().string()}, dir.path()); });
  EXPECT_NE(m.find("in use by process"), std::string::npos) << m;
  // In a corpus's words, not a run's (rows, checkpoints, SIGINT).
  EXPECT_NE(m.find("two writers would interleave the corpus's games and index. Wait for it to "
                   "end, then run corpus build --features again"),
            std::string::npos)
      << m;
  EXPECT_FALSE(fs::exists(dir.path() / "features.json"));
}

// rows: streams walks the same windows whether games are resident or read on demand.
TEST(BoundedMemory, StreamsAreTheSameBatches) {
  const std::vector<std::string> common = {paths_of(feature_dir()), "batch_size=2", "window=30",
                                           "stride=0", "rows=streams"};
  auto with = [&](const std::string& resident) {
    auto o = common;
    o.push_back("resident_games=" + resident);
    return o;
  };
  Loader all(with("all"), 3), bounded(with("4"), 3);
  for (uint64_t k = 0; k < all.stage().batches_per_epoch() + 2; ++k)
    ASSERT_TRUE(same_batch(all.batch(k), bounded.batch(k))) << k;
  EXPECT_LE(bounded.stage().resident_stats()->peak_games, 4u);
  const std::string m = error_of([&] {
    auto o = with("3");
    Loader L(o, 3);
  });
  EXPECT_NE(m.find("at least 2 x batch_size (4), got 3"), std::string::npos) << m;
}

// resident_games: auto reads games on demand when the features would not fit the budget.
TEST(BoundedMemory, AutoReadsOnDemandPastTheBudget) {
  const FeatureFootprint f = feature_footprint(feature_dir());
  const double per_game = static_cast<double>(f.feature_bytes) / 8;
  auto budget = [&](double games) {
    return "memory=" + std::to_string(games * per_game / 1073741824.0);
  };
  // The 8 games under 80 % of the budget: all resident.
  Loader fits({paths_of(feature_dir()), "batch_size=16", budget(10.5)});
  EXPECT_FALSE(fits.stage().resident_stats());
  // Over 80 %: on demand, as many games as fit 40 % of it (3).
  Loader on_demand({paths_of(feature_dir()), "batch_size=16", budget(9)});
  ASSERT_TRUE(on_demand.stage().resident_stats());
  on_demand.batch(0);
  EXPECT_LE(on_demand.stage().resident_stats()->peak_games, 3u);
  // all: refused, naming resident_games.
  const std::string m = error_of([&] {
    Loader X({paths_of(feature_dir()), "resident_games=all", "memory=0.0001"});
  });
  EXPECT_NE(m.find("resident_games: auto"), std::string::npos) << m;
}

// The pooled order on its own: every window of an epoch once, pools_of names the games a
// batch reads, games without windows are passed over.
TEST(WindowOrder, PoolsCoverEveryWindowOnce) {
  const std::vector<uint64_t> sizes = {5, 0, 17, 3, 0, 9, 11, 1, 8};
  std::vector<uint64_t> first = {0};
  for (uint64_t s : sizes) first.push_back(first.back() + s);
  const uint64_t n = first.back(), B = 4;
  for (const bool shuffle : {true, false}) {
    WindowOrder o;
    o.reset(n, B, n / B, false, shuffle, true, 7, 0, 1);
    o.set_pools(first, 2);
    for (uint64_t epoch = 0; epoch < 2; ++epoch) {
      std::set<size_t> seen;
      for (uint64_t j = 0; j < n / B; ++j) {
        const uint64_t k = epoch * (n / B) + j;
        std::set<uint32_t> games;
        for (const auto& p : o.pools_of(k))
          for (uint32_t g : o.pool_games(p)) games.insert(g);
        for (uint64_t r = 0; r < B; ++r) {
          const size_t w = o.window_at(k, r);
          ASSERT_LT(w, n);
          EXPECT_TRUE(seen.insert(w).second) << "window " << w << " twice";
          const uint32_t g = static_cast<uint32_t>(std::upper_bound(first.begin(), first.end(), w) -
                                                   first.begin() - 1);
          EXPECT_TRUE(games.count(g)) << "batch " << k << " reads game " << g;
        }
      }
      EXPECT_EQ(seen.size(), (n / B) * B);
    }
  }
}

// A game corpus built into a folder that holds a feature corpus (or the other way round): the
// newer of the two is read and the report says so (the feature corpus was read silently, the
// game corpus built after it never).
TEST(FeatureCorpus, AFolderHoldingBothKindsReadsTheNewerAndSaysSo) {
  TempDir dir("both");
  build_feature_corpus({synth_dir().string()}, dir.path());
  const fs::path inputs[] = {synth_dir()};
  slp::build_corpus(inputs, dir.path());
  // The game corpus is the newer, whatever the clock's resolution.
  fs::last_write_time(
      dir.path() / "manifest.json",
      fs::last_write_time(dir.path() / kFeatureManifestName) + std::chrono::seconds(5));
  Inputs in = resolve_inputs({dir.str()});
  EXPECT_EQ(in.corpora.size(), 1u);
  EXPECT_TRUE(in.feature_corpora.empty());
  ASSERT_EQ(in.ignored.size(), 1u);
  EXPECT_NE(in.ignored[0].find("holds a feature corpus (features.json) and a game corpus "
                               "(manifest.json): the newer, the game corpus, is read"),
            std::string::npos)
      << in.ignored[0];
  fs::last_write_time(dir.path() / kFeatureManifestName,
                      fs::last_write_time(dir.path() / "manifest.json") + std::chrono::seconds(5));
  in = resolve_inputs({dir.str()});
  EXPECT_EQ(in.feature_corpora.size(), 1u);
  EXPECT_TRUE(in.corpora.empty());
}

}  // namespace
}  // namespace slipstream::melee::testing

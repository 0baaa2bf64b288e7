#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <fstream>

#include <nlohmann/json.hpp>

#include "stages/melee/slp/corpus.h"
#include "stages/melee/slp/synth.h"
#include "stages/melee/slp/writer.h"
#include "tests/slp/corpus_damage.h"
#include "tests/slp/corpus_v1.h"
#include "tests/slp/replay_files.h"

namespace slipstream::slp {
namespace {

using testing::expect_same_columns;

std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("slp_corpus_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

void expect_corpus_equals_parse(const std::filesystem::path& dir,
                                const std::vector<std::filesystem::path>& files,
                                const CorpusOptions& options) {
  const Corpus corpus = Corpus::open(dir);
  ASSERT_EQ(corpus.size(), files.size());
  ParseOptions po;
  po.rollbacks = options.rollbacks;
  po.items = options.items;
  size_t frames = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    SCOPED_TRACE(files[i].string());
    const Game parsed = parse_slp_file(files[i], po);
    const CorpusGame game = corpus.game(i);
    const GameView& from_corpus = game.view();
    // A --zstd corpus decodes the game's own columns when the game is read, nothing else.
    if (options.zstd && parsed.frames.size() > 0) {
      EXPECT_GT(game.decoded_bytes(), 0u);
    } else if (!options.zstd) {
      EXPECT_EQ(game.decoded_bytes(), 0u);
    }
    EXPECT_EQ(from_corpus.info, parsed.info);
    expect_same_columns(from_corpus, view_of(parsed), files[i].string());
    if (i == 0 && !from_corpus.frames.frame.empty()) {
      // Each column starts 64-byte aligned; the first game starts at the column start.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(from_corpus.frames.frame.data()) % 64, 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(from_corpus.frames.ports[0].leader.post.x.data()) % 64,
                0u);
    }
    frames += parsed.frames.size();
  }
  EXPECT_EQ(corpus.total_frames(), frames);
}

TEST(SlpCorpus, ReadEqualsParseForAllRealReplays) {
  SLP_REQUIRE_REPLAYS();
  const auto files = testing::all_replays();
  // Uncompressed; --zstd (a frame per game and column); and format version 1's whole-column
  // zstd, which older builds wrote and this one still reads.
  for (const std::string mode : {"raw", "zstd", "zstd_v1"}) {
    SCOPED_TRACE(mode);
    const auto dir = temp_dir(mode);
    CorpusOptions options;
    options.zstd = mode == "zstd";
    const std::vector<std::filesystem::path> inputs = {testing::replay_dir()};
    const CorpusBuildReport r = build_corpus(inputs, dir, options);
    EXPECT_EQ(r.games, files.size());  // corrupt.slp is partial, still readable
    EXPECT_EQ(r.skipped, 0u);
    EXPECT_EQ(r.damaged, 1u);  // ... and said to be, with its byte offset
    ASSERT_EQ(r.examples.size(), 1u);
    EXPECT_NE(r.examples[0].find("corrupt.slp (byte offset 28383"), std::string::npos)
        << r.examples[0];
    if (mode == "zstd_v1") testing::rewrite_as_whole_column_zstd(dir);
    expect_corpus_equals_parse(dir, files, options);
    std::filesystem::remove_all(dir);
  }
}

TEST(SlpCorpus, KeepAllRollbacksAndSkippedFiles) {
  SLP_REQUIRE_REPLAYS();
  const auto src = temp_dir("src");
  std::filesystem::create_directories(src);
  std::filesystem::copy_file(testing::replay("peppi/ics2.slp"), src / "a.slp");
  std::filesystem::copy_file(testing::replay("slippi-js/rollbackFrameTest.slp"), src / "b.slp");
  std::ofstream(src / "c.slp") << "not a replay";
  const auto dir = temp_dir("keepall");
  CorpusOptions options;
  options.rollbacks = Rollbacks::kKeepAll;
  const std::vector<std::filesystem::path> inputs = {src};
  const CorpusBuildReport r = build_corpus(inputs, dir, options);
  EXPECT_EQ(r.games, 2u);
  EXPECT_EQ(r.skipped, 1u);
  ASSERT_EQ(r.examples.size(), 1u);
  EXPECT_NE(r.examples[0].find("skipped " + (src / "c.slp").string()), std::string::npos)
      << r.examples[0];
  expect_corpus_equals_parse(dir, {src / "a.slp", src / "b.slp"}, options);
  EXPECT_EQ(Corpus::open(dir).game(0).view().frames.size(), 9530u);

  std::ifstream in(dir / "manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  ASSERT_EQ(manifest.at("skipped").size(), 1u);
  EXPECT_NE(manifest["skipped"][0]["reason"].get<std::string>().find("byte offset 0"),
            std::string::npos);
  EXPECT_EQ(manifest["sources"][0]["size"], std::filesystem::file_size(src / "a.slp"));
  EXPECT_EQ(manifest["sources"][0]["hash"].get<std::string>().rfind("mix64:", 0), 0u);
  for (const auto& c : manifest["columns"]) EXPECT_EQ(c["offset"].get<size_t>() % 64, 0u);
  std::filesystem::remove_all(src);
  std::filesystem::remove_all(dir);
}

TEST(SlpCorpus, SyntheticGames) {
  const auto src = temp_dir("synth_src");
  const auto paths = write_synthetic_games(src, 4, 3, 800);
  const auto dir = temp_dir("synth");
  CorpusOptions options;
  options.zstd = true;
  const std::vector<std::filesystem::path> inputs = {src};
  build_corpus(inputs, dir, options);
  expect_corpus_equals_parse(dir, paths, options);
  std::filesystem::remove_all(src);
  std::filesystem::remove_all(dir);
}

TEST(SlpCorpus, FormatVersionMismatchSaysRebuild) {
  const auto src = temp_dir("ver_src");
  write_synthetic_games(src, 1, 1, 200);
  const auto dir = temp_dir("ver");
  const std::vector<std::filesystem::path> inputs = {src};
  build_corpus(inputs, dir);
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(dir / "manifest.json"));
  manifest["format_version"] = kCorpusFormatVersion + 1;
  std::ofstream(dir / "manifest.json") << manifest.dump();
  try {
    Corpus::open(dir);
    FAIL() << "opened a corpus of another format version";
  } catch (const CorpusError& e) {
    EXPECT_NE(std::string(e.what()).find("rebuild"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Corpus::open(dir / "missing"), CorpusError);
  std::filesystem::remove_all(src);
  std::filesystem::remove_all(dir);
}

// Two builds into one folder: the second is refused naming the first's process, and writes
// nothing there. A build that fails (here: a file-size limit, as a full disk) leaves no .build/
// or .tmp files, and says why.
TEST(SlpCorpus, OneBuildAtATimeAndNothingLeftByAFailedOne) {
  const auto src = temp_dir("lock_src");
  write_synthetic_games(src, 2, 5, 600);
  const auto dir = temp_dir("lock");
  std::filesystem::create_directories(dir);
  const std::vector<std::filesystem::path> inputs = {src};
  {
    const int fd = ::open((dir / ".build.lock").c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, "4242", 4, 0), 4);
    ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // another build's hold, as its process would have it
    try {
      build_corpus(inputs, dir);
      FAIL() << "a second build into one folder must be refused";
    } catch (const CorpusError& e) {
      EXPECT_NE(std::string(e.what()).find("another corpus build (process 4242)"),
                std::string::npos)
          << e.what();
    }
    ::close(fd);
  }
  EXPECT_FALSE(std::filesystem::exists(dir / ".build"));
  EXPECT_FALSE(std::filesystem::exists(dir / "manifest.json"));
  {
    rlimit saved{};
    getrlimit(RLIMIT_FSIZE, &saved);
    auto previous = std::signal(SIGXFSZ, SIG_IGN);
    rlimit small = saved;
    small.rlim_cur = 4096;
    setrlimit(RLIMIT_FSIZE, &small);
    try {
      build_corpus(inputs, dir);
      ADD_FAILURE() << "a build that cannot write must fail";
    } catch (const CorpusError& e) {
      EXPECT_NE(std::string(e.what()).find("File too large"), std::string::npos) << e.what();
    }
    setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, previous);
  }
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), ".build.lock") << e.path();
  build_corpus(inputs, dir);  // and then it builds
  EXPECT_EQ(Corpus::open(dir).size(), 2u);
  std::filesystem::remove_all(src);
  std::filesystem::remove_all(dir);
}

// A byte damaged inside one game's bytes: that game alone is refused when it is read, naming
// the corpus, the game and its source; the others read as parsed, raw and with --zstd (whose
// frames zstd would decode into other values without a complaint).
TEST(SlpCorpus, ADamagedGameIsRefusedAloneWhenRead) {
  const auto src = temp_dir("game_hash_src");
  write_synthetic_games(src, 3, 9, 600);
  const std::vector<std::filesystem::path> inputs = {src};
  const auto files = find_replays(inputs);
  for (const bool zstd : {false, true}) {
    SCOPED_TRACE(zstd ? "zstd" : "raw");
    const auto dir = temp_dir(zstd ? "game_hash_zstd" : "game_hash_raw");
    CorpusOptions options;
    options.zstd = zstd;
    build_corpus(inputs, dir, options);
    testing::damage_game(dir, 1);
    const Corpus corpus = Corpus::open(dir);
    ASSERT_EQ(corpus.size(), 3u);
    ParseOptions po;
    po.rollbacks = options.rollbacks;
    po.items = options.items;
    for (const size_t g : {0, 2}) {
      const CorpusGame game = corpus.game(g);
      expect_same_columns(game.view(), view_of(parse_slp_file(files[g], po)), files[g].string());
    }
    try {
      corpus.game(1);
      ADD_FAILURE() << "a damaged game was read";
    } catch (const CorpusError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("game 1 (" + files[1].string() + ") does not match its hash"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("columns.bin"), std::string::npos) << m;
    }
    std::filesystem::remove_all(dir);
  }
  std::filesystem::remove_all(src);
}

// A columns.bin cut short or of another build beside the manifest does not open; corpora built
// before each game had its hash check every column's hash at open, naming the column.
TEST(SlpCorpus, MismatchedColumnsDoNotOpen) {
  const auto src = temp_dir("hash_src");
  write_synthetic_games(src, 2, 9, 600);
  const auto dir = temp_dir("hash");
  const auto other = temp_dir("hash_other");
  const std::vector<std::filesystem::path> inputs = {src};
  build_corpus(inputs, dir);
  EXPECT_EQ(Corpus::open(dir).size(), 2u);
  const auto columns = dir / "columns.bin";
  write_synthetic_games(src, 1, 77, 600);  // another game: another build's columns
  build_corpus(inputs, other);
  std::filesystem::copy_file(other / "columns.bin", columns,
                             std::filesystem::copy_options::overwrite_existing);
  try {
    Corpus::open(dir);
    ADD_FAILURE() << "another build's columns opened";
  } catch (const CorpusError& e) {
    EXPECT_NE(std::string(e.what()).find("(another build's)"), std::string::npos) << e.what();
  }
  build_corpus(inputs, dir);
  std::filesystem::resize_file(columns, std::filesystem::file_size(columns) - 20);
  try {
    Corpus::open(dir);
    ADD_FAILURE() << "a columns.bin cut short opened";
  } catch (const CorpusError& e) {
    EXPECT_NE(std::string(e.what()).find("(cut short)"), std::string::npos) << e.what();
  }
  build_corpus(inputs, dir);
  testing::drop_game_hashes(dir);
  EXPECT_EQ(Corpus::open(dir).size(), 2u);
  testing::damage_game(dir, 1);
  try {
    Corpus::open(dir);
    ADD_FAILURE() << "a damaged corpus without game hashes opened";
  } catch (const CorpusError& e) {
    EXPECT_NE(std::string(e.what()).find("column 'frame' does not match its hash"),
              std::string::npos)
        << e.what();
  }
  for (const auto& d : {src, dir, other}) std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace slipstream::slp

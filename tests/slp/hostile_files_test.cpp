// Hostile replay folders and files (issue 16): symlink loops, unreadable folders, FIFOs,
// devices, directories named *.slp and huge junk files must be refused or skipped with a
// reason, never hang, throw out of a scan or get read whole.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include <nlohmann/json.hpp>

#include "stages/melee/slp/corpus.h"
#include "stages/melee/slp/inspect.h"
#include "stages/melee/slp/parser.h"
#include "stages/melee/slp/synth.h"
#include "tests/support/temp_dir.h"

namespace slipstream::slp {
namespace {

namespace fs = std::filesystem;

// A hang (FIFO, /dev/zero) kills the test binary instead of stalling the suite.
class Watchdog {
 public:
  explicit Watchdog(unsigned seconds) { ::alarm(seconds); }
  ~Watchdog() { ::alarm(0); }
};

bool skipped_with(const ReplayScan& scan, const fs::path& path, const std::string& reason) {
  for (const auto& s : scan.skipped)
    if (s.path == path && s.reason.find(reason) != std::string::npos) return true;
  return false;
}

std::string describe(const ReplayScan& scan) {
  std::string out;
  for (const auto& s : scan.skipped) out += s.path.string() + ": " + s.reason + "\n";
  return out;
}

std::string parse_error_of(const fs::path& path) {
  try {
    read_file_bytes(path);
  } catch (const ParseError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SlpHostile, SymlinkLoopsAreSkippedNotFatal) {
  const slipstream::testing::TempDir t;
  const fs::path d = t.path();
  write_synthetic_games(d, 1, 1, 200);
  write_synthetic_games(d / "sub", 1, 2, 200);
  fs::create_directory_symlink(d, d / "sub" / "up");  // sub/up -> the root: a cycle
  fs::create_symlink("loop2", d / "loop1");           // loop1 -> loop2 -> loop1
  fs::create_symlink("loop1", d / "loop2");
  fs::create_symlink("self.slp", d / "self.slp");

  Watchdog w(30);
  const fs::path inputs[] = {d};
  const ReplayScan scan = scan_replays(inputs);
  EXPECT_EQ(scan.files.size(), 2u) << describe(scan);  // each game once, nothing via sub/up
  EXPECT_TRUE(skipped_with(scan, d / "loop1", "symlink loop")) << describe(scan);
  EXPECT_TRUE(skipped_with(scan, d / "loop2", "symlink loop")) << describe(scan);
  EXPECT_TRUE(skipped_with(scan, d / "self.slp", "symlink loop")) << describe(scan);

  const CorpusBuildReport r = build_corpus(inputs, fs::path(t.path()) / "corpus");
  EXPECT_EQ(r.games, 2u);
  EXPECT_EQ(r.skipped, 3u);
  const auto manifest =
      nlohmann::json::parse(std::ifstream(fs::path(t.path()) / "corpus" / "manifest.json"));
  ASSERT_EQ(manifest.at("skipped").size(), 3u);
  EXPECT_EQ(manifest["skipped"][0]["path"], (d / "loop1").string());
  EXPECT_EQ(manifest["skipped"][0]["reason"], "symlink loop");
}

TEST(SlpHostile, UnreadableSubfolderIsSkippedNotFatal) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads folders whatever their mode";
  const slipstream::testing::TempDir t;
  const fs::path d = t.path();
  write_synthetic_games(d, 1, 1, 200);
  write_synthetic_games(d / "locked", 1, 2, 200);
  ASSERT_EQ(::chmod((d / "locked").c_str(), 0), 0);
  // Mode back on every way out, so the folder can be removed.
  struct Unlock {
    fs::path p;
    ~Unlock() { ::chmod(p.c_str(), 0700); }
  } unlock{d / "locked"};
  std::error_code ec;
  if (fs::directory_iterator(d / "locked", ec); !ec) {
    GTEST_SKIP() << "mode 000 does not stop reading here";
  }
  const fs::path inputs[] = {d};
  const ReplayScan scan = scan_replays(inputs);
  EXPECT_EQ(scan.files.size(), 1u);
  EXPECT_TRUE(skipped_with(scan, d / "locked", "cannot read folder")) << describe(scan);
  const CorpusBuildReport r = build_corpus(inputs, d / "corpus");
  EXPECT_EQ(r.games, 1u);
  EXPECT_EQ(r.skipped, 1u);
}

TEST(SlpHostile, NonRegularSlpEntriesInAFolderAreSkipped) {
  const slipstream::testing::TempDir t;
  const fs::path d = t.path();
  write_synthetic_games(d, 1, 1, 200);
  ASSERT_EQ(::mkfifo((d / "fifo.slp").c_str(), 0600), 0);
  fs::create_directory_symlink(d / "folder.slp", d / "link.slp");
  write_synthetic_games(d / "folder.slp", 1, 2, 200);  // a real folder is searched as usual
  fs::create_symlink("/dev/zero", d / "zero.slp");

  Watchdog w(30);
  const fs::path inputs[] = {d};
  const ReplayScan scan = scan_replays(inputs);
  EXPECT_EQ(scan.files.size(), 2u) << describe(scan);
  EXPECT_TRUE(skipped_with(scan, d / "fifo.slp", "not a regular file")) << describe(scan);
  EXPECT_TRUE(skipped_with(scan, d / "zero.slp", "not a regular file")) << describe(scan);
  EXPECT_TRUE(skipped_with(scan, d / "link.slp", "is a directory")) << describe(scan);
  const CorpusBuildReport r = build_corpus(inputs, d / "corpus");
  EXPECT_EQ(r.games, 2u);
  EXPECT_EQ(r.skipped, 3u);
}

TEST(SlpHostile, NonRegularFilesAreRefusedBeforeReading) {
  const slipstream::testing::TempDir t;
  const fs::path fifo = fs::path(t.path()) / "fifo.slp", dir = fs::path(t.path()) / "x.slp";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_directory(dir);

  Watchdog w(30);
  EXPECT_NE(parse_error_of("/dev/zero").find("/dev/zero: byte offset 0: not a regular file"),
            std::string::npos)
      << parse_error_of("/dev/zero");
  EXPECT_NE(parse_error_of(fifo).find("not a regular file (a FIFO)"), std::string::npos)
      << parse_error_of(fifo);
  EXPECT_NE(parse_error_of(dir).find(dir.string() + ": byte offset 0: is a directory"),
            std::string::npos)
      << parse_error_of(dir);
  // What `slipstream replay info` and `replay dump` use.
  for (const fs::path& p : {fs::path("/dev/zero"), fifo, dir}) {
    const auto info = replay_info_json(p);
    ASSERT_TRUE(replay_info_has_error(info)) << p;
    EXPECT_EQ(info["error"].get<std::string>().find("internal error"), std::string::npos)
        << info["error"];
    EXPECT_THROW(parse_slp_file(p), ParseError) << p;
  }
  // A corpus given such a file directly skips it (a folder given is searched, as any), naming
  // it; with no readable replay among its inputs no corpus is written.
  const fs::path inputs[] = {fifo, "/dev/zero", dir};
  try {
    build_corpus(inputs, fs::path(t.path()) / "corpus");
    FAIL() << "a corpus of no game was written";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no input is a readable replay (skipped "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(fs::path(t.path()) / "corpus" / "manifest.json"));
}

// A sparse file: 3 GB of zeros behind the given first bytes, costing no disk or memory.
fs::path sparse_file(const fs::path& path, const std::string& head) {
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, head.data(), head.size()), static_cast<ssize_t>(head.size()));
  const int rc = ::ftruncate(fd, off_t{3} << 30);
  ::close(fd);
  return rc == 0 ? path : fs::path();
}

TEST(SlpHostile, HugeJunkFileIsRefusedByItsHeader) {
  const slipstream::testing::TempDir t;
  // Junk from the first byte, and a valid container header whose events are zeros.
  const std::string container("{U\x03raw[$U#l\x7f\xff\xff\xff", 15);
  const struct {
    std::string head;
    uint64_t offset;
    std::string message;
  } cases[] = {
      {"JUNK JUNK JUNK", 0, "not a .slp file"},
      {container, 15, "expected Event Payloads (0x35), found 0x00"},
      {"{U\x03raw[#", 6, "'raw' is not an optimized uint8 array"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const fs::path p =
        sparse_file(fs::path(t.path()) / ("junk" + std::to_string(i++) + ".slp"), c.head);
    if (p.empty()) GTEST_SKIP() << "no sparse files here";
    SCOPED_TRACE(p.string());
    const auto t0 = std::chrono::steady_clock::now();
    try {
      read_file_bytes(p);
      ADD_FAILURE() << "read a 3 GB junk file";
    } catch (const ParseError& e) {
      EXPECT_EQ(e.file(), p.string());
      EXPECT_EQ(e.offset(), c.offset) << e.what();
      EXPECT_NE(e.message().find(c.message), std::string::npos) << e.what();
    }
    const auto info = replay_info_json(p);
    EXPECT_NE(info["error"].get<std::string>().find(c.message), std::string::npos) << info;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  }
}

// The header check refuses only what the parser refuses: a real-looking header goes through.
TEST(SlpHostile, HeaderCheckAcceptsValidReplays) {
  const slipstream::testing::TempDir t;
  const auto paths = write_synthetic_games(fs::path(t.path()), 2, 3, 300);
  for (const auto& p : paths) {
    const std::vector<uint8_t> bytes = read_file_bytes(p);
    EXPECT_EQ(bytes.size(), fs::file_size(p));
    EXPECT_NO_THROW(parse_slp(bytes, p.string(), {.strict = true}));
  }
}

}  // namespace
}  // namespace slipstream::slp

// The stats record: writer file handling, the seqlock, and the reader's validation.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/stats_record.h"
#include "test_util.h"

namespace slipstream::stats {
namespace {

using smi_test::LiveChild;
using smi_test::make_record;
using smi_test::set_text;
using smi_test::TempDir;
using smi_test::write_file;
using smi_test::write_record;

uint32_t my_uid() {
  return static_cast<uint32_t>(::geteuid());
}

TEST(StatsRecord, RecordPathAndDefaultDir) {
  EXPECT_EQ(record_path("/dev/shm", 1000, 42), "/dev/shm/slipstream-1000-42.stats");
  EXPECT_EQ(record_path("/tmp/x/", 7, 3), "/tmp/x/slipstream-7-3.stats");
  const char* old = std::getenv("SLIPSTREAM_STATS_DIR");
  std::string saved = old ? old : "";
  ::setenv("SLIPSTREAM_STATS_DIR", "/some/dir", 1);
  EXPECT_EQ(default_dir(), "/some/dir");
  ::setenv("SLIPSTREAM_STATS_DIR", "", 1);
  EXPECT_EQ(default_dir(), "/dev/shm");
  ::unsetenv("SLIPSTREAM_STATS_DIR");
  EXPECT_EQ(default_dir(), "/dev/shm");
  if (old) ::setenv("SLIPSTREAM_STATS_DIR", saved.c_str(), 1);
}

TEST(StatsRecord, RoundTrip) {
  TempDir dir;
  RecordWriter w(dir.path());
  EXPECT_EQ(w.path(), record_path(dir.path(), my_uid(), ::getpid()));
  w.update([](RunRecord& r) {
    r.state = RunState::running;
    set_text(r.run_name, "round-trip");
    set_text(r.preset, "cpu_quick");
    set_text(r.device, "cuda:1");
    r.step = 77;
    r.total_steps = 100;
    r.loss = 0.25;
    r.num_stages = 2;
    set_text(r.stages[0].name, "read");
    set_text(r.stages[1].name, "train");
    r.stages[1].items_out = 12345;
    r.stages[1].busy_frac_recent = 0.5;
    r.num_pools = 1;
    set_text(r.pools[0].name, "host");
    r.pools[0].peak_bytes = 1 << 20;
  });
  ReadResult got = read_record(w.path());
  ASSERT_TRUE(got.record) << got.error;
  const RunRecord& r = *got.record;
  EXPECT_EQ(r.magic, kMagic);
  EXPECT_EQ(r.layout_version, kLayoutVersion);
  EXPECT_EQ(r.record_size, sizeof(RunRecord));
  EXPECT_EQ(r.pid, ::getpid());
  EXPECT_EQ(r.uid, my_uid());
  EXPECT_EQ(r.sequence % 2, 0u);
  EXPECT_EQ(r.sequence, 2u);  // one update: odd, then even
  EXPECT_STREQ(r.run_name, "round-trip");
  EXPECT_STREQ(r.device, "cuda:1");
  EXPECT_EQ(r.step, 77u);
  EXPECT_EQ(r.loss, 0.25);
  EXPECT_EQ(r.num_stages, 2u);
  EXPECT_STREQ(r.stages[1].name, "train");
  EXPECT_EQ(r.stages[1].items_out, 12345u);
  EXPECT_EQ(r.pools[0].peak_bytes, 1u << 20);
  EXPECT_GT(r.start_unix_ns, 0u);
}

// The runner cuts names to their field (127 bytes for run_name) by bytes; a cut inside a
// multi-byte character must not be published as invalid UTF-8.
TEST(StatsRecord, NameCutInsideACharacterIsPublishedWithoutThePartialCharacter) {
  TempDir dir;
  RecordWriter w(dir.path());
  std::string name(125, 'a');
  name += "\xC3\xA9\xE2\x82\xAC";  // "é€": the 127-byte cut falls inside the €
  w.update([&](RunRecord& r) {
    set_text(r.run_name, name);  // byte cut, as the runner's copy does
    set_text(r.stages[0].name, std::string(46, 'b') + "\xF0\x9F\x98\x80");  // cut after 1 of 4
    set_text(r.preset, "caf\xC3\xA9");                                      // whole characters stay
  });
  ReadResult got = read_record(w.path());
  ASSERT_TRUE(got.record) << got.error;
  EXPECT_EQ(std::string(got.record->run_name), std::string(125, 'a') + "\xC3\xA9");
  EXPECT_EQ(std::string(got.record->stages[0].name), std::string(46, 'b'));
  EXPECT_EQ(std::string(got.record->preset), "caf\xC3\xA9");
}

TEST(StatsRecord, FreshRecordHasUnknownLossAndEta) {
  TempDir dir;
  RecordWriter w(dir.path());
  ReadResult got = read_record(w.path());
  ASSERT_TRUE(got.record) << got.error;
  EXPECT_TRUE(std::isnan(got.record->loss));
  EXPECT_LT(got.record->eta_s, 0);
  EXPECT_EQ(got.record->state, RunState::starting);
  EXPECT_EQ(got.record->num_stages, 0u);
}

TEST(StatsRecord, FileMode0600WhateverTheUmask) {
  for (mode_t mask : {mode_t{0}, mode_t{022}, mode_t{0277}}) {
    TempDir dir;
    mode_t old = ::umask(mask);
    {
      RecordWriter w(dir.path());
      struct stat st {};
      ASSERT_EQ(::stat(w.path().c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 07777, 0600u) << "umask " << std::oct << mask;
      EXPECT_EQ(st.st_size, static_cast<off_t>(sizeof(RunRecord)));
      EXPECT_EQ(st.st_uid, ::geteuid());
    }
    ::umask(old);
  }
}

TEST(StatsRecord, DestructorRemovesFileAndLeavesNoTemp) {
  TempDir dir;
  std::string path;
  {
    RecordWriter w(dir.path());
    path = w.path();
    EXPECT_TRUE(smi_test::file_exists(path));
    EXPECT_FALSE(smi_test::file_exists(path + ".tmp"));
  }
  EXPECT_FALSE(smi_test::file_exists(path));
}

TEST(StatsRecord, ForkedChildDoesNotRemoveParentsRecord) {
  TempDir dir;
  auto w = std::make_unique<RecordWriter>(dir.path());
  pid_t child = ::fork();
  if (child == 0) {
    w.reset();  // the child's copy of the writer goes out of scope
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(smi_test::file_exists(w->path()));
  EXPECT_TRUE(read_record(w->path()).record);
}

TEST(StatsRecord, WriterReplacesStaleFileOfSamePid) {
  TempDir dir;
  std::string path = record_path(dir.path(), my_uid(), ::getpid());
  write_file(path, "junk", 4);
  RecordWriter w(dir.path());
  ReadResult got = read_record(path);
  EXPECT_TRUE(got.record) << got.error;
}

TEST(StatsRecord, WriterThrowsNamingThePath) {
  try {
    RecordWriter w("/nonexistent/slipstream-smi-test");
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/slipstream-smi-test/slipstream-"),
              std::string::npos)
        << e.what();
  }
}

// A writer hammers updates in which every counter equals the update number; every copy the
// reader keeps must be internally consistent.
TEST(StatsRecord, SeqlockReaderNeverSeesTornRecord) {
  TempDir dir;
  RecordWriter w(dir.path());
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    uint64_t n = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      ++n;
      w.update([n](RunRecord& r) {
        r.step = n;
        r.samples = n;
        r.num_stages = kMaxStages;
        for (int i = 0; i < kMaxStages; ++i) {
          auto& s = r.stages[i];
          s.items_in = s.items_out = s.busy_ns = n;
          // Dwell mid-update so that reads overlap writes often: a reader that ignored the
          // sequence would keep torn copies (half old, half new) within a few hundred reads.
          if (i == kMaxStages / 2) {
            auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(5);
            while (std::chrono::steady_clock::now() < until) {
            }
          }
        }
        for (auto& p : r.pools) p.in_use_bytes = n;
      });
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  int consistent = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < deadline) {
    ReadResult got = read_record(w.path());
    if (!got.record) {
      // The reader may give up under a writer that never pauses; that is an error, not a tear.
      EXPECT_NE(got.error.find("kept changing"), std::string::npos) << got.error;
      continue;
    }
    const RunRecord& r = *got.record;
    EXPECT_EQ(r.sequence % 2, 0u);
    ASSERT_EQ(r.samples, r.step);
    if (r.step == 0) continue;
    for (const auto& s : r.stages) {
      ASSERT_EQ(s.items_in, r.step);
      ASSERT_EQ(s.items_out, r.step);
      ASSERT_EQ(s.busy_ns, r.step);
    }
    for (const auto& p : r.pools) ASSERT_EQ(p.in_use_bytes, r.step);
    ++consistent;
  }
  stop = true;
  writer.join();
  EXPECT_GT(consistent, 0);
}

// Deterministic half of the seqlock: inside update() the sequence is odd, so a reader refuses
// the half-written record; afterwards it is even again and the record reads.
TEST(StatsRecord, ReaderRefusesRecordWhileUpdateIsInProgress) {
  TempDir dir;
  RecordWriter w(dir.path());
  ReadResult during;
  w.update([&](RunRecord& r) {
    r.step = 1;
    during = read_record(w.path());
  });
  EXPECT_FALSE(during.record);
  EXPECT_NE(during.error.find("mid-update"), std::string::npos) << during.error;
  ReadResult after = read_record(w.path());
  ASSERT_TRUE(after.record) << after.error;
  EXPECT_EQ(after.record->sequence, 2u);
  EXPECT_EQ(after.record->step, 1u);
}

TEST(StatsRecord, OddSequenceForeverIsAnError) {
  TempDir dir;
  std::string path = dir.path() + "/r.stats";
  RunRecord r = make_record(::getpid());
  r.sequence = 7;  // a writer that died between its marks
  write_record(path, r);
  ReadResult got = read_record(path);
  EXPECT_FALSE(got.record);
  EXPECT_NE(got.error.find(path), std::string::npos);
  EXPECT_NE(got.error.find("mid-update"), std::string::npos) << got.error;
}

TEST(StatsRecord, LayoutVersionMismatchNamesBothVersions) {
  TempDir dir;
  std::string path = dir.path() + "/r.stats";
  // A newer record may be larger; the version is reported, not the size.
  std::vector<char> bytes(sizeof(RunRecord) + 64, 0);
  RunRecord r = make_record(::getpid());
  r.layout_version = kLayoutVersion + 1;
  std::memcpy(bytes.data(), &r, sizeof r);
  write_file(path, bytes.data(), bytes.size());
  ReadResult got = read_record(path);
  EXPECT_FALSE(got.record);
  EXPECT_EQ(got.error, path + ": stats record layout version " +
                           std::to_string(kLayoutVersion + 1) +
                           ", this slipstream-smi reads version " + std::to_string(kLayoutVersion) +
                           "; use the slipstream-smi of the same build");
}

TEST(StatsRecord, TruncatedFile) {
  TempDir dir;
  std::string path = dir.path() + "/r.stats";
  RunRecord r = make_record(::getpid());
  write_file(path, &r, sizeof r / 2);
  ReadResult got = read_record(path);
  EXPECT_FALSE(got.record);
  EXPECT_NE(got.error.find("truncated"), std::string::npos) << got.error;
  EXPECT_NE(got.error.find(std::to_string(sizeof r / 2) + " bytes"), std::string::npos);

  write_file(path, &r, 5);  // not even a header
  got = read_record(path);
  EXPECT_NE(got.error.find("truncated"), std::string::npos) << got.error;
  write_file(path, "", 0);
  got = read_record(path);
  EXPECT_NE(got.error.find("truncated: 0 bytes"), std::string::npos) << got.error;
}

TEST(StatsRecord, GarbageFile) {
  TempDir dir;
  std::string path = dir.path() + "/r.stats";
  std::vector<unsigned char> bytes(sizeof(RunRecord));
  unsigned seed = 12345;
  for (auto& b : bytes) b = static_cast<unsigned char>(rand_r(&seed));
  write_file(path, bytes.data(), bytes.size());
  ReadResult got = read_record(path);
  EXPECT_FALSE(got.record);
  EXPECT_NE(got.error.find("not a slipstream stats record"), std::string::npos) << got.error;
}

TEST(StatsRecord, WrongMagic) {
  TempDir dir;
  std::string path = dir.path() + "/r.stats";
  RunRecord r = make_record(::getpid());
  r.magic = 0x12345678;
  write_record(path, r);
  ReadResult got = read_record(path);
  EXPECT_FALSE(got.record);
  EXPECT_NE(got.error.find("magic 0x12345678"), std::string::npos) << got.error;
}

TEST(StatsRecord, CountsOutOfRange) {
  TempDir dir;
  std::string path = dir.path() + "/r.stats";
  RunRecord r = make_record(::getpid());
  r.num_stages = kMaxStages + 1;
  write_record(path, r);
  ReadResult got = read_record(path);
  EXPECT_FALSE(got.record);
  EXPECT_NE(got.error.find("num_stages 65 exceeds the maximum 64"), std::string::npos) << got.error;

  r.num_stages = 0xFFFFFFFFu;
  write_record(path, r);
  EXPECT_FALSE(read_record(path).record);

  r.num_stages = 1;
  r.num_pools = kMaxPools + 1;
  write_record(path, r);
  got = read_record(path);
  EXPECT_NE(got.error.find("num_pools 5 exceeds"), std::string::npos) << got.error;
}

TEST(StatsRecord, StringsMustBeNulTerminated) {
  TempDir dir;
  std::string path = dir.path() + "/r.stats";
  RunRecord r = make_record(::getpid());
  std::memset(r.run_name, 'x', sizeof r.run_name);
  write_record(path, r);
  ReadResult got = read_record(path);
  EXPECT_NE(got.error.find("run_name is not NUL-terminated"), std::string::npos) << got.error;

  r = make_record(::getpid());
  r.num_stages = 3;
  std::memset(r.stages[2].kind, 'k', sizeof r.stages[2].kind);
  write_record(path, r);
  got = read_record(path);
  EXPECT_NE(got.error.find("stage 2"), std::string::npos) << got.error;

  // Text of unused stage slots is never shown, so it is not checked.
  r.num_stages = 2;
  write_record(path, r);
  EXPECT_TRUE(read_record(path).record);
}

TEST(StatsRecord, UnknownStateAndBadRecordSize) {
  TempDir dir;
  std::string path = dir.path() + "/r.stats";
  RunRecord r = make_record(::getpid());
  r.state = static_cast<RunState>(99);
  write_record(path, r);
  EXPECT_NE(read_record(path).error.find("run state 99"), std::string::npos);
  r = make_record(::getpid());
  r.record_size = 12;
  write_record(path, r);
  EXPECT_NE(read_record(path).error.find("record_size field 12"), std::string::npos);
}

TEST(StatsRecord, MissingFileAndDirectory) {
  TempDir dir;
  ReadResult got = read_record(dir.path() + "/absent.stats");
  EXPECT_FALSE(got.record);
  EXPECT_NE(got.error.find("cannot open"), std::string::npos);
  got = read_record(dir.path());
  EXPECT_FALSE(got.record);
}

TEST(StatsRecord, FindRecordsReturnsLiveOwnRecords) {
  TempDir dir;
  RecordWriter w(dir.path());
  w.update([](RunRecord& r) { set_text(r.run_name, "mine"); });
  // A live process of ours other than this one.
  LiveChild live;
  const int live_pid = live.pid();
  write_record(record_path(dir.path(), my_uid(), live_pid), make_record(live_pid));
  auto found = find_records(dir.path());
  ASSERT_EQ(found.size(), 2u);
  for (const auto& f : found) ASSERT_TRUE(f.result.record) << f.result.error;
  // Sorted by pid.
  EXPECT_LT(found[0].result.record->pid, found[1].result.record->pid);
}

TEST(StatsRecord, FindRecordsRemovesStaleRecord) {
  TempDir dir;
  const int dead = smi_test::dead_pid();
  std::string path = record_path(dir.path(), my_uid(), dead);
  write_record(path, make_record(dead));
  auto found = find_records(dir.path());
  EXPECT_TRUE(found.empty());
  EXPECT_FALSE(smi_test::file_exists(path)) << "stale record of dead pid " << dead << " kept";
}

TEST(StatsRecord, FindRecordsReportsMalformedRecordOfLivePid) {
  TempDir dir;
  LiveChild live;
  const int live_pid = live.pid();
  std::string path = record_path(dir.path(), my_uid(), live_pid);
  write_file(path, "garbage", 7);
  auto found = find_records(dir.path());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_FALSE(found[0].result.record);
  EXPECT_EQ(found[0].path, path);
  EXPECT_NE(found[0].result.error.find("truncated"), std::string::npos);
  EXPECT_TRUE(smi_test::file_exists(path));  // malformed is not stale: left for its owner
}

TEST(StatsRecord, FindRecordsRejectsPidMismatch) {
  TempDir dir;
  LiveChild live;
  const int live_pid = live.pid();
  write_record(record_path(dir.path(), my_uid(), live_pid), make_record(live_pid + 1));
  auto found = find_records(dir.path());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_NE(found[0].result.error.find("names pid"), std::string::npos);
}

TEST(StatsRecord, FindRecordsSkipsOtherNamesUsersAndLinks) {
  TempDir dir;
  LiveChild live;
  const int live_pid = live.pid();
  const std::string other_user = record_path(dir.path(), my_uid() + 1, live_pid);
  write_record(other_user, make_record(live_pid));
  write_record(dir.path() + "/slipstream-" + std::to_string(my_uid()) + "-12x.stats",
               make_record(live_pid));
  write_record(record_path(dir.path(), my_uid(), live_pid) + ".tmp", make_record(live_pid));
  write_record(dir.path() + "/unrelated.stats", make_record(live_pid));
  // A symlink named as our record is refused (O_NOFOLLOW), not followed.
  write_record(dir.path() + "/target", make_record(live_pid));
  ASSERT_EQ(::symlink((dir.path() + "/target").c_str(),
                      record_path(dir.path(), my_uid(), live_pid).c_str()),
            0);
  EXPECT_TRUE(find_records(dir.path()).empty());
  EXPECT_TRUE(smi_test::file_exists(other_user));  // never touched
}

TEST(StatsRecord, FindRecordsSkipsFileOwnedBySomeoneElse) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown a file to another user";
  TempDir dir;
  LiveChild live;
  const int live_pid = live.pid();
  std::string path = record_path(dir.path(), my_uid(), live_pid);
  write_record(path, make_record(live_pid));
  ASSERT_EQ(::chown(path.c_str(), 4242, 4242), 0);
  EXPECT_TRUE(find_records(dir.path()).empty());
}

TEST(StatsRecord, FindRecordsInMissingDirIsEmpty) {
  EXPECT_TRUE(find_records("/nonexistent/slipstream-smi-test").empty());
}

}  // namespace
}  // namespace slipstream::stats

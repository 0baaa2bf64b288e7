// TensorBoard event files: CRC-32C (both paths, the standard vectors), TFRecord framing and the
// Event protos read back with our own parser, write failures, and a run's events file against
// its metrics.jsonl (tags, steps, values; each process's session start; run.tensorboard: false).
// tests/engine/read_tfevents.py reads a real run's files with TensorBoard itself.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>

#include "engine/crc32c.h"
#include "engine/runner.h"
#include "engine/tensorboard/event_writer.h"
#include "tensorboard/event.pb.h"
#include "tests/engine/test_stages.h"
#include "tests/engine/writing_run_options.h"
#include "tests/support/temp_dir.h"

using namespace slipstream;
using namespace slipstream::tensorboard;
using slipstream::testing::reset_recorded;
using slipstream::testing::TempDir;
using slipstream::testing::writing_options;
namespace fs = std::filesystem;

namespace {

uint32_t crc_of(const std::string& s) {
  return crc32c(s.data(), s.size());
}
uint32_t table_crc_of(const std::string& s) {
  return crc32c_table(s.data(), s.size());
}

uint64_t get_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(s[at + i])} << (8 * i);
  return v;
}

// The records of a TFRecord file, every CRC checked; a torn or corrupt record fails the test.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t at = 0;
  while (at < all.size()) {
    EXPECT_LE(at + 12, all.size()) << path << ": torn header at " << at;
    if (at + 12 > all.size()) break;
    const uint64_t len = get_le(all, at, 8);
    EXPECT_EQ(get_le(all, at + 8, 4), crc32c_mask(crc32c(all.data() + at, 8))) << "at " << at;
    EXPECT_LE(at + 12 + len + 4, all.size()) << path << ": torn record at " << at;
    if (at + 12 + len + 4 > all.size()) break;
    std::string data = all.substr(at + 12, len);
    EXPECT_EQ(get_le(all, at + 12 + len, 4), crc32c_mask(crc_of(data))) << "at " << at;
    out.push_back(std::move(data));
    at += 12 + len + 4;
  }
  return out;
}

std::vector<tfevents::Event> read_events(const std::string& path) {
  std::vector<tfevents::Event> out;
  for (const auto& r : read_records(path)) {
    tfevents::Event e;
    EXPECT_TRUE(e.ParseFromString(r));
    out.push_back(e);
  }
  return out;
}

// The events files of a run directory, in name order (the order TensorBoard reads them in).
std::vector<std::string> events_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("events.out.tfevents."))
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The file descriptor this process has open on `path`, or -1.
int fd_of(const std::string& path) {
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = fs::read_symlink(e.path(), ec);
    if (!ec && fs::equivalent(target, path, ec)) return std::stoi(e.path().filename().string());
  }
  return -1;
}

// Makes every later write through `fd` fail with ENOSPC, as on a full disk.
void fill_disk_under(int fd) {
  int full = ::open("/dev/full", O_WRONLY);
  ASSERT_GE(full, 0);
  ASSERT_GE(::dup2(full, fd), 0);
  ::close(full);
}

}  // namespace

// ---- CRC-32C ----

TEST(Crc32c, StandardCheckValueAndKnownVectors) {
  std::string zeros(32, '\0'), ones(32, '\xff'), up(32, '\0'), down(32, '\0');
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  // RFC 3720 B.4: an iSCSI SCSI Read (10) command PDU.
  const unsigned char pdu[48] = {0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,    0, 0, 0, 0,
                                 0x14, 0,    0, 0, 0, 0, 4, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,
                                 0x28, 0,    0, 0, 0, 0, 0, 0, 2, 0, 0, 0,    0, 0, 0, 0};
  const std::string iscsi(reinterpret_cast<const char*>(pdu), sizeof pdu);
  const std::vector<std::pair<std::string, uint32_t>> vectors = {
      {"123456789", 0xE3069283u}, {"", 0u},          {"a", 0xC1D04330u},  {zeros, 0x8A9136AAu},
      {ones, 0x62A8AB43u},        {up, 0x46DD794Eu}, {down, 0x113FDB5Cu}, {iscsi, 0xD9963A56u}};
  for (const auto& [text, want] : vectors) {
    EXPECT_EQ(crc_of(text), want) << "length " << text.size();
    EXPECT_EQ(table_crc_of(text), want) << "length " << text.size();
  }
  std::cout << "crc32c: " << (crc32c_hardware() ? "SSE4.2 instruction" : "table") << "\n";
}

TEST(Crc32c, HardwareAndTableAgreeAtEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::string buf(1100, '\0');
  for (auto& c : buf) c = static_cast<char>(rng());
  for (size_t off = 0; off < 9; ++off)
    for (size_t n = 0; n + off <= buf.size(); n += (n < 64 ? 1 : 37))
      ASSERT_EQ(crc32c(buf.data() + off, n), crc32c_table(buf.data() + off, n))
          << "offset " << off << " length " << n;
}

TEST(Crc32c, ExtendsAcrossPiecesAndMasksReversibly) {
  const std::string a = "12345", b = "6789";
  EXPECT_EQ(crc32c(b.data(), b.size(), crc_of(a)), 0xE3069283u);
  EXPECT_EQ(crc32c_table(b.data(), b.size(), table_crc_of(a)), 0xE3069283u);
  const uint32_t crc = 0xE3069283u;
  EXPECT_NE(crc32c_mask(crc), crc);
  EXPECT_NE(crc32c_mask(crc32c_mask(crc)), crc);
  EXPECT_EQ(crc32c_unmask(crc32c_mask(crc)), crc);
  EXPECT_EQ(crc32c_unmask(crc32c_unmask(crc32c_mask(crc32c_mask(crc)))), crc);
  EXPECT_EQ(crc32c_mask(0), 0xa282ead8u);
}

// ---- the writer ----

TEST(EventFileWriter, FramesRecordsAndReadsBackAsEvents) {
  TempDir d;
  const std::string path = d.path() + "/events.out.tfevents.1.test";
  {
    EventFileWriter w;
    w.open(path);
    ASSERT_TRUE(w.write_scalars(5, 1700000000.25,
                                {{"train/loss", 0.5},
                                 {"train/zero", 0.0},
                                 {"train/nan", std::nan("")},
                                 {"train/inf", std::numeric_limits<double>::infinity()}}));
    ASSERT_TRUE(w.write_scalars(10, 1700000001.5, {{"validation/loss", 0.25}}));
    ASSERT_TRUE(w.write_session_start(11, 1700000002.0));
  }
  auto ev = read_events(path);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].what_case(), tfevents::Event::kFileVersion);
  EXPECT_EQ(ev[0].file_version(), "brain.Event:2");
  EXPECT_GT(ev[0].wall_time(), 1.6e9);

  EXPECT_EQ(ev[1].step(), 5);
  EXPECT_EQ(ev[1].wall_time(), 1700000000.25);
  ASSERT_EQ(ev[1].summary().value_size(), 4);
  const auto& v = ev[1].summary().value();
  EXPECT_EQ(v[0].tag(), "train/loss");
  EXPECT_EQ(v[0].simple_value(), 0.5f);
  // A zero is on the wire, not left off as proto3 leaves a default: TensorBoard needs it set.
  EXPECT_EQ(v[1].tag(), "train/zero");
  EXPECT_EQ(v[1].value_case(), tfevents::Summary::Value::kSimpleValue);
  EXPECT_EQ(v[1].simple_value(), 0.0f);
  EXPECT_TRUE(std::isnan(v[2].simple_value()));
  EXPECT_TRUE(std::isinf(v[3].simple_value()));

  EXPECT_EQ(ev[2].step(), 10);
  ASSERT_EQ(ev[2].summary().value_size(), 1);
  EXPECT_EQ(ev[2].summary().value(0).tag(), "validation/loss");
  EXPECT_EQ(ev[2].summary().value(0).simple_value(), 0.25f);

  EXPECT_EQ(ev[3].step(), 11);
  EXPECT_EQ(ev[3].what_case(), tfevents::Event::kSessionLog);
  EXPECT_EQ(ev[3].session_log().status(), tfevents::SessionLog::START);
}

TEST(EventFileWriter, FramingMatchesTfRecordByteForByte) {
  // An empty record: 8 zero bytes of length, then the masked CRCs of those and of nothing.
  const std::string rec = EventFileWriter::frame("");
  ASSERT_EQ(rec.size(), 16u);
  EXPECT_EQ(rec.substr(0, 8), std::string(8, '\0'));
  EXPECT_EQ(get_le(rec, 8, 4), crc32c_mask(crc32c(std::string(8, '\0').data(), 8)));
  EXPECT_EQ(get_le(rec, 12, 4), crc32c_mask(0));
  const std::string r2 = EventFileWriter::frame("abc");
  EXPECT_EQ(get_le(r2, 0, 8), 3u);
  EXPECT_EQ(r2.substr(12, 3), "abc");
  EXPECT_EQ(get_le(r2, 15, 4), crc32c_mask(crc_of("abc")));
}

TEST(EventFileWriter, NamesFilesForTensorBoardAndNeverReusesOne) {
  EXPECT_EQ(EventFileWriter::file_name(1700000000, "host-1"),
            "events.out.tfevents.1700000000.host-1");
  TempDir d;
  EventFileWriter a, b;
  a.open_in(d.path());
  b.open_in(d.path());  // likely the same second: it must not take a's file
  EXPECT_NE(a.path(), b.path());
  auto files = events_files(d.path());
  ASSERT_EQ(files.size(), 2u);
  // The later file sorts after the earlier, the order TensorBoard reads them in.
  EXPECT_EQ(files[0], a.path());
  EXPECT_EQ(files[1], b.path());
  const std::regex name(R"(events\.out\.tfevents\.\d{10}\.[^/]+)");
  EXPECT_TRUE(std::regex_match(fs::path(a.path()).filename().string(), name)) << a.path();
  for (const auto& f : files) EXPECT_EQ(read_events(f).size(), 1u);  // the version record
}

TEST(EventFileWriter, AFullDiskIsReportedNamingTheFile) {
  // Opening writes the version record: a full disk fails there.
  EventFileWriter w;
  try {
    w.open("/dev/full");
    FAIL() << "writing to /dev/full must fail";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: cannot append a record: No space left"),
              std::string::npos)
        << e.what();
  }
  // A disk that fills up later fails the row it hits.
  TempDir d;
  EventFileWriter later;
  later.open(d.path() + "/events.out.tfevents.1.test");
  ASSERT_TRUE(later.write_scalars(1, 1.0, {{"train/loss", 1.0}}));
  const int fd = fd_of(later.path());
  ASSERT_GE(fd, 0);
  fill_disk_under(fd);
  EXPECT_FALSE(later.write_scalars(2, 2.0, {{"train/loss", 2.0}}));
  EXPECT_NE(later.error().find("events.out.tfevents.1.test: cannot append a record: No space left"),
            std::string::npos)
      << later.error();
}

TEST(EventFileWriter, ARecordCutShortIsTakenBackWhole) {
  TempDir d;
  EventFileWriter w;
  w.open(d.path() + "/events.out.tfevents.1.test");
  ASSERT_TRUE(w.write_scalars(1, 1.0, {{"train/loss", 1.0}}));
  const auto size = fs::file_size(w.path());
  // A file size limit a few bytes past the end: the next record's write stops part way.
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto previous = signal(SIGXFSZ, SIG_IGN);
  rlimit lim = old;
  lim.rlim_cur = size + 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  const bool ok = w.write_scalars(2, 2.0, {{"train/a_long_tag_name_for_a_long_record", 2.0}});
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, previous);
  EXPECT_FALSE(ok);
  EXPECT_NE(w.error().find("File too large"), std::string::npos) << w.error();
  EXPECT_EQ(fs::file_size(w.path()), size);  // no torn record left behind
  EXPECT_EQ(read_events(w.path()).size(), 2u);
}

// ---- in a run ----

namespace {

// src (20 batches) -> rec -> ckpt, rows every step, validation every 4.
std::string graph(const TempDir& d) {
  return R"(stages:
  - {name: src, kind: test_counter, params: {count: 20, batch: 2}}
  - {name: rec, kind: test_recorder, inputs: [src]}
  - {name: ckpt, kind: checkpoint, inputs: [rec], params: {every: 2, keep: 10}}
run: {log_every: 1, validate_every: 4, validate_batches: 1, runs_dir: )" +
         d.path() + "/runs}\n";
}

GraphPlan plan_text(const TempDir& d, const std::vector<std::string>& sets = {}) {
  return plan_graph(load_config(d.write("g.yaml", graph(d)), sets));
}

std::vector<nlohmann::json> rows(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// (step, tag) -> value, as a reader that lets later records replace earlier ones sees it,
// honouring SessionLog START (what TensorBoard's event accumulator does).
using Series = std::map<std::pair<int64_t, std::string>, float>;
Series scalars_of(const std::string& run_dir) {
  Series out;
  for (const auto& f : events_files(run_dir)) {
    auto ev = read_events(f);
    EXPECT_FALSE(ev.empty()) << f;
    EXPECT_EQ(ev.empty() ? "" : ev[0].file_version(), "brain.Event:2") << f;
    for (const auto& e : ev) {
      if (e.what_case() == tfevents::Event::kSessionLog &&
          e.session_log().status() == tfevents::SessionLog::START)
        std::erase_if(out, [&](const auto& kv) { return kv.first.first >= e.step(); });
      for (const auto& v : e.summary().value()) out[{e.step(), v.tag()}] = v.simple_value();
    }
  }
  return out;
}

// What metrics.jsonl says the scalars are: every number of every row but step and time.
Series scalars_of_rows(const std::vector<nlohmann::json>& rs) {
  Series out;
  for (const auto& r : rs)
    for (const auto& [k, v] : r.items())
      if (k != "step" && k != "time" && v.is_number())
        out[{r["step"].get<int64_t>(), r["split"].get<std::string>() + "/" + k}] =
            static_cast<float>(v.get<double>());
  return out;
}

}  // namespace

TEST(RunEvents, EveryNumberOfEveryRowIsAScalarAtItsStep) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, {"run.steps=8"}), writing_options());
  RunResult res = r.run();
  auto files = events_files(res.run_dir);
  ASSERT_EQ(files.size(), 1u);
  auto rs = rows(res.run_dir);
  auto want = scalars_of_rows(rs);
  auto got = scalars_of(res.run_dir);
  EXPECT_EQ(got, want);
  EXPECT_TRUE(got.count({8, "train/loss"}));
  EXPECT_TRUE(got.count({8, "train/samples_per_s"}));
  EXPECT_TRUE(got.count({8, "train/steps_averaged"}));
  EXPECT_TRUE(got.count({4, "validation/loss"}));
  // The version, the session's start at step 1, then one event per row with numbers (not the
  // end row), each at the row's time.
  auto ev = read_events(files[0]);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev[1].what_case(), tfevents::Event::kSessionLog);
  EXPECT_EQ(ev[1].session_log().status(), tfevents::SessionLog::START);
  EXPECT_EQ(ev[1].step(), 1);
  size_t numeric_rows = 0;
  for (const auto& row : rs)
    if (row["split"] != "end") ++numeric_rows;
  EXPECT_EQ(ev.size(), 2 + numeric_rows);
  for (size_t i = 2; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].what_case(), tfevents::Event::kSummary);
    EXPECT_EQ(ev[i].wall_time(), rs[i - 2]["time"].get<double>());
  }
}

TEST(RunEvents, ANonFiniteLossIsPlottedAsItIs) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, {"run.steps=4", "rec.nan_from=2", "run.validate_every=0"}),
           writing_options());
  RunResult res = r.run();
  auto got = scalars_of(res.run_dir);
  ASSERT_TRUE(got.count({3, "train/loss"}));
  EXPECT_TRUE(std::isnan(got[{3, "train/loss"}]));
  EXPECT_TRUE(rows(res.run_dir)[2]["loss"].is_null());  // metrics.jsonl holds null there
}

TEST(RunEvents, AResumeStartsANewFileThatRestartsAfterTheCheckpoint) {
  reset_recorded();
  TempDir d;
  Runner first(plan_text(d, {"run.steps=7"}), writing_options());
  std::string dir = first.run().run_dir;
  // Resume from step 4: metrics.jsonl drops steps 5-7, the events file cannot; the new file's
  // SessionLog START at step 5 (the run's second) tells TensorBoard to.
  RunOptions o = writing_options();
  o.resume_dir = dir;
  o.resume_checkpoint = (fs::path(dir) / "checkpoints" / "step-4").string();
  Runner second(plan_text(d, {"run.steps=10"}), o);
  second.run();
  auto files = events_files(dir);
  ASSERT_EQ(files.size(), 2u);
  auto ev = read_events(files[1]);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev[1].what_case(), tfevents::Event::kSessionLog);
  EXPECT_EQ(ev[1].step(), 5);
  // Nothing is dropped from the first file: its steps 5-7 are still there.
  bool first_has_7 = false;
  for (const auto& e : read_events(files[0])) first_has_7 |= e.step() == 7;
  EXPECT_TRUE(first_has_7);
  EXPECT_EQ(scalars_of(dir), scalars_of_rows(rows(dir)));
}

TEST(RunEvents, AnEventsFileThatStopsTakingRecordsStopsTheRun) {
  reset_recorded();
  TempDir d;
  RunOptions o = writing_options();
  std::string run_dir;
  o.on_step = [&](uint64_t step, uint64_t) {
    if (step != 3) return;
    for (const auto& e : fs::directory_iterator(d.path() + "/runs")) run_dir = e.path().string();
    auto files = events_files(run_dir);
    ASSERT_EQ(files.size(), 1u);
    fill_disk_under(fd_of(files[0]));
  };
  Runner r(plan_text(d, {"run.steps=10", "run.validate_every=0"}), o);
  try {
    r.run();
    FAIL() << "a run whose events file cannot be written must not end normally";
  } catch (const std::runtime_error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("events.out.tfevents."), std::string::npos) << what;
    EXPECT_NE(what.find("cannot append a record: No space left on device"), std::string::npos)
        << what;
    EXPECT_NE(what.find("stopped at step 3"), std::string::npos) << what;
  }
  // metrics.jsonl kept every row, and its last says why the run ended.
  auto rs = rows(run_dir);
  ASSERT_FALSE(rs.empty());
  EXPECT_EQ(rs.back()["split"], "end");
  EXPECT_EQ(rs.back()["reason"], "error");
  EXPECT_NE(rs.back()["error"].get<std::string>().find("events.out.tfevents."), std::string::npos);
  EXPECT_EQ(rs[rs.size() - 2]["step"], 3);
}

TEST(RunEvents, TurnedOffWritesNoEventsFile) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, {"run.steps=2", "run.tensorboard=false"}), writing_options());
  RunResult res = r.run();
  EXPECT_TRUE(events_files(res.run_dir).empty());
  EXPECT_FALSE(rows(res.run_dir).empty());
}

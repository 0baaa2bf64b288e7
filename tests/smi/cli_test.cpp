// slipstream-smi end to end: this test process publishes a record with known counters (it is
// the "running pipeline"), then runs the binary and checks what it prints.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/stats_record.h"
#include "test_util.h"

namespace slipstream::smi_test {
namespace {

const std::string kSmi = SLIPSTREAM_BINARY_DIR "/bin/slipstream-smi";
const std::string kNoNvml = "/nonexistent/libnvidia-ml.so.1";

struct Result {
  int status = -1;  // exit code; 128+signal when killed
  std::string out, err;
};

// Runs slipstream-smi with args and extra environment; stdout and stderr captured in files.
// stop_after > 0: a looping run, ended with SIGTERM after that long (not a failure).
Result run_smi(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
               std::chrono::milliseconds stop_after = std::chrono::milliseconds(0)) {
  TempDir io;
  const std::string out_path = io.path() + "/out", err_path = io.path() + "/err";
  pid_t child = ::fork();
  if (child == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    int out = ::open(out_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    int err = ::open(err_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char*> argv{const_cast<char*>(kSmi.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(kSmi.c_str(), argv.data());
    ::_exit(127);
  }
  Result r;
  int status = 0;
  const bool looping = stop_after.count() > 0;
  auto deadline =
      std::chrono::steady_clock::now() + (looping ? stop_after : std::chrono::milliseconds(30000));
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, looping ? SIGTERM : SIGKILL);
      ::waitpid(child, &status, 0);
      if (!looping) ADD_FAILURE() << "slipstream-smi timed out";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// The one line containing needle; fails when there is not exactly one.
std::string line_with(const std::string& text, const std::string& needle) {
  std::string found;
  int count = 0;
  for (const auto& l : lines_of(text)) {
    if (l.find(needle) != std::string::npos) {
      found = l;
      ++count;
    }
  }
  EXPECT_EQ(count, 1) << "lines with \"" << needle << "\" in:\n" << text;
  return found;
}

// The text of a table's rows without borders, joined by spaces: messages wrapped over
// several rows read as one.
std::string table_text(const std::string& table) {
  std::string text;
  for (const auto& l : lines_of(table)) {
    if (l.size() < 4 || l.rfind("| ", 0) != 0) continue;
    std::string inner = l.substr(2, l.size() - 4);
    while (!inner.empty() && inner.back() == ' ') inner.pop_back();
    text += inner + " ";
  }
  return text;
}

// Each token appears in line, in this order.
void expect_in_order(const std::string& line, const std::vector<std::string>& tokens) {
  size_t pos = 0;
  for (const auto& t : tokens) {
    size_t at = line.find(t, pos);
    ASSERT_NE(at, std::string::npos) << "\"" << t << "\" missing (in order) from: " << line;
    pos = at + t.size();
  }
}

// The demo run: "read" is the busiest stage but mostly blocked on output, so the bottleneck
// is "decode".
void publish_demo(stats::RecordWriter& w, uint64_t step, double samples_per_s = 1600.0) {
  w.update([&](stats::RunRecord& r) {
    r.state = stats::RunState::running;
    set_text(r.run_name, "resnet-small");
    set_text(r.preset, "cifar10");
    set_text(r.device, "cpu");
    set_text(r.run_dir, "/runs/resnet-small");
    r.step = step;
    r.total_steps = 5000;
    r.samples = step * 128;
    r.loss = 0.4321;
    r.steps_per_s = 12.5;
    r.samples_per_s = samples_per_s;
    r.eta_s = 304;
    r.data_wait_frac_recent = 0.03;
    r.host_rss_bytes = 1500ull << 20;
    r.device_reserved_bytes = 4ull << 30;
    r.validation_loss = 0.512;
    r.best_validation_loss = 0.498;
    r.num_stages = 3;
    auto stage = [&](int i, const char* name, const char* kind, double busy, double wait,
                     double blocked, double rate, double latency, uint32_t depth, uint32_t cap) {
      auto& s = r.stages[i];
      set_text(s.name, name);
      set_text(s.kind, kind);
      s.busy_frac_recent = busy;
      s.wait_input_frac_recent = wait;
      s.blocked_output_frac_recent = blocked;
      s.items_per_s_recent = rate;
      s.mean_latency_ms_recent = latency;
      s.queue_depth = depth;
      s.queue_capacity = cap;
      s.concurrency = 1;
      s.items_in = s.items_out = step * 128;
    };
    stage(0, "read", "source", 0.99, 0.0, 0.90, 1600.0, 0.08, 8, 8);
    stage(1, "decode", "map", 0.95, 0.01, 0.02, 1600.0, 2.4, 3, 8);
    stage(2, "train", "train", 0.60, 0.38, 0.0, 12.5, 48.0, 1, 2);
    r.stages[0].flags = stats::kStageSource;
    r.stages[2].flags = stats::kStageTrainable | stats::kStageLoss;
    r.num_pools = 1;
    set_text(r.pools[0].name, "host");
    r.pools[0].in_use_bytes = 3ull << 29;    // 1.50 GiB
    r.pools[0].reserved_bytes = 2ull << 30;  // 2.00 GiB
    r.pools[0].peak_bytes = 7ull << 28;      // 1.75 GiB
    r.pools[0].allocations = 1000;
  });
}

class SmiCli : public ::testing::Test {
 protected:
  void SetUp() override {
    writer_ = std::make_unique<stats::RecordWriter>(dir_.path());
    publish_demo(*writer_, 1200);
    env_ = {{"SLIPSTREAM_STATS_DIR", dir_.path()}, {"SLIPSTREAM_SMI_NVML_PATH", kNoNvml}};
  }
  std::string pid() const { return std::to_string(::getpid()); }
  TempDir dir_;
  std::unique_ptr<stats::RecordWriter> writer_;
  std::map<std::string, std::string> env_;
};

TEST_F(SmiCli, TableShowsCountersAndBottleneck) {
  Result r = run_smi({}, env_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::string& t = r.out;
  EXPECT_NE(t.find("| SLIPSTREAM-SMI "), std::string::npos) << t;
  EXPECT_NE(t.find("Driver Version: N/A"), std::string::npos);
  EXPECT_NE(line_with(t, "No NVIDIA GPU found: ")
                .rfind("No NVIDIA GPU found: " + kNoNvml + " not loadable (" + kNoNvml +
                           ": cannot open shared object file",
                       0),
            std::string::npos)
      << t;
  expect_in_order(line_with(t, "resnet-small  "),
                  {pid(), "resnet-small", "running", "12.50", "1600.0"});
  expect_in_order(line_with(t, "cifar10"), {"cifar10", "cpu", "1200 / 5000", "0.4321", "0:05:04"});
  expect_in_order(line_with(t, " read "),
                  {"read", "source", "99.0%", "1600.0", "0.080ms", "0.0%", "90.0%", "8/8"});
  std::string decode = line_with(t, " decode ");
  expect_in_order(decode, {"decode", "map", "95.0%", "1600.0", "2.40ms", "1.0%", "2.0%", "3/8",
                           "<- bottleneck"});
  expect_in_order(line_with(t, " train "),
                  {"train", "train", "60.0%", "12.50", "48.00ms", "38.0%", "0.0%", "1/2"});
  EXPECT_EQ(line_with(t, "<- bottleneck"), decode);
  expect_in_order(line_with(t, " host "),
                  {"host", "1.50 GiB", "2.00 GiB", "1.75 GiB", "1000", "0"});
  for (const auto& l : lines_of(t)) {
    if (!l.empty() && (l[0] == '|' || l[0] == '+')) {
      EXPECT_EQ(l.size(), 110u) << l;
    }
  }
}

TEST_F(SmiCli, NoRunsFound) {
  writer_.reset();
  Result r = run_smi({}, env_);
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("No running slipstream pipelines found in " + dir_.path()),
            std::string::npos)
      << r.out;
}

// A stats folder that is not there or not a folder is an error with the reason, not "no runs".
TEST_F(SmiCli, AStatsFolderThatCannotBeReadIsAnError) {
  for (const std::string& dir : {dir_.path() + "/missing", dir_.path() + "/file"}) {
    if (dir.ends_with("file")) std::ofstream(dir) << "x";
    Result r = run_smi({"--stats-dir", dir}, env_);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.err.find("cannot read the stats records' folder " + dir + ": "), std::string::npos)
        << r.err;
    EXPECT_EQ(r.out.find("No running"), std::string::npos) << r.out;
  }
  Result r = run_smi({"-f", dir_.path() + "/missing/out.txt"}, env_);
  EXPECT_NE(r.err.find("out.txt for writing: No such file or directory"), std::string::npos)
      << r.err;
}

TEST_F(SmiCli, QueryRunCsv) {
  const std::string q =
      "--query-run=pid,name,preset,device,state,step,total_steps,steps_per_s,samples_per_s,loss,"
      "eta,run_dir";
  Result r = run_smi({q, "--format=csv"}, env_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out,
            "pid, name, preset, device, state, step, total_steps, steps_per_s [steps/s], "
            "samples_per_s [samples/s], loss, eta [s], run_dir\n" +
                pid() +
                ", resnet-small, cifar10, cpu, running, 1200, 5000, 12.50 steps/s, 1600.0 "
                "samples/s, 0.4321, 304 s, /runs/resnet-small\n");
  r = run_smi({q, "--format=csv,noheader,nounits"}, env_);
  EXPECT_EQ(r.out, pid() +
                       ", resnet-small, cifar10, cpu, running, 1200, 5000, 12.50, 1600.0, 0.4321, "
                       "304, /runs/resnet-small\n");
  r = run_smi({q, "--format=csv,nounits"}, env_);
  EXPECT_EQ(lines_of(r.out).size(), 2u);
  EXPECT_EQ(lines_of(r.out)[0].rfind("pid, name, preset", 0), 0u);
  EXPECT_NE(lines_of(r.out)[0].find("steps_per_s [steps/s]"), std::string::npos);
  r = run_smi({q, "--format=csv,noheader"}, env_);
  EXPECT_EQ(lines_of(r.out).size(), 1u);
  EXPECT_NE(r.out.find("12.50 steps/s"), std::string::npos);
}

TEST_F(SmiCli, QueryStageCsvMarksBottleneck) {
  Result r = run_smi({"--query-stage=pid,run,name,kind,busy,items_per_s,latency_ms,wait_input,"
                      "blocked_output,queue_depth,queue_capacity,bottleneck",
                      "--format=csv"},
                     env_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out,
            "pid, run, name, kind, busy [%], items_per_s [items/s], latency_ms [ms], wait_input "
            "[%], blocked_output [%], queue_depth, queue_capacity, bottleneck\n" +
                pid() +
                ", resnet-small, read, source, 99.0 %, 1600.0 items/s, 0.080 ms, 0.0 %, 90.0 %, 8, "
                "8, No\n" +
                pid() +
                ", resnet-small, decode, map, 95.0 %, 1600.0 items/s, 2.400 ms, 1.0 %, 2.0 %, 3, "
                "8, Yes\n" +
                pid() +
                ", resnet-small, train, train, 60.0 %, 12.5 items/s, 48.000 ms, 38.0 %, 0.0 %, 1, "
                "2, No\n");
  r = run_smi({"--query-stage=name,bottleneck", "--format=csv,noheader,nounits"}, env_);
  EXPECT_EQ(r.out, "read, No\ndecode, Yes\ntrain, No\n");
}

TEST_F(SmiCli, QueryGpuWithoutNvml) {
  Result r = run_smi({"--query-gpu=index,name,memory.used", "--format=csv"}, env_);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "index, name, memory.used [MiB]\n");
  EXPECT_NE(r.err.find("No NVIDIA GPU found: " + kNoNvml + " not loadable"), std::string::npos)
      << r.err;
}

TEST_F(SmiCli, UnknownFieldIsUsageError) {
  Result r = run_smi({"--query-run=pid,bogus", "--format=csv"}, env_);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("unknown field \"bogus\" in --query-run"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("steps_per_s"), std::string::npos) << r.err;
  r = run_smi({"--query-gpu=memory.usedd"}, env_);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("clocks.sm"), std::string::npos) << r.err;
  EXPECT_EQ(run_smi({"--query-run=pid", "--format=xml"}, env_).status, 2);
  EXPECT_EQ(run_smi({"--no-such-flag"}, env_).status, 2);
  EXPECT_EQ(run_smi({"dmon", "-s", "z", "-c", "1"}, env_).status, 2);
  EXPECT_EQ(run_smi({"dmon", "-c", "0"}, env_).status, 2);  // no count: leave -c out
  // An interval out of range says the range in plain numbers (not the largest double).
  r = run_smi({"-l", "0"}, env_);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("not in range 1 to 86400"), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 200u) << r.err;
}

TEST_F(SmiCli, Json) {
  Result r = run_smi({"--json"}, env_);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["gpus"].empty());
  EXPECT_NE(j["gpu_unavailable"].get<std::string>().find("not loadable"), std::string::npos);
  ASSERT_EQ(j["runs"].size(), 1u);
  const auto& run = j["runs"][0];
  EXPECT_EQ(run["pid"], ::getpid());
  EXPECT_EQ(run["name"], "resnet-small");
  EXPECT_EQ(run["step"], 1200);
  EXPECT_EQ(run["total_steps"], 5000);
  EXPECT_EQ(run["samples"], 1200 * 128);
  EXPECT_DOUBLE_EQ(run["loss"].get<double>(), 0.4321);
  EXPECT_DOUBLE_EQ(run["samples_per_s"].get<double>(), 1600.0);
  EXPECT_EQ(run["bottleneck"], "decode");
  ASSERT_EQ(run["stages"].size(), 3u);
  EXPECT_EQ(run["stages"][1]["name"], "decode");
  EXPECT_TRUE(run["stages"][1]["bottleneck"].get<bool>());
  EXPECT_FALSE(run["stages"][0]["bottleneck"].get<bool>());
  EXPECT_DOUBLE_EQ(run["stages"][1]["busy_frac"].get<double>(), 0.95);
  EXPECT_EQ(run["stages"][0]["queue_capacity"], 8);
  EXPECT_TRUE(run["stages"][0]["source"].get<bool>());
  EXPECT_EQ(run["pools"][0]["in_use_bytes"], 3ull << 29);
  EXPECT_TRUE(j["errors"].empty());
}

// A record with bytes that are not UTF-8 and control characters in its names (any process of
// the user can write one) and absurd readings: every output still works and stays inert.
TEST_F(SmiCli, PlantedNamesAndValuesAreSafeInEveryOutput) {
  writer_->update([](stats::RunRecord& r) {
    set_text(r.run_name, "bad\xFF\xFEname\x1b[2J\nrow");
    set_text(r.stages[1].name, "dec\x1b[31mode");
    r.eta_s = 1e300;
    r.steps_per_s = std::nan("");
  });
  Result r = run_smi({"--json"}, env_);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["runs"][0]["name"], "bad\xEF\xBF\xBD\xEF\xBF\xBDname\x1b[2J\nrow");
  EXPECT_TRUE(j["runs"][0]["eta_s"].is_null());
  EXPECT_TRUE(j["runs"][0]["steps_per_s"].is_null());

  r = run_smi({}, env_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bad\\xff\\xfename\\x1b[2J\\nrow"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dec\\x1b[31mode"), std::string::npos) << r.out;

  r = run_smi({"--query-run=pid,name,eta", "--format=csv,noheader"}, env_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, pid() + ", bad\\xff\\xfename\\x1b[2J\\nrow, [N/A]\n");
}

// A run name in another script keeps the table's borders in line: padded by columns, not bytes.
TEST_F(SmiCli, ANonAsciiRunNameKeepsTheTableAligned) {
  writer_->update([](stats::RunRecord& r) { set_text(r.run_name, "\xC3\xBCn\xC3\xAF-run"); });
  Result r = run_smi({}, env_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\xC3\xBCn\xC3\xAF-run"), std::string::npos) << r.out;
  for (const auto& l : lines_of(r.out)) {
    if (l.empty() || (l[0] != '|' && l[0] != '+')) continue;
    // Characters, not bytes: every byte but a UTF-8 continuation byte starts one.
    const auto columns = std::count_if(
        l.begin(), l.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
    EXPECT_EQ(columns, 110) << l;
  }
}

TEST_F(SmiCli, MalformedRecordsAreErrorLinesNotCrashes) {
  const uint32_t uid = static_cast<uint32_t>(::geteuid());
  LiveChild live;  // alive and ours: its record is read, not removed as stale
  const int live_pid = live.pid();
  const std::string garbage = stats::record_path(dir_.path(), uid, live_pid);
  std::vector<unsigned char> bytes(sizeof(stats::RunRecord), 0xAB);
  write_file(garbage, bytes.data(), bytes.size());

  Result r = run_smi({}, env_);
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.err, "");  // the table carries the error
  EXPECT_NE(r.out.find("Unreadable stats records:"), std::string::npos) << r.out;
  EXPECT_NE(table_text(r.out).find("error: " + garbage +
                                   ": not a slipstream stats record (magic 0xABABABAB)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("<- bottleneck"), std::string::npos);  // the good run still shows

  stats::RunRecord valid = make_record(live_pid);
  write_file(garbage, &valid, 100);  // truncated
  r = run_smi({"--query-run=pid,name", "--format=csv,noheader"}, env_);
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.out, pid() + ", resnet-small\n");
  EXPECT_NE(r.err.find("slipstream-smi: error: " + garbage + ": truncated"), std::string::npos)
      << r.err;

  stats::RunRecord newer = make_record(live_pid);
  newer.layout_version = stats::kLayoutVersion + 1;
  write_record(garbage, newer);
  r = run_smi({"--json"}, env_);
  EXPECT_EQ(r.status, 3);
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["errors"].size(), 1u);
  EXPECT_EQ(j["errors"][0]["error"],
            garbage + ": stats record layout version " + std::to_string(stats::kLayoutVersion + 1) +
                ", this slipstream-smi reads version " + std::to_string(stats::kLayoutVersion) +
                "; use the slipstream-smi of the same build");
  EXPECT_EQ(j["runs"].size(), 1u);

  write_file(garbage, "", 0);  // empty
  r = run_smi({"dmon", "-c", "1", "-s", "r"}, env_);
  EXPECT_EQ(r.status, 3);
  EXPECT_NE(r.err.find("truncated: 0 bytes"), std::string::npos) << r.err;
}

TEST_F(SmiCli, StaleRecordOfDeadPidRemoved) {
  const int dead = dead_pid();
  const std::string stale =
      stats::record_path(dir_.path(), static_cast<uint32_t>(::geteuid()), dead);
  write_record(stale, make_record(dead));
  Result r = run_smi({"--query-run=pid", "--format=csv,noheader"}, env_);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, pid() + "\n");
  EXPECT_FALSE(file_exists(stale));
}

// A run that stopped publishing (SIGSTOP, hung) is "stale", with the age of its last record; a
// record whose pid now belongs to a process that started after the run is a reused pid: gone.
TEST_F(SmiCli, SilentRunsAreStaleAndReusedPidsAreRemoved) {
  const auto now_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count());
  writer_->update([&](stats::RunRecord& r) { r.update_unix_ns = now_ns - 83'000'000'000ull; });
  LiveChild reused;
  stats::RunRecord old = make_record(reused.pid());
  old.start_unix_ns = now_ns - 3600'000'000'000ull;  // the run began an hour before this process
  old.update_unix_ns = now_ns - 3500'000'000'000ull;
  const std::string path =
      stats::record_path(dir_.path(), static_cast<uint32_t>(::geteuid()), reused.pid());
  write_record(path, old);
  Result r = run_smi({"--query-run=pid,state,heartbeat_age", "--format=csv,noheader"}, env_);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind(pid() + ", stale 8", 0), 0u) << r.out;
  EXPECT_EQ(lines_of(r.out).size(), 1u) << r.out;
  EXPECT_FALSE(file_exists(path));
  Result table = run_smi({}, env_);
  EXPECT_NE(table.out.find("stale 8"), std::string::npos) << table.out;
  // dmon has no state column: a stale run's rates, ETA and busy are dashes, not its old figures.
  Result dmon = run_smi({"dmon", "-s", "rs", "-c", "1"}, env_);
  EXPECT_EQ(dmon.status, 0) << dmon.err;
  const std::string line = line_with(dmon.out, pid());
  EXPECT_EQ(line.find("12.5"), std::string::npos) << dmon.out;  // its steps/s before it stopped
  expect_in_order(line, {pid(), "1200", "-", "-", "0.4321", "-"});
}

// What a run's health needs at a glance: the data wait, host and device memory, and the
// latest and best validation loss, in the table, the query fields and the JSON.
TEST_F(SmiCli, RunsShowDataWaitMemoryAndValidationLoss) {
  Result q = run_smi({"--query-run=pid,data_wait,host_rss,device_memory,validation_loss,"
                      "best_validation_loss",
                      "--format=csv,noheader"},
                     env_);
  EXPECT_EQ(q.status, 0) << q.err;
  EXPECT_EQ(q.out, pid() + ", 3.0 %, 1500 MiB, 4096 MiB, 0.512, 0.498\n");
  Result table = run_smi({}, env_);
  expect_in_order(table.out, {"Data-Wait", "Host-RSS", "Device-Mem", "Val-Loss", "Best-Val", "3.0%",
                              "1.46 GiB", "4.00 GiB", "0.5120", "0.4980"});
  auto j = nlohmann::json::parse(run_smi({"--json"}, env_).out);
  EXPECT_DOUBLE_EQ(j["runs"][0]["data_wait_frac"].get<double>(), 0.03);
  EXPECT_EQ(j["runs"][0]["host_rss_bytes"], 1500ull << 20);
  EXPECT_EQ(j["runs"][0]["best_validation_loss"], 0.498);
}

TEST_F(SmiCli, OutputToFile) {
  const std::string file = dir_.path() + "/smi.log";
  Result r = run_smi({"-f", file, "--query-run=name", "--format=csv,noheader"}, env_);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(read_file(file), "resnet-small\n");
  EXPECT_EQ(run_smi({"-f", "/nonexistent/dir/smi.log"}, env_).status, 1);
}

TEST_F(SmiCli, NoNvmlByDefaultOnThisKindOfMachine) {
  // Without the override the real soname is tried; on a machine without the driver the GPU
  // section is one line and the pipelines still show.
  auto env = env_;
  env.erase("SLIPSTREAM_SMI_NVML_PATH");
  if (::access("/proc/driver/nvidia/version", F_OK) == 0) GTEST_SKIP() << "NVIDIA driver present";
  Result r = run_smi({}, env);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("No NVIDIA GPU found: libnvidia-ml.so.1 not loadable ("), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("<- bottleneck"), std::string::npos);
}

TEST_F(SmiCli, FakeNvmlGpuTableAndQuery) {
  auto env = env_;
  env["SLIPSTREAM_SMI_NVML_PATH"] = SMI_FAKE_NVML_PATH;
  Result r = run_smi({}, env);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string& t = r.out;
  EXPECT_NE(t.find("Driver Version: 550.54.15"), std::string::npos) << t;
  EXPECT_NE(t.find("CUDA Version: 12.4"), std::string::npos);
  expect_in_order(line_with(t, "Fake GPU Alpha"),
                  {"0", "Fake GPU Alpha", "00000000:18:00.0", "87%", "12%"});
  expect_in_order(line_with(t, "40%   30C"),
                  {"40%", "30C", "P0", "71W /  700W", "1024MiB /  81559MiB", "1980MHz", "2619MHz"});
  expect_in_order(line_with(t, "Fake GPU Beta"), {"1", "Fake GPU Beta", "00000000:2A:00.0", "5%"});
  expect_in_order(line_with(t, "350W"), {"N/A", "31C", "P0", "350W /  700W"});

  r = run_smi({"--query-gpu=index,name,temperature.gpu,power.draw,power.limit,memory.used,"
               "memory.total,utilization.gpu,clocks.sm,driver_version,fan.speed",
               "--format=csv"},
              env);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(
      r.out,
      "index, name, temperature.gpu, power.draw [W], power.limit [W], memory.used [MiB], "
      "memory.total [MiB], utilization.gpu [%], clocks.sm [MHz], driver_version, fan.speed [%]\n"
      "0, Fake GPU Alpha, 30, 71.23 W, 700.00 W, 1024 MiB, 81559 MiB, 87 %, 1980 MHz, 550.54.15, "
      "40 %\n"
      "1, Fake GPU Beta, 31, 350.00 W, 700.00 W, 1024 MiB, 81559 MiB, 5 %, 1980 MHz, 550.54.15, "
      "[N/A]\n");

  r = run_smi({"-i", "1", "--query-gpu=index,name", "--format=csv,noheader"}, env);
  EXPECT_EQ(r.out, "1, Fake GPU Beta\n");
  r = run_smi({"-i", "0,1", "--query-gpu=index", "--format=csv,noheader"}, env);
  EXPECT_EQ(r.out, "0\n1\n");
  r = run_smi({"-i", "5"}, env);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("GPU index 5 not found"), std::string::npos) << r.err;
  EXPECT_EQ(run_smi({"-i", "zero"}, env).status, 2);

  // Old drivers: the v2 memory call fails and v1's numbers are used.
  env["FAKE_NVML_NO_V2"] = "1";
  r = run_smi({"--query-gpu=memory.used", "--format=csv,noheader,nounits"}, env);
  EXPECT_EQ(r.out, "999\n999\n");
}

TEST_F(SmiCli, DmonLines) {
  auto env = env_;
  env["SLIPSTREAM_SMI_NVML_PATH"] = SMI_FAKE_NVML_PATH;
  Result r = run_smi({"dmon", "-c", "2", "-d", "1"}, env);
  ASSERT_EQ(r.status, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 2u + 2 * 3) << r.out;  // 2 header lines, then 2 GPUs + 1 run, twice
  EXPECT_EQ(lines[0].rfind("# gpu", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("# Idx", 0), 0u) << lines[1];
  for (const char* col : {"pwr", "gtemp", "sm", "mem", "mclk", "pclk", "step", "stp/s", "bneck"})
    EXPECT_NE(lines[0].find(col), std::string::npos) << col;
  std::istringstream gpu0(lines[2]);
  std::vector<std::string> f;
  for (std::string w; gpu0 >> w;) f.push_back(w);
  // gpu pid pwr gtemp sm mem mclk pclk step stp/s smp/s loss eta bneck busy it/s
  ASSERT_EQ(f.size(), 16u) << lines[2];
  EXPECT_EQ(f[0], "0");
  EXPECT_EQ(f[1], "-");
  EXPECT_EQ(f[2], "71");
  EXPECT_EQ(f[3], "30");
  EXPECT_EQ(f[4], "87");
  EXPECT_EQ(f[6], "2619");
  EXPECT_EQ(f[7], "1755");
  expect_in_order(lines[4], {"-", pid(), "1200", "12.50", "1600.0", "0.4321", "304", "decode",
                             "95.0", "1600.0"});
  EXPECT_EQ(lines[4], lines[7]);

  // Only our groups, no NVML at all: run lines only, with the pid column first.
  r = run_smi({"dmon", "-c", "1", "-s", "rs"}, env_);
  ASSERT_EQ(r.status, 0) << r.err;
  lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  std::istringstream header(lines[0]);
  std::string hash, first;
  header >> hash >> first;
  EXPECT_EQ(hash, "#");
  EXPECT_EQ(first, "pid") << lines[0];
  expect_in_order(lines[2], {pid(), "1200", "decode"});
}

TEST_F(SmiCli, HelpQueryListsFields) {
  Result r = run_smi({"--help-query"}, env_);
  EXPECT_EQ(r.status, 0);
  for (const char* f :
       {"--query-gpu=", "--query-run=", "--query-stage=", "memory.used [MiB]", "clocks.sm [MHz]",
        "steps_per_s [steps/s]", "run_dir", "blocked_output [%]", "bottleneck"})
    EXPECT_NE(r.out.find(f), std::string::npos) << f;
  r = run_smi({"--version"}, env_);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.rfind("slipstream-smi ", 0), 0u);
}

TEST_F(SmiCli, LoopReprintsToFile) {
  // -lms 100 for ~1 s into a file: several rows under one header; the loop ends on a signal.
  const std::string file = dir_.path() + "/loop.csv";
  Result r = run_smi({"-lms", "100", "-f", file, "--query-run=step", "--format=csv"}, env_,
                     std::chrono::milliseconds(1000));
  EXPECT_EQ(r.status, 128 + SIGTERM);
  auto lines = lines_of(read_file(file));
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines[0], "step");
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_EQ(lines[i], "1200");
  // The same with the -lms=MS and --loop-ms spellings, and the table view.
  r = run_smi({"-lms=100", "-f", file}, env_, std::chrono::milliseconds(700));
  std::string text = read_file(file);
  size_t tables = 0;
  for (size_t at = 0; (at = text.find("| SLIPSTREAM-SMI", at)) != std::string::npos; ++at) ++tables;
  EXPECT_GE(tables, 3u);
}

// tmux drives the looping default view like a person at a terminal: the counters change while
// it runs, and the new values appear on screen.
class TmuxSession {
 public:
  TmuxSession() {
    static int sessions = 0;  // a fresh server per session: kill-server is asynchronous
    socket_ =
        "slipstream-smi-test-" + std::to_string(::getpid()) + "-" + std::to_string(++sessions);
  }
  ~TmuxSession() { shell("tmux -L " + socket_ + " kill-server >/dev/null 2>&1"); }
  static bool available() { return shell("command -v tmux >/dev/null 2>&1") == 0; }
  int start(const std::string& command) {
    return shell("env -u TMUX tmux -L " + socket_ + " new-session -d -s smi -x 200 -y 60 '" +
                 command + "'");
  }
  std::string capture() const {
    std::string out;
    FILE* p = ::popen(("tmux -L " + socket_ + " capture-pane -p -t smi 2>/dev/null").c_str(), "r");
    if (!p) return out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    ::pclose(p);
    return out;
  }
  // Polls the screen until it shows needle; false after timeout.
  bool wait_for(const std::string& needle, std::chrono::seconds timeout) const {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (capture().find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  static int shell(const std::string& cmd) { return std::system(cmd.c_str()); }
  std::string socket_;
};

TEST_F(SmiCli, LoopModeRefreshesUnderTmux) {
  if (!TmuxSession::available()) GTEST_SKIP() << "tmux not installed (apt-get install tmux)";
  TmuxSession tmux;
  ASSERT_EQ(tmux.start("env SLIPSTREAM_STATS_DIR=" + dir_.path() +
                       " SLIPSTREAM_SMI_NVML_PATH=" + kNoNvml + " " + kSmi + " -lms 200"),
            0);
  ASSERT_TRUE(tmux.wait_for("1200 / 5000", std::chrono::seconds(15))) << tmux.capture();
  EXPECT_TRUE(tmux.wait_for("<- bottleneck", std::chrono::seconds(5))) << tmux.capture();
  publish_demo(*writer_, 4321, 2345.0);
  EXPECT_TRUE(tmux.wait_for("4321 / 5000", std::chrono::seconds(15))) << tmux.capture();
  EXPECT_TRUE(tmux.wait_for("2345.0", std::chrono::seconds(5))) << tmux.capture();
  // -l SEC spelling with the nvidia-smi flag, too: a second session is not needed; -l 1 is
  // covered by the csv loop test below.
}

TEST_F(SmiCli, LoopModeCsvUnderTmux) {
  if (!TmuxSession::available()) GTEST_SKIP() << "tmux not installed (apt-get install tmux)";
  TmuxSession tmux;
  ASSERT_EQ(tmux.start("env SLIPSTREAM_STATS_DIR=" + dir_.path() + " " + kSmi +
                       " -l 1 --query-run=name,step --format=csv"),
            0);
  ASSERT_TRUE(tmux.wait_for("resnet-small, 1200", std::chrono::seconds(15))) << tmux.capture();
  publish_demo(*writer_, 2500);
  ASSERT_TRUE(tmux.wait_for("resnet-small, 2500", std::chrono::seconds(15))) << tmux.capture();
  // The header is printed once, as nvidia-smi -l does.
  std::string screen = tmux.capture();
  size_t first = screen.find("name, step");
  ASSERT_NE(first, std::string::npos) << screen;
  EXPECT_EQ(screen.find("name, step", first + 1), std::string::npos) << screen;
}

}  // namespace
}  // namespace slipstream::smi_test

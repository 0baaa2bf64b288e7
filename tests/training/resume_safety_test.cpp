// The newcomer's ways to lose a run, through `slipstream run` on the real graph: a resume given
// another preset, a resume whose --set changes the model's shapes, a reader of the output that
// goes away.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/run_directory.h"
#include "tests/support/cli_output.h"
#include "tests/support/temp_dir.h"
#include "tests/training/training_fixture.h"

using namespace slipstream;
using slipstream::testing::source_path;
using slipstream::testing::TempDir;
using slipstream::testing::tiny_overrides;
namespace fs = std::filesystem;

namespace {

using Output = slipstream::testing::CliOutput;
Output run_cli(const std::string& args) {
  return slipstream::testing::run_command(std::string(SLIPSTREAM_CLI) + " " + args);
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// A tiny run of configs/train_bc.yaml for `steps` steps, checkpointing every step; its directory.
std::string first_run(const TempDir& d, int steps, const std::string& extra = "") {
  std::string args = "run --config " + source_path("configs/train_bc.yaml");
  for (const auto& s : tiny_overrides(d.path())) args += " --set " + s;
  args += " --set run.steps=" + std::to_string(steps) + " --set ckpt.every=1" + extra;
  Output o = run_cli(args);
  EXPECT_EQ(o.status, 0) << o.text;
  for (const auto& e : fs::directory_iterator(d.path() + "/runs")) return e.path().string();
  return {};
}

}  // namespace

// `--resume RUN --preset cpu_quick` (what `make run ARGS="--resume RUN"` used to do): refused
// with the differences, exit 2, the run untouched. The run's own config.yaml given as --config
// is the same graph, and resumes.
TEST(ResumeSafety, AResumeGivenAnotherPresetIsRefusedWithTheDifferences) {
  TempDir d;
  const std::string dir = first_run(d, 2);
  const std::string config = read(fs::path(dir) / "config.yaml");
  Output o = run_cli("run --resume " + dir + " --preset cpu_quick --set run.steps=4");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_NE(o.text.find("refused, it is not the graph the run trains"), std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("core.d_model: 16 -> "), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("replays.synthetic: 6 -> "), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("--set run.init_from=" + dir), std::string::npos) << o.text;
  // A graph of another core: its weights cannot start it, so init_from is not offered.
  Output gru = run_cli("run --resume " + dir + " --preset cpu_quick_gru --set run.steps=4");
  EXPECT_EQ(gru.status, 2) << gru.text;
  EXPECT_NE(gru.text.find("core.kind: mamba -> gru"), std::string::npos) << gru.text;
  EXPECT_NE(gru.text.find("start a new run of cpu_quick_gru (its stages are of other kinds"),
            std::string::npos)
      << gru.text;
  EXPECT_EQ(gru.text.find("run.init_from"), std::string::npos) << gru.text;
  EXPECT_EQ(read(fs::path(dir) / "config.yaml"), config);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "config.previous.yaml"));
  Output same =
      run_cli("run --resume " + dir + " --config " + dir + "/config.yaml --set run.steps=3");
  EXPECT_EQ(same.status, 0) << same.text;
  EXPECT_NE(same.text.find("done: 3 steps"), std::string::npos) << same.text;
}

// A resume with another batch size goes on, warning with what changed (it named the windows'
// count alone, unchanged, so the warning read as if nothing had).
TEST(ResumeSafety, AResumeWithAnotherBatchSizeSaysWhatChanged) {
  TempDir d;
  const std::string dir = first_run(d, 2);
  Output o = run_cli("run --resume " + dir + " --set replays.batch_size=2 --set run.steps=3");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("settings differ from the checkpoint's (batch_size: "), std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find(" then, 2 now)"), std::string::npos) << o.text;
}

// `--resume RUN --set core.d_model=32`: the checkpoint's shapes do not fit; the error says so,
// and config.yaml, metrics.jsonl and the checkpoints are as they were: a plain resume and eval
// still work.
TEST(ResumeSafety, AResumeWhoseShapesDoNotFitLeavesTheRunUsable) {
  TempDir d;
  const std::string dir = first_run(d, 2);
  const std::string config = read(fs::path(dir) / "config.yaml");
  const std::string metrics = read(fs::path(dir) / "metrics.jsonl");
  Output o = run_cli("run --resume " + dir + " --set core.d_model=32 --set run.steps=4");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("core."), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("drop the --set that changes its size"), std::string::npos) << o.text;
  EXPECT_EQ(o.text.find("config.yaml: updated"), std::string::npos) << o.text;
  EXPECT_EQ(read(fs::path(dir) / "config.yaml"), config);
  EXPECT_EQ(read(fs::path(dir) / "metrics.jsonl"), metrics);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "config.previous.yaml"));
  Output plain = run_cli("run --resume " + dir + " --set run.steps=3");
  EXPECT_EQ(plain.status, 0) << plain.text;
}

// `slipstream run ... | head -1`: the reader goes after one line; the run trains to its end,
// writes its checkpoint and end row, and exits 0.
TEST(ResumeSafety, AReaderThatGoesAwayCostsOnlyTheConsole) {
  TempDir d;
  std::string args = "run --config " + source_path("configs/train_bc.yaml");
  for (const auto& s : tiny_overrides(d.path())) args += " --set " + s;
  args += " --set run.steps=30 --set run.log_every=1";
  Output o = slipstream::testing::run_command("bash -c 'set -o pipefail; " +
                                              std::string(SLIPSTREAM_CLI) + " " + args +
                                              " | head -1; echo \"run exited ${PIPESTATUS[0]}\"'");
  EXPECT_NE(o.text.find("run exited 0"), std::string::npos) << o.text;
  std::string dir;
  for (const auto& e : fs::directory_iterator(d.path() + "/runs")) dir = e.path().string();
  ASSERT_FALSE(dir.empty());
  auto ckpt = latest_checkpoint(dir);
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_EQ(fs::path(*ckpt).filename(), "step-30");
  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line)) last = line;
  EXPECT_EQ(nlohmann::json::parse(last)["split"], "end");
  EXPECT_NE(read(fs::path(dir) / "console.log").find("done: 30 steps"), std::string::npos);
}

// `--resume RUN --set run.steps=N` past a finished cosine schedule: the schedule is rescaled to
// the new length, and the resume says what that does to the LR and how to keep the old one.
TEST(ResumeSafety, ExtendingACosineRunSaysWhatItDoesToTheLr) {
  TempDir d;
  const std::string dir = first_run(d, 4, " --set step.schedule=cosine");
  Output o = run_cli("run --resume " + dir + " --set run.steps=8");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("step: the cosine schedule now decays over 8 steps (the checkpoint's "
                        "run: 4): the LR at step 4 goes from 0 to"),
            std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("--set step.total_steps=4"), std::string::npos) << o.text;
  Output plain = run_cli("run --resume " + dir + " --set run.steps=10 --set step.total_steps=8");
  EXPECT_EQ(plain.text.find("cosine schedule now"), std::string::npos) << plain.text;
}

// A checkpoint that cannot be written (a full disk; here the shell caps a file's size below a
// checkpoint's and past every other file's) stops the run naming the newest checkpoint to go on
// from, and leaves nothing of the failed one. The resume it names then works.
TEST(ResumeSafety, ACheckpointThatCannotBeWrittenNamesTheNewestAndLeavesNoPart) {
  TempDir d;
  const std::string dir = first_run(d, 2);
  // ulimit -f counts 512-byte blocks in dash, 1024 in bash: 30 or 60 KB, below the 77 KB of the
  // tiny model's weights file; SIGXFSZ ignored, a write past it fails with EFBIG.
  Output o = slipstream::testing::run_command("trap '' XFSZ; ulimit -f 60; " +
                                              std::string(SLIPSTREAM_CLI) + " run --resume " + dir +
                                              " --set run.steps=4");
  EXPECT_NE(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("step-3 was not written (nothing of it is left). The newest checkpoint is "
                        "step-2: --resume " +
                        dir + " goes on from it"),
            std::string::npos)
      << o.text;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "checkpoints"))
    left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"last", "step-1", "step-2"}));
  Output again = run_cli("run --resume " + dir + " --set run.steps=4");
  EXPECT_EQ(again.status, 0) << again.text;
  EXPECT_EQ(fs::path(*latest_checkpoint(dir)).filename(), "step-4");
}

// The run directory removed or moved away while the run trains (an `rm -rf` or `mv` of the
// wrong folder): the next checkpoint makes it again with its config.yaml and metrics.jsonl takes
// the rows again, each said in a warning, so the run ends in a directory that resumes.
TEST(ResumeSafety, ARunDirectoryRemovedWhileTheRunTrainsComesBackAndResumes) {
  TempDir d;
  std::string args = "run --config " + source_path("configs/train_bc.yaml");
  for (const auto& s : tiny_overrides(d.path())) args += " --set " + s;
  args +=
      " --set run.steps=1000000 --set run.epochs=100000 --set ckpt.every=5 --set "
      "run.log_every=5";
  const std::string log = d.path() + "/log.txt";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c",
          ("exec " + std::string(SLIPSTREAM_CLI) + " " + args + " > " + log + " 2>&1").c_str(),
          nullptr);
    _exit(127);
  }
  auto stop = [&] {
    kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
  };
  auto wait_for = [](const std::function<bool()>& ready) {
    for (int i = 0; i < 1200; ++i) {
      if (ready()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  fs::path run;
  const bool checkpointed = wait_for([&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d.path() + "/runs", ec))
      if (latest_checkpoint(e.path().string())) run = e.path();
    return !run.empty();
  });
  if (!checkpointed) stop();
  ASSERT_TRUE(checkpointed) << "the run wrote no checkpoint";
  // Moved away whole, at once (an `rm -rf` racing the run's writes may leave some files; a
  // rename takes everything, the case to mend).
  fs::rename(run, run.string() + ".moved");
  const bool back = wait_for([&] {
    return fs::exists(run / "config.yaml") && fs::exists(run / "metrics.jsonl") &&
           latest_checkpoint(run.string()).has_value();
  });
  // ... and locked: a resume of it while the run trains is refused, as of any running run.
  const bool relocked =
      back && wait_for([&] { return read(log).find("locked again") != std::string::npos; });
  Output second = relocked ? run_cli("run --resume " + run.string()) : Output{};
  // The moved directory stays locked too: the run still writes its console.log there.
  Output moved = relocked ? run_cli("run --resume " + run.string() + ".moved") : Output{};
  // Its config.yaml emptied under the live run (a full disk's editor): a resume is refused as
  // in use, before it reads the file, and the run writes the file again at its next checkpoint.
  if (relocked) std::ofstream(run / "config.yaml", std::ios::trunc);
  Output emptied = relocked ? run_cli("run --resume " + run.string()) : Output{};
  const bool rewritten = relocked && wait_for([&] {
                           std::error_code ec;
                           return fs::file_size(run / "config.yaml", ec) > 0 && !ec;
                         });
  const int status = stop();
  ASSERT_TRUE(back) << "the run directory did not come back:\n" << read(log);
  ASSERT_TRUE(relocked) << read(log);
  EXPECT_NE(second.status, 0) << second.text;
  EXPECT_NE(second.text.find("in use by process"), std::string::npos) << second.text;
  EXPECT_NE(moved.status, 0) << moved.text;
  EXPECT_NE(moved.text.find("in use by process"), std::string::npos) << moved.text;
  EXPECT_NE(emptied.text.find("in use by process"), std::string::npos) << emptied.text;
  EXPECT_TRUE(rewritten) << read(log);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const std::string text = read(log);
  EXPECT_NE(text.find("config.yaml was gone"), std::string::npos) << text;
  EXPECT_NE(text.find("metrics.jsonl was gone"), std::string::npos) << text;
  const std::string name = fs::path(*latest_checkpoint(run.string())).filename().string();
  const uint64_t step = std::stoull(name.substr(5));
  Output more =
      run_cli("run --resume " + run.string() + " --set run.steps=" + std::to_string(step + 2));
  EXPECT_EQ(more.status, 0) << more.text;
  EXPECT_NE(more.text.find("done: " + std::to_string(step + 2) + " steps"), std::string::npos)
      << more.text;
}

// A run directory whose config.yaml was deleted or left empty (a full disk's editor) still has
// its checkpoints, whose weights carry the graph: --resume writes config.yaml again from the
// checkpoint it resumes, and goes on with the optimizer's state (it sent the user from "give a
// checkpoint" to "a checkpoint outside a run directory" and back). A rewind's set-aside folder
// is no run and gets none. `--resume ""` (an unset variable) is refused, never a new run.
TEST(ResumeSafety, ARunDirectoryWithoutItsConfigResumesFromItsCheckpointsGraph) {
  TempDir d;
  const std::string dir = first_run(d, 3);
  const fs::path config = fs::path(dir) / "config.yaml";
  fs::remove(config);
  {  // a run writing there holds its lock: nothing is written under it (the resume is refused)
    const DirectoryLock live(dir, "test");
    EXPECT_TRUE(directory_in_use(dir));
    EXPECT_EQ(restore_run_config(dir), "");
    EXPECT_FALSE(fs::exists(config));
  }
  EXPECT_FALSE(directory_in_use(dir));
  Output o = run_cli("run --resume " + dir + " --set run.steps=4");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("config.yaml was missing: written again from the graph step-3 carries"),
            std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("resumed from"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("done: 4 steps"), std::string::npos) << o.text;
  std::ofstream(config, std::ios::trunc).close();  // empty
  o = run_cli("run --resume " + dir + "/checkpoints/step-4 --set run.steps=5");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("config.yaml was empty: written again from the graph step-4 carries"),
            std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("done: 5 steps"), std::string::npos) << o.text;
  EXPECT_NE(read(config).find("stages:"), std::string::npos);
  EXPECT_EQ(restore_run_config(dir), "");  // there: left as it is

  // A rewind sets step-5 aside; its folder does not become a run.
  o = run_cli("run --resume " + dir + "/checkpoints/step-4 --set run.steps=5");
  EXPECT_EQ(o.status, 0) << o.text;
  fs::path aside;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "set-aside")) aside = e.path();
  ASSERT_FALSE(aside.empty());
  EXPECT_EQ(restore_run_config(aside.string()), "");
  EXPECT_FALSE(fs::exists(aside / "config.yaml"));

  const auto runs = [&] {
    return std::distance(fs::directory_iterator(d.path() + "/runs"), fs::directory_iterator());
  };
  const auto before = runs();
  o = run_cli("run --resume \"\" --config " + dir + "/config.yaml");
  EXPECT_NE(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("--resume \"\": no run directory given"), std::string::npos) << o.text;
  EXPECT_EQ(runs(), before);
}

// A stop signal while a fresh run sets up (decoding its replays, minutes on a large set) ends
// the process and takes the run's directory with it: it left a directory no resume could use
// (no checkpoint) and died by the signal with its console lost.
TEST(ResumeSafety, AStopSignalDuringSetupLeavesNoRunDirectory) {
  const std::string replays = slipstream::testing::shared_replays();
  if (replays.empty() && std::getenv("CI")) FAIL() << "CI without ../shared/replays";
  if (replays.empty()) GTEST_SKIP() << "../shared/replays is not beside the checkout";
  TempDir d;
  std::string args = "run --config " + source_path("configs/train_bc.yaml");
  for (const auto& s : tiny_overrides(d.path())) args += " --set " + s;
  args += " --set replays.paths=[" + replays + "] --set run.steps=5";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c",
          ("exec " + std::string(SLIPSTREAM_CLI) + " " + args + " > " + d.path() + "/log.txt 2>&1")
              .c_str(),
          nullptr);
    _exit(127);
  }
  // console.log is made once the start-up handlers are in place; setup (74 replays) follows.
  bool started = false;
  for (int i = 0; i < 20000 && !started; ++i) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d.path() + "/runs", ec))
      started = started || fs::exists(e.path() / "console.log");
    if (!started) std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(started) << read(d.path() + "/log.txt");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(d.path() + "/runs")) left.push_back(e.path());
  if (WIFEXITED(status)) {
    // The setup was over before the signal (a fast machine): then it stopped as a run does.
    EXPECT_EQ(WEXITSTATUS(status), 130) << read(d.path() + "/log.txt");
    EXPECT_EQ(left.size(), 1u);
  } else {
    ASSERT_TRUE(WIFSIGNALED(status));
    EXPECT_EQ(WTERMSIG(status), SIGINT);
    EXPECT_TRUE(left.empty()) << left.front();
  }
}

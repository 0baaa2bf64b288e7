// A run's work is never lost: a resume that fails writes nothing, a rewind moves the later
// checkpoints and rows aside, names a run did not write are left alone, one writer per run
// directory, writes that fail leave the old file whole, the stop signals checkpoint, a closed
// terminal costs only the terminal, and a run that fails before its first step leaves nothing.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "engine/atomic_file.h"
#include "engine/checkpoint.h"
#include "engine/config_diff.h"
#include "engine/console_tee.h"
#include "engine/host_memory.h"
#include "engine/resource_limits.h"
#include "engine/run_directory.h"
#include "engine/runner.h"
#include "engine/safetensors.h"
#include "engine/stop_signals.h"
#include "tests/engine/test_stages.h"
#include "tests/engine/writing_run_options.h"
#include "tests/support/temp_dir.h"

using namespace slipstream;
using slipstream::testing::recorded;
using slipstream::testing::reset_recorded;
using slipstream::testing::TempDir;
using slipstream::testing::with_set;
using slipstream::testing::writing_options;
namespace fs = std::filesystem;

namespace {

// src (20 batches) -> acc (a weight and a step count, saved) -> rec -> ckpt; rows every step.
std::string graph(const TempDir& d, const std::string& ckpt_params,
                  const std::string& acc_name = "acc") {
  return std::string(R"(stages:
  - {name: src, kind: test_counter, params: {count: 20, batch: 2}}
  - {name: )") +
         acc_name + R"(, kind: test_accumulator, inputs: [src]}
  - {name: rec, kind: test_recorder, inputs: [src]}
  - {name: ckpt, kind: checkpoint, inputs: [rec], params: {)" +
         ckpt_params + "}}\nrun: {log_every: 1, runs_dir: " + d.path() + "/runs}\n";
}

GraphPlan plan_text(const TempDir& d, const std::string& text, std::vector<std::string> sets = {}) {
  return plan_graph(load_config(d.write("g.yaml", text), sets));
}

RunOptions resume_options(const std::string& dir, const std::string& checkpoint = "") {
  RunOptions o = writing_options();
  o.resume_dir = dir;
  o.resume_checkpoint = checkpoint;
  return o;
}

// A first run of `steps` steps of graph `g`; its run directory.
std::string first_run(const TempDir& d, const std::string& g, int steps) {
  Runner first(plan_text(d, g, {"run.steps=" + std::to_string(steps)}), writing_options());
  return first.run().run_dir;
}

// What `fn` throws, "(nothing thrown)" when it returns.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

std::vector<nlohmann::json> rows(const fs::path& file) {
  std::ifstream in(file);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename() != "last") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Everything a run directory holds, file by file (path -> bytes), for "nothing changed".
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != ".lock" &&
        e.path().filename() != "console.log")
      out[fs::relative(e.path(), dir).string()] = read(e.path());
  return out;
}

fs::path only_subdirectory(const fs::path& dir) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dir)) found.push_back(e.path());
  EXPECT_EQ(found.size(), 1u) << dir;
  return found.empty() ? fs::path() : found.front();
}

}  // namespace

// A stage whose save() throws while a checkpoint is written: the error names that stage (not
// the checkpoint stage that asked), and nothing of the checkpoint is left, as it says.
TEST(ResumeSafety, AStageThatCannotSaveIsNamedAndNothingOfTheCheckpointIsLeft) {
  TempDir d;
  Runner r(plan_text(d, graph(d, "every: 4"), {"run.steps=12", "acc.fail_save_at=6"}),
           writing_options());
  const std::string m = error_of([&] { r.run(); });
  EXPECT_NE(m.find("stage 'acc' (test_accumulator): saving its state: the accumulator's state "
                   "is not ready; step-8 was not written (nothing of it is left)"),
            std::string::npos)
      << m;
  const std::vector<std::string> runs = names_in(d.path() + "/runs");
  ASSERT_EQ(runs.size(), 1u);
  const fs::path checkpoints = fs::path(d.path()) / "runs" / runs[0] / "checkpoints";
  EXPECT_EQ(names_in(checkpoints), (std::vector<std::string>{"step-4"}));
}

// A write through a symlink replaces the link's target, the link staying a link; a device or FIFO
// in the path's place is refused before anything is written (a rename over /dev/null, as root,
// would make it a file).
TEST(RunSafety, AnAtomicWriteGoesThroughSymlinksAndRefusesDevices) {
  TempDir d;
  const std::string target = d.write("target.txt", "old");
  fs::create_symlink(target, d.path() + "/link.txt");
  write_file_atomically(d.path() + "/link.txt", "new");
  EXPECT_TRUE(fs::is_symlink(d.path() + "/link.txt"));
  std::ifstream in(target);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "new");
  // A link whose target is not there yet: the target is made, the link stays.
  fs::create_symlink("made.txt", d.path() + "/dangling.txt");
  write_file_atomically(d.path() + "/dangling.txt", "made");
  EXPECT_TRUE(fs::is_symlink(d.path() + "/dangling.txt"));
  EXPECT_TRUE(fs::is_regular_file(d.path() + "/made.txt"));
  const std::string fifo = d.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  try {
    write_file_atomically(fifo, "x");
    FAIL() << "a FIFO was replaced";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file (a device, FIFO or socket)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
}

TEST(RunSafety, AResumeThatDoesNotFitItsCheckpointWritesNothing) {
  reset_recorded();
  TempDir d;
  const std::string dir = first_run(d, graph(d, "every: 2"), 4);
  const auto before = snapshot(dir);
  Runner other(plan_text(d, graph(d, "every: 2", "acc2"), {"run.steps=8"}), resume_options(dir));
  const std::string what = error_of([&] { other.run(); });
  EXPECT_NE(what.find("acc2"), std::string::npos) << what;
  EXPECT_EQ(snapshot(dir), before);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "config.previous.yaml"));
  EXPECT_NE(read(fs::path(dir) / "console.log").find("error: "), std::string::npos);
  Runner again(plan_text(d, graph(d, "every: 2"), {"run.steps=6"}), resume_options(dir));
  EXPECT_EQ(again.run().final_step, 6u);
}

// The newest checkpoint damaged (a flipped bit): the resume's error names the one before it and
// the --resume that goes on from there, which then works. Nothing is written.
TEST(RunSafety, ADamagedNewestCheckpointNamesTheOneBeforeIt) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2");
  const std::string dir = first_run(d, g, 4);
  const fs::path model = fs::path(dir) / "checkpoints" / "step-4" / "model.safetensors";
  std::string bytes = read(model);
  bytes[bytes.size() - 1] ^= 0x10;  // the last byte of the last tensor's data
  std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes;
  const auto before = snapshot(dir);
  Runner second(plan_text(d, g, {"run.steps=8"}), resume_options(dir));
  const std::string what = error_of([&] { second.run(); });
  const std::string earlier = (fs::path(dir) / "checkpoints" / "step-2").string();
  EXPECT_NE(what.find("does not match its checksum"), std::string::npos) << what;
  EXPECT_NE(what.find("the newest checkpoint before it is " + earlier + ": --resume " + earlier +
                      " goes on from there"),
            std::string::npos)
      << what;
  EXPECT_EQ(snapshot(dir), before);
  Runner third(plan_text(d, g, {"run.steps=8"}), resume_options(dir, earlier));
  EXPECT_EQ(third.run().final_step, 8u);
}

// `--resume RUN/checkpoints/step-2` with step-4, step-6 and their rows after it: they move into
// RUN/set-aside/after-step-2-<time>/, whole, and the run goes on from step 2.
TEST(RunSafety, ARewindMovesLaterCheckpointsAndRowsAsideAndDeletesNothing) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2, keep: 10, keep_best: 5");
  const std::vector<std::string> val = {"run.validate_every=2", "run.validate_batches=1"};
  auto with = [&](std::string s) { return with_set(val, std::move(s)); };
  Runner first(plan_text(d, g, with("run.steps=6")), writing_options());
  const std::string dir = first.run().run_dir;
  const fs::path root = fs::path(dir) / "checkpoints";
  const auto later = names_in(root);
  ASSERT_EQ(later, (std::vector<std::string>{"best-step-2", "best-step-4", "best-step-6", "step-2",
                                             "step-4", "step-6"}));
  const std::string step6_weights = read(root / "step-6" / "model.safetensors");
  const auto all_rows = rows(fs::path(dir) / "metrics.jsonl");

  Runner back(plan_text(d, g, with("run.steps=4")),
              resume_options(dir, (root / "step-2").string()));
  EXPECT_EQ(back.run().final_step, 4u);
  EXPECT_EQ(names_in(root),
            (std::vector<std::string>{"best-step-2", "best-step-4", "step-2", "step-4"}));
  const fs::path aside = only_subdirectory(fs::path(dir) / "set-aside");
  EXPECT_TRUE(aside.filename().string().starts_with("after-step-2-")) << aside;
  EXPECT_EQ(names_in(aside / "checkpoints"),
            (std::vector<std::string>{"best-step-4", "best-step-6", "step-4", "step-6"}));
  EXPECT_EQ(read(aside / "checkpoints" / "step-6" / "model.safetensors"), step6_weights);
  // Every row of the first run is in one file or the other.
  size_t past = 0;
  for (const auto& r : all_rows) past += r["step"].get<int>() > 2;
  const auto aside_rows = rows(aside / "metrics.jsonl");
  EXPECT_EQ(aside_rows.size(), past);
  for (const auto& r : aside_rows) EXPECT_GT(r["step"].get<int>(), 2) << r.dump();
  for (const auto& r : rows(fs::path(dir) / "metrics.jsonl"))
    EXPECT_LE(r["step"].get<int>(), 4) << r.dump();
}

// What a user put in checkpoints/ is theirs: a plain resume counts only complete checkpoints by
// their exact names, removes only its own `.tmp` leftovers, and lists what it left alone.
TEST(RunSafety, APlainResumeLeavesWhatItDidNotWrite) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2, keep: 2");
  const std::string dir = first_run(d, g, 4);
  const fs::path root = fs::path(dir) / "checkpoints";
  fs::copy(root / "step-2", root / "my-favourite", fs::copy_options::recursive);
  fs::copy(root / "step-2", root / "step-20.bak", fs::copy_options::recursive);
  fs::copy(root / "step-4", root / "step-40-good", fs::copy_options::recursive);
  std::ofstream(root / "README.txt") << "notes\n";
  fs::create_directories(root / "step-3");  // no DONE: not a checkpoint, not ours to remove
  fs::create_directories(root / "step-6.tmp");
  EXPECT_EQ(fs::path(*latest_checkpoint(dir)).filename(), "step-4");  // not step-40-good

  Runner second(plan_text(d, g, {"run.steps=8"}), resume_options(dir));
  EXPECT_EQ(second.run().final_step, 8u);
  EXPECT_EQ(names_in(root),
            (std::vector<std::string>{"README.txt", "my-favourite", "step-20.bak", "step-3",
                                      "step-40-good", "step-6", "step-8"}));
  EXPECT_EQ(read(root / "README.txt"), "notes\n");
}

// keep_best lowered on a resume removes none of the best checkpoints the run has at the start
// (it removed the extra ones there, the run's best models lost to a setting): they go only as
// better ones are written, and the run says so.
TEST(RunSafety, LoweringKeepBestOnAResumeRemovesNoBestCheckpoint) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2, keep: 10, keep_best: 3");
  // Validations at steps 2 and 4: both are kept as best (fewer than keep_best so far).
  Runner first(plan_text(d, g, {"run.steps=4", "run.validate_every=2", "run.validate_batches=1"}),
               writing_options());
  const std::string dir = first.run().run_dir;
  const fs::path root = fs::path(dir) / "checkpoints";
  ASSERT_TRUE(fs::exists(root / "best-step-2"));
  RunOptions o = resume_options(dir);
  std::ostringstream said;  // the stage's lines reach the run's console (StageContext::log)
  o.log = &said;
  Runner second(plan_text(d, g, {"run.steps=6", "ckpt.keep_best=0"}), o);
  second.run();
  const std::string err = said.str();
  EXPECT_TRUE(fs::exists(root / "best-step-2" / "DONE"));
  EXPECT_TRUE(fs::exists(root / "best-step-4" / "DONE"));
  EXPECT_NE(err.find("ckpt: keep_best 0 (this run's setting) keeps fewer best checkpoints than "
                     "the run has: "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(" stay (keep_best 0 writes no more)"), std::string::npos) << err;
  for (const char* best : {"best-step-2", "best-step-4"})
    EXPECT_NE(err.find(best), std::string::npos) << err;
  EXPECT_EQ(err.find("removed"), std::string::npos) << err;
}

// After a keep_best lowered on a resume, better checkpoints replace the ones past it, the
// worst first, and a new best is kept (not pruned as soon as written).
TEST(RunSafety, BestCheckpointsPastALoweredKeepBestGoAsBetterOnesCome) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2, keep: 10, keep_best: 3");
  const std::vector<std::string> sets = {"run.validate_every=2", "run.validate_batches=1",
                                         "rec.validation_improves=true"};
  auto with = [&](const std::string& extra) { return with_set(sets, extra); };
  Runner first(plan_text(d, g, with("run.steps=6")), writing_options());
  const std::string dir = first.run().run_dir;
  const fs::path root = fs::path(dir) / "checkpoints";
  for (const char* b : {"best-step-2", "best-step-4", "best-step-6"})
    ASSERT_TRUE(fs::exists(root / b / "DONE")) << b;
  RunOptions o = resume_options(dir);
  std::ostringstream said;
  o.log = &said;
  // One more validation, better than every one before.
  Runner lowered(plan_text(d, g, with_set(with("run.steps=8"), "ckpt.keep_best=1")), o);
  lowered.run();
  EXPECT_NE(said.str().find("stay until better ones are written"), std::string::npos) << said.str();
  std::vector<std::string> bests;
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().starts_with("best-step-"))
      bests.push_back(e.path().filename().string());
  EXPECT_EQ(bests, std::vector<std::string>{"best-step-8"});
}

// The validation at a run's end comes after that step's periodic checkpoint, so the checkpoint's
// state does not list the best it makes. A resume from it still counts that best against
// keep_best (its own state names it with its loss): a resumed run keeps keep_best of them, not
// one more on every resume.
TEST(RunSafety, ABestCheckpointOfTheRunsLastStepCountsOnResume) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2, keep: 10, keep_best: 2");
  const std::vector<std::string> validate = {"run.validate_every=3", "run.validate_batches=1"};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), validate.begin(), validate.end());
    return sets;
  };
  // Validations at step 3 (every 3) and at step 4, the end, after step-4 was written.
  Runner first(plan_text(d, g, with({"run.steps=4"})), writing_options());
  const std::string dir = first.run().run_dir;
  const fs::path root = fs::path(dir) / "checkpoints";
  ASSERT_TRUE(fs::exists(root / "best-step-3"));
  ASSERT_TRUE(fs::exists(root / "best-step-4"));
  // The equal losses of later validations are no better: the two bests stay the two.
  Runner second(plan_text(d, g, with({"run.steps=8"})), resume_options(dir));
  EXPECT_EQ(second.run().final_step, 8u);
  EXPECT_EQ(names_in(root), (std::vector<std::string>{"best-step-3", "best-step-4", "step-2",
                                                      "step-4", "step-6", "step-8"}));
  // And keep_best lowered names it past the count like any best of the run (removing none).
  RunOptions o = resume_options(dir);
  std::ostringstream said;
  o.log = &said;
  Runner third(plan_text(d, g, with({"run.steps=10", "ckpt.keep_best=1"})), o);
  third.run();
  EXPECT_NE(said.str().find("keeps fewer best checkpoints than the run has: best-step-"),
            std::string::npos)
      << said.str();
  EXPECT_NE(said.str().find(" stay until better ones are written"), std::string::npos)
      << said.str();
  EXPECT_TRUE(fs::exists(root / "best-step-4"));
  EXPECT_TRUE(fs::exists(root / "best-step-3"));
}

// Two writers of one run directory: the second is refused, naming the holder, and writes nothing.
TEST(RunSafety, ASecondWriterOfARunDirectoryIsRefusedWithTheHoldersPid) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2");
  const std::string dir = first_run(d, g, 2);
  const auto before = snapshot(dir);
  {
    DirectoryLock holder(dir, "resume it");  // as a run of another process would hold it
    Runner second(plan_text(d, g, {"run.steps=4"}), resume_options(dir));
    const std::string what = error_of([&] { second.run(); });
    EXPECT_NE(what.find("in use by process " + std::to_string(::getpid())), std::string::npos)
        << what;
    EXPECT_EQ(snapshot(dir), before);
    // Its config.yaml deleted under the live run: still "in use", not "no config.yaml", and
    // nothing written there (the live run writes it again at its next checkpoint).
    const std::string config = (fs::path(dir) / "config.yaml").string();
    const std::string text = read(config);
    fs::remove(config);
    EXPECT_EQ(restore_run_config(dir), "");
    const std::string refused = resolve_checkpoint_path(dir).error;
    EXPECT_NE(refused.find("in use by process " + std::to_string(::getpid())), std::string::npos)
        << refused;
    EXPECT_NE(refused.find("its config.yaml is gone"), std::string::npos) << refused;
    EXPECT_FALSE(fs::exists(config));
    std::ofstream(config) << text;
  }
  // Released with its holder.
  Runner third(plan_text(d, g, {"run.steps=4"}), resume_options(dir));
  EXPECT_EQ(third.run().final_step, 4u);
  // Fresh directories of one name in one second: mkdir makes each once.
  const std::string base = d.path() + "/same";
  EXPECT_EQ(create_fresh_directory(base), base);
  EXPECT_EQ(create_fresh_directory(base), base + "-2");
  EXPECT_EQ(create_fresh_directory(base), base + "-3");
}

namespace {

// A file-size limit makes writes past `bytes` fail with EFBIG, as a full disk fails them with
// ENOSPC: every write in reach of a test, without a disk to fill.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    previous_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit l = saved_;
    l.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &l);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_);
  }

 private:
  rlimit saved_{};
  void (*previous_)(int) = SIG_DFL;
};

}  // namespace

// A resume with --set on a full disk: the write of config.yaml fails, naming the file and errno,
// and config.yaml (and the rest of the run) is as it was.
TEST(RunSafety, AFailedConfigWriteLeavesTheConfigWhole) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2");
  const std::string dir = first_run(d, g, 2);
  const auto before = snapshot(dir);
  {
    GraphPlan longer = plan_text(d, g, {"run.steps=4"});
    FileSizeLimit full(64);
    Runner second(std::move(longer), resume_options(dir));
    const std::string what = error_of([&] { second.run(); });
    EXPECT_NE(what.find("config"), std::string::npos) << what;
    EXPECT_NE(what.find("File too large"), std::string::npos) << what;
  }
  auto after = snapshot(dir);
  EXPECT_EQ(after, before);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  Runner third(plan_text(d, g, {"run.steps=4"}), resume_options(dir));
  EXPECT_EQ(third.run().final_step, 4u);
  EXPECT_NE(read(fs::path(dir) / "config.yaml").find("steps: 4"), std::string::npos);
  // The same for any file written whole: the old content stays.
  const std::string file = d.path() + "/whole.txt";
  write_file_atomically(file, "old\n");
  {
    FileSizeLimit full(8);
    EXPECT_THROW(write_file_atomically(file, std::string(100, 'x')), std::runtime_error);
  }
  EXPECT_EQ(read(file), "old\n");
}

// A fresh run that fails before its first step (its setup, a config it cannot write) leaves no
// run directory behind.
TEST(RunSafety, AFreshRunThatFailsBeforeItsFirstStepLeavesNoDirectory) {
  reset_recorded();
  TempDir d;
  Runner failing(plan_text(d, graph(d, "every: 2"), {"rec.fail_setup=true"}), writing_options());
  EXPECT_THROW(failing.run(), std::exception);
  EXPECT_TRUE(names_in(d.path() + "/runs").empty());
  // Its first batch failing (the steps' graph started, no step done): nothing either.
  Runner first_batch(plan_text(d, graph(d, "every: 2"), {"rec.fail_at=0"}), writing_options());
  EXPECT_NE(error_of([&] { first_batch.run(); }).find("injected failure"), std::string::npos);
  EXPECT_TRUE(names_in(d.path() + "/runs").empty());
  // Its second: the first step's directory stays (its row, and a resume's starting point).
  Runner second_batch(plan_text(d, graph(d, "every: 1"), {"rec.fail_at=1"}), writing_options());
  EXPECT_THROW(second_batch.run(), std::exception);
  EXPECT_EQ(names_in(d.path() + "/runs").size(), 1u);
  fs::remove_all(d.path() + "/runs");
  {
    GraphPlan plan = plan_text(d, graph(d, "every: 2"));
    FileSizeLimit full(16);
    Runner no_space(std::move(plan), writing_options());
    const std::string what = error_of([&] { no_space.run(); });
    EXPECT_NE(what.find("config.yaml"), std::string::npos) << what;
  }
  EXPECT_TRUE(names_in(d.path() + "/runs").empty());
}

// SIGHUP (a closed terminal), SIGUSR1 (Slurm's warning), SIGXCPU and SIGALRM stop a run as
// SIGINT does: the step finishes, a checkpoint and the end row say so. SIGPIPE is ignored.
TEST(RunSafety, EveryStopSignalCheckpointsAndEndsTheRows) {
  for (int sig : {SIGHUP, SIGUSR1, SIGXCPU, SIGALRM}) {
    reset_recorded();
    TempDir d;
    Runner r(plan_text(d, graph(d, "every: 0"),
                       {"rec.term_at=3", "rec.term_signal=" + std::to_string(sig),
                        "run.max_in_flight=2"}),
             writing_options());
    RunResult res = r.run();
    const std::string name = signal_name(sig);
    EXPECT_TRUE(res.interrupted) << name;
    EXPECT_EQ(res.stop_signal, sig);
    EXPECT_EQ(res.end_reason, "interrupted (" + name + ")");
    auto ckpt = latest_checkpoint(res.run_dir);
    ASSERT_TRUE(ckpt.has_value()) << name;
    EXPECT_EQ(fs::path(*ckpt).filename(), "step-" + std::to_string(res.final_step));
    EXPECT_EQ(rows(fs::path(res.run_dir) / "metrics.jsonl").back()["reason"],
              "interrupted (" + name + ")");
  }
  reset_recorded();
  TempDir d;
  Runner piped(plan_text(d, graph(d, "every: 0"),
                         {"rec.term_at=3", "rec.term_signal=" + std::to_string(SIGPIPE)}),
               writing_options());
  RunResult res = piped.run();
  EXPECT_FALSE(res.interrupted);
  EXPECT_EQ(res.final_step, 20u);
}

// A second signal while the first's stop is under way (its checkpoint being written) changes
// nothing: the first is the one the run reports, and its checkpoint is whole.
TEST(RunSafety, ASecondSignalDuringTheStopKeepsTheFirst) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, graph(d, "every: 0"),
                     {"rec.term_at=3", "rec.term_signal=" + std::to_string(SIGTERM),
                      "rec.then_signal=" + std::to_string(SIGINT), "run.max_in_flight=2"}),
           writing_options());
  RunResult res = r.run();
  EXPECT_EQ(res.stop_signal, SIGTERM);
  auto ckpt = latest_checkpoint(res.run_dir);
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_NO_THROW(read_safetensors(*ckpt + "/model.safetensors"));
  {
    StopSignals s;
    raise_stop_signal_for_testing(SIGUSR1);
    raise_stop_signal_for_testing(SIGINT);
    EXPECT_EQ(StopSignals::received(), SIGUSR1);
  }
  EXPECT_EQ(StopSignals::take(), SIGUSR1);
  EXPECT_EQ(StopSignals::received(), 0);
}

namespace {

// A terminal that is gone: every write fails, as on a closed pipe with SIGPIPE ignored.
class ClosedPipe : public std::streambuf {
 protected:
  int overflow(int) override { return traits_type::eof(); }
  std::streamsize xsputn(const char*, std::streamsize) override { return 0; }
};

}  // namespace

// `slipstream run | head`: the terminal goes away, console.log keeps every line after it and the
// stream stays good for the run's later output.
TEST(RunSafety, AClosedTerminalCostsTheTerminalNotTheLog) {
  TempDir d;
  const std::string log = d.path() + "/console.log";
  ClosedPipe gone;
  std::streambuf* saved = std::cout.rdbuf(&gone);
  {
    ConsoleTee tee(log);
    std::cout << "first line\n" << std::flush;
    std::cout << "second line\n" << std::flush;
    std::cerr << "an error line\n";
    EXPECT_TRUE(std::cout.good());
  }
  std::cout.rdbuf(saved);
  std::cout.clear();
  EXPECT_EQ(read(log), "first line\nsecond line\nan error line\n");
}

// A FIFO (or anything not a regular file) where a checkpoint file should be is refused at once,
// never a blocking open.
TEST(RunSafety, AFifoInPlaceOfACheckpointFileIsRefusedWithoutWaiting) {
  TempDir d;
  const std::string fifo = d.path() + "/model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string what = error_of([&] { read_safetensors(fifo); });
  EXPECT_NE(what.find("not a regular file"), std::string::npos) << what;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// What two resolved configurations differ in, setting by setting; run settings aside on request.
TEST(RunSafety, ConfigDifferencesNameEachSetting) {
  const std::string a = R"(# Resolved configuration: preset 'x'
description: one
run:
  steps: 10
  seed: 1
stages:
  - name: replays
    kind: replays
    params:
      paths: [/data/a]  # as given: a
  - name: core
    kind: mamba
    inputs: [replays]
    params:
      d_model: 64
)";
  std::string b = a;
  b.replace(b.find("steps: 10"), 9, "steps: 20");
  b.replace(b.find("description: one"), 16, "description: two");
  EXPECT_TRUE(config_differences(a, b, RunKeys::ignore).empty());
  EXPECT_EQ(config_differences(a, b, RunKeys::compare),
            (std::vector<std::string>{"run.steps: 10 -> 20"}));
  b.replace(b.find("/data/a]  # as given: a"), 23, "/data/b]");
  b.replace(b.find("d_model: 64"), 11, "d_model: 128\n      layers: 2");
  EXPECT_EQ(config_differences(a, b, RunKeys::ignore),
            (std::vector<std::string>{"replays.paths: [/data/a] -> [/data/b]",
                                      "core.d_model: 64 -> 128", "core.layers: (not set) -> 2"}));
}

// A checkpoint whose weights are NaN (a run that diverged as it was written) is refused when it
// loads, for a resume and a scoring alike, naming the weight.
TEST(RunSafety, NonFiniteWeightsAreRefusedOnLoad) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2");
  const std::string dir = first_run(d, g, 2);
  const std::string model = dir + "/checkpoints/step-2/model.safetensors";
  SafetensorsFile f = read_safetensors(model);
  f.tensors.at("acc.w").data<float>()[1] = std::nanf("");
  for (auto it = f.metadata.begin(); it != f.metadata.end();)
    it = it->first.starts_with(kChecksumPrefix) ? f.metadata.erase(it) : std::next(it);
  add_tensor_checksums(f.tensors, f.metadata);  // a consistent file: only its values are bad
  write_safetensors(model, f.tensors, f.metadata);
  Runner resume(plan_text(d, g, {"run.steps=4"}), resume_options(dir));
  const std::string what = error_of([&] { resume.run(); });
  EXPECT_NE(what.find("weight 'acc.w' holds 1 non-finite value(s)"), std::string::npos) << what;
  Runner scoring(plan_text(d, g), RunOptions::embedded(nullptr));
  EXPECT_THROW(scoring.evaluate(dir + "/checkpoints/step-2"), std::runtime_error);
}

// A resume that changed the graph's settings: the older checkpoints still open with the graph
// they were trained with, and the change is listed.
TEST(RunSafety, AnOlderCheckpointOpensWithItsOwnGraphAndSaysWhatChanged) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2, keep: 10");
  const std::string dir = first_run(d, g, 2);
  Runner changed(plan_text(d, g, {"run.steps=4", "rec.sleep_us=5"}), resume_options(dir));
  changed.run();
  const CheckpointPath old = find_checkpoint(dir + "/checkpoints/step-2");
  ASSERT_TRUE(old.error.empty()) << old.error;
  EXPECT_EQ(fs::path(old.graph_file).filename(), "model.safetensors");
  EXPECT_EQ(old.config_changes, (std::vector<std::string>{"rec.sleep_us: 0 -> 5"}));
  const CheckpointPath now = find_checkpoint(dir);
  EXPECT_TRUE(now.config_changes.empty());
}

// A step that does not end after a stop signal (a library spinning, a hung collective) would
// keep the process forever, its checkpoint never coming: after run.stop_timeout_s the process
// exits with 128 + the signal, saying so and naming the newest checkpoint.
TEST(RunSafetyDeathTest, AStepStuckAfterAStopSignalEndsTheProcess) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  TempDir d;
  const std::string g = graph(d, "every: 1");
  EXPECT_EXIT(
      {
        Runner r(plan_text(d, g,
                           {"rec.term_at=3", "rec.then_sleep_us=30000000", "run.stop_timeout_s=1",
                            "run.stats_interval_ms=50", "run.max_in_flight=1"}),
                 writing_options());
        r.run();
      },
      ::testing::ExitedWithCode(128 + SIGTERM),
      "SIGTERM was received 1 s ago and step 4 has not finished.*the newest checkpoint is "
      ".*step-3");
}

// A virtual memory limit too low to run is refused before anything starts; a higher one is a
// note on how to bound memory instead.
TEST(RunSafety, AVirtualMemoryLimitTooLowIsRefusedAtStart) {
  rlimit saved{};
  getrlimit(RLIMIT_AS, &saved);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < (rlim_t{16} << 30))
    GTEST_SKIP() << "the hard limit is already set";
  AddressSpaceCheck low, high, none;
  {
    rlimit l = saved;
    l.rlim_cur = rlim_t{3} << 30;
    setrlimit(RLIMIT_AS, &l);
    low = check_address_space_limit();
    l.rlim_cur = rlim_t{16} << 30;
    setrlimit(RLIMIT_AS, &l);
    high = check_address_space_limit();
    setrlimit(RLIMIT_AS, &saved);
    none = check_address_space_limit();
  }
  EXPECT_NE(low.refusal.find("ulimit -v) of 3 GiB"), std::string::npos) << low.refusal;
  EXPECT_TRUE(high.refusal.empty());
  EXPECT_NE(high.note.find("cgroup"), std::string::npos) << high.note;
  EXPECT_TRUE(none.refusal.empty() && none.note.empty());
}

// A stop signal while a fresh run sets up removes its directory whatever setup wrote there
// (splits, a skipped list, the events file: it removed five named files and kept the rest), ends
// the process by the signal and says so; a folder made there keeps the directory, emptied of
// files. StopSignals takes the handlers over: the start-up's removal is off after it.
TEST(RunSafety, AStopSignalDuringStartUpRemovesTheFreshDirectory) {
  TempDir d;
  auto child = [&](const std::string& dir, bool with_folder, bool hand_over) {
    fs::create_directories(dir);
    for (const char* f : {".lock", "config.yaml", "replays.splits.json", "events.out.x",
                          "replays.splits.json.tmp.1.2.3"})
      std::ofstream(fs::path(dir) / f) << "x";
    if (with_folder) fs::create_directories(fs::path(dir) / "checkpoints");
    // Armed before the fork (it allocates; a forked child of a threaded process must not): the
    // child inherits the handlers and only raises.
    std::optional<StartupSignals> startup(std::in_place);
    startup->arm(dir);
    const pid_t pid = fork();
    if (pid == 0) {
      if (hand_over) {
        StopSignals stop;     // takes the handlers over (no allocation)
        std::raise(SIGTERM);  // now only recorded: the run would stop at its step's end
        _exit(StopSignals::received() == SIGTERM ? 7 : 8);
      }
      std::raise(SIGTERM);
      _exit(9);  // not reached: the signal ends the process
    }
    startup.reset();  // this process's handlers as before
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
  };
  const std::string gone = d.path() + "/fresh";
  int status = child(gone, false, false);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
  EXPECT_FALSE(fs::exists(gone));
  const std::string kept = d.path() + "/with-folder";
  status = child(kept, true, false);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
  ASSERT_TRUE(fs::exists(kept));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(kept)) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"checkpoints"});
  const std::string handed = d.path() + "/handed-over";
  status = child(handed, false, true);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << status;
  EXPECT_TRUE(fs::exists(fs::path(handed) / "config.yaml"));
  // Under nohup SIGHUP is ignored, and stays so (a closed terminal stops nothing); SIGINT, which
  // a shell's background job ignores, is taken: `kill -INT` means stop.
  auto disposition = [](int sig) {
    struct sigaction now {};
    sigaction(sig, nullptr, &now);
    return now.sa_handler;
  };
  const auto hup = std::signal(SIGHUP, SIG_IGN), intr = std::signal(SIGINT, SIG_IGN);
  {
    StartupSignals startup;
    EXPECT_EQ(disposition(SIGHUP), SIG_IGN);
    EXPECT_NE(disposition(SIGINT), SIG_IGN);
    StopSignals stop;
    EXPECT_EQ(disposition(SIGHUP), SIG_IGN);
    EXPECT_NE(disposition(SIGINT), SIG_IGN);
  }
  EXPECT_EQ(disposition(SIGINT), SIG_IGN);  // restored as it was
  std::signal(SIGHUP, hup);
  std::signal(SIGINT, intr);
}

// The memory a cgroup leaves: v2's memory.max and v1's memory.limit_in_bytes (older hosts,
// Slurm's cgroup/v1), each less the use besides page cache; v1's "no limit" (the largest
// page-aligned number) and a v2 "max" are none. v1 was not read: a job on such a host sized
// its data to the machine's free memory and was killed at its limit.
TEST(RunSafety, CgroupMemoryLimitsAreReadOnV2AndV1) {
  TempDir d;
  auto put = [&](const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path(d.path()) / fs::path(rel).parent_path());
    std::ofstream(fs::path(d.path()) / rel) << text;
  };
  const std::string root = d.path() + "/sys";
  put("v1.cgroup", "9:name=systemd:/\n4:memory:/job/7\n1:cpu:/\n0::/\n");
  put("sys/memory/job/7/memory.limit_in_bytes", "1073741824\n");
  put("sys/memory/job/7/memory.usage_in_bytes", "402653184\n");
  put("sys/memory/job/7/memory.stat", "cache 1\ntotal_cache 134217728\n");
  std::optional<HostMemory> v1 = cgroup_memory_left(d.path() + "/v1.cgroup", root);
  ASSERT_TRUE(v1.has_value());
  EXPECT_EQ(v1->bytes, uint64_t{1073741824 - (402653184 - 134217728)});
  EXPECT_NE(v1->source.find("cgroup v1 memory.limit_in_bytes"), std::string::npos) << v1->source;
  // In a container the listed path is the host's: the container's own cgroup is at the top.
  put("v1c.cgroup", "4:cpuacct,memory:/docker/abc\n");
  put("sys/memory/memory.limit_in_bytes", "2147483648\n");
  put("sys/memory/memory.usage_in_bytes", "0\n");
  const std::optional<HostMemory> top = cgroup_memory_left(d.path() + "/v1c.cgroup", root);
  ASSERT_TRUE(top.has_value());
  EXPECT_EQ(top->bytes, uint64_t{2147483648});
  put("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");  // no limit
  EXPECT_FALSE(cgroup_memory_left(d.path() + "/v1c.cgroup", root).has_value());
  put("v2.cgroup", "0::/slurm/job9\n");
  put("sys/slurm/job9/memory.max", "536870912\n");
  put("sys/slurm/job9/memory.current", "268435456\n");
  put("sys/slurm/job9/memory.stat", "anon 1\nfile 67108864\n");
  const std::optional<HostMemory> v2 = cgroup_memory_left(d.path() + "/v2.cgroup", root);
  ASSERT_TRUE(v2.has_value());
  EXPECT_EQ(v2->bytes, uint64_t{536870912 - (268435456 - 67108864)});
  EXPECT_NE(v2->source.find("cgroup memory.max"), std::string::npos) << v2->source;
  put("sys/slurm/job9/memory.max", "max\n");
  EXPECT_FALSE(cgroup_memory_left(d.path() + "/v2.cgroup", root).has_value());
}

// The memory a loader may plan on counts an address space limit: what it leaves past the
// process's VmSize, named, when that is less than the host has free.
TEST(RunSafety, UsableMemoryCountsTheAddressSpaceLimit) {
  rlimit saved{};
  getrlimit(RLIMIT_AS, &saved);
  // The comparison needs a process without a limit of its own: one already in force would be in
  // `before` and in the last check too.
  if (saved.rlim_cur != RLIM_INFINITY)
    GTEST_SKIP() << "an address space limit (ulimit -v) is already in force";
  const std::optional<HostMemory> before = usable_host_memory();
  ASSERT_TRUE(before);
  uint64_t vm = 0;
  {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);)
      if (line.starts_with("VmSize:")) vm = std::stoull(line.substr(7)) * 1024;
  }
  ASSERT_GT(vm, 0u);
  const uint64_t room = std::min<uint64_t>(before->bytes / 2, uint64_t{1} << 30);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < vm + room)
    GTEST_SKIP() << "the hard limit (" << saved.rlim_max << " bytes) is below the one to set";
  rlimit l = saved;
  l.rlim_cur = vm + room;
  ASSERT_EQ(setrlimit(RLIMIT_AS, &l), 0);
  const std::optional<HostMemory> limited = usable_host_memory();
  setrlimit(RLIMIT_AS, &saved);
  ASSERT_TRUE(limited);
  EXPECT_LE(limited->bytes, room);
  EXPECT_GT(limited->bytes, room / 2);
  EXPECT_NE(limited->source.find("ulimit -v (address space limit"), std::string::npos)
      << limited->source;
  EXPECT_EQ(usable_host_memory()->source.find("ulimit"), std::string::npos);
}

// A checkpoint whose run position was edited to what no run writes (a negative step, no ranks)
// is refused naming the key, not resumed at a position that does not exist.
TEST(RunSafety, ImpossibleRunPositionsInACheckpointAreNamed) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2");
  const std::string dir = first_run(d, g, 2);
  const std::string state = dir + "/checkpoints/step-2/state.safetensors";
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"run.step", "-1"}, {"run.world_size", "0"}}) {
    SafetensorsFile f = read_safetensors(state);
    const SafetensorsFile saved = f;
    f.metadata[key] = value;
    write_safetensors(state, f.tensors, f.metadata);
    Runner resume(plan_text(d, g, {"run.steps=4"}), resume_options(dir));
    const std::string what = error_of([&] { resume.run(); });
    EXPECT_NE(what.find(key + " is " + value + ", which no run writes"), std::string::npos) << what;
    write_safetensors(state, saved.tensors, saved.metadata);
  }
}

// A run under faults: divergence, a disk that stops taking metrics rows, kills between a row and
// its checkpoint, leftovers of interrupted checkpoint writes, SIGTERM, resuming a finished run.
#include <gtest/gtest.h>

#include <cmath>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/checkpoint.h"
#include "engine/runner.h"
#include "engine/safetensors.h"
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

// src (20 batches) -> rec -> ckpt, rows every step.
std::string graph(const TempDir& d, const std::string& ckpt_params) {
  return std::string(R"(stages:
  - {name: src, kind: test_counter, params: {count: 20, batch: 2}}
  - {name: rec, kind: test_recorder, inputs: [src]}
  - {name: ckpt, kind: checkpoint, inputs: [rec], params: {)") +
         ckpt_params + "}}\nrun: {log_every: 1, runs_dir: " + d.path() + "/runs}\n";
}

GraphPlan plan_text(const TempDir& d, const std::string& text, std::vector<std::string> sets = {}) {
  return plan_graph(load_config(d.write("g.yaml", text), sets));
}

std::vector<nlohmann::json> rows(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));  // throws if torn
  return out;
}

std::vector<std::string> checkpoint_dirs(const std::string& run_dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints"))
    if (e.path().filename() != "last") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string run_dir_of(const TempDir& d) {
  for (const auto& e : fs::directory_iterator(d.path() + "/runs")) return e.path().string();
  return {};
}

}  // namespace

TEST(RunFaults, NonFiniteLossForKStepsStopsWithAnErrorAndNoCheckpointOfIt) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, graph(d, "every: 2"), {"rec.nan_from=3", "run.max_nonfinite_steps=4"}),
           writing_options());
  try {
    r.run();
    FAIL() << "a diverged run must not end normally";
  } catch (const std::runtime_error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("training diverged"), std::string::npos) << what;
    EXPECT_NE(what.find("4 consecutive steps (4 to 7)"), std::string::npos) << what;
    EXPECT_NE(what.find("run.max_nonfinite_steps"), std::string::npos) << what;
    EXPECT_NE(what.find("the newest checkpoint, " + run_dir_of(d) + "/checkpoints/step-2,"),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(recorded().finished.load(), 0);  // no finish(): no final checkpoint of the NaN state
  std::string dir = run_dir_of(d);
  // step-4 and step-6 fell in the streak: the last good checkpoint is the newest.
  EXPECT_EQ(checkpoint_dirs(dir), (std::vector<std::string>{"step-2"}));
  auto rs = rows(dir);
  ASSERT_FALSE(rs.empty());
  EXPECT_EQ(rs.back()["split"], "end");
  EXPECT_EQ(rs.back()["reason"], "diverged");
  EXPECT_EQ(rs.back()["step"], 7);
  EXPECT_TRUE(rs[rs.size() - 2]["loss"].is_null());  // the NaN is logged, as null
}

TEST(RunFaults, ABriefNonFiniteStretchOrALimitOfZeroDoesNotStopTheRun) {
  reset_recorded();
  TempDir d;
  Runner brief(plan_text(d, graph(d, "every: 2"),
                         {"rec.nan_from=3", "rec.nan_count=2", "run.max_nonfinite_steps=3"}),
               writing_options());
  RunResult a = brief.run();
  EXPECT_EQ(a.final_step, 20u);
  EXPECT_EQ(a.end_reason, "data end");
  reset_recorded();
  TempDir d2;
  Runner never(
      plan_text(d2, graph(d2, "every: 0"), {"rec.nan_from=0", "run.max_nonfinite_steps=0"}),
      writing_options());
  EXPECT_EQ(never.run().final_step, 20u);
}

// A validation pass that scored nothing (its games left out as unreadable since the split) says
// so on the console and in its row, not a bare "validation @ step N:" and a row of no figures.
TEST(RunFaults, AValidationThatScoredNothingSaysSo) {
  reset_recorded();
  TempDir d;
  std::ostringstream said;
  const RunOptions o = writing_options(said);
  Runner r(plan_text(d, graph(d, "every: 0"),
                     {"run.steps=2", "run.validate_every=2", "run.validate_batches=1",
                      "rec.validation_scores=false"}),
           o);
  const std::string dir = r.run().run_dir;
  EXPECT_NE(said.str().find("validation @ step 2: no validation window was scored"),
            std::string::npos)
      << said.str();
  bool noted = false;
  for (const auto& row : rows(dir))
    noted = noted || (row["split"] == "validation" &&
                      row.value("note", "") == "no validation window was scored");
  EXPECT_TRUE(noted);
}

TEST(RunFaults, NonFiniteValidationLossIsNeverBest) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, graph(d, "every: 0, keep_best: 2"),
                     {"rec.validation_nan=true", "run.validate_every=3", "run.steps=9",
                      "run.validate_batches=1"}),
           writing_options());
  r.run();
  EXPECT_EQ(checkpoint_dirs(run_dir_of(d)), (std::vector<std::string>{"step-9"}));
  // A finite one is.
  reset_recorded();
  TempDir d2;
  Runner ok(plan_text(d2, graph(d2, "every: 0, keep_best: 2"),
                      {"run.validate_every=3", "run.steps=9", "run.validate_batches=1"}),
            writing_options());
  ok.run();
  EXPECT_EQ(checkpoint_dirs(run_dir_of(d2)),
            (std::vector<std::string>{"best-step-3", "best-step-6", "step-9"}));
}

TEST(RunFaults, AFullDiskStopsTheRunNamingMetricsAndKeepsTheSteps) {
  reset_recorded();
  TempDir d;
  std::string g = graph(d, "every: 4");
  Runner first(plan_text(d, g, {"run.steps=4"}), writing_options());
  std::string dir = first.run().run_dir;
  size_t rows_before = rows(dir).size();
  // Every write to /dev/full fails with ENOSPC, as on a full disk.
  fs::remove(fs::path(dir) / "metrics.jsonl");
  fs::create_symlink("/dev/full", fs::path(dir) / "metrics.jsonl");
  RunOptions o = writing_options();
  o.resume_dir = dir;
  Runner second(plan_text(d, g, {"run.steps=10"}), o);
  try {
    second.run();
    FAIL() << "a run whose metrics cannot be written must not end normally";
  } catch (const std::runtime_error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("metrics.jsonl: cannot append a row: No space left on device"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("stopped at step 5"), std::string::npos) << what;
  }
  // It stopped the way SIGINT does: the step it failed at has its checkpoint.
  EXPECT_EQ(recorded().finished.load(), 2);
  auto ckpt = latest_checkpoint(dir);
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_EQ(fs::path(*ckpt).filename(), "step-5");
  EXPECT_GT(rows_before, 4u);
}

TEST(RunFaults, AKillBetweenRowsAndTheirCheckpointLosesNoRow) {
  reset_recorded();
  TempDir d;
  std::string g = graph(d, "every: 4, keep: 10");
  Runner straight(plan_text(d, g, {"run.validate_every=2", "run.validate_batches=1"}),
                  writing_options());
  auto want = rows(straight.run().run_dir);

  TempDir d2;
  g = graph(d2, "every: 4, keep: 10");
  Runner first(plan_text(d2, g, {"run.validate_every=2", "run.validate_batches=1", "run.steps=6"}),
               writing_options());
  std::string dir = first.run().run_dir;
  // As if killed after step 6's rows, before its checkpoint, mid-way through another row.
  fs::remove_all(fs::path(dir) / "checkpoints" / "step-6");
  std::ofstream(fs::path(dir) / "metrics.jsonl", std::ios::app) << "{\"step\": 7, \"spl";
  RunOptions o = writing_options();
  o.resume_dir = dir;
  Runner second(plan_text(d2, g, {"run.validate_every=2", "run.validate_batches=1"}), o);
  RunResult res = second.run();
  EXPECT_EQ(res.steps, 16u);
  auto got = rows(dir);  // parses every line: nothing torn is left
  auto key = [](const std::vector<nlohmann::json>& rs) {
    std::vector<std::pair<int, std::string>> k;
    for (const auto& r : rs)
      if (r["split"] != "end") k.emplace_back(r["step"].get<int>(), r["split"].get<std::string>());
    return k;
  };
  EXPECT_EQ(key(got), key(want));  // each train and validation row once, in order
  // Each row has the same values as the uninterrupted run's.
  for (size_t i = 0, j = 0; i < got.size() && j < want.size(); ++i, ++j) {
    while (i < got.size() && got[i]["split"] == "end") ++i;
    while (j < want.size() && want[j]["split"] == "end") ++j;
    if (i < got.size() && j < want.size() && got[i].contains("loss")) {
      EXPECT_EQ(got[i]["loss"], want[j]["loss"]) << got[i].dump();
    }
  }
}

TEST(RunFaults, ResumeAppliesKeepToCheckpointsOnDiskAndClearsLeftovers) {
  reset_recorded();
  TempDir d;
  std::string g = graph(d, "every: 2, keep: 3, keep_best: 3");
  std::vector<std::string> sets = {"run.validate_every=2", "run.validate_batches=1"};
  auto with = [&](std::vector<std::string> extra) {
    auto s = sets;
    s.insert(s.end(), extra.begin(), extra.end());
    return s;
  };
  Runner first(plan_text(d, g, with({"run.steps=6"})), writing_options());
  std::string dir = first.run().run_dir;
  fs::path root = fs::path(dir) / "checkpoints";
  EXPECT_EQ(checkpoint_dirs(dir),
            (std::vector<std::string>{"best-step-2", "best-step-4", "best-step-6", "step-2",
                                      "step-4", "step-6"}));
  // Leftovers: a write killed before its rename, a prune killed half-way, a best checkpoint
  // written after the state that was saved (past it: moved aside), a directory with no DONE
  // (not a checkpoint: left alone).
  fs::create_directories(root / "step-8.tmp");
  fs::create_directories(root / "step-0.tmp");
  fs::create_directories(root / "best-step-7");
  std::ofstream(root / "best-step-7" / "DONE") << "7\n";
  fs::create_directories(root / "step-5");
  RunOptions o = writing_options();
  o.resume_dir = dir;
  Runner second(plan_text(d, g, with({"run.steps=8", "ckpt.keep=2", "ckpt.keep_best=1"})), o);
  second.run();
  // keep 2 counted what was on disk (a lower keep_best removes no best checkpoint); the write
  // leftovers are gone.
  auto names = checkpoint_dirs(dir);
  EXPECT_EQ(names, (std::vector<std::string>{"best-step-2", "best-step-4", "best-step-6", "step-5",
                                             "step-6", "step-8"}));
  bool aside = false;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "set-aside"))
    aside = aside || fs::exists(e.path() / "checkpoints" / "best-step-7" / "DONE");
  EXPECT_TRUE(aside);
  auto ckpt = latest_checkpoint(dir);
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_EQ(fs::path(*ckpt).filename(), "step-8");
}

// A checkpoint removed while it is read (eval of a live run whose ckpt.keep prunes it) is said
// as that, with what to give instead, not as a bare "open: No such file or directory".
TEST(RunFaults, ACheckpointRemovedWhileReadIsSaidSo) {
  reset_recorded();
  TempDir d;
  const std::string g = graph(d, "every: 2");
  Runner first(plan_text(d, g, {"run.steps=4"}), writing_options());
  const std::string dir = first.run().run_dir;
  RunOptions o = writing_options();
  o.resume_dir = dir;
  o.resume_checkpoint = dir + "/checkpoints/step-2";
  fs::remove_all(o.resume_checkpoint);  // pruned between finding it and reading it
  Runner second(plan_text(d, g, {"run.steps=6"}), o);
  try {
    second.run();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("step-2 was removed while it was read"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("give the run directory again for its newest"),
              std::string::npos)
        << e.what();
  }
}

TEST(RunFaults, ResumingAFinishedRunDoesNothing) {
  reset_recorded();
  TempDir d;
  std::string g = graph(d, "every: 0");
  Runner first(plan_text(d, g, {"run.steps=6"}), writing_options());
  std::string dir = first.run().run_dir;
  auto before = rows(dir);
  reset_recorded();
  RunOptions o = writing_options();
  o.resume_dir = dir;
  Runner again(plan_text(d, g, {"run.steps=6"}), o);
  RunResult res = again.run();
  EXPECT_TRUE(res.already_complete);
  EXPECT_EQ(res.steps, 0u);
  EXPECT_EQ(res.final_step, 6u);
  EXPECT_TRUE(recorded().values.empty());
  EXPECT_EQ(checkpoint_dirs(dir), (std::vector<std::string>{"step-6"}));
  EXPECT_EQ(rows(dir).size(), before.size());
  // A run that ended with its data: the resume trains nothing and rewrites nothing.
  reset_recorded();
  TempDir d2;
  g = graph(d2, "every: 0");
  Runner whole(plan_text(d2, g), writing_options());
  dir = whole.run().run_dir;
  auto written = fs::last_write_time(fs::path(dir) / "checkpoints" / "step-20" / "DONE");
  o.resume_dir = dir;
  const size_t rows_before = rows(dir).size();
  Runner more(plan_text(d2, g), o);
  const RunResult after = more.run();
  EXPECT_EQ(after.steps, 0u);
  EXPECT_TRUE(after.already_complete);  // "nothing to do", as at run.steps
  EXPECT_EQ(after.final_step, 20u);
  EXPECT_EQ(fs::last_write_time(fs::path(dir) / "checkpoints" / "step-20" / "DONE"), written);
  EXPECT_EQ(rows(dir).size(), rows_before);  // no second end row
}

TEST(RunFaults, ResumeFromAChosenCheckpointRewindsTheRun) {
  reset_recorded();
  TempDir d;
  std::string g = graph(d, "every: 2, keep: 10");
  Runner first(plan_text(d, g, {"run.steps=6"}), writing_options());
  std::string dir = first.run().run_dir;
  RunOptions o = writing_options();
  o.resume_dir = dir;
  o.resume_checkpoint = (fs::path(dir) / "checkpoints" / "step-2").string();
  Runner second(plan_text(d, g, {"run.steps=4"}), o);
  RunResult res = second.run();
  EXPECT_EQ(res.steps, 2u);
  EXPECT_EQ(checkpoint_dirs(dir), (std::vector<std::string>{"step-2", "step-4"}));
  for (const auto& r : rows(dir)) EXPECT_LE(r["step"].get<int>(), 4) << r.dump();
}

// Early stopping counts on across a resume: the run stops where it would have without one (its
// best validation loss and the validations since it improved ride in the checkpoint).
TEST(RunFaults, AResumeCountsEarlyStoppingOnWhereTheRunWas) {
  const std::vector<std::string> sets = {"run.validate_every=3", "run.validate_batches=1",
                                         "run.early_stop_patience=2"};
  reset_recorded();
  TempDir d;
  Runner straight(plan_text(d, graph(d, "every: 3"), sets), writing_options());
  const RunResult want = straight.run();
  ASSERT_TRUE(want.early_stopped);
  ASSERT_EQ(want.final_step, 9u);  // validations at 3 (the best), 6 and 9: two without a gain
  // Resumed, a run that stopped early stays stopped; a larger patience goes on.
  std::ostringstream said;
  RunOptions stopped = writing_options(said);
  stopped.resume_dir = want.run_dir;
  Runner again(plan_text(d, graph(d, "every: 3"), sets), stopped);
  EXPECT_EQ(again.run().steps, 0u);
  EXPECT_NE(said.str().find("nothing to do: the run stopped early"), std::string::npos)
      << said.str();
  Runner more(plan_text(d, graph(d, "every: 3"), with_set(sets, "run.early_stop_patience=3")),
              stopped);
  const RunResult went_on = more.run();
  EXPECT_EQ(went_on.final_step, 12u);  // one more validation without a gain: three
  EXPECT_TRUE(went_on.early_stopped);
  // Rewound to the best checkpoint (written by the validation at 3, which it carries the books
  // of): it stops at 9 again, as the straight run did.
  RunOptions from_best = writing_options();
  from_best.resume_dir = want.run_dir;
  from_best.resume_checkpoint = want.run_dir + "/checkpoints/best-step-3";
  Runner rewound(plan_text(d, graph(d, "every: 3"), sets), from_best);
  const RunResult again_from_best = rewound.run();
  EXPECT_EQ(again_from_best.final_step, 9u);
  EXPECT_TRUE(again_from_best.early_stopped);

  reset_recorded();
  TempDir d2;
  std::vector<std::string> first_sets = sets;
  first_sets.push_back("run.steps=6");
  Runner first(plan_text(d2, graph(d2, "every: 3"), first_sets), writing_options());
  const std::string dir = first.run().run_dir;
  RunOptions o = writing_options();
  o.resume_dir = dir;
  Runner second(plan_text(d2, graph(d2, "every: 3"), sets), o);
  const RunResult got = second.run();
  EXPECT_TRUE(got.early_stopped);
  EXPECT_EQ(got.final_step, want.final_step);
  // The checkpoint says so itself: a step-6 resume has one validation without a gain behind it.
  const SafetensorsFile state =
      read_safetensors(dir + "/checkpoints/step-6/state.safetensors", SafetensorsRead::metadata);
  EXPECT_EQ(state.metadata.at("run.validations_without_improvement"), "1");
  EXPECT_EQ(state.metadata.at("run.best_validation_loss"), "1");
}

TEST(RunFaults, SigtermStopsLikeSigintWithACheckpoint) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, graph(d, "every: 0"), {"rec.term_at=3", "run.max_in_flight=2"}),
           writing_options());
  RunResult res = r.run();
  EXPECT_TRUE(res.interrupted);
  EXPECT_EQ(res.stop_signal, SIGTERM);
  EXPECT_EQ(res.end_reason, "interrupted (SIGTERM)");
  EXPECT_LT(res.final_step, 20u);
  auto ckpt = latest_checkpoint(res.run_dir);
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_EQ(fs::path(*ckpt).filename(), "step-" + std::to_string(res.final_step));
  auto rs = rows(res.run_dir);
  EXPECT_EQ(rs.back()["reason"], "interrupted (SIGTERM)");
}

TEST(RunFaults, TrainRowsSayHowManyStepsTheyAverage) {
  reset_recorded();
  TempDir d;
  std::string g = graph(d, "every: 3");
  Runner first(plan_text(d, g, {"run.steps=3", "run.log_every=2"}), writing_options());
  std::string dir = first.run().run_dir;
  RunOptions o = writing_options();
  o.resume_dir = dir;
  Runner second(plan_text(d, g, {"run.steps=6", "run.log_every=2"}), o);
  second.run();
  std::vector<std::pair<int, int>> got;
  for (const auto& r : rows(dir))
    if (r["split"] == "train") got.emplace_back(r["step"], r["steps_averaged"]);
  // 2, then the last step (3) alone; after the resume step 4 alone, then 6 over two.
  EXPECT_EQ(got, (std::vector<std::pair<int, int>>{{2, 2}, {3, 1}, {4, 1}, {6, 2}}));
}

// run.json says how to repeat each invocation; console.log keeps what the terminal showed,
// including the error that ended a run.
TEST(RunFaults, RunDirectoryRecordsInvocationsAndTheConsole) {
  reset_recorded();
  TempDir d;
  std::string g = graph(d, "every: 2");
  RunOptions o = writing_options();
  o.log = nullptr;  // progress on std::cout, as the CLI has it
  o.command_line = "slipstream run --config g.yaml --set run.steps=4";
  Runner first(plan_text(d, g, {"run.steps=4", "rec.fail_at=-1"}), o);
  std::string dir = first.run().run_dir;
  o.resume_dir = dir;
  o.command_line = "slipstream run --resume RUN";
  Runner second(plan_text(d, g, {"rec.fail_at=6"}), o);
  EXPECT_THROW(second.run(), StageError);

  std::ifstream in(fs::path(dir) / "run.json");
  auto doc = nlohmann::json::parse(in);
  ASSERT_EQ(doc["invocations"].size(), 2u);
  const auto& a = doc["invocations"][0];
  EXPECT_EQ(a["command"], "slipstream run --config g.yaml --set run.steps=4");
  EXPECT_EQ(a["device"], "cpu");
  EXPECT_TRUE(a["resumed_from"].is_null());
  EXPECT_FALSE(a["commit"].get<std::string>().empty());
  EXPECT_FALSE(a["version"].get<std::string>().empty());
  EXPECT_EQ(a["cwd"], fs::current_path().string());
  const auto& b = doc["invocations"][1];
  EXPECT_EQ(b["command"], "slipstream run --resume RUN");
  EXPECT_NE(b["resumed_from"].get<std::string>().find("step-4"), std::string::npos);

  std::ifstream cin(fs::path(dir) / "console.log");
  std::string log((std::istreambuf_iterator<char>(cin)), {});
  EXPECT_NE(log.find("device: "), std::string::npos) << log;
  EXPECT_NE(log.find("done: 4 steps"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
  EXPECT_NE(log.find("error: stage 'rec' (test_recorder), batch 6: injected failure"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find('\033'), std::string::npos);  // no terminal escapes in the file
  EXPECT_EQ(log.find('\r'), std::string::npos);
}

// `--set run.steps=N` on a resume is what config.yaml then says; a plain resume leaves it.
TEST(RunFaults, ResumeWithNewSettingsUpdatesConfigYaml) {
  reset_recorded();
  TempDir d;
  std::string g = graph(d, "every: 2");
  Runner first(plan_text(d, g, {"run.steps=4"}), writing_options());
  std::string dir = first.run().run_dir;
  RunOptions o = writing_options();
  o.resume_dir = dir;
  Runner same(plan_text(d, g, {"run.steps=4"}), o);
  same.run();
  EXPECT_FALSE(fs::exists(fs::path(dir) / "config.previous.yaml"));
  Runner longer(plan_text(d, g, {"run.steps=6"}), o);
  EXPECT_EQ(longer.run().final_step, 6u);
  auto read = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  EXPECT_NE(read(fs::path(dir) / "config.yaml").find("steps: 6"), std::string::npos);
  EXPECT_NE(read(fs::path(dir) / "config.previous.yaml").find("steps: 4"), std::string::npos);
}

// checkpoints/last names the newest checkpoint (after a rewind too) and opens like it; the
// weights carry the graph that made them; metadata numbers are plain decimals.
TEST(RunFaults, LastIsTheNewestCheckpointAndTheWeightsCarryTheirGraph) {
  reset_recorded();
  TempDir d;
  std::string g = graph(d, "every: 2, keep: 10, keep_best: 1");
  const std::vector<std::string> sets = {"run.validate_every=2", "run.validate_batches=1"};
  auto with = [&](const std::string& extra) { return with_set(sets, extra); };
  Runner first(plan_text(d, g, with("run.steps=6")), writing_options());
  const std::string dir = first.run().run_dir;
  const fs::path last = fs::path(dir) / "checkpoints" / "last";
  ASSERT_TRUE(fs::is_symlink(last));
  EXPECT_EQ(fs::read_symlink(last), "step-6");
  const CheckpointPath where = find_checkpoint(last.string());
  EXPECT_TRUE(where.error.empty()) << where.error;
  EXPECT_EQ(fs::path(where.run_dir), fs::path(dir));
  // The checkpoint it names, not "last": what a resume records in run.json and reports.
  EXPECT_EQ(fs::path(where.checkpoint).filename(), "step-6");

  const auto weights = read_safetensors((last / "model.safetensors").string());
  const std::string text = weights.metadata.at("slipstream.config");
  const GraphPlan again = plan_graph(load_config(d.write("from_weights.yaml", text)));
  ASSERT_EQ(again.stages.size(), 3u);
  EXPECT_EQ(again.stages[2].params.integer("every"), 2);
  const auto state = read_safetensors((last / "state.safetensors").string());
  const std::string loss = state.metadata.at("ckpt.best.0.loss");
  EXPECT_EQ(loss.find("0x"), std::string::npos) << loss;
  EXPECT_TRUE(std::isfinite(std::stod(loss))) << loss;

  RunOptions o = writing_options();
  o.resume_dir = dir;
  o.resume_checkpoint = (fs::path(dir) / "checkpoints" / "step-2").string();
  Runner second(plan_text(d, g, with("run.steps=4")), o);
  second.run();
  EXPECT_EQ(fs::read_symlink(last), "step-4") << "a rewound run's newest checkpoint";
}

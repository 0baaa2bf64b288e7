// replays.batch_size: auto (engine/auto_batch.h) on the emulated device, whose memory is the host
// pool: with run.device_memory as the budget, the chosen batch is a multiple of 8, the run's
// peak stays within 90% of the budget, and twice the budget gives a larger batch. A CPU run, and
// an emulated one without a budget, are refused before any probe, saying why. An out-of-memory
// error's hint names the batch size.
#include <gtest/gtest.h>

#include <sstream>

#include "engine/auto_batch.h"
#include "engine/memory_pool.h"
#include "tests/support/temp_dir.h"
#include "tests/training/training_fixture.h"

using namespace slipstream;
using namespace slipstream::testing;

namespace {

std::vector<std::string> auto_sets(const std::string& dir, const std::string& device,
                                   const std::string& gib) {
  auto sets = tiny_overrides(dir);
  sets.back() = "run.device=" + device;  // tiny_overrides ends with run.device=cpu
  sets.push_back("replays.batch_size=auto");
  sets.push_back("run.steps=1");
  if (!gib.empty()) sets.push_back("run.device_memory=" + gib);
  return sets;
}

#if SLIPSTREAM_CUDA_EMULATOR
TEST(AutoBatch, FitsTheBudgetAndGrowsWithIt) {
  TempDir d;
  int64_t chosen[2] = {0, 0};
  const char* budgets[2] = {"0.004", "0.008"};
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(std::string("run.device_memory=") + budgets[i]);
    std::ostringstream log;
    GraphPlan plan = plan_graph(load_config(source_path("configs/train_bc.yaml"),
                                            auto_sets(d.path(), "emulated", budgets[i])));
    RunOptions options = quiet_run_options(log);
    resolve_auto_batch(plan, options);  // before the Runner is built
    Runner r(std::move(plan), options);
    for (const auto& s : r.graph().plan().stages)
      if (s.name == "replays") chosen[i] = s.params.integer("batch_size");
    EXPECT_GE(chosen[i], 8);
    EXPECT_EQ(chosen[i] % 8, 0);
    Pools::host().reset_peak();
    const RunResult res = r.run();
    EXPECT_EQ(res.final_step, 1u);
    EXPECT_NE(log.str().find("replays.batch_size: auto -> " + std::to_string(chosen[i]) + " ("),
              std::string::npos)
        << log.str();
    EXPECT_LE(double(Pools::host().stats().peak_bytes),
              0.9 * std::stod(budgets[i]) * double(1 << 30));
  }
  EXPECT_GT(chosen[1], chosen[0]);
}
#endif

TEST(AutoBatch, RefusedWhereThereIsNoDeviceMemoryToMeasure) {
  TempDir d;
  std::ostringstream log;
  for (const auto& [device, want] : std::vector<std::pair<std::string, std::string>>{
           {"cpu", "auto sizes a batch to a GPU's memory and this run is on the CPU"},
           {"emulated", "auto on device emulated needs run.device_memory"}}) {
    try {
      GraphPlan plan = plan_graph(
          load_config(source_path("configs/train_bc.yaml"), auto_sets(d.path(), device, "")));
      RunOptions options = quiet_run_options(log);
      resolve_auto_batch(plan, options);
      FAIL() << device << ": the run was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("replays.batch_size"), std::string::npos) << e.what();
    }
  }
}

// A Runner is never handed an unresolved auto: it names the parameter and where it is resolved.
TEST(AutoBatch, TheRunnerRefusesAnUnresolvedAuto) {
  TempDir d;
  std::ostringstream log;
  try {
    Runner r(plan_graph(
                 load_config(source_path("configs/train_bc.yaml"), auto_sets(d.path(), "cpu", ""))),
             quiet_run_options(log));
    FAIL() << "the Runner took batch_size: auto";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("replays.batch_size: auto is resolved before the run is "
                                         "built (resolve_auto_batch"),
              std::string::npos)
        << e.what();
  }
}

// An allocation that fails says which knob to turn: the graph's batch size, as it stands.
TEST(AutoBatch, OutOfMemoryNamesTheBatchSize) {
  TempDir d;
  std::ostringstream log;
  auto sets = tiny_overrides(d.path());
  sets.push_back("replays.batch_size=24");
  Runner r(plan_graph(load_config(source_path("configs/train_bc.yaml"), sets)),
           quiet_run_options(log));
  EXPECT_EQ(Pools::oom_hint(), "lower replays.batch_size (now 24)");
}

}  // namespace

// On synthetic replays, whose inputs are a deterministic function of the game state, the model
// learns every head to >= 95% validation accuracy. Minutes on 2 cores: ctest label `slow`.
#include <gtest/gtest.h>

#include <sstream>

#include "tests/support/temp_dir.h"
#include "tests/training/training_fixture.h"

using namespace slipstream;
using namespace slipstream::testing;

TEST(Learning, SyntheticReplaysEveryHeadAbove95Percent) {
  TempDir d;
  std::ostringstream log;
  std::vector<std::string> sets{"replays.synthetic_dir=" + d.path() + "/synth",
                                "run.runs_dir=" + d.path() + "/runs",
                                "run.steps=3000",
                                "run.epochs=3",
                                "run.validate_every=3000",
                                "run.validate_batches=40",
                                "ckpt.every=0"};
  Runner r(plan_graph(load_config(source_path("presets/cpu_quick.yaml"), sets)),
           quiet_run_options(log));
  RunResult res = r.run();
  const auto& v = res.last_validation_metrics;
  int heads = 0;
  for (const auto& [k, x] : v) {
    if (!k.starts_with("acc/")) continue;
    ++heads;
    std::printf("  %s %.4f (baseline %.4f)\n", k.c_str(), x,
                v.count("baseline/" + k) ? v.at("baseline/" + k) : -1.0);
    EXPECT_GE(x, 0.95) << k;
  }
  EXPECT_EQ(heads, 6) << log.str();
}

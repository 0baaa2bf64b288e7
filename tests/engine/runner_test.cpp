// The runner on the flow graph: wiring, order, backpressure, failures, SIGINT, resume,
// validation passes, plugins and the stats record.
#include <gtest/gtest.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "engine/checkpoint.h"
#include "engine/launch.h"
#include "engine/registry.h"
#include "engine/runner.h"
#include "engine/sdk_abi.h"
#include "engine/stage_harness.h"
#include "engine/stats_record.h"
#include "engine/step_benchmark.h"
#include "tests/engine/test_stages.h"
#include "tests/support/temp_dir.h"

using namespace slipstream;
using slipstream::testing::recorded;
using slipstream::testing::reset_recorded;
using slipstream::testing::TempDir;

namespace {

RunOptions quiet_options() {
  static std::ostringstream sink;
  RunOptions o;
  o.create_run_dir = false;
  o.publish_stats = false;
  o.log = &sink;
  return o;
}

GraphPlan plan_text(const TempDir& d, const std::string& text, std::vector<std::string> sets = {}) {
  return plan_graph(load_config(d.write("g.yaml", text), sets));
}

const char* kChain = R"(stages:
  - {name: src, kind: test_counter, params: {count: 20, batch: 4}}
  - {name: work, kind: test_sleep, inputs: [src]}
  - {name: rec, kind: test_recorder, inputs: [work]}
)";

std::vector<int32_t> expected_values(int n, int batch) {
  std::vector<int32_t> v;
  for (int k = 0; k < n; ++k) v.push_back(k * batch);
  return v;
}

}  // namespace

TEST(Runner, RunsChainInOrder) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, kChain), quiet_options());
  RunResult res = r.run();
  EXPECT_EQ(res.steps, 20u);
  EXPECT_EQ(res.samples, 80u);
  EXPECT_EQ(recorded().values, expected_values(20, 4));
  EXPECT_EQ(recorded().finished.load(), 1);
  EXPECT_EQ(r.counters(0).items_out, 20u);
  EXPECT_EQ(r.counters(1).items_out, 20u);
  EXPECT_EQ(r.counters(2).items_out, 20u);
  EXPECT_FALSE(res.interrupted);
}

// A stage that reads an input's bf16 copy (StageSchema::reads_bf16_copy) gets the one its
// producer wrote, bit for bit fp32_to_bf16's, under precision bf16 only; a producer that writes
// none leaves it none, and a copy nobody reads is refused.
TEST(Runner, Bf16CopiesGoFromTheProducerToTheStageThatReadsThem) {
  const std::string g = R"(stages:
  - {name: src, kind: test_counter, params: {count: 3, batch: 5}}
  - {name: conv, kind: test_to_f32, inputs: [src]}
  - {name: rec, kind: test_bf16_reader, inputs: [conv]}
)";
  TempDir d;
  {
    reset_recorded();
    Runner r(plan_text(d, g, {"run.precision=bf16"}), quiet_options());
    const auto& slots = r.graph().plan().slots;
    EXPECT_TRUE(std::any_of(slots.begin(), slots.end(),
                            [](const SlotInfo& s) { return s.name == "bf16:conv.y"; }));
    r.run();
    EXPECT_EQ(recorded().bf16_copies, std::vector<int>(3, 1));
  }
  {
    reset_recorded();
    Runner r(plan_text(d, g, {"run.precision=fp32"}), quiet_options());
    r.run();
    EXPECT_EQ(recorded().bf16_copies, std::vector<int>(3, 0)) << "no copy wanted in fp32";
  }
  {
    reset_recorded();
    Runner r(plan_text(d, g, {"run.precision=bf16", "conv.write_copy=false"}), quiet_options());
    r.run();
    EXPECT_EQ(recorded().bf16_copies, std::vector<int>(3, 0)) << "a producer that writes none";
  }
  {  // the copy of an output no stage reads: the producer's mistake, named
    const std::string unread = R"(stages:
  - {name: src, kind: test_counter, params: {count: 3, batch: 5}}
  - {name: conv, kind: test_to_f32, inputs: [src], params: {always_copy: true}}
  - {name: sink, kind: test_f32_sink, inputs: [conv], params: {level: 1}}
)";
    Runner r(plan_text(d, unread, {"run.precision=bf16"}), quiet_options());
    try {
      r.run();
      FAIL() << "expected a StageError";
    } catch (const StageError& e) {
      EXPECT_NE(std::string(e.what()).find("output 'y' has no reader of a bf16 copy"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_NE(StageRegistry::find("test_bf16_reader")->help().find("reads its bf16 copy"),
            std::string::npos);
}

// A stage whose tensors break what its port and setup promised is named as the culprit: an
// output of another dtype or rank when it sets it, an output left unset by the consumer that
// finds it empty, a gradient of the wrong shape when it gives it (each was reported by the
// stage after it, or not at all: a wrong dtype trained on).
TEST(Runner, AStageBreakingItsPortsPromiseIsNamed) {
  TempDir d;
  const std::string g = R"(stages:
  - {name: src, kind: test_counter, params: {count: 3, batch: 5}}
  - {name: conv, kind: test_to_f32, inputs: [src]}
  - {name: rec, kind: test_bf16_reader, inputs: [conv]}
)";
  const std::pair<const char*, const char*> cases[] = {
      {"dtype",
       "stage 'conv': output 'y' is i32[5] on cpu in batch 0, not f32[5] declared at "
       "setup (test_to_f32)"},
      {"rank",
       "stage 'conv': output 'y' is f32[5, 1] on cpu in batch 0, not f32[5] declared at "
       "setup (test_to_f32)"},
      {"unset",
       "stage 'rec': input 'y' is empty in batch 0: stage 'conv' (test_to_f32) did not "
       "set its output 'y'"},
      {"throw_int",
       "stage 'conv' (test_to_f32), batch 0: threw an exception that is not a "
       "std::exception"}};
  for (const auto& [misuse, message] : cases) {
    Runner r(plan_text(d, g, {std::string("conv.misuse=") + misuse}), quiet_options());
    try {
      r.run();
      ADD_FAILURE() << misuse << ": the run went on";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  // stage run / stage check feed a stage through the harness: a tensor its port does not take
  // is refused, as a graph's validation refuses its producer.
  try {
    StageHarness bad("test_wrong_gradient", {}, "wrong");
    bad.setup({{"x", Tensor::zeros({2, 3}, DType::i32)}});
    ADD_FAILURE() << "an i32 tensor went into an f32 port";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x' is i32[2, 3] on cpu, and the port takes f32, "
                                         "any rank"),
              std::string::npos)
        << e.what();
  }
  StageHarness h("test_wrong_gradient", {}, "wrong");
  h.setup({{"x", Tensor::zeros({2, 3}, DType::f32)}});
  h.forward({{"x", Tensor::zeros({2, 3}, DType::f32)}});
  try {
    h.backward({{"y", Tensor::zeros({2, 3}, DType::f32)}});
    ADD_FAILURE() << "a gradient of the wrong shape was taken";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("stage 'wrong': the gradient of input 'x' is f32[1] on "
                                         "cpu, not the input's shape [2, 3] (test_wrong_gradient)"),
              std::string::npos)
        << e.what();
  }
  // The harness (stage run, stage check, a stage's tests) holds a stage to what its setup
  // declared, on setup's shapes, as a graph's consumers would: an undeclared output, one the
  // forward does not set, one of another size than declared (a graph's run refuses each).
  const Tensor x = Tensor::zeros({5}, DType::i32);
  const std::pair<const char*, const char*> harnessed[] = {
      {"undeclared", "stage kind 'test_to_f32' did not declare output 'y' in setup()"},
      {"unset", "stage kind 'test_to_f32': output 'y' was not set by the forward"},
      {"size",
       "stage kind 'test_to_f32': output 'y' is f32[6] on cpu, not f32[5] declared at "
       "setup for these inputs"}};
  for (const auto& [misuse, message] : harnessed) {
    try {
      StageHarness s("test_to_f32", {std::string("misuse=") + misuse});
      s.setup({{"x", x}});
      s.forward({{"x", x}});
      ADD_FAILURE() << misuse << ": the harness took it";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos)
          << misuse << ": " << e.what();
    }
  }
  StageHarness fine("test_to_f32", {});
  fine.setup({{"x", x}});
  EXPECT_EQ(fine.forward({{"x", x}}).at("y").shape(), Shape({5}));
}

TEST(Runner, ParallelStageKeepsSourceOrder) {
  reset_recorded();
  TempDir d;
  std::string g = kChain;
  g.replace(g.find("inputs: [src]}"), 14,
            "inputs: [src], concurrency: 4, params: {jitter_us: 3000}}");
  Runner r(plan_text(d, g, {"run.max_in_flight=8"}), quiet_options());
  r.run();
  EXPECT_EQ(recorded().values, expected_values(20, 4));
  for (size_t i = 0; i < recorded().indices.size(); ++i) EXPECT_EQ(recorded().indices[i], i);
}

TEST(Runner, BackpressureBoundsBatchesInFlight) {
  reset_recorded();
  TempDir d;
  std::string g = kChain;
  g.replace(g.find("kind: test_recorder, inputs: [work]}"), 36,
            "kind: test_recorder, inputs: [work], params: {sleep_us: 4000}}");
  Runner r(plan_text(d, g, {"run.max_in_flight=3"}), quiet_options());
  r.run();
  EXPECT_LE(r.max_in_flight_seen(), 3u);
  EXPECT_GE(r.max_in_flight_seen(), 2u);  // the source did run ahead
  // The fast source spent its time blocked on the full pipeline, not working.
  auto src = r.counters(0);
  EXPECT_GT(src.blocked_output_ns, 20u * 1000 * 1000);
  EXPECT_LE(r.counters(2).max_queue_depth, 3u);
}

TEST(Runner, StageFailureCancelsAndNamesStageAndBatch) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, kChain, {"rec.fail_at=5"}), quiet_options());
  try {
    r.run();
    FAIL() << "expected a StageError";
  } catch (const StageError& e) {
    EXPECT_EQ(std::string(e.what()), "stage 'rec' (test_recorder), batch 5: injected failure");
    EXPECT_EQ(e.stage(), "rec");
    EXPECT_EQ(e.batch(), 5u);
  }
  EXPECT_EQ(recorded().values.size(), 5u);
  EXPECT_EQ(recorded().finished.load(), 0);  // no finish() after a failure
}

// Reports read back later (as device stages make them) arrive before the step's row, in batch
// order, and an error in one still names its stage and batch.
TEST(Runner, ReportsReadBackLaterCountInTheirStep) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, kChain, {"rec.report_later=true", "run.log_every=1"}), quiet_options());
  const RunResult res = r.run();
  EXPECT_EQ(res.steps, 20u);
  std::vector<uint64_t> order(20);
  for (uint64_t k = 0; k < 20; ++k) order[k] = k;
  EXPECT_EQ(recorded().indices, order);
  ASSERT_TRUE(res.last_train_metrics.count("loss"));
  EXPECT_EQ(res.last_train_metrics.at("loss"),
            19.0);  // the last step's own value, not a neighbour's

  reset_recorded();
  Runner f(plan_text(d, kChain, {"rec.report_later=true", "rec.fail_at=5"}), quiet_options());
  try {
    f.run();
    FAIL() << "expected a StageError";
  } catch (const StageError& e) {
    EXPECT_EQ(std::string(e.what()), "stage 'rec' (test_recorder), batch 5: injected failure");
  }
  EXPECT_EQ(recorded().indices.size(), 5u);
}

// The step without the data path: after the first 3 batches reach the section, the source
// stops loading and the section trains on those 3 again, skipping the data stages.
TEST(Runner, ResidentBatchesRepeatWithoutLoading) {
  reset_recorded();
  TempDir d;
  RunOptions o = quiet_options();
  o.resident_batches = 3;
  Runner r(plan_text(d, kChain, {"src.count=1000", "run.steps=40", "run.max_in_flight=2"}), o);
  const RunResult res = r.run();
  EXPECT_EQ(res.steps, 40u);
  const auto& v = recorded().values;
  ASSERT_EQ(v.size(), 40u);
  EXPECT_EQ(std::vector<int32_t>(v.begin(), v.begin() + 3), (std::vector<int32_t>{0, 4, 8}));
  // Loading stopped: a few batches were in flight when the 3 arrived, then none.
  const uint64_t loaded = r.counters(0).items_out;
  EXPECT_LE(loaded, 3u + 2u + 2u);
  for (size_t i = loaded; i < v.size(); ++i)
    EXPECT_TRUE(v[i] == 0 || v[i] == 4 || v[i] == 8) << "step " << i << " trained on " << v[i];
}

TEST(Runner, SigintFinishesTheStepAndStops) {
  reset_recorded();
  TempDir d;
  RunOptions o = quiet_options();
  o.handle_sigint = true;
  Runner r(plan_text(d, kChain, {"rec.stop_at=3", "run.max_in_flight=2"}), o);
  RunResult res = r.run();
  EXPECT_TRUE(res.interrupted);
  EXPECT_GE(recorded().values.size(), 4u);  // batch 3 itself finished
  EXPECT_LT(recorded().values.size(), 20u);
  EXPECT_EQ(recorded().finished.load(), 1);
  EXPECT_EQ(recorded().values, expected_values(static_cast<int>(recorded().values.size()), 4));
}

TEST(Runner, StepLimitStops) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, kChain, {"run.steps=7"}), quiet_options());
  RunResult res = r.run();
  EXPECT_EQ(res.final_step, 7u);
  // In-flight batches past the limit may not start a step.
  EXPECT_EQ(recorded().values.size(), 7u);
}

TEST(Runner, ValidationAndEarlyStopping) {
  reset_recorded();
  TempDir d;
  Runner r(
      plan_text(d, kChain,
                {"run.validate_every=3", "run.early_stop_patience=1", "run.validate_batches=2"}),
      quiet_options());
  RunResult res = r.run();
  EXPECT_TRUE(res.early_stopped);
  EXPECT_EQ(recorded().validation_passes.load(), 2);
  EXPECT_EQ(res.final_step, 6u);
  EXPECT_DOUBLE_EQ(res.last_validation_metrics.at("loss"), 1.0);
}

// A run that ends between validations (step limit or data end) validates where it ended.
TEST(Runner, FinalValidationWhenTheRunEndsBetweenValidations) {
  reset_recorded();
  TempDir d;
  Runner r(plan_text(d, kChain, {"run.validate_every=3", "run.steps=7", "run.validate_batches=1"}),
           quiet_options());
  RunResult res = r.run();
  EXPECT_EQ(res.final_step, 7u);
  EXPECT_EQ(recorded().validation_passes.load(), 3);  // at 3, 6 and the last step
  EXPECT_EQ(res.end_reason, "steps");
  reset_recorded();
  Runner data_end(plan_text(d, kChain, {"run.validate_every=6", "run.validate_batches=1"}),
                  quiet_options());
  EXPECT_EQ(data_end.run().final_step, 20u);
  EXPECT_EQ(recorded().validation_passes.load(), 4);  // 6, 12, 18 and 20
  reset_recorded();
  Runner on_step(plan_text(d, kChain, {"run.validate_every=5", "run.validate_batches=1"}),
                 quiet_options());
  on_step.run();
  EXPECT_EQ(recorded().validation_passes.load(), 4);  // 5, 10, 15, 20: nothing extra
}

// On a terminal the runner keeps one live line: a bar with rate, elapsed and remaining time
// between train rows, and the validation batch being run.
TEST(Runner, LiveProgressOnATerminal) {
  reset_recorded();
  TempDir d;
  std::ostringstream out;
  RunOptions o = quiet_options();
  o.log = &out;
  o.live_progress = true;
  Runner r(plan_text(d, kChain,
                     {"run.steps=8", "run.log_every=4", "run.validate_every=4",
                      "run.validate_batches=2"}),
           o);
  r.run();
  const std::string text = out.str();
  EXPECT_NE(text.find("\r\033[Kstep 1/8  12% |██▌"), std::string::npos) << text;
  EXPECT_NE(text.find(" steps/s 00:0"), std::string::npos) << text;
  EXPECT_NE(text.find("<00:0"), std::string::npos) << text;
  EXPECT_NE(text.find("\r\033[Kvalidation @ step 4: batch 2/2"), std::string::npos) << text;
  // Without the option (the log is not a terminal) none of it.
  std::ostringstream plain;
  o.log = &plain;
  o.live_progress.reset();
  Runner q(plan_text(d, kChain, {"run.steps=8", "run.log_every=4"}), o);
  q.run();
  EXPECT_EQ(plain.str().find('\r'), std::string::npos) << plain.str();
}

// A graph sized for a GPU that runs on the CPU says so at start, and what its steps cost once
// the first train row has measured them.
// precision bf16 on the CPU costs time for the GPU's numerics: said once at start, not for fp32.
TEST(Runner, Bf16OnTheCpuSaysWhatItCosts) {
  reset_recorded();
  TempDir d;
  RunOptions o = quiet_options();
  for (const char* precision : {"bf16", "fp32"}) {
    std::ostringstream out;
    o.log = &out;
    Runner r(
        plan_text(d, kChain,
                  {"run.steps=2", "run.device=cpu", std::string("run.precision=") + precision}),
        o);
    r.run();
    const std::string text = out.str();
    const size_t at = text.find("note: precision bf16 on the CPU");
    if (std::string(precision) == "bf16") {
      EXPECT_NE(at, std::string::npos) << text;
      EXPECT_EQ(text.find("note: precision bf16", at + 1), std::string::npos) << "said once";
    } else {
      EXPECT_EQ(at, std::string::npos) << text;
    }
  }
}

TEST(Runner, GpuSizedRunOnTheCpuSaysWhatItCosts) {
  reset_recorded();
  TempDir d;
  std::ostringstream out;
  RunOptions o = quiet_options();
  o.log = &out;
  Runner r(plan_text(d, std::string("sized_for: gpu\n") + kChain,
                     {"run.steps=8", "run.log_every=4", "run.device=cpu"}),
           o);
  r.run();
  const std::string text = out.str();
  EXPECT_NE(text.find("note: 'g' is sized for a GPU and runs on the CPU here"), std::string::npos)
      << text;
  EXPECT_NE(text.find("note: on this CPU a step of this run takes "), std::string::npos) << text;
  EXPECT_NE(text.find("the remaining 4 steps take about "), std::string::npos) << text;
  // Said once, and not at all for a graph sized for the CPU.
  EXPECT_EQ(text.find("note: on this CPU", text.find("note: on this CPU") + 1), std::string::npos);
  std::ostringstream cpu;
  o.log = &cpu;
  Runner c(plan_text(d, std::string("sized_for: cpu\n") + kChain, {"run.steps=8"}), o);
  c.run();
  EXPECT_EQ(cpu.str().find("note:"), std::string::npos) << cpu.str();
  try {
    plan_text(d, std::string("sized_for: tpu\n") + kChain);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("g.yaml:1:12: sized_for must be cpu or gpu, not 'tpu'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Runner, ResumeIsExact) {
  TempDir d;
  const std::string g = std::string(R"(stages:
  - {name: src, kind: test_counter, params: {count: 10, batch: 3}}
  - {name: acc, kind: test_accumulator, inputs: [src.x]}
  - {name: ckpt, kind: checkpoint, inputs: [acc], params: {every: 4}}
run: {runs_dir: )") + d.path() +
                        "/runs}\n";
  // acc's input port is `y`; bind src.x to it explicitly.
  std::string graph = g;
  graph.replace(graph.find("inputs: [src.x]"), 15, "inputs: {y: src.x}");
  auto weights = [](Runner& r) { return r.graph().stage(1).parameters()[0]->value.clone(); };
  RunOptions o = quiet_options();
  o.create_run_dir = true;

  Runner straight(plan_text(d, graph), o);
  RunResult a = straight.run();
  ASSERT_EQ(a.final_step, 10u);
  Tensor wa = weights(straight);

  Runner first(plan_text(d, graph, {"run.steps=6"}), o);
  RunResult b1 = first.run();
  ASSERT_EQ(b1.final_step, 6u);
  auto ckpt = latest_checkpoint(b1.run_dir);
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_NE(ckpt->find("step-6"), std::string::npos);

  RunOptions ro = o;
  ro.resume_dir = b1.run_dir;
  Runner second(plan_text(d, graph), ro);
  RunResult b2 = second.run();
  EXPECT_EQ(b2.final_step, 10u);
  EXPECT_EQ(b2.steps, 4u);
  Tensor wb = weights(second);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(wa.data<float>()[i], wb.data<float>()[i]) << i;
}

TEST(Runner, PluginStageLoadsFromGraphFile) {
  reset_recorded();
  TempDir d;
  std::string g = std::string("plugins: [") + SLIPSTREAM_TEST_PLUGIN + R"(]
stages:
  - {name: src, kind: test_counter, params: {count: 3, batch: 2}}
  - {name: scale, kind: plugin_scale, inputs: [src], params: {factor: 3}}
  - {name: rec, kind: test_recorder, inputs: [scale]}
)";
  Runner r(plan_text(d, g), quiet_options());
  r.run();
  EXPECT_EQ(recorded().values, (std::vector<int32_t>{0, 6, 12}));
  // Loading the same plugin again is a no-op, not a duplicate registration.
  EXPECT_NO_THROW(plan_text(d, g));
  // Another library registering the same kind is refused with the plugin and the kind named
  // (its static initialiser must not end the process), every time it is asked for; the kind
  // registered first still runs.
  const std::string again = std::string("plugins: [") + SLIPSTREAM_TEST_PLUGIN_AGAIN + "]\n" +
                            g.substr(g.find("stages:"));
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      plan_text(d, again);
      FAIL() << "a second plugin of kind plugin_scale loaded";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("plugin '") + SLIPSTREAM_TEST_PLUGIN_AGAIN +
                                           "' registers stage kind(s) 'plugin_scale', registered "
                                           "before it"),
                std::string::npos)
          << e.what();
    }
  }
  reset_recorded();
  Runner still(plan_text(d, g), quiet_options());
  still.run();
  EXPECT_EQ(recorded().values, (std::vector<int32_t>{0, 6, 12}));
  // A kind from a plugin loaded otherwise (`slipstream --plugin`, not the graph's plugins:): the
  // resolved graph (config.yaml, a checkpoint's) names that plugin, so a resume, eval or the
  // policy library reading it finds the kind.
  const std::string without = g.substr(g.find("stages:"));
  const std::string resolved = resolved_config_yaml(plan_text(d, without));
  EXPECT_NE(resolved.find("plugins:\n  - " +
                          std::filesystem::weakly_canonical(SLIPSTREAM_TEST_PLUGIN).string()),
            std::string::npos)
      << resolved;
  // The run's plugin moved and the kind comes from the one loaded by --plugin: the graph plans,
  // and its resolved form names the plugin that served, not the one that is gone.
  const std::string moved = "plugins: [/nonexistent/moved/libscale.so]\n" + without;
  std::string moved_resolved;
  EXPECT_NO_THROW(moved_resolved = resolved_config_yaml(plan_text(d, moved)));
  EXPECT_EQ(moved_resolved.find("/nonexistent/moved"), std::string::npos) << moved_resolved;
  EXPECT_NE(moved_resolved.find(std::filesystem::weakly_canonical(SLIPSTREAM_TEST_PLUGIN).string()),
            std::string::npos)
      << moved_resolved;
  // A plugin whose schema() throws, or whose two classes register one kind: refused naming
  // the plugin and what is wrong (the throw escaped its static initialiser and ended the
  // process; the second kind was said to be "registered before it").
  const std::pair<const char*, std::string> faulty[] = {
      {SLIPSTREAM_TEST_PLUGIN_THROWING_SCHEMA,
       "': a stage's schema() threw while the plugin loaded: a schema that cannot be built"},
      {SLIPSTREAM_TEST_PLUGIN_OTHER_SDK,
       std::string("' was built against other slipstream headers (SDK 0.0.0+other; this "
                   "slipstream's: ") +
           SLIPSTREAM_SDK_ABI + "): rebuild it"},
      {SLIPSTREAM_TEST_PLUGIN_TWICE,
       "' registers stage kind(s) 'plugin_faulty' twice (two of its classes name the same "
       "kind): rename one"}};
  for (const auto& [path, message] : faulty) {
    try {
      StageRegistry::load_plugin(path);
      ADD_FAILURE() << path << " loaded";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("plugin '") + path + message),
                std::string::npos)
          << e.what();
    }
  }
  // A library that registers no stage kind (not a plugin) is refused naming it.
  try {
    StageRegistry::load_plugin("libm.so.6");
    FAIL() << "a library of no stage kind loaded as a plugin";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("registers no stage kind"), std::string::npos) << e.what();
  }
  TempDir d2;
  std::string bad = "plugins: [/nonexistent/libnope.so]\n" + std::string(kChain);
  try {
    plan_text(d2, bad);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("plugin '/nonexistent/libnope.so' not found"),
              std::string::npos)
        << e.what();
  }
  // A relative one: where it was looked for.
  try {
    plan_text(d2, "plugins: [build/libnope.so]\n" + std::string(kChain));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("plugin 'build/libnope.so' not found (a relative path is "
                                         "looked for from " +
                                         std::filesystem::absolute(d2.path()).string()),
              std::string::npos)
        << e.what();
  }
  // The plugin given for the command (`slipstream --plugin NEW.so eval RUN`) stands in for the
  // graph's own of the same kind, which would be refused: the graph plans with the given one.
  StageRegistry::load_plugin(SLIPSTREAM_TEST_PLUGIN, /*given=*/true);
  GraphPlan stood_in;
  EXPECT_NO_THROW(stood_in = plan_text(d, again));
  // Its resolved form names the plugin that served, not both (which a later run would refuse).
  const std::string stood_in_yaml = resolved_config_yaml(stood_in);
  EXPECT_EQ(stood_in_yaml.find(SLIPSTREAM_TEST_PLUGIN_AGAIN), std::string::npos) << stood_in_yaml;
  EXPECT_EQ(StageRegistry::plugin_of("plugin_scale"),
            std::filesystem::weakly_canonical(SLIPSTREAM_TEST_PLUGIN).string());
}

// A stage inside an item longer than the publish interval reads busy while it runs, not idle
// until the item ends (what slipstream-smi's Busy % and bottleneck are made of).
TEST(Runner, AStageInsideALongItemIsPublishedBusy) {
  reset_recorded();
  TempDir d;
  setenv("SLIPSTREAM_STATS_DIR", d.path().c_str(), 1);
  std::string g = kChain;
  g.replace(g.find("{count: 20, batch: 4}"), 21, "{count: 2, batch: 4}");
  g.replace(g.find("kind: test_recorder, inputs: [work]}"), 36,
            "kind: test_recorder, inputs: [work], params: {sleep_us: 1200000}}");
  RunOptions o = quiet_options();
  o.publish_stats = true;
  Runner r(plan_text(d, g, {"run.stats_interval_ms=50", "run.name=longitem"}), o);
  double busiest_before_an_item_ended = 0;
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (auto& f : stats::find_records(d.path()))
        if (f.result.record && f.result.record->num_stages == 3) {
          const auto& rec = f.result.record->stages[2];
          if (rec.items_out == 0)
            busiest_before_an_item_ended =
                std::max(busiest_before_an_item_ended, rec.busy_frac_recent);
        }
    }
  });
  r.run();
  done = true;
  watcher.join();
  unsetenv("SLIPSTREAM_STATS_DIR");
  EXPECT_GT(busiest_before_an_item_ended, 0.8);
}

TEST(Runner, PublishesStatsRecordWhileRunning) {
  reset_recorded();
  TempDir d;
  setenv("SLIPSTREAM_STATS_DIR", d.path().c_str(), 1);
  std::string g = kChain;
  g.replace(g.find("kind: test_recorder, inputs: [work]}"), 36,
            "kind: test_recorder, inputs: [work], params: {sleep_us: 30000}}");
  RunOptions o = quiet_options();
  o.publish_stats = true;
  Runner r(plan_text(d, g, {"run.stats_interval_ms=20", "run.name=statstest"}), o);
  std::optional<stats::RunRecord> seen;
  std::thread watcher([&] {
    for (int i = 0; i < 200 && !seen; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      for (auto& f : stats::find_records(d.path()))
        if (f.result.record && f.result.record->step >= 3) seen = f.result.record;
    }
  });
  r.run();
  watcher.join();
  unsetenv("SLIPSTREAM_STATS_DIR");
  ASSERT_TRUE(seen.has_value());
  EXPECT_STREQ(seen->run_name, "statstest");
  EXPECT_EQ(seen->num_stages, 3u);
  EXPECT_STREQ(seen->stages[2].name, "rec");
  EXPECT_STREQ(seen->stages[2].kind, "test_recorder");
  EXPECT_GT(seen->stages[2].busy_ns, 0u);
  EXPECT_EQ(seen->pid, getpid());
  EXPECT_TRUE(stats::find_records(d.path()).empty());  // removed when the run ends
}

TEST(Launch, ReadsTheLaunchersRankAndSize) {
  const char* vars[] = {"OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK",
                        "PMIX_RANK",
                        "PMIX_SIZE",
                        "PMIX_LOCAL_RANK",
                        "PMI_RANK",
                        "PMI_SIZE",
                        "MPI_LOCALRANKID",
                        "SLURM_PROCID",
                        "SLURM_NTASKS",
                        "SLURM_LOCALID"};
  for (const char* v : vars) unsetenv(v);
  EXPECT_EQ(launch_info().world_size, 1);
  EXPECT_EQ(launch_info().local_rank, 0);
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "4", 1);
  LaunchInfo s = launch_info();
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.world_size, 4);
  EXPECT_EQ(s.local_rank, 0);  // no SLURM_LOCALID: one rank per node
  EXPECT_EQ(s.launcher, "slurm");
  setenv("SLURM_LOCALID", "1", 1);
  EXPECT_EQ(launch_info().local_rank, 1);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);  // Open MPI's variables win
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  EXPECT_EQ(launch_info().launcher, "openmpi");
  EXPECT_EQ(launch_info().rank, 1);
  EXPECT_EQ(launch_info().local_rank, 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "-1", 1);
  EXPECT_THROW(launch_info(), std::runtime_error);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);  // rank outside [0, size)
  EXPECT_THROW(launch_info(), std::runtime_error);
  for (const char* v : vars) unsetenv(v);
}

TEST(Launch, EachLocalRankTakesItsNodesGpu) {
  EXPECT_EQ(local_device_index(0, 8), 0);
  EXPECT_EQ(local_device_index(5, 8), 5);
  EXPECT_EQ(local_device_index(9, 8), 1);  // more ranks than GPUs: they share, round robin
  EXPECT_EQ(local_device_index(3, 0), 0);
}

TEST(Runner, OnlyRankZeroWritesTheRunDirectory) {
  reset_recorded();
  TempDir d;
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  RunOptions o = quiet_options();
  o.create_run_dir = true;
  std::string g = std::string(kChain) + "run: {runs_dir: " + d.path() + "/runs}\n";
#if defined(__SANITIZE_ADDRESS__)
  // Open MPI's MPI_Init (a world of 2 asks for MPI) leaks in its components, as the mpirun tests
  // say with detect_leaks=0: not this test's to report. Its other threads' few are suppressed by
  // tests/engine/open_mpi_lsan.supp.
  __lsan::ScopedDisabler open_mpi_leaks;
#endif
  Runner r(plan_text(d, g), o);
  RunResult res = r.run();
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(r.state().rank, 1);
  EXPECT_EQ(r.state().world_size, 2);
  EXPECT_TRUE(res.run_dir.empty());
  EXPECT_FALSE(std::filesystem::exists(d.path() + "/runs"));
  EXPECT_EQ(res.steps, 20u);
}

// --op-times under the emulator asks for graph mode (auto is off there) unless told otherwise.
TEST(OperationTimes, TheEmulatorGetsGraphModeUnlessSetOtherwise) {
  std::vector<std::string> sets;
  add_operation_time_sets(sets, "emulated");
  EXPECT_EQ(sets, std::vector<std::string>{"run.cuda_graph=on"});
  sets = {"run.cuda_graph=off"};
  add_operation_time_sets(sets, "emulated");
  EXPECT_EQ(sets, std::vector<std::string>{"run.cuda_graph=off"});
  sets.clear();
  add_operation_time_sets(sets, "cuda:0");  // auto is on there
  EXPECT_TRUE(sets.empty());
}

// RunOptions::on_step sees every step; run_step_benchmark times the steps after the warm-up and
// refuses to report a run that ended before its warm-up was over.
TEST(StepBenchmark, TimesTheStepsAfterTheWarmUp) {
  reset_recorded();
  TempDir d;
  StepBenchmarkOptions o;
  o.preset_or_file = d.write("g.yaml", kChain);
  o.warmup = 3;
  o.steps = 12;
  const StepBenchmark b = run_step_benchmark(o);
  EXPECT_EQ(b.steps, 12u);
  EXPECT_EQ(b.device, "cpu");
  EXPECT_EQ(recorded().values.size(), 15u);
  EXPECT_GT(b.step_median_ms, 0);
  EXPECT_LE(b.step_min_ms, b.step_median_ms);
  EXPECT_LE(b.step_median_ms, b.step_p90_ms);
  EXPECT_NEAR(b.samples_per_s, 4 * b.steps_per_s, 1e-6 * b.samples_per_s);
  EXPECT_EQ(b.frames_per_s, 0) << "the source has no window";
  ASSERT_EQ(b.stages.size(), 3u);
  EXPECT_EQ(b.stages[1].name, "work");
  EXPECT_GT(b.stages[1].busy_ms_per_step, 0);
  EXPECT_NE(format_step_benchmark(b).find("12 steps timed"), std::string::npos);
  EXPECT_EQ(step_benchmark_json(b).at("stages").size(), 3u);

  // The operations' times are read in a CUDA graph: a CPU run has none, and says so.
  o.operation_times = true;
  o.warmup = 1;
  try {
    run_step_benchmark(o);
    ADD_FAILURE() << "operation times on the CPU";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("this run is on the CPU"), std::string::npos) << e.what();
  }
  o.operation_times = false;

  o.warmup = 30;  // the source has 20 batches
  try {
    run_step_benchmark(o);
    ADD_FAILURE() << "a run shorter than its warm-up has no steady state to report";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("before its warm-up was over"), std::string::npos)
        << e.what();
  }
}

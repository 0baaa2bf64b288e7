// The trainable stages in real graphs: source -> mamba/gru -> loss -> allreduce -> adamw.
// Zero heap allocations per step once warm, learning, bit-exact resume, the adamw stage's
// schedule/metric wiring, and allreduce's `none` path (never touching MPI).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/checkpoint.h"
#include "engine/graph.h"
#include "engine/runner.h"
#include "stages/dist/mpi_reduce.h"
#include "stages/dist/nccl_reduce.h"
#include "stages/optim/lr_schedule.h"
#include "tests/nn/alloc_counter.h"
#include "tests/nn/nn_test_stages.h"
#include "tests/support/onednn_allocations.h"
#include "tests/support/temp_dir.h"

namespace slipstream {
namespace {

using testing::TempDir;

std::string train_graph(const std::string& core, const std::string& extra_adamw = "") {
  return R"(stages:
  - {name: data, kind: nn_test_source, params: {batch: 4, window: 16, din: 6, dout: 16, reuse: true}}
  - {name: core, kind: )" +
         core + R"(, inputs: [data]}
  - {name: loss, kind: nn_test_mse, inputs: {y: core.y, target: data.target}}
  - {name: sync, kind: allreduce, inputs: [loss], params: {backend: none}}
  - {name: step, kind: adamw, inputs: [sync], params: {lr: 0.01)" +
         extra_adamw + R"(}}
)";
}

// The same graph with a source that does not say how many batches it has.
std::string without_count(std::string graph) {
  return graph.replace(graph.find("reuse: "), 0, "tells_count: false, ");
}

// The runner's trainable section for one batch (forward, backward from the loss, updates).
void run_section(Graph& g, Batch& b) {
  const auto& plan = g.plan();
  const size_t n = g.size(), begin = static_cast<size_t>(plan.section_begin);
  for (size_t k = begin; k < n; ++k)
    if (!plan.stages[k].after_loss) g.stage(k).forward(b, g.context(k));
  for (size_t k = n; k-- > begin;)
    if (!plan.stages[k].after_loss && plan.stages[k].schema->is_differentiable())
      g.stage(k).backward(b, g.context(k));
  for (size_t k = begin; k < n; ++k)
    if (plan.stages[k].after_loss) g.stage(k).forward(b, g.context(k));
}

struct ZeroAllocCase {
  std::string core;
  Precision precision;
};

class ZeroAllocTest : public ::testing::TestWithParam<ZeroAllocCase> {};

TEST_P(ZeroAllocTest, SteadyStateStepAllocatesNothing) {
  TempDir d;
  RunState run;
  run.precision = GetParam().precision;
  double last_metric = 0;
  run.metric_sink = [&](std::string_view, double v, MetricKind, double) { last_metric = v; };
  Graph g(plan_graph(load_config(
              d.write("g.yaml", train_graph(GetParam().core, ", clip: 0.5, ema: 0.99")))),
          run);
  g.setup();
  Batch b = g.new_batch();
  auto step = [&] {
    for (auto& s : b.slots) s = Tensor();  // a fresh batch, as the runner makes
    ASSERT_TRUE(g.stage(0).produce(b, g.context(0)));
    run_section(g, b);
    b.index++;
  };
  for (int i = 0; i < 3; ++i) step();
  {
    const slipstream::testing::WithoutOnednn widen;  // our code alone: nothing
    const uint64_t before = nn_test::allocations();
    for (int i = 0; i < 5; ++i) step();
    EXPECT_EQ(nn_test::allocations() - before, 0u) << "heap allocations in 5 steady-state steps";
  }
  // oneDNN's GEMMs (fp32 at AVX2 and above, native bf16) where the CPU has them: only oneDNN's own,
  // per product.
  const uint64_t calls = kernels::onednn_gemm_calls();
  const uint64_t before = nn_test::allocations();
  for (int i = 0; i < 5; ++i) step();
  const uint64_t products = kernels::onednn_gemm_calls() - calls;
  const uint64_t made = nn_test::allocations() - before;
  EXPECT_LE(made, slipstream::testing::kOnednnAllocationsPerGemm * products)
      << made << " heap allocations in 5 steps, " << products << " oneDNN products";
  if (products) std::printf("oneDNN: %.2f allocations per product\n", double(made) / products);
  EXPECT_GT(last_metric, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Models, ZeroAllocTest,
    ::testing::Values(ZeroAllocCase{"mamba, params: {d_model: 16, layers: 2}", Precision::fp32},
                      ZeroAllocCase{"mamba, params: {d_model: 16, layers: 2}", Precision::bf16},
                      ZeroAllocCase{"gru, params: {hidden: 16, layers: 2}", Precision::fp32},
                      ZeroAllocCase{"gru, params: {hidden: 16, layers: 2}", Precision::bf16}),
    [](const auto& info) {
      return std::string(info.param.core.substr(0, info.param.core.find(','))) +
             (info.param.precision == Precision::bf16 ? "Bf16" : "Fp32");
    });

// One tensor read by two consumers (both inputs of a sum): its producer gets the two
// gradients added, on the CPU and on the device path (emulator: the same memory, the device
// backend's context).
TEST(TrainGraph, TwoConsumersGradientsAdd) {
  for (bool emulated : {false, true}) {
    SCOPED_TRACE(emulated ? "emulated" : "cpu");
    TempDir d;
    RunState run;
    run.exec = std::make_shared<ExecContext>(Device::cpu(), emulated);
    Graph g(plan_graph(load_config(d.write("g.yaml", R"(stages:
  - {name: data, kind: nn_test_source, params: {batch: 2, window: 5, din: 3, dout: 3}}
  - {name: probe, kind: nn_test_probe, inputs: {x: data.x}}
  - {name: twice, kind: nn_test_sum, inputs: {a: probe.y, b: probe.y}}
  - {name: loss, kind: nn_test_mse, inputs: {y: twice.y, target: data.target}}
)"))),
            run);
    g.setup();
    Batch b = g.new_batch();
    ASSERT_TRUE(g.stage(0).produce(b, g.context(0)));
    run_section(g, b);
    const Tensor& x = g.context(1).input(b, "x");
    const Tensor& t = g.context(3).input(b, "target");
    const auto& got = nn_test::probed_gradient();
    ASSERT_EQ(got.size(), size_t(x.numel()));
    const double n = double(x.numel());
    for (size_t i = 0; i < got.size(); ++i) {
      // d/dx of mean((2x - t)^2) = 2 * 2 (2x - t) / n: the loss's gradient once per consumer.
      const double want = 2.0 * 2.0 * (2.0 * x.data<float>()[i] - t.data<float>()[i]) / n;
      EXPECT_NEAR(got[i], want, 1e-6) << "element " << i;
    }
  }
}

RunOptions quiet(const std::string& runs_dir = "") {
  static std::ostringstream sink;
  RunOptions o;
  o.create_run_dir = !runs_dir.empty();
  o.publish_stats = false;
  o.handle_sigint = false;
  o.log = &sink;
  return o;
}

TEST(TrainGraph, MambaLearnsTheTask) {
  TempDir d;
  nn_test::reset_losses();
  std::string graph =
      train_graph("mamba, params: {d_model: 16, layers: 1}", ", schedule: cosine, warmup: 5") +
      "run: {steps: 80}\n";
  graph.replace(graph.find("reuse: true"), 11, "reuse: false");
  Runner r(plan_graph(load_config(d.write("g.yaml", graph))), quiet());
  RunResult res = r.run();
  EXPECT_EQ(res.final_step, 80u);
  const auto& l = nn_test::losses();
  ASSERT_EQ(l.size(), 80u);
  EXPECT_LT(l.back(), 0.5 * l.front()) << "first " << l.front() << " last " << l.back();
  // The cosine schedule decayed the lr (the metric is the last log interval's mean, steps 51-80:
  // about 0.13 of the peak); grad_norm is reported.
  ASSERT_TRUE(res.last_train_metrics.count("lr"));
  EXPECT_LT(res.last_train_metrics.at("lr"), 0.01 * 0.2);
  EXPECT_TRUE(res.last_train_metrics.count("grad_norm"));
  EXPECT_FALSE(dist::mpi_is_initialized());  // backend none never touches MPI
}

TEST(TrainGraph, GruLearnsTheTask) {
  TempDir d;
  nn_test::reset_losses();
  std::string graph = train_graph("gru, params: {hidden: 16}") + "run: {steps: 60}\n";
  graph.replace(graph.find("reuse: true"), 11, "reuse: false");
  graph.replace(graph.find("lr: 0.01"), 8, "lr: 0.03");
  Runner r(plan_graph(load_config(d.write("g.yaml", graph))), quiet());
  r.run();
  const auto& l = nn_test::losses();
  ASSERT_EQ(l.size(), 60u);
  EXPECT_LT(l.back(), 0.7 * l.front()) << "first " << l.front() << " last " << l.back();
}

// Accumulate 4 and an EMA; the first run's data ends two batches into step 7, so its last
// checkpoint (step 6, from finish()) holds two accumulated batches: resuming gives the same
// weights, bit for bit, as the uninterrupted run.
TEST(TrainGraph, ResumeIsBitExact) {
  TempDir d;
  std::string graph =
      train_graph("mamba, params: {d_model: 16, layers: 1}", ", accumulate: 4, ema: 0.9");
  graph.replace(graph.find("reuse: true"), 11, "reuse: false");
  graph +=
      "  - {name: ckpt, kind: checkpoint, inputs: [step], params: {every: 5}}\nrun: {runs_dir: " +
      d.path() + "/runs}\n";
  auto weights = [](Runner& r) {
    std::vector<float> all;
    for (Parameter* p : r.graph().stage(static_cast<size_t>(r.graph().find("core"))).parameters())
      all.insert(all.end(), p->value.data<float>(), p->value.data<float>() + p->value.numel());
    return all;
  };
  Runner straight(plan_graph(load_config(d.write("g.yaml", graph), {"run.steps=11"})),
                  quiet(d.path()));
  straight.run();
  Runner first(plan_graph(load_config(d.write("g.yaml", graph), {"data.count=26"})),
               quiet(d.path()));
  RunResult a = first.run();
  EXPECT_EQ(a.steps, 6u);
  RunOptions o = quiet(d.path());
  o.resume_dir = a.run_dir;
  Runner second(plan_graph(load_config(d.write("g.yaml", graph), {"run.steps=11"})), o);
  RunResult b = second.run();
  EXPECT_EQ(b.steps, 5u);
  EXPECT_EQ(weights(straight), weights(second));
}

// Under gradient accumulation a step is an optimizer update: run.steps, log_every and the
// schedule's horizon count updates, each made of `accumulate` batches; without run.steps the
// data decides, in whole updates.
TEST(TrainGraph, AccumulateCountsOptimizerSteps) {
  TempDir d;
  const std::string graph =
      train_graph("gru, params: {hidden: 16}", ", accumulate: 3, schedule: cosine, warmup: 0") +
      "run: {runs_dir: " + d.path() + "/runs, log_every: 1}\n";
  nn_test::reset_losses();
  Runner r(plan_graph(load_config(d.write("g.yaml", graph), {"run.steps=5"})), quiet(d.path()));
  RunResult res = r.run();
  EXPECT_EQ(res.steps, 5u);
  EXPECT_EQ(nn_test::losses().size(), 15u);
  EXPECT_EQ(r.state().total_steps, 5u);
  std::vector<uint64_t> steps;
  std::vector<double> lrs;
  std::ifstream rows(res.run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(rows, line);) {
    auto row = nlohmann::json::parse(line);
    if (row["split"] != "train") continue;
    steps.push_back(row["step"].get<uint64_t>());
    lrs.push_back(row["lr"].get<double>());
  }
  EXPECT_EQ(steps, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  optim::LrSchedule cosine;
  cosine.kind = optim::LrSchedule::Kind::cosine;
  cosine.lr = 0.01;
  cosine.total = 5;  // the run's 5 updates, not 5 / 3
  ASSERT_EQ(lrs.size(), 5u);
  for (size_t i = 0; i < lrs.size(); ++i)
    EXPECT_NEAR(lrs[i], cosine.at(static_cast<int64_t>(i)), 1e-9) << "step " << i + 1;

  // A row over several steps logs the rate at its last step, not the window's mean.
  Runner w(plan_graph(load_config(d.write("g.yaml", graph), {"run.steps=5", "run.log_every=5"})),
           quiet(d.path()));
  std::ifstream wrows(w.run().run_dir + "/metrics.jsonl");
  std::string first;
  std::getline(wrows, first);
  auto row = nlohmann::json::parse(first);
  EXPECT_EQ(row["steps_averaged"], 5);
  EXPECT_NEAR(row["lr"].get<double>(), cosine.at(4), 1e-12);

  // 14 batches of data: 4 whole updates (the 2 batches left over do not make a fifth).
  Runner e(plan_graph(load_config(d.write("g.yaml", graph), {"data.count=14"})), quiet(d.path()));
  EXPECT_EQ(e.run().steps, 4u);
  EXPECT_EQ(e.state().total_steps, 4u);
  // Every stage after the source counts the batches it took in (smi's items_in), not only the
  // section's first.
  for (size_t k = 1; k < e.graph().size(); ++k) {
    EXPECT_EQ(e.counters(k).items_in, 14u) << e.graph().plan().stages[k].name;
    EXPECT_EQ(e.counters(k).items_out, 14u) << e.graph().plan().stages[k].name;
  }

  // A batcher joining pairs first: 14 batches -> 7 joined -> 2 updates of 3.
  std::string joined = graph;
  joined.replace(joined.find("  - {name: core"), 0,
                 "  - {name: join, kind: batcher, inputs: [data], params: {factor: 2}}\n");
  joined.replace(joined.find("inputs: [data]}"), 15, "inputs: [join]}");
  // (the loss still names data.target: a batcher acts on the tensors of the stages before it)
  Runner j(plan_graph(load_config(d.write("g.yaml", joined), {"data.count=14"})), quiet(d.path()));
  EXPECT_EQ(j.run().steps, 2u);
  EXPECT_EQ(j.state().total_steps, 2u);
}

// Accumulation values that disagree (an allreduce and an optimizer can both care) are an error.
TEST(TrainGraph, AccumulationIsOneValuePerGraph) {
  TempDir d;
  std::string graph = train_graph("gru, params: {hidden: 16}", ", accumulate: 2");
  graph += "  - {name: step2, kind: adamw, inputs: [step], params: {accumulate: 3}}\n";
  try {
    plan_graph(load_config(d.write("g.yaml", graph)));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("batches per optimizer step 'step2.accumulate' (3) differ "
                                         "from 'step.accumulate' (2)"),
              std::string::npos)
        << e.what();
  }
}

TEST(TrainGraph, CosineWithoutStepsIsAnError) {
  TempDir d;
  RunState run;
  Graph g(plan_graph(load_config(d.write(
              "g.yaml",
              without_count(train_graph("gru, params: {hidden: 16}", ", schedule: cosine"))))),
          run);
  try {
    g.setup();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("total_steps"), std::string::npos) << e.what();
  }
}

// A moment decay of 1 divides the bias correction by zero: refused at validation, naming the
// setting's line (ema likewise).
TEST(TrainGraph, DecaysOfOneAreErrors) {
  for (const char* setting : {", beta1: 1", ", beta2: 1.0", ", ema: 1"}) {
    TempDir d;
    try {
      plan_graph(load_config(d.write("g.yaml", train_graph("gru, params: {hidden: 16}", setting))));
      FAIL() << setting << ": expected an error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("must be below 1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("g.yaml:"), std::string::npos) << e.what();
    }
  }
}

// nccl reduces device gradients: a CPU run is refused, naming what to use (a build without CUDA
// says it needs one).
TEST(Allreduce, NcclRefusesHostGradients) {
  TempDir d;
  std::string graph = train_graph("gru, params: {hidden: 16}");
  graph.replace(graph.find("backend: none"), 13, "backend: nccl");
  RunState run;
  Graph g(plan_graph(load_config(d.write("g.yaml", graph))), run);
  try {
    g.setup();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string want = dist::nccl_built()
                                 ? "backend nccl reduces GPU gradients and this run is on cpu"
                                 : "backend nccl needs a CUDA build";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(Allreduce, AutoWithoutLauncherIsNone) {
  if (dist::launched_with_multiple_ranks()) GTEST_SKIP() << "running under a multi-rank launcher";
  TempDir d;
  std::string graph = train_graph("gru, params: {hidden: 16}");
  graph.replace(graph.find("backend: none"), 13, "backend: auto");
  RunState run;
  Graph g(plan_graph(load_config(d.write("g.yaml", graph))), run);
  g.setup();
  Batch b = g.new_batch();
  ASSERT_TRUE(g.stage(0).produce(b, g.context(0)));
  run_section(g, b);
  EXPECT_FALSE(dist::mpi_is_initialized());
}

}  // namespace
}  // namespace slipstream

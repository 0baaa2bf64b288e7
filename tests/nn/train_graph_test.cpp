// The trainable stages in real graphs: source -> mamba/gru -> loss -> allreduce -> adamw.
// Zero heap allocations per step once warm, learning, bit-exact resume, the adamw stage's
// schedule/metric wiring, and allreduce's `none` path (never touching MPI).
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "engine/checkpoint.h"
#include "engine/graph.h"
#include "engine/runner.h"
#include "stages/dist/mpi_reduce.h"
#include "tests/nn/alloc_counter.h"
#include "tests/nn/nn_test_stages.h"
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
  run.metric_sink = [&](std::string_view, double v) { last_metric = v; };
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
  const uint64_t before = nn_test::allocations();
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(nn_test::allocations() - before, 0u) << "heap allocations in 5 steady-state steps";
  EXPECT_GT(last_metric, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Models, ZeroAllocTest,
    ::testing::Values(ZeroAllocCase{"mamba, params: {d_model: 16, layers: 2}", Precision::fp32},
                      ZeroAllocCase{"mamba, params: {d_model: 16, layers: 2}", Precision::bf16},
                      ZeroAllocCase{"gru, params: {hidden: 16, layers: 2}", Precision::fp32}),
    [](const auto& info) {
      return std::string(info.param.core.substr(0, info.param.core.find(','))) +
             (info.param.precision == Precision::bf16 ? "Bf16" : "Fp32");
    });

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

// Checkpoint at step 6 with accumulate 4 (two micro-batches pending) and an EMA: resuming gives
// the same weights, bit for bit, as the uninterrupted run.
TEST(TrainGraph, ResumeIsBitExact) {
  TempDir d;
  std::string graph =
      train_graph("mamba, params: {d_model: 16, layers: 1}", ", accumulate: 4, ema: 0.9");
  graph.replace(graph.find("reuse: true"), 11, "reuse: false");
  graph +=
      "  - {name: ckpt, kind: checkpoint, inputs: [step], params: {every: 6}}\nrun: {runs_dir: " +
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
  Runner first(plan_graph(load_config(d.write("g.yaml", graph), {"run.steps=6"})), quiet(d.path()));
  RunResult a = first.run();
  RunOptions o = quiet(d.path());
  o.resume_dir = a.run_dir;
  Runner second(plan_graph(load_config(d.write("g.yaml", graph), {"run.steps=11"})), o);
  RunResult b = second.run();
  EXPECT_EQ(b.steps, 5u);
  EXPECT_EQ(weights(straight), weights(second));
}

TEST(TrainGraph, CosineWithoutStepsIsAnError) {
  TempDir d;
  RunState run;
  Graph g(plan_graph(load_config(
              d.write("g.yaml", train_graph("gru, params: {hidden: 16}", ", schedule: cosine")))),
          run);
  try {
    g.setup();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("total_steps"), std::string::npos) << e.what();
  }
}

TEST(Allreduce, NcclNeedsCuda) {
  TempDir d;
  std::string graph = train_graph("gru, params: {hidden: 16}");
  graph.replace(graph.find("backend: none"), 13, "backend: nccl");
  RunState run;
  Graph g(plan_graph(load_config(d.write("g.yaml", graph))), run);
  try {
    g.setup();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("backend nccl needs a CUDA build"), std::string::npos)
        << e.what();
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

// The flow graph's own cost per batch: a source that hands out one small tensor per batch, then
// `stages` stages that pass it on and do nothing else (one of them with concurrency 2 when
// `parallel`, so a sequencer restores the order), the last a trainable section of one
// differentiable stage and a loss, as a training graph is laid out. Everything measured is the
// runner: limiter, function nodes, sequencers, batch slots, counters. Counter ns_per_batch.
//   build/bin/bench_flow --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/config.h"
#include "engine/graph.h"
#include "engine/registry.h"
#include "engine/runner.h"

namespace slipstream {
namespace {

class FlowSource : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("bench_flow_source")
        .family("bench")
        .doc("One 4-element tensor per batch, `count` batches.")
        .role(StageRole::source)
        .output("x", DType::f32, 1, "zeros")
        .param("count", int64_t{1000}, "batches")
        .range(1, 1e9);
  }
  void setup(StageContext& ctx) override {
    count_ = static_cast<uint64_t>(ctx.params().integer("count"));
    ctx.declare_output("x", {4}, DType::f32);
  }
  bool produce(Batch& out, StageContext& ctx) override {
    if (out.index >= count_) return false;
    out.samples = 1;
    ctx.set_output(out, "x", Tensor::zeros({4}, DType::f32));
    return true;
  }
  void seek(uint64_t, StageContext&) override {}

 private:
  uint64_t count_ = 0;
};
SLIPSTREAM_REGISTER_STAGE(FlowSource);

class FlowPass : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("bench_flow_pass")
        .family("bench")
        .doc("Passes x on.")
        .input("x", DType::f32, 1, "in")
        .output("y", DType::f32, 1, "x");
  }
  void setup(StageContext& ctx) override {
    ctx.declare_output("y", ctx.input_shape("x"), DType::f32);
  }
  void forward(Batch& b, StageContext& ctx) override { ctx.set_output(b, "y", ctx.input(b, "x")); }
};
SLIPSTREAM_REGISTER_STAGE(FlowPass);

// The same in the trainable section.
class FlowModel : public FlowPass {
 public:
  static StageSchema schema() {
    return StageSchema("bench_flow_model")
        .family("bench")
        .doc("A trainable stage that passes x on.")
        .trainable()
        .differentiable()
        .input("x", DType::f32, 1, "in")
        .output("y", DType::f32, 1, "x");
  }
};
SLIPSTREAM_REGISTER_STAGE(FlowModel);

class FlowLoss : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("bench_flow_loss")
        .family("bench")
        .doc("A loss that does nothing.")
        .role(StageRole::loss)
        .differentiable()
        .input("y", DType::f32, 1, "in");
  }
};
SLIPSTREAM_REGISTER_STAGE(FlowLoss);

std::string graph_text(int64_t stages, bool parallel, int64_t count) {
  std::ostringstream g;
  g << "stages:\n  - {name: src, kind: bench_flow_source, params: {count: " << count << "}}\n";
  std::string prev = "src";
  for (int64_t i = 0; i < stages; ++i) {
    const std::string name = "pass" + std::to_string(i);
    g << "  - {name: " << name << ", kind: bench_flow_pass, inputs: [" << prev << "]"
      << (parallel && i == stages / 2 ? ", concurrency: 2" : "") << "}\n";
    prev = name;
  }
  g << "  - {name: model, kind: bench_flow_model, inputs: [" << prev << "]}\n"
    << "  - {name: loss, kind: bench_flow_loss, inputs: [model]}\n";
  return g.str();
}

void BM_FlowGraph(benchmark::State& state) {
  const int64_t stages = state.range(0), count = 20000;
  const bool parallel = state.range(1) != 0;
  const auto path = std::filesystem::temp_directory_path() /
                    ("slipstream-flow-bench-" + std::to_string(stages) + ".yaml");
  std::ofstream(path) << graph_text(stages, parallel, count);
  double seconds = 0;
  for (auto _ : state) {
    std::ostringstream log;
    Runner r(plan_graph(load_config(path.string(), {"run.log_every=1000000000"})),
             RunOptions::embedded(&log));
    const auto t0 = std::chrono::steady_clock::now();
    const RunResult res = r.run();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (res.steps != static_cast<uint64_t>(count)) state.SkipWithError("the run lost batches");
  }
  std::filesystem::remove(path);
  state.counters["ns_per_batch"] =
      seconds * 1e9 / (static_cast<double>(state.iterations()) * static_cast<double>(count));
}
BENCHMARK(BM_FlowGraph)
    ->ArgNames({"stages", "parallel"})
    ->Args({0, 0})
    ->Args({4, 0})
    ->Args({4, 1})
    ->Args({16, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace slipstream

BENCHMARK_MAIN();

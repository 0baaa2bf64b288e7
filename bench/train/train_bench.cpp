// One training step of the `mamba` stage: forward, backward (from an MSE-to-zero gradient) and
// the AdamW update of every weight, through the stage code the runner calls, fp32 vs bf16.
// Counters: steps/s (items_per_second) and samples/s.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "engine/stage_harness.h"
#include "stages/nn/param_layout.h"
#include "stages/optim/adamw_optimizer.h"

namespace slipstream {
namespace {

int slot(StageHarness& h, const std::string& name) {
  const auto& slots = h.context().graph_plan().slots;
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i].name == name) return static_cast<int>(i);
  throw std::logic_error("no slot " + name);
}

// args: B, W, Din, d_model, layers, bf16
void BM_MambaTrainStep(benchmark::State& state) {
  const int64_t B = state.range(0), W = state.range(1), Din = state.range(2), dm = state.range(3);
  const int64_t layers = state.range(4);
  const Precision prec = state.range(5) ? Precision::bf16 : Precision::fp32;
  StageHarness h(
      "mamba", {"d_model=" + std::to_string(dm), "layers=" + std::to_string(layers), "d_state=16"},
      "core", prec);
  Tensor x = Tensor::empty({B, W, Din}, DType::f32);
  nn::InitRng rng(1);
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = static_cast<float>(rng.uniform(-1, 1));
  h.setup({{"x", x}});
  std::vector<std::pair<std::string, Parameter*>> params;
  for (Parameter* p : h.stage().parameters()) params.emplace_back(p->name, p);
  optim::AdamWConfig cfg;
  cfg.schedule.lr = 1e-4;
  optim::AdamWOptimizer opt;
  opt.attach(params, cfg);
  opt.refresh_shadows();

  Batch b;
  b.slots.resize(h.context().graph_plan().slots.size());
  const int sx = slot(h, "input.x"), sy = slot(h, "core.y"), sdy = slot(h, "grad:core.y");
  const int sdx = slot(h, "grad:input.x");
  Tensor dy = Tensor::empty({B, W, dm}, DType::f32);
  const float scale = 2.0f / static_cast<float>(dy.numel());
  for (auto _ : state) {
    b.slots[static_cast<size_t>(sx)] = x;
    b.slots[static_cast<size_t>(sdx)] = Tensor();
    h.stage().forward(b, h.context());
    const float* y = b.slots[static_cast<size_t>(sy)].data<float>();
    float* g = dy.data<float>();
    for (int64_t i = 0; i < dy.numel(); ++i) g[i] = scale * y[i];
    b.slots[static_cast<size_t>(sdy)] = dy;
    h.stage().backward(b, h.context());
    opt.micro_step();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * B), benchmark::Counter::kIsRate);
  int64_t n = 0;
  for (auto& [name, p] : params) n += p->value.numel();
  state.counters["params"] = static_cast<double>(n);
}

// cpu_quick shape, then the standard shape; fp32 and bf16 each.
BENCHMARK(BM_MambaTrainStep)
    ->ArgNames({"B", "W", "Din", "d_model", "layers", "bf16"})
    ->Args({32, 30, 64, 64, 1, 0})
    ->Args({32, 30, 64, 64, 1, 1})
    ->Args({64, 60, 64, 128, 2, 0})
    ->Args({64, 60, 64, 128, 2, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace slipstream

BENCHMARK_MAIN();

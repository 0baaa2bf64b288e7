// Per-frame latency of the temporal models one frame at a time, the path a bot takes
// (stages/nn/mamba_recurrent.h, gru_recurrent.h): one step() per iteration at batch 1 (one game)
// and 32 (32 games at once), for d_model 128 / 2 layers (gpu_standard's core) and the production
// core (d_model 256, 3 layers, d_state 32); the input is the Melee embedding's width (E = 192).
// Besides Google Benchmark's mean, each run reports the p50 and p99 of the per-step times in
// microseconds (counters p50_us, p99_us) and frames per second over all rows. policy_bench.cpp
// measures the whole policy (libslipstream_policy: embedding, temporal step, heads, the graph).
//   build/bin/bench_infer --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <chrono>
#include <random>
#include <vector>

#include "bench/infer/latency_counters.h"
#include "stages/nn/gru_recurrent.h"
#include "stages/nn/mamba_recurrent.h"

namespace {

using namespace slipstream::nn;
constexpr int kEmbedding = 192;

template <class Model>
void run_steps(benchmark::State& state, Model& m, const std::vector<float>& w, int din, int dout) {
  const int B = static_cast<int>(state.range(0));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(B) * static_cast<size_t>(din));
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(static_cast<size_t>(B) * static_cast<size_t>(dout));
  std::vector<double> us;
  us.reserve(1 << 16);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    m.step(x.data(), w.data(), y.data());
    benchmark::DoNotOptimize(y.data());
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  report_latency(state, us);
  state.counters["frames_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * B, benchmark::Counter::kIsRate);
}

void BM_MambaStep(benchmark::State& state) {
  MambaConfig c;
  c.din = kEmbedding;
  c.d_model = static_cast<int>(state.range(1));
  c.layers = static_cast<int>(state.range(2));
  c.d_state = static_cast<int>(state.range(3));
  MambaLayout lay(c);
  std::vector<float> w(lay.params.total());
  mamba_init(c, lay, w.data(), 1);
  MambaRecurrent<float> m(c, static_cast<int>(state.range(0)));
  m.hold_weights(w.data());  // a bot plays a fixed checkpoint
  run_steps(state, m, w, c.din, c.d_model);
}
// batch, d_model, layers, d_state
BENCHMARK(BM_MambaStep)
    ->ArgNames({"B", "d_model", "layers", "d_state"})
    ->Args({1, 128, 2, 16})
    ->Args({32, 128, 2, 16})
    ->Args({1, 256, 3, 32})
    ->Args({32, 256, 3, 32});

void BM_GruStep(benchmark::State& state) {
  GruConfig c;
  c.din = kEmbedding;
  c.hidden = static_cast<int>(state.range(1));
  c.layers = static_cast<int>(state.range(2));
  GruLayout lay(c);
  std::vector<float> w(lay.params.total());
  gru_init(c, lay, w.data(), 1);
  GruRecurrent<float> m(c, static_cast<int>(state.range(0)));
  run_steps(state, m, w, c.din, c.hidden);
}
BENCHMARK(BM_GruStep)
    ->ArgNames({"B", "hidden", "layers"})
    ->Args({1, 128, 1})
    ->Args({32, 128, 1})
    ->Args({1, 256, 2})
    ->Args({32, 256, 2});

}  // namespace

BENCHMARK_MAIN();

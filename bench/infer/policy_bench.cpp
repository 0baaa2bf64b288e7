// The whole policy a bot links (libslipstream_policy): one slipstream_policy_step per iteration
// on the calling thread (the frame's features through the run's graph: melee_frames, embedding,
// Mamba's recurrent step, heads; the answer read back and chosen). The checkpoint is a one-step
// run of configs/train_bc.yaml at the model sizes given (gpu_standard's core, d_model 128 / 2
// layers, and the production core, 256 / 3 / d_state 32), trained in a temporary directory on
// synthetic games first. Counters p50_us and p99_us as in infer_bench.cpp. BM_PolicyStepBatch:
// slipstream_policy_step_batch of n games per call (n = 1, 64, 256, 1024) at gpu_standard's core,
// with frames/s over all games (counter frames_per_s) beside the per-call latency, on the
// caller's thread alone and on 2 (slipstream_policy_set_threads). BM_PolicyStepBatchOnDevice:
// the same on the device SLIPSTREAM_BENCH_DEVICE names (default cuda; emulated checks it without
// a GPU, slowly), skipped with a message where there is none.
#include <benchmark/benchmark.h>
#include <slipstream/policy.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "bench/infer/latency_counters.h"
#include "engine/config.h"
#include "engine/graph.h"
#include "engine/runner.h"
#include "stages/melee/slp/synth.h"

namespace {

namespace fs = std::filesystem;
using namespace slipstream;

// A run of one step with the model sizes of `state`'s arguments; returns its directory.
std::string train_checkpoint(const fs::path& dir, int64_t d_model, int64_t layers,
                             int64_t d_state) {
  slp::write_synthetic_games(dir / "games", 2, 5, 600);
  const std::vector<std::string> sets = {"replays.paths=[" + (dir / "games").string() + "]",
                                         "replays.batch_size=2",
                                         "replays.window=8",
                                         "replays.stride=64",
                                         "replays.min_frames=0",
                                         "core.d_model=" + std::to_string(d_model),
                                         "core.layers=" + std::to_string(layers),
                                         "core.d_state=" + std::to_string(d_state),
                                         "run.steps=1",
                                         "run.validate_every=0",
                                         "run.device=cpu",
                                         "run.runs_dir=" + (dir / "runs").string()};
  std::ostringstream log;
  RunOptions o;
  o.publish_stats = false;
  o.log = &log;
  Runner r(
      plan_graph(load_config(std::string(SLIPSTREAM_SOURCE_DIR) + "/configs/train_bc.yaml", sets)),
      o);
  return r.run().run_dir;
}

slipstream_game_frame frame_at(int t, const slipstream_controller& pressed) {
  slipstream_game_frame f{};
  f.stage = 31;
  f.player.exists = 1;
  f.player.character = 1;
  f.player.action_state = 14;
  f.player.action_frame = static_cast<float>(t % 60);
  f.player.facing = 1;
  f.player.x = -20;
  f.player.on_ground = 1;
  f.player.stocks = 4;
  f.opponent = f.player;
  f.opponent.character = 22;
  f.opponent.facing = -1;
  f.opponent.x = 20.0f + 15.0f * std::sin(static_cast<float>(t) / 40.0f);
  f.controller = pressed;
  return f;
}

void BM_PolicyStep(benchmark::State& state) {
  const fs::path dir = fs::temp_directory_path() /
                       ("slipstream-policy-bench-" + std::to_string(::getpid()) + "-" +
                        std::to_string(state.range(0)) + "x" + std::to_string(state.range(1)));
  fs::remove_all(dir);
  const std::string run = train_checkpoint(dir, state.range(0), state.range(1), state.range(2));
  slipstream_policy* p = nullptr;
  if (slipstream_policy_open(run.c_str(), "cpu", &p) != SLIPSTREAM_OK) {
    state.SkipWithError(slipstream_policy_error(nullptr));
    fs::remove_all(dir);
    return;
  }
  slipstream_controller pressed{};
  std::vector<double> us;
  us.reserve(1 << 16);
  int t = 0;
  for (auto _ : state) {
    const slipstream_game_frame f = frame_at(t++, pressed);
    const auto t0 = std::chrono::steady_clock::now();
    if (slipstream_policy_step(p, &f, &pressed) != SLIPSTREAM_OK) {
      state.SkipWithError(slipstream_policy_error(p));
      break;
    }
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  report_latency(state, us);
  slipstream_policy_close(p);
  fs::remove_all(dir);
}
BENCHMARK(BM_PolicyStep)
    ->ArgNames({"d_model", "layers", "d_state"})
    ->Args({128, 2, 16})
    ->Args({256, 3, 32})
    ->Unit(benchmark::kMicrosecond);

// n games per call on `device` with `threads` threads.
void policy_step_batch(benchmark::State& state, int32_t n, const char* device, int32_t threads) {
  const fs::path dir =
      fs::temp_directory_path() /
      ("slipstream-policy-batch-bench-" + std::to_string(::getpid()) + "-" + std::to_string(n));
  fs::remove_all(dir);
  const std::string run = train_checkpoint(dir, 128, 2, 16);
  slipstream_policy* p = nullptr;
  if (slipstream_policy_open(run.c_str(), device, &p) != SLIPSTREAM_OK) {
    state.SkipWithError(slipstream_policy_error(nullptr));
    fs::remove_all(dir);
    return;
  }
  if (slipstream_policy_set_threads(p, threads) != SLIPSTREAM_OK) {
    state.SkipWithError(slipstream_policy_error(p));
    slipstream_policy_close(p);
    fs::remove_all(dir);
    return;
  }
  std::vector<slipstream_controller> pressed(static_cast<size_t>(n));
  std::vector<slipstream_game_frame> frames(static_cast<size_t>(n));
  std::vector<double> us;
  us.reserve(1 << 16);
  int t = 0;
  for (auto _ : state) {
    for (int32_t i = 0; i < n; ++i)
      frames[static_cast<size_t>(i)] = frame_at(t + 17 * i, pressed[static_cast<size_t>(i)]);
    ++t;
    const auto t0 = std::chrono::steady_clock::now();
    if (slipstream_policy_step_batch(p, n, frames.data(), pressed.data()) != SLIPSTREAM_OK) {
      state.SkipWithError(slipstream_policy_error(p));
      break;
    }
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  report_latency(state, us);
  state.counters["frames_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * n, benchmark::Counter::kIsRate);
  slipstream_policy_close(p);
  fs::remove_all(dir);
}

void BM_PolicyStepBatch(benchmark::State& state) {
  policy_step_batch(state, static_cast<int32_t>(state.range(0)), "cpu",
                    static_cast<int32_t>(state.range(1)));
}
BENCHMARK(BM_PolicyStepBatch)
    ->ArgNames({"games", "threads"})
    ->ArgsProduct({{1, 64, 256, 1024}, {1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_PolicyStepBatchOnDevice(benchmark::State& state) {
  const char* device = std::getenv("SLIPSTREAM_BENCH_DEVICE");
  policy_step_batch(state, static_cast<int32_t>(state.range(0)),
                    device && *device ? device : "cuda", 1);
}
BENCHMARK(BM_PolicyStepBatchOnDevice)
    ->ArgNames({"games"})
    ->Args({1})
    ->Args({64})
    ->Args({256})
    ->Args({1024})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

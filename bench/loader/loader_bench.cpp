// slippi_replays throughput: windows/s out of produce() (batch 256, window 60) and setup time
// (decode + feature extraction), over the shared real replays and a synthetic set, on 1, 2, 4,
// ... threads up to the machine's cores; and the epoch's window order, a table built at the
// epoch's start against the keyed order computed per position, for one batch's 256 positions.
// Run: build/bin/bench_loader [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "engine/stage_harness.h"
#include "stages/melee/replay_split.h"
#include "stages/melee/replays.h"
#include "stages/melee/slp/synth.h"

namespace fs = std::filesystem;
using namespace slipstream;

namespace {

fs::path real_dir() {
  return fs::path(SLIPSTREAM_SOURCE_DIR) / ".." / "shared" / "replays";
}

// 64 synthetic games of 3600 frames, written once per process.
const fs::path& synth_dir() {
  static const fs::path dir = [] {
    fs::path d =
        fs::temp_directory_path() / ("slipstream_bench_loader_" + std::to_string(::getpid()));
    slp::write_synthetic_games(d, 64, 1, 3600);
    return d;
  }();
  return dir;
}

struct Cleanup {
  ~Cleanup() {
    std::error_code ec;
    fs::remove_all(
        fs::temp_directory_path() / ("slipstream_bench_loader_" + std::to_string(::getpid())), ec);
  }
} cleanup;

fs::path set_dir(int which) {
  return which == 0 ? real_dir() : synth_dir();
}

std::unique_ptr<StageHarness> make_loader(const fs::path& dir, int threads) {
  auto h = std::make_unique<StageHarness>(
      "slippi_replays",
      std::vector<std::string>{"paths=[\"" + dir.string() + "\"]", "batch_size=256", "window=60",
                               "threads=" + std::to_string(threads)},
      "replays");
  h->run().epochs = 1000;  // never run out while timing
  h->setup({});
  return h;
}

// arg 0: set (0 real, 1 synthetic); arg 1: threads.
void BM_Setup(benchmark::State& state) {
  const fs::path dir = set_dir(static_cast<int>(state.range(0)));
  if (!fs::is_directory(dir)) {
    state.SkipWithError("replays not found");
    return;
  }
  std::FILE* quiet = std::freopen("/dev/null", "w", stderr);
  (void)quiet;
  uint64_t frames = 0;
  for (auto _ : state) {
    auto h = make_loader(dir, static_cast<int>(state.range(1)));
    benchmark::DoNotOptimize(h.get());
    frames = dynamic_cast<melee::ReplaysStage&>(h->stage()).windows();
  }
  state.counters["windows"] = static_cast<double>(frames);
}

void BM_Produce(benchmark::State& state) {
  const fs::path dir = set_dir(static_cast<int>(state.range(0)));
  if (!fs::is_directory(dir)) {
    state.SkipWithError("replays not found");
    return;
  }
  auto h = make_loader(dir, static_cast<int>(state.range(1)));
  auto& stage = dynamic_cast<melee::ReplaysStage&>(h->stage());
  const uint64_t total = stage.total_batches();
  uint64_t k = 0;
  for (auto _ : state) {
    Batch b;
    b.slots.resize(64);
    b.index = k++ % total;
    if (!stage.produce(b, h->context())) state.SkipWithError("stream ended");
    benchmark::DoNotOptimize(b.slots.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * 256);  // windows
  state.counters["frames/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 256 * 60, benchmark::Counter::kIsRate);
}

}  // namespace

// Both sets at 1, 2, 4, ... threads up to the machine's cores (and at that count itself).
void thread_counts(benchmark::internal::Benchmark* b) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  b->ArgNames({"synthetic", "threads"});
  for (int set = 0; set < 2; ++set) {
    for (int t = 1; t < cores; t *= 2) b->Args({set, t});
    b->Args({set, cores});
  }
}

// The first batch of an epoch over N windows: the table form builds the epoch's permutation
// first (what stalled the loader at epoch boundaries), the keyed form computes its 256 windows.
void BM_EpochFirstBatchOrder(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  const bool keyed = state.range(1) != 0;
  melee::WindowOrder order;
  order.reset(n, 256, n / 256, false, true, keyed, 1, 0, 1);
  uint64_t epoch = 0, sum = 0;
  for (auto _ : state) {
    const uint64_t k = (epoch++) * (n / 256);  // batch 0 of the next epoch
    for (uint64_t r = 0; r < 256; ++r) sum += order.window_at(k, r);
  }
  benchmark::DoNotOptimize(sum);
  state.SetLabel(keyed ? "keyed" : "table");
}

BENCHMARK(BM_EpochFirstBatchOrder)
    ->ArgNames({"windows", "keyed"})
    ->Args({1 << 20, 0})
    ->Args({1 << 20, 1})
    ->Args({25 << 20, 0})
    ->Args({25 << 20, 1})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Setup)->Apply(thread_counts)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Produce)->Apply(thread_counts)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_MAIN();

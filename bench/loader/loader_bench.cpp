// slippi_replays throughput: windows/s out of produce() (batch 256, window 60) and setup time
// (decode + feature extraction), over the shared real replays and a synthetic set, on 1, 2, 4,
// ... threads up to the machine's cores; and the epoch's window order, a table built at the
// epoch's start against the keyed order computed per position and the streams order (rows: streams,
// the epoch's game order drawn at its first batch), for one batch's 256 positions; and produce()
// from a feature corpus, held resident against read on demand (resident_games).
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
#include "stages/melee/feature_corpus.h"
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
    const fs::path d =
        fs::temp_directory_path() / ("slipstream_bench_loader_" + std::to_string(::getpid()));
    fs::remove_all(d, ec);
    fs::remove_all(d.string() + "-features", ec);
  }
} cleanup;

fs::path set_dir(int which) {
  return which == 0 ? real_dir() : synth_dir();
}

// The synthetic set as a feature corpus (corpus build --features), built once per process.
const fs::path& feature_dir() {
  static const fs::path dir = [] {
    const fs::path d = synth_dir().string() + "-features";
    melee::build_feature_corpus({synth_dir().string()}, d);
    return d;
  }();
  return dir;
}

std::unique_ptr<StageHarness> make_loader(const fs::path& dir, int threads,
                                          const std::string& resident = "all") {
  auto h = std::make_unique<StageHarness>(
      "slippi_replays",
      std::vector<std::string>{"paths=[\"" + dir.string() + "\"]", "batch_size=256", "window=60",
                               "threads=" + std::to_string(threads), "resident_games=" + resident},
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

// Windows/s out of produce() for a loader; `h` already set up.
void produce_batches(benchmark::State& state, StageHarness* h) {
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

void BM_Produce(benchmark::State& state) {
  const fs::path dir = set_dir(static_cast<int>(state.range(0)));
  if (!fs::is_directory(dir)) {
    state.SkipWithError("replays not found");
    return;
  }
  auto h = make_loader(dir, static_cast<int>(state.range(1)));
  produce_batches(state, h.get());
}

// The 64 synthetic games from a feature corpus on all cores: arg 0 held resident, arg N read on
// demand with at most N resident (pools of N/3: most batches of a pool find its games read).
void BM_ProduceFeatureCorpus(benchmark::State& state) {
  std::FILE* quiet = std::freopen("/dev/null", "w", stderr);
  (void)quiet;
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  auto h = make_loader(feature_dir(), cores,
                       state.range(0) == 0 ? "all" : std::to_string(state.range(0)));
  produce_batches(state, h.get());
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

// Arg 1 of the order benchmarks: the order's form.
enum OrderForm { kTable, kKeyed, kStreams };
const char* const kOrderNames[] = {"table", "keyed", "streams"};

// A window order over n windows; streams: perspectives of 120 windows (a two-minute game at
// window = stride = 60).
melee::WindowOrder make_order(uint64_t n, int form) {
  melee::WindowOrder order;
  order.reset(n, 256, n / 256, false, true, form != kTable, 1, 0, 1);
  if (form == kStreams) {
    std::vector<uint64_t> first;
    for (uint64_t w = 0; w < n; w += 120) first.push_back(w);
    first.push_back(n);
    order.set_streams(std::move(first));
  }
  return order;
}

// The first batch of an epoch over N windows: the table form builds the epoch's permutation
// first (what stalled the loader at epoch boundaries), the keyed form computes its 256 windows,
// the streams form draws the epoch's game order, then finds its 256 positions in it.
void BM_EpochFirstBatchOrder(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  const int form = static_cast<int>(state.range(1));
  melee::WindowOrder order = make_order(n, form);
  uint64_t epoch = 0, sum = 0;
  for (auto _ : state) {
    const uint64_t k = (epoch++) * (n / 256);  // batch 0 of the next epoch
    for (uint64_t r = 0; r < 256; ++r) sum += order.window_at(k, r);
  }
  benchmark::DoNotOptimize(sum);
  state.SetLabel(kOrderNames[form]);
}

// A batch inside an epoch (the epoch's order already drawn): 256 positions.
void BM_BatchOrder(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  const int form = static_cast<int>(state.range(1));
  melee::WindowOrder order = make_order(n, form);
  uint64_t k = 1, sum = 0;
  bool cont = false;
  for (auto _ : state) {
    for (uint64_t r = 0; r < 256; ++r) sum += order.window_at(k, r, &cont);
    k = k % (n / 256 - 1) + 1;
  }
  benchmark::DoNotOptimize(sum);
  state.SetLabel(kOrderNames[form]);
}

BENCHMARK(BM_EpochFirstBatchOrder)
    ->ArgNames({"windows", "order"})
    ->Args({1 << 20, kTable})
    ->Args({1 << 20, kKeyed})
    ->Args({1 << 20, kStreams})
    ->Args({25 << 20, kTable})
    ->Args({25 << 20, kKeyed})
    ->Args({25 << 20, kStreams})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BatchOrder)
    ->ArgNames({"windows", "order"})
    ->Args({25 << 20, kKeyed})
    ->Args({25 << 20, kStreams})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Setup)->Apply(thread_counts)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Produce)->Apply(thread_counts)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_ProduceFeatureCorpus)
    ->ArgName("resident")
    ->Arg(0)
    ->Arg(12)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK_MAIN();

// Parse throughput over the real replays (one thread, and all threads via TBB) and corpus read
// throughput. Run: bench_slp [--benchmark_filter=...]; SLIPSTREAM_REPLAYS=dir picks the files.
#include <benchmark/benchmark.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "stages/melee/slp/corpus.h"
#include "stages/melee/slp/parser.h"

namespace {

using namespace slipstream::slp;

std::filesystem::path replay_dir() {
  const char* env = std::getenv("SLIPSTREAM_REPLAYS");
  return env ? std::filesystem::path(env) : std::filesystem::path(SLIPSTREAM_REPLAY_DIR);
}

struct Files {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::string> names;
  size_t total_bytes = 0;
  size_t total_frames = 0;
};

// Loaded once; only files that parse cleanly count, so every iteration does the same work.
const Files& files() {
  static const Files f = [] {
    Files out;
    const std::vector<std::filesystem::path> inputs = {replay_dir()};
    for (const auto& p : find_replays(inputs)) {
      auto bytes = read_file_bytes(p);
      try {
        const Game g = parse_slp(bytes);
        out.total_frames += g.frames.size();
      } catch (const ParseError&) {
        continue;
      }
      out.total_bytes += bytes.size();
      out.bytes.push_back(std::move(bytes));
      out.names.push_back(p.string());
    }
    return out;
  }();
  return f;
}

void report(benchmark::State& state, size_t bytes, size_t frames) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["frames/s"] = benchmark::Counter(static_cast<double>(state.iterations() * frames),
                                                  benchmark::Counter::kIsRate);
}

void BM_ParseOneThread(benchmark::State& state) {
  const Files& f = files();
  if (f.bytes.empty()) {
    state.SkipWithError("no replays found");
    return;
  }
  for (auto _ : state) {
    for (const auto& b : f.bytes) {
      Game g = parse_slp(b);
      benchmark::DoNotOptimize(g.frames.frame.data());
    }
  }
  report(state, f.total_bytes, f.total_frames);
}
BENCHMARK(BM_ParseOneThread)->Unit(benchmark::kMillisecond)->UseRealTime();

// A loader's steady state: each file parsed into the same Game, reusing its buffers.
void BM_ParseReuseOneThread(benchmark::State& state) {
  const Files& f = files();
  if (f.bytes.empty()) {
    state.SkipWithError("no replays found");
    return;
  }
  Game g;
  for (auto _ : state) {
    for (const auto& b : f.bytes) {
      parse_slp_into(g, b);
      benchmark::DoNotOptimize(g.frames.frame.data());
    }
  }
  report(state, f.total_bytes, f.total_frames);
}
BENCHMARK(BM_ParseReuseOneThread)->Unit(benchmark::kMillisecond)->UseRealTime();

// Files in parallel, state.range(0) threads (0 = all hardware threads).
void BM_ParseThreads(benchmark::State& state) {
  const Files& f = files();
  if (f.bytes.empty()) {
    state.SkipWithError("no replays found");
    return;
  }
  const int threads = state.range(0) > 0 ? static_cast<int>(state.range(0))
                                         : static_cast<int>(std::thread::hardware_concurrency());
  tbb::task_arena arena(threads);
  const bool reuse = state.range(1) != 0;
  // One reusable Game per worker thread when `reuse`.
  std::vector<Game> games(static_cast<size_t>(threads));
  for (auto _ : state) {
    arena.execute([&] {
      tbb::parallel_for(size_t(0), f.bytes.size(), [&](size_t i) {
        if (reuse) {
          Game& g = games[static_cast<size_t>(tbb::this_task_arena::current_thread_index())];
          parse_slp_into(g, f.bytes[i]);
          benchmark::DoNotOptimize(g.frames.frame.data());
        } else {
          Game g = parse_slp(f.bytes[i]);
          benchmark::DoNotOptimize(g.frames.frame.data());
        }
      });
    });
  }
  state.counters["threads"] = threads;
  report(state, f.total_bytes, f.total_frames);
}
BENCHMARK(BM_ParseThreads)
    ->ArgNames({"threads", "reuse"})
    ->ArgsProduct({{1, 2, 0}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Opening a corpus and reading every column value of every game (bytes = column bytes).
void BM_CorpusRead(benchmark::State& state) {
  const bool zstd = state.range(0) != 0;
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("bench_slp_corpus_" + std::string(zstd ? "zstd" : "raw") + "_" + std::to_string(::getpid()));
  const std::vector<std::filesystem::path> inputs = {replay_dir()};
  CorpusOptions options;
  options.zstd = zstd;
  const CorpusBuildReport built = build_corpus(inputs, dir, options);
  size_t column_bytes = 0;
  size_t frames = 0;
  for (auto _ : state) {
    const Corpus corpus = Corpus::open(dir);
    uint64_t sum = 0;
    column_bytes = 0;
    frames = 0;
    for (size_t i = 0; i < corpus.size(); ++i) {
      const CorpusGame game = corpus.game(i);
      const GameView& g = game.view();
      frames += g.frames.size();
      visit_frame_columns(g.frames, [&](const std::string&, const auto& col) {
        const auto* p = reinterpret_cast<const uint8_t*>(col.data());
        // Touch one byte per cache line: the cost is getting the data, not adding it.
        for (size_t k = 0; k < col.size_bytes(); k += 64) sum += p[k];
        column_bytes += col.size_bytes();
      });
    }
    benchmark::DoNotOptimize(sum);
  }
  state.counters["games"] = static_cast<double>(built.games);
  report(state, column_bytes, frames);
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_CorpusRead)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

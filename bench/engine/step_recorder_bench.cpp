// The host's cost of recording a training step for its CUDA graph (kernels/step_recorder.h),
// per enqueued operation: an operation shaped like a kernel launch (its function, grid and block,
// four pointers and two sizes hashed into the key and copied into the closure) enqueued N times
//   direct: no recorder, the operation runs at once (a step with graphs off);
//   record: recorded, its key hashed, handed over at the step's end (a step whose graph replays:
//           what the host does besides the graph launch);
//   record_issue: recorded, then issued one by one (a step seen for the first time).
// The operation itself only bumps a counter, so the figures are the recorder's. Counter ns_per_op.
//   build/bin/bench_flow --benchmark_filter=StepRecorder
#include <benchmark/benchmark.h>

#include <cstdint>

#include "kernels/step_recorder.h"

namespace slipstream {
namespace {

struct Dim {
  unsigned x, y, z;
};

void launch_like(uint64_t& counter, const Dim&, const Dim&, const float*, float*, const float*,
                 float*, int, int) {
  ++counter;
}

void enqueue_ops(int n, void* stream, uint64_t& counter, float* buf) {
  for (int i = 0; i < n; ++i) {
    const Dim grid{unsigned(i % 7 + 1), 1, 1}, block{256, 1, 1};
    const float* a = buf + i;
    float* b = buf + 2 * i;
    capture::enqueue(
        "launch_like", stream,
        [&] {
          return capture::key_of(capture::function_key(&launch_like), grid, block, a, b, a, b, i,
                                 n);
        },
        [&counter, grid, block, a, b, i, n] {
          launch_like(counter, grid, block, a, b, a, b, i, n);
        });
  }
}

void BM_StepRecorder(benchmark::State& st) {
  const int mode = static_cast<int>(st.range(0)), n = static_cast<int>(st.range(1));
  static float buf[4096];
  uint64_t counter = 0;
  void* stream = reinterpret_cast<void*>(uintptr_t{0x5});
  for (auto _ : st) {
    if (mode == 0) {
      enqueue_ops(n, stream, counter, buf);
      continue;
    }
    capture::StepRecorder rec(stream);
    enqueue_ops(n, stream, counter, buf);
    const auto ops = rec.finish();
    benchmark::DoNotOptimize(rec.signature());
    if (mode == 2) capture::issue_ops(ops);
  }
  benchmark::DoNotOptimize(counter);
  st.counters["ns_per_op"] =
      benchmark::Counter(double(n) * double(st.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  st.SetLabel(mode == 0 ? "direct" : mode == 1 ? "record" : "record_issue");
}
// 150 operations: about a tiny model's training step on the device path.
BENCHMARK(BM_StepRecorder)->ArgsProduct({{0, 1, 2}, {150}})->ArgNames({"mode", "ops"});

}  // namespace
}  // namespace slipstream

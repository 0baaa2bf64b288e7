// A run measured step by step (`slipstream bench`, bench/e2e): the graph of a preset or file runs
// `warmup` + `steps` optimizer steps without writing anything (no run directory, checkpoint or
// validation), each step's end is stamped on the section's thread, and the report gives the
// steady state (the steps after the warm-up) apart from start-up (construction, setup, data
// loading and the warm-up steps).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/device.h"
#include "engine/runner.h"

namespace slipstream {

struct StepBenchmarkOptions {
  std::string preset_or_file = "cpu_quick";
  std::vector<std::string> sets;  // --set overrides, applied before the benchmark's own
  int64_t warmup = 5;  // steps run first and not timed (start-up, caches, pools); at least 1
  int64_t steps = 40;  // steps timed
  // The step without the data path (RunOptions::resident_batches): after this many batches the
  // section trains on them again and nothing is loaded or copied; 0 trains on loaded data.
  uint32_t resident_batches = 0;
  // Each operation of the timed steps' CUDA graphs timed on the device (RunOptions::
  // time_operations_after_batches): StepBenchmark::operations. The host then waits for each batch's
  // graph, so the step's wall-time figures are no longer the step's own.
  bool operation_times = false;
  // Told, on the section's thread, when the timed steps start (true) and when they end (false),
  // with the run's device. The engine does not see the GPU's utilisation: a caller samples it
  // (NVML) over that window and returns, when told the end, the busy share in percent (-1: not
  // measured), which becomes StepBenchmark::gpu_busy_pct.
  std::function<double(bool timing, const Device& device)> gpu_busy;
};

struct StepBenchmark {
  std::string preset, device, precision;  // device: cpu, cuda:N or emulated
  uint64_t steps = 0;                     // timed steps
  double startup_s = 0;                   // start to the end of the last warm-up step
  double seconds = 0;                     // the timed steps, end of warm-up to end of the last step
  double step_median_ms = 0, step_p90_ms = 0, step_min_ms = 0;
  double steps_per_s = 0, samples_per_s = 0;
  double frames_per_s = 0;   // samples x the source's `window` param; 0 when it has none
  double data_wait_pct = 0;  // of the timed time, the section waiting for its batches
  struct Stage {
    std::string name, kind;
    double busy_pct = 0;  // of the timed wall time (> 100: concurrent copies)
    double busy_ms_per_step = 0;
  };
  std::vector<Stage> stages;
  uint64_t host_peak_rss_bytes = 0;  // the process's maximum resident set (getrusage)
  struct Pool {
    std::string name;
    uint64_t peak_bytes = 0, reserved_bytes = 0;
  };
  std::vector<Pool> pools;        // every memory pool: host, and each device's
  uint32_t resident_batches = 0;  // the options' (0: loaded data)
  double gpu_busy_pct = -1;       // set by a caller that sampled it (NVML); -1: not measured
  // run.cuda_graph over the whole run (warm-up included): graph_steps_summary(), "" when off.
  std::string cuda_graph;
  RunResult::GraphSteps graph_steps;
  // StepBenchmarkOptions::operation_times: the timed steps' operations, and the batches a step
  // (to give the sums a step).
  std::optional<OperationTimes> operations;
  uint64_t batches_per_step = 1;
};

// The data path's share of the step: `repeats` pairs of benchmarks at the same options,
// alternating, one on loaded data and one on `resident_batches` resident batches (the same
// step without loading or copies). ratio = median steps/s loading ÷ median steps/s resident:
// 1 when loading and copies hide behind the step entirely.
struct OverlapBenchmark {
  std::vector<StepBenchmark> loading, resident;
  double loading_steps_per_s = 0, resident_steps_per_s = 0;  // medians
  double ratio = 0;
};
OverlapBenchmark run_overlap_benchmark(const StepBenchmarkOptions& options, int repeats,
                                       uint32_t resident_batches = 8);
std::string format_overlap_benchmark(const OverlapBenchmark& o);
nlohmann::json overlap_benchmark_json(const OverlapBenchmark& o);

// Runs and measures. Throws as Runner::run does, and std::runtime_error when the run ends
// before its warm-up is over.
StepBenchmark run_step_benchmark(const StepBenchmarkOptions& options);

// A table for people, and the same figures as JSON for scripts.
std::string format_step_benchmark(const StepBenchmark& b);
nlohmann::json step_benchmark_json(const StepBenchmark& b);

}  // namespace slipstream

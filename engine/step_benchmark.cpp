// See step_benchmark.h.
#include "engine/step_benchmark.h"
#include "engine/auto_batch.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "engine/config.h"
#include "engine/exec_context.h"
#include "engine/graph.h"
#include "engine/memory_pool.h"
#include "engine/quantile.h"
#include "engine/runner.h"

namespace slipstream {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

StepBenchmark run_step_benchmark(const StepBenchmarkOptions& o) {
  // The first step ends the start-up (setup, first allocations, graph capture): never timed.
  if (o.warmup < 1 || o.steps < 1)
    throw std::invalid_argument("bench: --steps and --warmup must be at least 1");
  std::vector<std::string> sets = o.sets;
  sets.push_back("run.steps=" + std::to_string(o.warmup + o.steps));
  sets.push_back("run.validate_every=0");
  sets.push_back("run.log_every=1000000000");
  GraphPlan plan = plan_graph(load_config(o.preset_or_file, sets));
  const Params& src = plan.stages.front().params;
  const int64_t window = src.has("window") ? src.integer("window") : 0;

  const auto t0 = Clock::now();
  std::vector<Clock::time_point> ends;  // end of every step, warm-up included
  std::vector<uint64_t> waits;          // the section's wait for each step's batches
  ends.reserve(static_cast<size_t>(o.warmup + o.steps));
  std::vector<uint64_t> busy_at_warm;
  std::ostringstream log;
  RunOptions opt = RunOptions::embedded(&log);  // nothing written: no run directory, checkpoint
  opt.resident_batches = o.resident_batches;
  if (o.operation_times)
    opt.time_operations_after_batches =
        static_cast<uint64_t>(o.warmup) *
        static_cast<uint64_t>(std::max<int64_t>(plan.micro_batches, 1));
  Runner* runner_ptr = nullptr;
  bool timing = false;
  double gpu_busy = -1;
  auto set_timing = [&](bool on) {
    if (timing == on || !o.gpu_busy || !runner_ptr) return;
    timing = on;
    const double busy = o.gpu_busy(on, runner_ptr->state().device);
    if (!on) gpu_busy = busy;
  };
  opt.on_step = [&](uint64_t step, uint64_t wait_ns) {
    ends.push_back(Clock::now());
    waits.push_back(wait_ns);
    if (step == static_cast<uint64_t>(o.warmup)) {
      busy_at_warm.clear();
      for (size_t k = 0; k < runner_ptr->graph().size(); ++k)
        busy_at_warm.push_back(runner_ptr->counters(k).busy_ns);
      set_timing(true);
    }
    if (step == static_cast<uint64_t>(o.warmup + o.steps)) set_timing(false);
  };
  resolve_auto_batch(plan, opt);
  Runner runner(std::move(plan), opt);
  runner_ptr = &runner;
  RunResult r;
  try {
    r = runner.run();
  } catch (...) {
    set_timing(false);
    throw;
  }
  set_timing(false);
  const size_t warm = static_cast<size_t>(o.warmup);
  if (ends.size() <= warm)
    throw std::runtime_error("the run ended (" + r.end_reason + ", " + std::to_string(ends.size()) +
                             " steps) before its warm-up was over: lower --warmup or give it "
                             "more data");

  StepBenchmark b;
  b.resident_batches = o.resident_batches;
  b.gpu_busy_pct = gpu_busy;
  b.cuda_graph = graph_steps_summary(r);
  b.graph_steps = r.graph_steps;
  b.batches_per_step = std::max<uint64_t>(runner.state().micro_batches_per_step, 1);
  if (o.operation_times) b.operations = r.operation_times;
  b.preset = o.preset_or_file;
  const auto& exec = runner.state().exec;
  b.device =
      exec && exec->backend() == KernelBackend::emulated ? "emulated" : runner.state().device.str();
  b.precision = runner.state().precision == Precision::bf16 ? "bf16" : "fp32";
  const Clock::time_point warm_end = ends[warm - 1];
  b.steps = ends.size() - warm;
  b.startup_s = std::chrono::duration<double>(warm_end - t0).count();
  b.seconds = std::chrono::duration<double>(ends.back() - warm_end).count();
  std::vector<double> ms;
  uint64_t wait = 0;
  for (size_t i = warm; i < ends.size(); ++i) {
    const Clock::time_point prev = ends[i - 1];
    ms.push_back(std::chrono::duration<double, std::milli>(ends[i] - prev).count());
    wait += waits[i];
  }
  b.step_median_ms = quantile(ms, 0.5);
  b.step_p90_ms = quantile(ms, 0.9);
  b.step_min_ms = *std::min_element(ms.begin(), ms.end());
  b.steps_per_s = b.seconds > 0 ? static_cast<double>(b.steps) / b.seconds : 0;
  const double samples_per_step =
      r.steps ? static_cast<double>(r.samples) / static_cast<double>(r.steps) : 0;
  b.samples_per_s = b.steps_per_s * samples_per_step;
  b.frames_per_s = b.samples_per_s * static_cast<double>(window);
  b.data_wait_pct = b.seconds > 0 ? 100.0 * static_cast<double>(wait) * 1e-9 / b.seconds : 0;
  const GraphPlan& p = runner.graph().plan();
  for (size_t k = 0; k < runner.graph().size(); ++k) {
    const double busy = static_cast<double>(runner.counters(k).busy_ns - busy_at_warm[k]) * 1e-9;
    b.stages.push_back({p.stages[k].name, p.stages[k].schema->kind(),
                        b.seconds > 0 ? 100.0 * busy / b.seconds : 0,
                        1e3 * busy / static_cast<double>(b.steps)});
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  b.host_peak_rss_bytes = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  for (MemoryPool* pool : Pools::all()) {
    const PoolStats s = pool->stats();
    b.pools.push_back({pool->name(), s.peak_bytes, s.reserved_bytes});
  }
  return b;
}

std::string format_step_benchmark(const StepBenchmark& b) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "bench: %s on %s, %s, %llu steps timed after %.2f s of start-up\n",
                b.preset.c_str(), b.device.c_str(), b.precision.c_str(),
                static_cast<unsigned long long>(b.steps), b.startup_s);
  out += line;
  std::snprintf(line, sizeof line,
                "step: median %.3f ms, p90 %.3f ms, min %.3f ms | %.2f steps/s, %.1f samples/s",
                b.step_median_ms, b.step_p90_ms, b.step_min_ms, b.steps_per_s, b.samples_per_s);
  out += line;
  if (b.frames_per_s > 0) {
    std::snprintf(line, sizeof line, ", %.0f frames/s", b.frames_per_s);
    out += line;
  }
  std::snprintf(line, sizeof line, " | data wait %.1f%%", b.data_wait_pct);
  out += line;
  if (b.gpu_busy_pct >= 0) {
    std::snprintf(line, sizeof line, " | GPU busy %.1f%%", b.gpu_busy_pct);
    out += line;
  }
  out += "\n";
  if (b.resident_batches > 0)
    out += "(on " + std::to_string(b.resident_batches) +
           " resident batches: nothing loaded or copied after them)\n";
  if (!b.cuda_graph.empty()) out += b.cuda_graph + "\n";
  std::snprintf(line, sizeof line, "\n%-16s %-18s %8s %12s\n", "stage", "kind", "busy %",
                "ms/step");
  out += line;
  for (const auto& s : b.stages) {
    std::snprintf(line, sizeof line, "%-16s %-18s %8.1f %12.3f\n", s.name.c_str(), s.kind.c_str(),
                  s.busy_pct, s.busy_ms_per_step);
    out += line;
  }
  if (b.operations) out += "\n" + format_operation_times(*b.operations, b.batches_per_step, "step");
  out += "\nmemory: host peak resident " + format_bytes(b.host_peak_rss_bytes);
  for (const auto& p : b.pools)
    out += "; pool " + p.name + " peak " + format_bytes(p.peak_bytes) + " (reserved " +
           format_bytes(p.reserved_bytes) + ")";
  out += "\n";
  return out;
}

nlohmann::json step_benchmark_json(const StepBenchmark& b) {
  nlohmann::json j{{"preset", b.preset},
                   {"device", b.device},
                   {"precision", b.precision},
                   {"steps", b.steps},
                   {"startup_s", b.startup_s},
                   {"seconds", b.seconds},
                   {"step_median_ms", b.step_median_ms},
                   {"step_p90_ms", b.step_p90_ms},
                   {"step_min_ms", b.step_min_ms},
                   {"steps_per_s", b.steps_per_s},
                   {"samples_per_s", b.samples_per_s},
                   {"frames_per_s", b.frames_per_s},
                   {"data_wait_pct", b.data_wait_pct},
                   {"host_peak_rss_bytes", b.host_peak_rss_bytes},
                   {"resident_batches", b.resident_batches}};
  if (b.gpu_busy_pct >= 0) j["gpu_busy_pct"] = b.gpu_busy_pct;
  if (!b.cuda_graph.empty())
    j["cuda_graph"] = {{"summary", b.cuda_graph},
                       {"replayed", b.graph_steps.replayed},
                       {"captured", b.graph_steps.captured},
                       {"operations", b.graph_steps.ops},
                       {"issued", b.graph_steps.issued},
                       {"uncaptured", b.graph_steps.uncaptured}};
  if (b.operations)
    j["operations"] = operation_times_json(*b.operations, b.batches_per_step, "step");
  for (const auto& s : b.stages)
    j["stages"].push_back({{"name", s.name},
                           {"kind", s.kind},
                           {"busy_pct", s.busy_pct},
                           {"busy_ms_per_step", s.busy_ms_per_step}});
  for (const auto& p : b.pools)
    j["pools"].push_back(
        {{"name", p.name}, {"peak_bytes", p.peak_bytes}, {"reserved_bytes", p.reserved_bytes}});
  return j;
}

OverlapBenchmark run_overlap_benchmark(const StepBenchmarkOptions& options, int repeats,
                                       uint32_t resident_batches) {
  if (repeats < 1) throw std::invalid_argument("bench: --repeats must be at least 1");
  if (resident_batches < 1) throw std::invalid_argument("bench: resident batches must be >= 1");
  OverlapBenchmark o;
  std::vector<double> loading, resident;
  for (int k = 0; k < repeats; ++k) {
    StepBenchmarkOptions a = options;
    a.resident_batches = 0;
    o.loading.push_back(run_step_benchmark(a));
    loading.push_back(o.loading.back().steps_per_s);
    a.resident_batches = resident_batches;
    o.resident.push_back(run_step_benchmark(a));
    resident.push_back(o.resident.back().steps_per_s);
  }
  o.loading_steps_per_s = quantile(loading, 0.5);
  o.resident_steps_per_s = quantile(resident, 0.5);
  o.ratio = o.resident_steps_per_s > 0 ? o.loading_steps_per_s / o.resident_steps_per_s : 0;
  return o;
}

std::string format_overlap_benchmark(const OverlapBenchmark& o) {
  char line[256];
  std::snprintf(line, sizeof line,
                "overlap: %.2f steps/s loading the data, %.2f on resident batches (medians of %zu "
                "alternating runs): ratio %.3f\n",
                o.loading_steps_per_s, o.resident_steps_per_s, o.loading.size(), o.ratio);
  return line;
}

nlohmann::json overlap_benchmark_json(const OverlapBenchmark& o) {
  nlohmann::json j{{"loading_steps_per_s", o.loading_steps_per_s},
                   {"resident_steps_per_s", o.resident_steps_per_s},
                   {"overlap_ratio", o.ratio}};
  for (const auto& b : o.loading) j["loading"].push_back(step_benchmark_json(b));
  for (const auto& b : o.resident) j["resident"].push_back(step_benchmark_json(b));
  return j;
}

}  // namespace slipstream

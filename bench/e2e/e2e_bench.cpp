// End-to-end benchmark: runs a preset through the real runner (loader, flow graph, model,
// optimizer) for a fixed number of steps, once per precision, and prints a table and JSON with
// steps/s, samples/s and each stage's busy time per step, timed from the end of the warm-up steps
// (start-up, data loading and warm-up are reported apart), and the bf16/fp32 ratio measured in
// the same process (the machines are shared: compare ratios, not absolute numbers).
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "engine/runner.h"

using namespace slipstream;

namespace {

struct Measured {
  std::string precision;
  RunResult result;
  double steps_per_s = 0, samples_per_s = 0;  // after warm-up
  double startup_s = 0;                       // setup, data loading and the warm-up steps
  std::vector<std::pair<std::string, double>> stage_busy_ms;  // per step
};

Measured measure(const std::string& preset, const std::vector<std::string>& sets,
                 const std::string& precision, int64_t steps, int64_t warmup) {
  std::vector<std::string> all = sets;
  all.push_back("run.precision=" + precision);
  all.push_back("run.steps=" + std::to_string(steps + warmup));
  all.push_back("run.validate_every=0");
  all.push_back("run.log_every=1000000");
  all.push_back("ckpt.every=0");
  std::ostringstream log;
  RunOptions opt;
  opt.create_run_dir = false;
  opt.publish_stats = false;
  opt.log = &log;
  Runner runner(plan_graph(load_config(preset, all)), opt);
  // The clock starts when the warm-up steps are done (setup, data loading and the first steps'
  // allocations excluded): a watcher samples the step counter and the stages' busy time then.
  const auto n = runner.graph().size();
  std::vector<uint64_t> busy_at_warm(n, 0);
  std::optional<std::chrono::steady_clock::time_point> warm_at;
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done.load()) {
      if (runner.state().step.load() >= static_cast<uint64_t>(warmup)) {
        warm_at = std::chrono::steady_clock::now();
        for (size_t k = 0; k < n; ++k) busy_at_warm[k] = runner.counters(k).busy_ns;
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  Measured m;
  m.precision = precision;
  const auto t0 = std::chrono::steady_clock::now();
  m.result = runner.run();
  const auto t1 = std::chrono::steady_clock::now();
  done = true;
  watcher.join();
  if (!warm_at || m.result.steps <= static_cast<uint64_t>(warmup))
    throw std::runtime_error("the run ended (" + std::to_string(m.result.steps) +
                             " steps) before its warm-up was over");
  const uint64_t timed = m.result.steps - static_cast<uint64_t>(warmup);
  const double secs = std::chrono::duration<double>(t1 - *warm_at).count();
  m.startup_s = std::chrono::duration<double>(*warm_at - t0).count();
  m.steps_per_s = static_cast<double>(timed) / secs;
  m.samples_per_s =
      m.steps_per_s * static_cast<double>(m.result.samples) / static_cast<double>(m.result.steps);
  for (size_t k = 0; k < n; ++k)
    m.stage_busy_ms.emplace_back(runner.graph().plan().stages[k].name,
                                 static_cast<double>(runner.counters(k).busy_ns - busy_at_warm[k]) *
                                     1e-6 / static_cast<double>(timed));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"slipstream end-to-end benchmark"};
  std::string preset = "cpu_quick", json_path;
  std::vector<std::string> sets, precisions{"fp32", "bf16"};
  int64_t steps = 40, warmup = 5;
  app.add_option("--preset", preset, "preset or graph file");
  app.add_option("--set", sets, "overrides (as for slipstream run)");
  app.add_option("--steps", steps, "steps to time per precision");
  app.add_option("--warmup", warmup, "steps run first and not timed (caches, pools)");
  app.add_option("--precisions", precisions, "precisions to compare (first is the baseline)");
  app.add_option("--json", json_path, "also write the results as JSON here");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<Measured> runs;
    for (const auto& p : precisions) runs.push_back(measure(preset, sets, p, steps, warmup));
    nlohmann::json out;
    out["preset"] = preset;
    out["overrides"] = sets;
    std::printf("preset %s, %lld steps (+%lld warm-up)\n\n", preset.c_str(),
                static_cast<long long>(steps), static_cast<long long>(warmup));
    std::printf("%-10s %12s %14s %10s %12s\n", "precision", "steps/s", "samples/s", "vs first",
                "start-up s");
    for (const auto& m : runs) {
      double ratio = m.samples_per_s / runs[0].samples_per_s;
      std::printf("%-10s %12.2f %14.1f %9.2fx %12.2f\n", m.precision.c_str(), m.steps_per_s,
                  m.samples_per_s, ratio, m.startup_s);
      nlohmann::json r{{"precision", m.precision},
                       {"steps", m.result.steps},
                       {"steps_per_s", m.steps_per_s},
                       {"samples_per_s", m.samples_per_s},
                       {"startup_and_warmup_s", m.startup_s},
                       {"ratio_to_first", ratio}};
      for (const auto& [name, ms] : m.stage_busy_ms) r["stage_busy_ms_per_step"][name] = ms;
      out["runs"].push_back(r);
    }
    std::printf("\nbusy ms per step by stage:\n%-10s", "stage");
    for (const auto& m : runs) std::printf(" %10s", m.precision.c_str());
    std::printf("\n");
    for (size_t k = 0; k < runs[0].stage_busy_ms.size(); ++k) {
      std::printf("%-10s", runs[0].stage_busy_ms[k].first.c_str());
      for (const auto& m : runs) std::printf(" %10.2f", m.stage_busy_ms[k].second);
      std::printf("\n");
    }
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    std::cout << "\n" << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "bench_e2e: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

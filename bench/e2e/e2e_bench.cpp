// End-to-end benchmark: runs a preset through the real runner (loader, flow graph, model,
// optimizer) for a fixed number of steps, once per precision, and prints a table and JSON with
// steps/s, samples/s, each stage's share of the time, and the bf16/fp32 ratio measured in the
// same process (the machines are shared: compare ratios, not absolute numbers).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/runner.h"

using namespace slipstream;

namespace {

struct Measured {
  std::string precision;
  RunResult result;
  double steps_per_s = 0, samples_per_s = 0;
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
  // Time only the steps after warm-up: a sink stage is not needed, the runner's counters are.
  Measured m;
  m.precision = precision;
  auto t0 = std::chrono::steady_clock::now();
  m.result = runner.run();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.steps_per_s = static_cast<double>(m.result.steps) / secs;
  m.samples_per_s = static_cast<double>(m.result.samples) / secs;
  for (size_t k = 0; k < runner.graph().size(); ++k)
    m.stage_busy_ms.emplace_back(runner.graph().plan().stages[k].name,
                                 static_cast<double>(runner.counters(k).busy_ns) * 1e-6 /
                                     static_cast<double>(std::max<uint64_t>(1, m.result.steps)));
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
  app.add_option("--warmup", warmup, "extra steps included first (caches, pools)");
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
    std::printf("%-10s %12s %14s %10s\n", "precision", "steps/s", "samples/s", "vs first");
    for (const auto& m : runs) {
      double ratio = m.samples_per_s / runs[0].samples_per_s;
      std::printf("%-10s %12.2f %14.1f %9.2fx\n", m.precision.c_str(), m.steps_per_s,
                  m.samples_per_s, ratio);
      nlohmann::json r{{"precision", m.precision},
                       {"steps", m.result.steps},
                       {"steps_per_s", m.steps_per_s},
                       {"samples_per_s", m.samples_per_s},
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

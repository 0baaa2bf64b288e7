// End-to-end benchmark: `slipstream bench`'s measurement (engine/step_benchmark.h: the real
// runner, loader, flow graph, model and optimizer, timed after the warm-up steps) once per
// precision, with the bf16/fp32 ratio measured in the same process (the machines are shared:
// compare ratios, not absolute numbers); with --without-graph also the last precision with
// run.cuda_graph=off, so the CUDA graph's gain is a ratio of the same process too.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "engine/step_benchmark.h"

using namespace slipstream;

namespace {

StepBenchmark measure(const std::string& preset, const std::vector<std::string>& sets,
                      const std::string& precision, int64_t steps, int64_t warmup) {
  StepBenchmarkOptions o;
  o.preset_or_file = preset;
  o.sets = sets;
  o.sets.push_back("run.precision=" + precision);
  o.steps = steps;
  o.warmup = warmup;
  return run_step_benchmark(o);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"slipstream end-to-end benchmark"};
  std::string preset = "cpu_quick", json_path;
  std::vector<std::string> sets, precisions{"fp32", "bf16"};
  int64_t steps = 40, warmup = 5;
  bool without_graph = false;
  app.add_option("--preset", preset, "preset or graph file");
  app.add_option("--set", sets, "overrides (as for slipstream run)");
  app.add_option("--steps", steps, "steps to time per precision");
  app.add_option("--warmup", warmup, "steps run first and not timed (caches, pools)");
  app.add_option("--precisions", precisions, "precisions to compare (first is the baseline)");
  app.add_option("--json", json_path, "also write the results as JSON here");
  app.add_flag("--without-graph", without_graph,
               "also time the last precision with run.cuda_graph=off (labelled PRECISION/nograph)");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<StepBenchmark> runs;
    for (const auto& p : precisions) runs.push_back(measure(preset, sets, p, steps, warmup));
    if (without_graph && !precisions.empty()) {
      auto off = sets;
      off.push_back("run.cuda_graph=off");
      runs.push_back(measure(preset, off, precisions.back(), steps, warmup));
      runs.back().precision += "/nograph";
    }
    nlohmann::json out;
    out["preset"] = preset;
    out["overrides"] = sets;
    std::printf("preset %s, %lld steps (+%lld warm-up)\n\n", preset.c_str(),
                static_cast<long long>(steps), static_cast<long long>(warmup));
    std::printf("%-14s %12s %14s %10s %12s\n", "precision", "steps/s", "samples/s", "vs first",
                "start-up s");
    for (const auto& m : runs) {
      double ratio = m.samples_per_s / runs[0].samples_per_s;
      std::printf("%-14s %12.2f %14.1f %9.2fx %12.2f\n", m.precision.c_str(), m.steps_per_s,
                  m.samples_per_s, ratio, m.startup_s);
      nlohmann::json r = step_benchmark_json(m);
      r["ratio_to_first"] = ratio;
      out["runs"].push_back(r);
    }
    std::printf("\nbusy ms per step by stage:\n%-10s", "stage");
    for (const auto& m : runs) std::printf(" %14s", m.precision.c_str());
    std::printf("\n");
    for (size_t k = 0; k < runs[0].stages.size(); ++k) {
      std::printf("%-10s", runs[0].stages[k].name.c_str());
      for (const auto& m : runs) std::printf(" %14.2f", m.stages[k].busy_ms_per_step);
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

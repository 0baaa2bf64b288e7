// `slipstream bench`: a preset's steady-state training step, measured (engine/step_benchmark.h).
#include <CLI/CLI.hpp>

#include <iostream>

#include "engine/config.h"
#include "engine/step_benchmark.h"
#include "kernels/gemm_bf16_onednn.h"
#include "kernels/vector_math.h"
#include "tools/slipstream/commands.h"

namespace slipstream::cli {

namespace {

struct BenchArgs {
  StepBenchmarkOptions options;
  std::string config, device, json;
};

int bench_command(BenchArgs a) {
  if (!a.config.empty()) a.options.preset_or_file = a.config;
  if (!a.device.empty()) a.options.sets.push_back("run.device=" + a.device);
  return exit_status_of([&] {
    const StepBenchmark b = run_step_benchmark(a.options);
    std::cout << format_step_benchmark(b);
    // What the CPU kernels ran at: figures from different levels are not comparable.
    const std::string isa = kernels::cpu_isa_name(kernels::cpu_isa());
    const std::string bf16 = kernels::onednn_bf16_gemm_native()
                                 ? "oneDNN " + kernels::onednn_bf16_gemm_kernel()
                                 : "fp32 sgemm of rounded operands";
    if (b.device == "cpu") std::cout << "cpu kernels: " << isa << "; bf16 GEMMs: " << bf16 << "\n";
    if (!a.json.empty()) {
      nlohmann::json j = step_benchmark_json(b);
      j["cpu_isa"] = isa;
      j["cpu_bf16_gemm"] = bf16;
      write_json_file(a.json, j);
    }
    return kExitOk;
  });
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand(
      "bench",
      "Measure a preset's training step in steady state: step time (median, p90), samples/s, "
      "frames/s, data wait, each stage's busy %, peak memory; start-up reported apart. Writes "
      "nothing but --json");
  auto* preset = cmd->add_option("--preset,-p", a->options.preset_or_file,
                                 "preset name or path (default cpu_quick)");
  cmd->add_option("--config,-c", a->config, "a graph file instead of a preset")->excludes(preset);
  cmd->add_option("--steps", a->options.steps, "steps to time")->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--warmup", a->options.warmup, "steps run first and not timed")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--device", a->device, "auto | cpu | cuda | cuda:N | emulated");
  cmd->add_option("--set,-s", a->options.sets, "override stage.param=value or run.key=value");
  cmd->add_option("--json", a->json, "also write the figures as JSON here");
  cmd->callback([a] { set_exit_code(bench_command(*a)); });
}

}  // namespace slipstream::cli

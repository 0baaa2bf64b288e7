// `slipstream bench`: a preset's steady-state training step, measured (engine/step_benchmark.h).
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include "engine/config.h"
#include "engine/step_benchmark.h"
#include "tools/slipstream/commands.h"
#include "tools/slipstream/cpu_kernels.h"
#include "tools/smi/nvml.h"

namespace slipstream::cli {

namespace {

struct BenchArgs {
  StepBenchmarkOptions options;
  std::string config, device, json;
  bool overlap = false;
  int repeats = 1;
  uint32_t resident = 8;
};

// The GPU's busy share over the timed steps (NVML's utilization.gpu, sampled every 50 ms) when
// the run is on a CUDA device NVML can see; -1 otherwise.
class GpuBusy {
 public:
  double timing(bool on, const Device& device) {
    if (!on) {
      const double busy = sampler_ ? sampler_->stop().value_or(-1) : -1;
      sampler_.reset();
      return busy;
    }
    if (!device.is_cuda()) return -1;
    const CudaProbe& p = probe_cuda();
    if (device.index >= static_cast<int>(p.devices.size())) return -1;
    const CudaDeviceInfo& d = p.devices[static_cast<size_t>(device.index)];
    if (!nvml_) nvml_ = std::make_unique<smi::Nvml>();
    const auto index = smi::nvml_index_of_pci(*nvml_, d.pci_domain, d.pci_bus, d.pci_device);
    if (!index) return -1;
    sampler_ = std::make_unique<smi::UtilizationSampler>(*nvml_, *index);
    sampler_->start();
    return -1;
  }

 private:
  std::unique_ptr<smi::Nvml> nvml_;
  std::unique_ptr<smi::UtilizationSampler> sampler_;
};

int bench_command(BenchArgs a) {
  if (!a.config.empty()) a.options.preset_or_file = a.config;
  if (!a.device.empty()) a.options.sets.push_back("run.device=" + a.device);
  if (a.options.operation_times) add_operation_time_sets(a.options.sets, a.device);
  auto busy = std::make_shared<GpuBusy>();
  a.options.gpu_busy = [busy](bool on, const Device& d) { return busy->timing(on, d); };
  return exit_status_of([&] {
    if (a.overlap) {
      OverlapBenchmark o = run_overlap_benchmark(a.options, a.repeats, a.resident);
      std::cout << format_step_benchmark(o.loading.back()) << "\n"
                << format_step_benchmark(o.resident.back()) << "\n"
                << format_overlap_benchmark(o);
      if (!a.json.empty()) write_json_file(a.json, overlap_benchmark_json(o));
      return kExitOk;
    }
    const StepBenchmark b = run_step_benchmark(a.options);
    std::cout << format_step_benchmark(b);
    // What the CPU kernels ran at: figures from different levels are not comparable (the
    // emulator's GEMMs are the CPU's too).
    const CpuKernels k = cpu_kernels();
    if (b.device == "cpu" || b.device == "emulated") std::cout << cpu_kernels_line() << "\n";
    if (!a.json.empty()) {
      nlohmann::json j = step_benchmark_json(b);
      j["cpu_isa"] = k.isa;
      j["cpu_fp32_gemm"] = k.fp32;
      j["cpu_bf16_gemm"] = k.bf16;
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
      "no run directory, only --json (a preset without replays trains on synthetic ones, "
      "generated once into replays.synthetic_dir as a run's are)");
  auto* preset = cmd->add_option("--preset,-p", a->options.preset_or_file,
                                 "preset name or path (default cpu_quick)");
  cmd->add_option("--config,-c", a->config, "a graph file instead of a preset")->excludes(preset);
  cmd->add_option("--steps", a->options.steps, "steps to time")->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--warmup", a->options.warmup,
                  "steps run first and not timed (at least 1: the first step holds the run's "
                  "start-up, which is reported apart)")
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--device", a->device, "auto | cpu | cuda | cuda:N | emulated");
  cmd->add_option("--set,-s", a->options.sets, "override stage.param=value or run.key=value");
  cmd->add_option("--json", a->json, "also write the figures as JSON here");
  cmd->add_flag("--overlap", a->overlap,
                "also time the step on resident batches (nothing loaded or copied after the "
                "first --resident) and report the ratio: how much of the data path hides behind "
                "the step (1 = all of it)");
  auto* op_times = cmd->add_flag(
      "--op-times", a->options.operation_times,
      "also time each operation of the step on the device (time stamps between the operations "
      "of its CUDA graph: a CUDA device, or --device emulated): a table "
      "of kernels and calls by stage, their calls and microseconds a step. The host then waits "
      "for each graph, so the step's own times are read without it");
  op_times->excludes(cmd->get_option("--overlap"));
  cmd->add_option("--repeats", a->repeats, "--overlap: alternating pairs of runs (medians)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--resident", a->resident, "--overlap: batches kept resident")
      ->check(CLI::Range(1, 1024));
  cmd->callback([a] { set_exit_code(bench_command(*a)); });
}

}  // namespace slipstream::cli

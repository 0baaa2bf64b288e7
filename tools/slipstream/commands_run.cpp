// `slipstream run`, `slipstream devices`, `slipstream doctor`.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>

#include "engine/auto_batch.h"
#include "engine/checkpoint.h"
#include "engine/config_diff.h"
#include "engine/diagnostics.h"
#include "engine/graph.h"
#include "engine/launch.h"
#include "engine/run_directory.h"
#include "engine/runner.h"
#include "tools/slipstream/commands.h"
#include "tools/slipstream/cpu_kernels.h"

namespace slipstream::cli {

namespace {

struct RunArgs {
  std::string preset;
  std::string config;
  std::optional<std::string> resume;  // given: "" is a mistake, not a fresh run
  std::string device;
  std::vector<std::string> sets;
};

int run_command(const RunArgs& a) {
  namespace fs = std::filesystem;
  std::string target = !a.config.empty() ? a.config : a.preset;
  std::vector<std::string> sets = a.sets;
  std::string run_dir, checkpoint;
  if (a.resume) {
    if (a.resume->empty()) {  // an unset variable in a script: never a fresh run instead
      std::cerr << "--resume \"\": no run directory given (give RUN_DIR or "
                   "RUN_DIR/checkpoints/step-N; without --resume a new run starts)\n";
      return kExitConfig;
    }
    const std::string& resume = *a.resume;
    // A run directory whose config.yaml went missing: its checkpoints carry the graph.
    try {
      if (const std::string restored = restore_run_config(resume); !restored.empty())
        std::cerr << "note: " << restored << "\n";
    } catch (const std::exception& e) {
      std::cerr << "--resume " << resume << ": its config.yaml is missing and cannot be written "
                << "again from its checkpoint: " << e.what() << "\n";
      return kExitFailure;
    }
    // --resume RUN_DIR, or --resume RUN_DIR/checkpoints/step-N to continue from that one.
    const CheckpointPath where = resolve_checkpoint_path(resume);
    if (!where.error.empty()) {
      std::cerr << where.error << "\n";
      return kExitFailure;
    }
    if (where.run_dir.empty()) {
      std::cerr << resume << ": a checkpoint outside a run directory; --resume continues a "
                << "run (RUN_DIR or RUN_DIR/checkpoints/step-N). To train on from these weights "
                << "in a new run: --set run.init_from=" << resume << "\n";
      return kExitFailure;
    }
    run_dir = where.run_dir;
    // A run that is live there refuses the resume, naming itself, before anything reads its
    // files (a config.yaml emptied under it would be refused as no preset instead). Rank 0's
    // check: the other ranks of this resume find rank 0's own lock there.
    if (const std::string held = launch_info().rank == 0 ? in_use_refusal(run_dir) : "";
        !held.empty()) {
      std::cerr << held << "\n";
      return kExitFailure;
    }
    checkpoint = where.checkpoint;
    // A resumed run repeats the configuration it was started with. A preset or graph file given
    // as well must say the same (its run: settings aside): another model or other data would
    // continue the run as something it was not.
    const std::string recorded = (fs::path(run_dir) / "config.yaml").string();
    if (!target.empty()) {
      std::vector<std::string> diffs;
      const int status = exit_status_of([&] {
        diffs = config_differences(resolved_config_yaml(plan_graph(load_config(recorded, sets))),
                                   resolved_config_yaml(plan_graph(load_config(target, sets))),
                                   RunKeys::ignore);
        return kExitOk;
      });
      if (status != kExitOk) return status;
      if (!diffs.empty()) {
        std::cerr << "--resume " << resume << " with "
                  << (a.config.empty() ? "--preset " : "--config ") << target
                  << ": refused, it is not the graph the run trains (" << recorded << " -> "
                  << target << "):\n";
        for (const auto& d : diffs) std::cerr << "  " << d << "\n";
        // Weights go into a graph of the same stage kinds only (another core has other tensors).
        const bool other_kinds = std::any_of(diffs.begin(), diffs.end(), [](const std::string& d) {
          return d.find(".kind: ") != std::string::npos;
        });
        std::cerr << "A resume continues the run as configured: drop "
                  << (a.config.empty() ? "--preset" : "--config")
                  << " (the run's config.yaml is used) and change single settings with --set, or ";
        if (other_kinds)
          std::cerr << "start a new run of " << target
                    << " (its stages are of other kinds, so these weights cannot start it)\n";
        else
          std::cerr << "train a new run from these weights: --set run.init_from=" << resume << "\n";
        return kExitConfig;
      }
    }
    target = recorded;
  }
  if (target.empty()) target = "cpu_quick";
  if (!a.device.empty()) sets.push_back("run.device=" + a.device);
  return exit_status_of([&] {
    GraphPlan plan = plan_graph(load_config(target, sets));
    RunOptions opt;
    opt.resume_dir = run_dir;
    opt.resume_checkpoint = checkpoint;
    opt.command_line = command_line();
    resolve_auto_batch(plan, opt);
    Runner runner(std::move(plan), opt);
    RunResult r = runner.run();
    // The runner printed the summary line (and console.log has it).
    return r.interrupted ? kExitInterrupted : kExitOk;
  });
}

}  // namespace

void add_run_commands(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  auto* run =
      app.add_subcommand("run", "Run a graph from a preset (default cpu_quick) or a graph file");
  auto* preset =
      run->add_option("--preset,-p", a->preset, "preset name (presets/NAME.yaml) or path");
  run->add_option("--config,-c", a->config, "a graph file, e.g. a run directory's config.yaml")
      ->excludes(preset);
  run->add_option(
      "--resume", a->resume,
      "continue RUN_DIR from its latest checkpoint, or from RUN_DIR/checkpoints/step-N");
  run->add_option("--device", a->device,
                  "auto | cpu | cuda | cuda:N | emulated (same as --set run.device=...)");
  run->add_option("--set,-s", a->sets, "override stage.param=value or run.key=value (repeatable)");
  run->callback([a] { set_exit_code(run_command(*a)); });

  app.add_subcommand("devices", "Show the CPU, CUDA devices, driver and library versions")
      ->callback([] { std::cout << devices_report() << cpu_kernels_line() << "\n"; });
  auto dev = std::make_shared<std::string>("auto");
  auto* doctor =
      app.add_subcommand("doctor", "Check each link between slipstream and the GPU, with fixes");
  doctor->add_option("--device", *dev, "the device a run would use");
  doctor->callback([dev] { set_exit_code(run_doctor(std::cout, *dev)); });
}

}  // namespace slipstream::cli

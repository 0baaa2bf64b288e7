// `slipstream summary PRESET|RUN|FILE`: parameters per stage and the FLOPs of a training step
// (engine/graph_summary.h), from a preset, a graph file, a run directory's config.yaml or a
// checkpoint's weights.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "engine/auto_batch.h"
#include "engine/checkpoint.h"
#include "engine/graph_summary.h"
#include "engine/runner.h"
#include "tools/slipstream/commands.h"

namespace fs = std::filesystem;

namespace slipstream::cli {

namespace {

struct SummaryArgs {
  std::string target, device, json;
  std::vector<std::string> sets;
};

int summary_command(SummaryArgs a) {
  return exit_status_of([&] {
    std::string target = a.target;
    std::error_code ec;
    // A run directory: its config.yaml; a checkpoint directory: load_config reads the graph its
    // weights carry.
    if (fs::is_directory(target, ec) && !fs::exists(fs::path(target) / "model.safetensors", ec)) {
      target = (fs::path(target) / "config.yaml").string();
      if (!fs::exists(target))
        throw std::runtime_error(a.target +
                                 " is a directory without config.yaml or model.safetensors: give "
                                 "a run or checkpoint directory, a preset or a graph file");
    }
    // A checkpoint that is not there (pruned, mistyped): the run's checkpoints, by name.
    if (!fs::exists(target, ec) && fs::path(target).parent_path().filename() == "checkpoints")
      if (const std::string e = resolve_checkpoint_path(target).error; !e.empty())
        throw std::runtime_error(e);
    std::vector<std::string> sets = a.sets;
    if (!a.device.empty()) sets.push_back("run.device=" + a.device);
    std::ostringstream setup_log;  // the device line; the summary names the device itself
    GraphPlan plan = plan_graph(load_config(target, sets));
    RunOptions options = RunOptions::embedded(&setup_log);
    resolve_auto_batch(plan, options);
    Runner runner(std::move(plan), options);
    const GraphSummary s = summarize_graph(runner);
    std::cout << format_graph_summary(s);
    if (!a.json.empty()) write_json_file(a.json, graph_summary_json(s));
    return kExitOk;
  });
}

}  // namespace

void add_summary_command(CLI::App& app) {
  auto a = std::make_shared<SummaryArgs>();
  auto* cmd = app.add_subcommand(
      "summary",
      "Parameters per stage, the total, and the floating-point operations of a training step "
      "(per stage and per sample), for a preset, a graph file, a run or a checkpoint. Runs no "
      "batch; a preset without replays still has its synthetic ones generated, once, into "
      "replays.synthetic_dir");
  cmd->add_option("preset_or_run", a->target,
                  "preset name, graph file, run or checkpoint directory")
      ->required();
  cmd->add_option("--device", a->device, "auto | cpu | cuda | cuda:N | emulated");
  cmd->add_option("--set,-s", a->sets, "override stage.param=value or run.key=value");
  cmd->add_option("--json", a->json, "also write the figures as JSON here");
  cmd->callback([a] { set_exit_code(summary_command(*a)); });
}

}  // namespace slipstream::cli

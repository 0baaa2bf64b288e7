// `slipstream reference-step`: one training step's inputs and results written for another
// implementation of the same graph to reproduce (bench/peers: the PyTorch peer must give the
// same loss and gradients before any time counts). Writes into --out:
//   batch.safetensors    every tensor the data stages produced for the first training batch,
//                        named "<stage>.<port>"
//   model.safetensors    the weights the step started from (checkpoint names "<stage>.<param>")
//   grads.safetensors    each weight's gradient after the step's backward (same names)
//   graph.json           every stage's name, kind, resolved parameters and inputs, the run's
//                        settings, and the step's metrics (loss, ...)
#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "engine/auto_batch.h"
#include "engine/config.h"
#include "engine/graph.h"
#include "engine/runner.h"
#include "engine/safetensors.h"
#include "tools/slipstream/commands.h"

namespace slipstream::cli {

namespace {

struct ReferenceArgs {
  std::string preset = "cpu_quick", config, checkpoint, out;
  std::vector<std::string> sets;
};

nlohmann::json params_json(const Params& params) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, e] : params.entries())
    out[name] = std::visit([](const auto& x) { return nlohmann::json(x); }, e.value);
  return out;
}

// Every stage's name, kind, resolved parameters and inputs ("port": "stage.port"), and the run's
// settings (precision, seed, ...).
nlohmann::json graph_json(const GraphPlan& plan) {
  nlohmann::json graph;
  graph["run"] = params_json(plan.run);
  for (const auto& ps : plan.stages) {
    nlohmann::json inputs = nlohmann::json::object();
    for (size_t i = 0; i < ps.inputs.size(); ++i) {
      const PortBinding& in = ps.inputs[i];
      if (in.producer < 0) continue;  // an optional input left unbound
      const PlannedStage& from = plan.stages[static_cast<size_t>(in.producer)];
      inputs[ps.schema->inputs()[i].name] =
          from.name + "." + from.schema->outputs()[static_cast<size_t>(in.producer_port)].name;
    }
    graph["stages"].push_back({{"name", ps.name},
                               {"kind", ps.schema->kind()},
                               {"params", params_json(ps.params)},
                               {"inputs", inputs}});
  }
  return graph;
}

int reference_command(const ReferenceArgs& a) {
  namespace fs = std::filesystem;
  std::vector<std::string> sets = a.sets;
  sets.push_back("run.device=cpu");
  return exit_status_of([&] {
    GraphPlan plan = plan_graph(load_config(a.config.empty() ? a.preset : a.config, sets));
    fs::create_directories(a.out);
    nlohmann::json graph = graph_json(plan);
    std::ostringstream log;
    RunOptions options = RunOptions::embedded(&log);
    resolve_auto_batch(plan, options);
    Runner runner(std::move(plan), options);
    // The weights as the step starts (the backward does not change them).
    Batch b;
    const auto metrics = runner.gradient_step(a.checkpoint, b);
    Graph& g = runner.graph();
    const GraphPlan& p = g.plan();
    std::map<std::string, Tensor> batch, weights, grads;
    for (int k = 0; k < p.section_begin; ++k) {
      const StageContext& cx = g.context(static_cast<size_t>(k));
      for (const auto& port : p.stages[static_cast<size_t>(k)].schema->outputs())
        if (const Tensor& t = cx.output(b, port.name); t.defined())
          batch[p.stages[static_cast<size_t>(k)].name + "." + port.name] = t.to(Device::cpu());
    }
    for (size_t k = 0; k < g.size(); ++k)
      for (Parameter* prm : g.stage(k).parameters()) {
        const std::string name = p.stages[k].name + "." + prm->name;
        weights[name] = prm->value.to(Device::cpu());
        grads[name] = prm->grad.to(Device::cpu());
      }
    graph["metrics"] = metrics;
    write_safetensors((fs::path(a.out) / "batch.safetensors").string(), batch);
    write_safetensors((fs::path(a.out) / "model.safetensors").string(), weights,
                      {{"format", "pt"}});
    write_safetensors((fs::path(a.out) / "grads.safetensors").string(), grads, {{"format", "pt"}});
    std::ofstream(fs::path(a.out) / "graph.json") << graph.dump(2) << "\n";
    std::printf("reference step: %zu batch tensors, %zu weights; loss %.6f -> %s\n", batch.size(),
                weights.size(), metrics.count("loss") ? metrics.at("loss") : NAN, a.out.c_str());
    return kExitOk;
  });
}

}  // namespace

void add_reference_command(CLI::App& app) {
  auto a = std::make_shared<ReferenceArgs>();
  auto* cmd = app.add_subcommand(
      "reference-step",
      "Write one training step's batch, starting weights, gradients and loss (CPU, fp32 by "
      "default) for another implementation of the graph to reproduce");
  auto* preset = cmd->add_option("--preset,-p", a->preset, "preset name or path");
  cmd->add_option("--config,-c", a->config, "a graph file instead of a preset")->excludes(preset);
  cmd->add_option("--checkpoint", a->checkpoint,
                  "start from these weights (RUN/checkpoints/step-N)");
  cmd->add_option("--set,-s", a->sets,
                  "override stage.param=value or run.key=value (run.device stays cpu)");
  cmd->add_option("--out", a->out, "directory to write into")->required();
  cmd->callback([a] { set_exit_code(reference_command(*a)); });
}

}  // namespace slipstream::cli

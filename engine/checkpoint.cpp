#include "engine/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <map>

#include "engine/graph.h"
#include "engine/safetensors.h"
#include "engine/state_io.h"

namespace fs = std::filesystem;

namespace slipstream {

void save_checkpoint(GraphPlan& graph, const RunState& run, uint64_t next_batch,
                     const std::string& dir) {
  fs::path tmp = dir + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  std::map<std::string, Tensor> weights, state;
  std::map<std::string, std::string> meta;
  for (size_t k = 0; k < graph.stages.size(); ++k) {
    const std::string& name = graph.stages[k].name;
    for (Parameter* p : graph.instances[k]->parameters())
      weights[name + "." + p->name] = p->value.to(Device::cpu(), "checkpoint weight");
    StateWriter w(state, meta, name);
    graph.instances[k]->save(w);
  }
  meta["run.step"] = std::to_string(run.step);
  meta["run.next_batch"] = std::to_string(next_batch);
  meta["run.seed"] = std::to_string(run.seed);
  meta["run.world_size"] = std::to_string(run.world_size);
  meta["run.precision"] = run.precision == Precision::bf16 ? "bf16" : "fp32";
  // The graph that made the weights rides along: the file alone says how to rebuild the model.
  write_safetensors((tmp / "model.safetensors").string(), weights,
                    {{"format", "pt"},
                     {"step", std::to_string(run.step)},
                     {"slipstream.config", resolved_config_yaml(graph)}});
  write_safetensors((tmp / "state.safetensors").string(), state, meta);
  std::ofstream(tmp / "DONE") << run.step << "\n";
  fs::remove_all(dir);
  fs::rename(tmp, dir);
}

namespace {

// The trainable parameters of stages [first_stage, end) from the checkpoint's model file.
void load_parameters(GraphPlan& graph, const std::string& dir, size_t first_stage) {
  const std::string model_path = (fs::path(dir) / "model.safetensors").string();
  SafetensorsFile model = read_safetensors(model_path);
  for (size_t k = first_stage; k < graph.stages.size(); ++k) {
    StateReader weights(model.tensors, model.metadata, graph.stages[k].name, model_path);
    for (Parameter* p : graph.instances[k]->parameters()) weights.tensor_into(p->name, p->value);
  }
}

}  // namespace

CheckpointInfo load_checkpoint(GraphPlan& graph, const std::string& dir, size_t first_stage) {
  load_parameters(graph, dir, first_stage);
  std::string state_path = (fs::path(dir) / "state.safetensors").string();
  SafetensorsFile state = read_safetensors(state_path);
  for (size_t k = first_stage; k < graph.stages.size(); ++k) {
    StateReader r(state.tensors, state.metadata, graph.stages[k].name, state_path);
    graph.instances[k]->load(r);
  }
  StateReader run(state.tensors, state.metadata, "run", state_path);
  CheckpointInfo info;
  info.dir = dir;
  info.step = static_cast<uint64_t>(run.integer("step"));
  info.next_batch = static_cast<uint64_t>(run.integer("next_batch"));
  info.world_size = run.has("world_size") ? static_cast<int>(run.integer("world_size")) : 1;
  return info;
}

uint64_t load_weights(GraphPlan& graph, const std::string& dir) {
  load_parameters(graph, dir, 0);
  const std::string state_path = (fs::path(dir) / "state.safetensors").string();
  SafetensorsFile state = read_safetensors(state_path);
  return static_cast<uint64_t>(
      StateReader(state.tensors, state.metadata, "run", state_path).integer("step"));
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  fs::path root = fs::path(run_dir) / "checkpoints";
  std::optional<std::string> best;
  uint64_t best_step = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string name = e.path().filename().string();
    if (!name.starts_with("step-") || name.ends_with(".tmp") || !fs::exists(e.path() / "DONE"))
      continue;
    uint64_t step = std::strtoull(name.c_str() + 5, nullptr, 10);
    if (!best || step >= best_step) best = e.path().string(), best_step = step;
  }
  return best;
}

namespace {

// The graph that rebuilds a checkpoint: its run's config.yaml; for a checkpoint outside a run,
// the one its weights carry.
void pick_graph_file(CheckpointPath& c) {
  std::error_code ec;
  if (!c.run_dir.empty() && fs::exists(fs::path(c.run_dir) / "config.yaml", ec)) {
    c.graph_file = (fs::path(c.run_dir) / "config.yaml").string();
    return;
  }
  const std::string weights = (fs::path(c.checkpoint) / "model.safetensors").string();
  try {
    if (read_safetensors(weights, SafetensorsRead::metadata).metadata.count("slipstream.config")) {
      c.graph_file = weights;
      return;
    }
  } catch (const std::exception& e) {
    c.error = e.what();
    return;
  }
  c.error = c.checkpoint + ": outside a run directory, and its weights carry no graph (no " +
            "'slipstream.config' metadata: written before checkpoints carried it); give it " +
            "inside its run directory";
}

}  // namespace

CheckpointPath resolve_checkpoint_path(const std::string& path) {
  CheckpointPath r;
  fs::path p = fs::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  std::error_code ec;  // error-code forms: a name the system refuses is "not found", not a throw
  if (p.filename() == "model.safetensors" && fs::is_regular_file(p, ec)) p = p.parent_path();
  const bool in_run = p.parent_path().filename() == "checkpoints" &&
                      fs::exists(p.parent_path().parent_path() / "config.yaml", ec);
  if (fs::is_directory(p, ec) && (in_run || fs::exists(p / "model.safetensors", ec))) {
    if (!fs::exists(p / "DONE", ec)) {
      r.error = path + ": an incomplete checkpoint (no DONE file: its write did not finish)";
      return r;
    }
    r.checkpoint = p.string();
    if (in_run) {
      r.run_dir = p.parent_path().parent_path().string();
      if (r.run_dir.empty()) r.run_dir = ".";
    }
    pick_graph_file(r);
    return r;
  }
  r.run_dir = p.string();
  if (!fs::exists(fs::path(r.run_dir) / "config.yaml", ec))
    r.error = path + ": not a run directory (no config.yaml) nor a checkpoint (no " +
              "model.safetensors)";
  return r;
}

CheckpointPath find_checkpoint(const std::string& path) {
  CheckpointPath c = resolve_checkpoint_path(path);
  if (c.error.empty() && c.checkpoint.empty()) {
    c.checkpoint = latest_checkpoint(c.run_dir).value_or("");
    if (c.checkpoint.empty())
      c.error = path + ": the run has no complete checkpoint";
    else
      pick_graph_file(c);
  }
  return c;
}

}  // namespace slipstream

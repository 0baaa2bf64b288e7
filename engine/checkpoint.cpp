#include "engine/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "engine/atomic_file.h"
#include "engine/config_diff.h"
#include "engine/graph.h"
#include "engine/memory_pool.h"
#include "engine/run_directory.h"
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
  // A stage whose state cannot be taken is the one to look at (the checkpoint stage that asked
  // reports it); nothing was written yet, and the empty folder goes too. Out of memory keeps
  // its type (callers tell memory apart).
  const auto discard = [&tmp] {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  };
  for (size_t k = 0; k < graph.stages.size(); ++k) {
    const std::string& name = graph.stages[k].name;
    const std::string who = "stage '" + name + "' (" + graph.stages[k].schema->kind() + ")";
    try {
      for (Parameter* p : graph.instances[k]->parameters())
        weights[name + "." + p->name] = p->value.to(Device::cpu(), "checkpoint weight");
      StateWriter w(state, meta, name);
      graph.instances[k]->save(w);
    } catch (const OutOfMemoryError&) {
      discard();
      throw;
    } catch (const std::bad_alloc&) {
      discard();
      throw;
    } catch (...) {
      discard();
      throw std::runtime_error(who + ": saving its state: " + what_of_current_exception());
    }
  }
  meta["run.step"] = std::to_string(run.step);
  meta["run.next_batch"] = std::to_string(next_batch);
  meta["run.seed"] = std::to_string(run.seed);
  meta["run.world_size"] = std::to_string(run.world_size);
  meta["run.precision"] = run.precision == Precision::bf16 ? "bf16" : "fp32";
  {
    StateWriter books(state, meta, "run");
    if (std::isfinite(run.best_validation_loss))
      books.number("best_validation_loss", run.best_validation_loss);
    books.integer("validations_without_improvement", run.validations_without_improvement);
  }
  // The graph that made the weights rides along: the file alone says how to rebuild the model.
  // Each tensor's checksum too: a damaged file is an error at load, never another model.
  std::map<std::string, std::string> model_meta = {
      {"format", "pt"},
      {"step", std::to_string(run.step)},
      {"slipstream.config", resolved_config_yaml(graph)}};
  add_tensor_checksums(weights, model_meta);
  add_tensor_checksums(state, meta);
  try {
    write_safetensors((tmp / "model.safetensors").string(), weights, model_meta);
    write_safetensors((tmp / "state.safetensors").string(), state, meta);
    write_file_atomically((tmp / "DONE").string(), std::to_string(run.step) + "\n");
    fs::remove_all(dir);
    fs::rename(tmp, dir);
  } catch (const std::exception& e) {
    // A full disk: the part written goes at once, so the space is there for whatever comes next.
    std::error_code ec;
    const bool removed = !fs::exists(tmp, ec) && !ec;
    fs::remove_all(tmp, ec);
    if (removed) throw CheckpointRemoved(e.what());
    throw;
  }
  // step-N on disk before anything older is pruned. A failure here leaves a complete step-N in
  // place, said as the error it is (a retry would delete it), unless the folder itself went (the
  // run directory moved away between the rename and this): written again, as above.
  try {
    sync_parent_directory(dir);
  } catch (const std::exception& e) {
    std::error_code ec;
    if (!fs::exists(fs::path(dir).parent_path(), ec) && !ec) throw CheckpointRemoved(e.what());
    throw;
  }
}

namespace {

// A weight that is NaN or infinite: a model that diverged. Scoring it, playing it or training on
// from it would only spread the NaN; the checkpoint is refused, naming the weight.
void check_finite(const SafetensorsFile& model, const std::string& path) {
  for (const auto& [name, t] : model.tensors) {
    if (t.dtype() != DType::f32) continue;
    size_t bad = 0;
    for (float v : t.span<float>()) bad += !std::isfinite(v);
    if (bad)
      throw std::runtime_error(path + ": weight '" + name + "' holds " + std::to_string(bad) +
                               " non-finite value(s) (NaN or Inf): the run had diverged when it "
                               "was written; use an earlier checkpoint");
  }
}

// The trainable parameters of stages [first_stage, end) from the checkpoint's model file.
void load_parameters(GraphPlan& graph, const std::string& dir, size_t first_stage) {
  const std::string model_path = (fs::path(dir) / "model.safetensors").string();
  SafetensorsFile model = read_safetensors(model_path);
  check_finite(model, model_path);
  for (size_t k = first_stage; k < graph.stages.size(); ++k) {
    StateReader weights(model.tensors, model.metadata, graph.stages[k].name, model_path);
    for (Parameter* p : graph.instances[k]->parameters()) weights.tensor_into(p->name, p->value);
  }
}

}  // namespace

namespace {

// A checkpoint read while a running run prunes it (its ckpt.keep): said as that, not as a file
// that cannot be opened. `read` does the reading; the exception is rethrown otherwise.
template <class Read>
auto read_checkpoint_files(const std::string& dir, Read&& read) {
  try {
    return read();
  } catch (const std::exception& e) {
    std::error_code ec;
    if (fs::exists(dir, ec) || ec) throw;
    throw std::runtime_error(dir + " was removed while it was read (" + e.what() +
                             "): a running run prunes its older checkpoints (ckpt.keep); give "
                             "the run directory again for its newest");
  }
}

}  // namespace

CheckpointInfo load_checkpoint(GraphPlan& graph, const std::string& dir, size_t first_stage) {
  std::string state_path = (fs::path(dir) / "state.safetensors").string();
  SafetensorsFile state = read_checkpoint_files(dir, [&] {
    load_parameters(graph, dir, first_stage);
    return read_safetensors(state_path);
  });
  for (size_t k = first_stage; k < graph.stages.size(); ++k) {
    StateReader r(state.tensors, state.metadata, graph.stages[k].name, state_path);
    graph.instances[k]->load(r);
  }
  StateReader run(state.tensors, state.metadata, "run", state_path);
  // Numbers a run writes are never negative (nor a world of no ranks): anything else was
  // edited or damaged, and would resume at a position that does not exist.
  auto counted = [&](const std::string& key, int64_t least) {
    const int64_t v = run.integer(key);
    if (v < least)
      throw std::runtime_error(state_path + ": run." + key + " is " + std::to_string(v) +
                               ", which no run writes (at least " + std::to_string(least) +
                               "): the file was edited or is damaged; use another checkpoint");
    return v;
  };
  CheckpointInfo info;
  info.dir = dir;
  info.step = static_cast<uint64_t>(counted("step", 0));
  info.next_batch = static_cast<uint64_t>(counted("next_batch", 0));
  info.world_size = run.has("world_size") ? static_cast<int>(counted("world_size", 1)) : 1;
  // Early stopping's books (absent in checkpoints written before they were saved, and before the
  // first validation: the loss).
  if (run.has("best_validation_loss")) {
    info.best_validation_loss = run.number("best_validation_loss");
    if (!std::isfinite(*info.best_validation_loss))
      throw std::runtime_error(state_path +
                               ": run.best_validation_loss is not a finite number, which no run "
                               "writes: the file was edited or is damaged; use another checkpoint");
  }
  if (run.has("validations_without_improvement"))
    info.validations_without_improvement = counted("validations_without_improvement", 0);
  return info;
}

uint64_t load_weights(GraphPlan& graph, const std::string& dir) {
  const std::string state_path = (fs::path(dir) / "state.safetensors").string();
  SafetensorsFile state = read_checkpoint_files(dir, [&] {
    load_parameters(graph, dir, 0);
    return read_safetensors(state_path);
  });
  return static_cast<uint64_t>(
      StateReader(state.tensors, state.metadata, "run", state_path).integer("step"));
}

bool checkpoint_step(const std::string& name, const std::string& prefix, uint64_t& step) {
  if (!name.starts_with(prefix) || name.size() == prefix.size()) return false;
  const char* b = name.data() + prefix.size();
  const char* e = name.data() + name.size();
  auto r = std::from_chars(b, e, step);
  return r.ec == std::errc() && r.ptr == e;
}

bool run_checkpoint_step(const std::string& name, uint64_t& step) {
  return checkpoint_step(name, "step-", step) || checkpoint_step(name, "best-step-", step);
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir,
                                             std::optional<uint64_t> before) {
  fs::path root = fs::path(run_dir) / "checkpoints";
  std::optional<std::string> best;
  uint64_t best_step = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string name = e.path().filename().string();
    uint64_t step = 0;
    if (!checkpoint_step(name, "step-", step) || !fs::exists(e.path() / "DONE", ec)) continue;
    if (before && step >= *before) continue;
    if (!best || step >= best_step) best = e.path().string(), best_step = step;
  }
  return best;
}

namespace {

// The complete checkpoints in `dir` named `prefix`N (any: step-N and best-step-N; not `last`, a
// link, nor a write's step-N.tmp), in step order, and the same names as one list for messages.
std::vector<std::string> complete_checkpoints(const fs::path& dir, const std::string& prefix = "") {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    uint64_t step = 0;
    const bool named =
        prefix.empty() ? run_checkpoint_step(name, step) : checkpoint_step(name, prefix, step);
    if (named && !e.is_symlink(ec) && fs::exists(e.path() / "DONE", ec)) names.push_back(name);
  }
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;  // step-5 before step-10
  });
  return names;
}
std::string listed(const std::vector<std::string>& names) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return list;
}

}  // namespace

std::string best_checkpoints_note(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const std::vector<std::string> bests = complete_checkpoints(root, "best-step-");
  if (bests.empty()) return "";
  return "; its best checkpoint" + std::string(bests.size() > 1 ? "s: " : ": ") + listed(bests) +
         " (give " + (root / bests.back()).string() + " for the newest)";
}

namespace {

// The graph that rebuilds a checkpoint: the one its weights carry (the run's config.yaml as it
// was at that step; a later resume with --set may have changed the file since, and those changes
// are listed); for checkpoints written before the weights carried it, the run's config.yaml.
void pick_graph_file(CheckpointPath& c) {
  std::error_code ec;
  const fs::path run_config = c.run_dir.empty() ? fs::path() : fs::path(c.run_dir) / "config.yaml";
  const bool have_run_config = !c.run_dir.empty() && fs::exists(run_config, ec);
  const std::string weights = (fs::path(c.checkpoint) / "model.safetensors").string();
  try {
    const SafetensorsFile f = read_safetensors(weights, SafetensorsRead::metadata);
    if (auto it = f.metadata.find("slipstream.config"); it != f.metadata.end()) {
      c.graph_file = weights;
      if (have_run_config) {
        std::ifstream in(run_config);
        const std::string now((std::istreambuf_iterator<char>(in)), {});
        c.config_changes = config_differences(it->second, now, RunKeys::ignore);
      }
      return;
    }
  } catch (const std::exception& e) {
    if (!have_run_config) {
      c.error = e.what();
      return;
    }
  }
  if (have_run_config) {
    c.graph_file = run_config.string();
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
  if ((p.filename() == "model.safetensors" || p.filename() == "config.yaml") &&
      fs::is_regular_file(p, ec))
    p = p.parent_path().empty() ? fs::path(".")
                                : p.parent_path();  // a checkpoint's weights, a run's config
  // checkpoints/last: the checkpoint it names (what a resume records and reports)
  if (p.filename() == "last" && fs::is_symlink(p, ec)) {
    const fs::path target = fs::read_symlink(p, ec);
    if (!ec && target.is_relative() && target.has_filename()) p = p.parent_path() / target;
  }
  const bool in_run = p.parent_path().filename() == "checkpoints" &&
                      fs::exists(p.parent_path().parent_path() / "config.yaml", ec);
  if (fs::is_directory(p, ec) && (in_run || fs::exists(p / "model.safetensors", ec))) {
    if (!fs::exists(p / "DONE", ec)) {
      r.error = path +
                ": an incomplete checkpoint (no DONE file: its write did not finish, or the folder "
                "was copied without it; copy the whole step-N folder)";
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
  if (fs::exists(fs::path(r.run_dir) / "config.yaml", ec)) return r;
  // What is there instead, and what to give: the checkpoints a run holds, by name.
  auto names_in = [](const fs::path& dir) { return listed(complete_checkpoints(dir)); };
  if (!fs::exists(p, ec)) {
    r.error = path + ": no such file or directory";
    if (p.parent_path().filename() == "checkpoints")
      if (const std::string list = names_in(p.parent_path()); !list.empty())
        r.error += " (the checkpoints there: " + list + ")";
  } else if (const std::string held = in_use_refusal(p.string()); !held.empty()) {
    // A live run whose config.yaml was deleted under it (it writes it again at its next
    // checkpoint): that it is in use, and by whom, is what to say.
    r.error = held + " (its config.yaml is gone: the run writes it again at its next checkpoint)";
  } else if (const std::string list = names_in(p / "checkpoints"); !list.empty()) {
    r.error = path + ": a run directory without its config.yaml; give one of its checkpoints (" +
              list + ", in " + (p / "checkpoints").string() + "): their weights carry the graph";
  } else {
    r.error = path + ": not a run directory (no config.yaml) nor a checkpoint (no " +
              "model.safetensors)";
  }
  return r;
}

std::string restore_run_config(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  std::error_code ec;
  // The run directory meant, and the checkpoint whose graph it was trained with at the end.
  fs::path run_dir, checkpoint;
  if (p.parent_path().filename() == "checkpoints" && fs::exists(p / "DONE", ec)) {
    run_dir = p.parent_path().parent_path();
    checkpoint = p;
  } else if (fs::is_directory(p / "checkpoints", ec)) {
    run_dir = p;
    if (auto newest = latest_checkpoint(p.string())) checkpoint = *newest;
  }
  // A rewind's set-aside folder holds checkpoints too, and is no run to write into; a run
  // writing there now (its config.yaml deleted under it) is its own business, and refuses the
  // resume.
  if (checkpoint.empty() || run_dir.parent_path().filename() == "set-aside" ||
      directory_in_use(run_dir.string()))
    return "";
  const fs::path config = run_dir / "config.yaml";
  const bool there = fs::exists(config, ec);
  if (there) {
    std::ifstream in(config);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    if (text.find_first_not_of(" \t\r\n") != std::string::npos) return "";  // there, as it is
  }
  std::string graph;
  try {
    const SafetensorsFile f =
        read_safetensors((checkpoint / "model.safetensors").string(), SafetensorsRead::metadata);
    auto it = f.metadata.find("slipstream.config");
    if (it == f.metadata.end()) return "";
    graph = it->second;
  } catch (const std::exception&) {
    return "";  // the resume names what is wrong with the checkpoint
  }
  write_file_atomically(config.string(), graph);
  return config.string() + " was " + (there ? "empty" : "missing") +
         ": written again from the graph " + checkpoint.filename().string() +
         " carries (the run's configuration at that step)";
}

CheckpointPath find_checkpoint(const std::string& path) {
  CheckpointPath c = resolve_checkpoint_path(path);
  if (c.error.empty() && c.checkpoint.empty()) {
    c.checkpoint = latest_checkpoint(c.run_dir).value_or("");
    if (c.checkpoint.empty())
      c.error =
          path + ": the run has no complete periodic checkpoint" + best_checkpoints_note(c.run_dir);
    else
      pick_graph_file(c);
  }
  return c;
}

}  // namespace slipstream

// `slipstream export`: a checkpoint's policy as a model another runtime serves. --format onnx
// writes the one-frame step (policy_onnx.h: the frame's tensors and the temporal model's state
// in; the logits, each head's probabilities and the next state out). With --replay it also
// records, for one port's frames of that replay, the tensors the step reads and the logits our
// own step gives (`infer`'s computation: the run's graph frame by frame, state carried), as
// safetensors: what a serving stack feeds the exported model (the ids as its int64 inputs) and
// checks its answers against. Both files are written after everything is read and built, so a
// mistake (a replay or port with no frames) leaves no file behind.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/command_registry.h"
#include "engine/graph.h"
#include "engine/runner.h"
#include "engine/safetensors.h"
#include "stages/melee/batch_layout.h"
#include "stages/melee/model_math.h"
#include "stages/melee/policy_onnx.h"
#include "stages/melee/replay_scoring.h"

namespace slipstream::melee {
namespace {

struct ExportArgs {
  std::string checkpoint, format = "onnx", out, replay, samples;
  int port = 1;
  int64_t frames = 1000;
  std::vector<std::string> sets;
};

struct Samples {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  int64_t frames = 0;
};

// The first `frames` frames of one port of a replay, one at a time through the run's graph on
// the CPU: the loader's tensors of each frame and the heads' logits.
Samples record_samples(const ExportArgs& a, const CheckpointPath& where) {
  std::vector<std::string> sets = a.sets;
  sets.push_back("run.device=cpu");
  GraphPlan plan = plan_graph(
      config_for_replays(where.graph_file, sets, frame_by_frame(a.replay, a.port, "export")));
  Runner runner(std::move(plan), RunOptions::embedded());
  Graph& g = runner.graph();
  const int src = stage_of_kind(g.plan(), "slippi_replays"),
            heads = stage_of_kind(g.plan(), "controller_heads");
  const char* const f32_names[] = {"numeric", "prev_controller"};
  const char* const id_names[] = {"action", "character", "stage"};
  std::map<std::string, std::vector<float>> f32;
  std::map<std::string, std::vector<int64_t>> ids;  // the exported step's id inputs are int64
  std::vector<float> logits;
  int64_t n = 0;
  const EvalResult r = runner.stream(where.checkpoint, [&](const Batch& b, double) {
    if (n >= a.frames) return;
    const StageContext& sc = g.context(static_cast<size_t>(src));
    for (const char* name : f32_names) {
      const Tensor t = sc.output(b, name).to(Device::cpu());
      f32[name].insert(f32[name].end(), t.data<float>(), t.data<float>() + t.numel());
    }
    for (const char* name : id_names) {
      const Tensor t = sc.output(b, name).to(Device::cpu());
      ids[name].insert(ids[name].end(), t.data<int32_t>(), t.data<int32_t>() + t.numel());
    }
    const StageContext& hc = g.context(static_cast<size_t>(heads));
    for (int h = 0; h < kHeads; ++h) {
      const Tensor t = hc.output(b, kHeadNames[h]).to(Device::cpu());
      logits.insert(logits.end(), t.data<float>(), t.data<float>() + t.numel());
    }
    ++n;
  });
  if (n == 0)
    throw std::runtime_error(a.replay + ": no frame of port " + std::to_string(a.port) +
                             " to record");
  auto tensor = [n](std::vector<int64_t> dims, DType t, const void* data) {
    dims.insert(dims.begin(), n);
    Tensor out = Tensor::empty(Shape(dims), t);
    std::memcpy(out.raw(), data, out.nbytes());
    return out;
  };
  Samples s;
  std::map<std::string, Tensor>& out = s.tensors;
  out["numeric"] = tensor({kSlots, kNumericFeatures}, DType::f32, f32["numeric"].data());
  out["prev_controller"] = tensor({kControllerFeatures}, DType::f32, f32["prev_controller"].data());
  out["action"] = tensor({kSlots}, DType::i64, ids["action"].data());
  out["character"] = tensor({kSlots}, DType::i64, ids["character"].data());
  out["stage"] = tensor({}, DType::i64, ids["stage"].data());
  out["logits"] = tensor({kHeadsWidth}, DType::f32, logits.data());
  s.metadata = {{"replay", a.replay},
                {"port", std::to_string(a.port)},
                {"checkpoint_step", std::to_string(r.step)}};
  s.frames = n;
  return s;
}

// The weights the policy plays with: the checkpoint's, with an optimizer's EMA copy in their
// place where the run kept one (validation, eval, infer and the policy library swap it in:
// adamw's `ema`), from its state ("<optimizer>.ema.<stage>.<param>").
std::map<std::string, Tensor> policy_weights(const CheckpointPath& where, const GraphPlan& plan,
                                             std::string& note) {
  auto weights = read_safetensors(where.checkpoint + "/model.safetensors").tensors;
  const std::string state_file = where.checkpoint + "/state.safetensors";
  std::error_code ec;
  if (!std::filesystem::exists(state_file, ec)) return weights;
  size_t swapped = 0;
  for (auto& [key, t] : read_safetensors(state_file).tensors)
    for (const PlannedStage& s : plan.stages) {
      const std::string prefix = s.name + ".ema.";
      if (s.schema->kind() != "adamw" || !key.starts_with(prefix)) continue;
      const auto it = weights.find(key.substr(prefix.size()));
      if (it == weights.end() || !(it->second.shape() == t.shape())) continue;
      it->second = t;
      ++swapped;
    }
  if (swapped)
    note = " (the optimizer's EMA weights, " + std::to_string(swapped) +
           " parameters, as eval, infer and the policy library play)";
  return weights;
}

int export_command(const ExportArgs& a) {
  const auto found = command_checkpoint(a.checkpoint, std::cerr, std::cerr);
  if (!found) return 1;
  const CheckpointPath& where = *found;
  try {
    const GraphPlan plan = plan_graph(load_config(where.graph_file, a.sets));
    std::string ema;
    const auto weights = policy_weights(where, plan, ema);
    const PolicyOnnx m = build_policy_onnx(plan, weights);
    std::optional<Samples> samples;
    if (!a.replay.empty()) samples = record_samples(a, where);
    m.graph->write(a.out);
    std::string states;
    for (const std::string& s : m.state_inputs) states += " " + s;
    std::printf(
        "export: %s: the one-frame step of %s%s (%s core; %zu nodes, %zu initializers)\n"
        "  inputs: numeric, action, character, stage, prev_controller; state (zeros at a "
        "stream's first frame):%s\n"
        "  outputs: logits, buttons, main_x, main_y, c_x, c_y, shoulder; each state's next "
        "value (NAME.next)\n",
        a.out.c_str(), where.checkpoint.c_str(), ema.c_str(), m.core_kind.c_str(), m.graph->nodes(),
        m.graph->initializers(), states.c_str());
    if (samples) {
      write_safetensors(a.samples, samples->tensors, samples->metadata);
      std::printf("export: %s: %lld frames of %s, port %d (inputs and our step's logits)\n",
                  a.samples.c_str(), static_cast<long long>(samples->frames), a.replay.c_str(),
                  a.port);
    }
  } catch (const ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

void setup_export(CLI::App& parent) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* cmd = parent.add_subcommand(
      "export",
      "Write a checkpoint's policy for another runtime: --format onnx, the one-frame step (the "
      "frame's tensors and the temporal model's state in; logits, probabilities and the next "
      "state out)");
  add_checkpoint_option(*cmd, a->checkpoint);
  cmd->add_option("--format", a->format, "onnx")->check(CLI::IsMember({"onnx"}));
  cmd->add_option("--out,-o", a->out, "the model file to write (e.g. policy.onnx)")->required();
  CLI::Option* replay = cmd->add_option(
      "--replay", a->replay,
      "also record a replay's frames: the step's inputs (ids as int64, as the model takes them) "
      "and our own step's logits");
  cmd->add_option("--port", a->port, "with --replay: the player (1-4)")
      ->check(CLI::Range(1, 4))
      ->needs(replay);
  cmd->add_option("--frames", a->frames, "with --replay: at most this many frames")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->needs(replay);
  cmd->add_option("--samples", a->samples, "with --replay: the safetensors file to write")
      ->needs(replay);
  cmd->add_option("--set,-s", a->sets, "override stage.param=value");
  cmd->callback([a] {
    if (!a->replay.empty() && a->samples.empty())
      throw CLI::ValidationError("--replay", "needs --samples FILE to write the frames to");
    if (const int code = export_command(*a); code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace
}  // namespace slipstream::melee

SLIPSTREAM_REGISTER_COMMAND(melee_export, "export", slipstream::melee::setup_export);

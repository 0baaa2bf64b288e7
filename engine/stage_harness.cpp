#include "engine/stage_harness.h"

#include "engine/registry.h"
#include "engine/text_match.h"

namespace slipstream {

// Defined in graph.cpp: the same validation the graph loader applies.
Params resolve_params(const StageSchema& schema, const std::map<std::string, ConfigValue>& raw,
                      const std::string& prefix, const SourceMark& owner_mark,
                      std::vector<ConfigIssue>& issues, bool resolved_config = false);

StageHarness::StageHarness(const std::string& kind, const std::vector<std::string>& overrides,
                           const std::string& name, Precision precision, uint64_t seed) {
  const StageSchema* schema = StageRegistry::find(kind);
  if (!schema) {
    std::vector<std::string> kinds;
    for (const auto* s : StageRegistry::all()) kinds.push_back(s->kind());
    throw ConfigError(
        {{{"<command line>"}, "unknown stage kind '" + kind + "'" + did_you_mean(kind, kinds)}});
  }
  std::map<std::string, ConfigValue> raw;
  for (const auto& o : overrides) {
    auto [key, value] = parse_override(o, "param=value");
    if (key.starts_with(name + ".")) key = key.substr(name.size() + 1);
    raw[key] = value;
  }
  std::vector<ConfigIssue> issues;
  PlannedStage ps;
  ps.name = name;
  ps.schema = schema;
  ps.params = resolve_params(*schema, raw,
                             "stage '" + name + "' (" + kind + "): ", {"<command line>"}, issues);
  if (!issues.empty()) throw ConfigError(issues);
  // Every input port gets a slot of its own (fed by us), as do outputs and all gradients.
  for (const auto& in : schema->inputs()) {
    PortBinding b;
    b.slot = static_cast<int>(plan_.slots.size());
    plan_.slots.emplace_back("input." + in.name);
    b.grad_slot = static_cast<int>(plan_.slots.size());
    plan_.slots.emplace_back("grad:input." + in.name);
    ps.inputs.push_back(b);
  }
  for (const auto& out : schema->outputs()) {
    ps.output_slots.push_back(static_cast<int>(plan_.slots.size()));
    plan_.slots.emplace_back(name + "." + out.name);
    ps.output_grad_slots.push_back(static_cast<int>(plan_.slots.size()));
    plan_.slots.emplace_back("grad:" + name + "." + out.name);
  }
  ps.in_section = true;
  plan_.stages.push_back(ps);
  plan_.section_begin = 0;
  run_.precision = precision;
  run_.seed = seed;
  run_.metric_sink = [this](std::string_view n, double v, MetricKind, double) {
    metrics_[std::string(n)] = v;
  };
  run_.run_dir.clear();
  stage_ = StageRegistry::create(kind);
  ctx_ = std::make_unique<StageContext>();
  ctx_->name_ = name;
  ctx_->schema_ = schema;
  ctx_->params_ = plan_.stages[0].params;
  ctx_->run_ = &run_;
  ctx_->plan_ = &plan_;
  for (const auto& b : plan_.stages[0].inputs) ctx_->input_slots_.push_back(b.slot);
  ctx_->output_slots_ = plan_.stages[0].output_slots;
  plan_.instances.push_back(stage_.get());
  plan_.contexts.push_back(ctx_.get());
  batch_.slots.resize(plan_.slots.size());
}

StageHarness::~StageHarness() = default;
Stage& StageHarness::stage() {
  return *stage_;
}
StageContext& StageHarness::context() {
  return *ctx_;
}
RunState& StageHarness::run() {
  return run_;
}

void StageHarness::setup(const std::map<std::string, Tensor>& inputs) {
  const auto& ins = ctx_->schema().inputs();
  for (const auto& [port, t] : inputs) {
    const PortSpec* spec = ctx_->schema().find_input(port);
    if (!spec) {
      std::vector<std::string> names;
      for (const auto& i : ins) names.push_back(i.name);
      throw std::runtime_error("stage kind '" + ctx_->schema().kind() + "' has no input '" + port +
                               "'" + did_you_mean(port, names));
    }
    // What the port takes, as a graph's validation holds a producer to it: an i32 tensor read
    // as f32 would be its bits as floats.
    if ((spec->dtype && t.dtype() != *spec->dtype) ||
        (spec->rank >= 0 && t.shape().rank() != spec->rank))
      throw std::runtime_error(
          "stage kind '" + ctx_->schema().kind() + "': input '" + port + "' is " + t.describe() +
          ", and the port takes " +
          (spec->dtype ? std::string(dtype_name(*spec->dtype)) : std::string("any dtype")) + ", " +
          (spec->rank < 0 ? "any rank" : "rank " + std::to_string(spec->rank)));
    auto& slot = plan_.slots[plan_.stages[0].inputs[static_cast<size_t>(spec - ins.data())].slot];
    slot.shape = t.shape();
    slot.dtype = t.dtype();
    slot.declared = true;
  }
  // Unconnected inputs read as absent.
  for (size_t i = 0; i < ins.size(); ++i)
    if (!inputs.count(ins[i].name)) {
      if (!ins[i].optional)
        throw std::runtime_error("stage kind '" + ctx_->schema().kind() + "' needs input '" +
                                 ins[i].name + "'");
      ctx_->input_slots_[i] = -1;
    }
  stage_->setup(*ctx_);
  setup_shapes_.clear();
  for (const auto& [port, t] : inputs) setup_shapes_[port] = t.shape();
  const auto& outs = ctx_->schema().outputs();
  for (size_t o = 0; o < outs.size(); ++o)
    if (!plan_.slots[plan_.stages[0].output_slots[o]].declared)
      throw std::runtime_error("stage kind '" + ctx_->schema().kind() +
                               "' did not declare output '" + outs[o].name +
                               "' in setup() (ctx.declare_output): a graph refuses it");
}

void StageHarness::load_weights(const std::map<std::string, Tensor>& weights) {
  for (Parameter* p : stage_->parameters()) {
    auto it = weights.find(ctx_->name() + "." + p->name);
    if (it == weights.end()) it = weights.find(p->name);
    if (it == weights.end())
      throw std::runtime_error("weights have no entry for parameter '" + p->name + "'");
    if (!(it->second.shape() == p->value.shape()) || it->second.dtype() != p->value.dtype())
      throw std::runtime_error("weight '" + p->name + "' is " + it->second.describe() +
                               ", the stage expects " + p->value.describe());
    p->value.copy_from(it->second);
  }
}

std::map<std::string, Tensor> StageHarness::weights() {
  std::map<std::string, Tensor> out;
  for (Parameter* p : stage_->parameters()) out[p->name] = p->value.clone();
  return out;
}

std::map<std::string, Tensor> StageHarness::forward(const std::map<std::string, Tensor>& inputs,
                                                    bool training) {
  for (auto& s : batch_.slots) s = Tensor();
  const auto& ins = ctx_->schema().inputs();
  for (size_t i = 0; i < ins.size(); ++i) {
    auto it = inputs.find(ins[i].name);
    if (it != inputs.end() && ctx_->input_slots_[i] >= 0)
      batch_.slots[ctx_->input_slots_[i]] = it->second;
  }
  batch_.samples = 0;
  run_.training = training;
  stage_->forward(batch_, *ctx_);
  std::map<std::string, Tensor> out;
  for (const auto& o : ctx_->schema().outputs())
    if (ctx_->output(batch_, o.name).defined()) out[o.name] = ctx_->output(batch_, o.name);
  // On setup's shapes, what setup declared is what the forward must give (set_output checks the
  // dtype, rank and a feature row's width; here every known size).
  bool as_setup = training && inputs.size() == setup_shapes_.size();
  for (const auto& [port, t] : inputs)
    as_setup = as_setup && setup_shapes_.count(port) && setup_shapes_.at(port) == t.shape();
  const auto& outs = ctx_->schema().outputs();
  for (size_t o = 0; as_setup && o < outs.size(); ++o) {
    const SlotInfo& slot = plan_.slots[plan_.stages[0].output_slots[o]];
    auto it = out.find(outs[o].name);
    const std::string who = "stage kind '" + ctx_->schema().kind() + "': output '" + outs[o].name;
    if (it == out.end())
      throw std::runtime_error(who +
                               "' was not set by the forward (ctx.set_output): a graph's "
                               "run stops at the first stage that reads it");
    bool same = it->second.shape().rank() == slot.shape.rank();
    for (int d = 0; same && d < slot.shape.rank(); ++d)
      same = slot.shape[d] < 0 || slot.shape[d] == it->second.shape()[d];
    if (!same)
      throw std::runtime_error(who + "' is " + it->second.describe() + ", not " +
                               std::string(dtype_name(slot.dtype)) + slot.shape.str() +
                               " declared at setup for these inputs: a graph's consumers were "
                               "promised that");
  }
  return out;
}

std::map<std::string, Tensor> StageHarness::backward(
    const std::map<std::string, Tensor>& output_grads) {
  for (Parameter* p : stage_->parameters())
    if (p->grad.defined()) p->grad.zero_();
  const auto& outs = ctx_->schema().outputs();
  for (size_t o = 0; o < outs.size(); ++o) {
    auto it = output_grads.find(outs[o].name);
    batch_.slots[plan_.stages[0].output_grad_slots[o]] =
        it == output_grads.end() ? Tensor() : it->second;
  }
  for (const auto& b : plan_.stages[0].inputs) batch_.slots[b.grad_slot] = Tensor();
  stage_->backward(batch_, *ctx_);
  std::map<std::string, Tensor> out;
  const auto& ins = ctx_->schema().inputs();
  for (size_t i = 0; i < ins.size(); ++i) {
    const Tensor& g = batch_.slots[plan_.stages[0].inputs[i].grad_slot];
    if (g.defined()) out["grad." + ins[i].name] = g;
  }
  for (Parameter* p : stage_->parameters())
    if (p->grad.defined()) out["grad." + p->name] = p->grad.clone();
  return out;
}

}  // namespace slipstream

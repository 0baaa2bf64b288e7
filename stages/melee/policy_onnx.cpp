#include "stages/melee/policy_onnx.h"

#include <algorithm>
#include <stdexcept>

#include "stages/melee/batch_layout.h"
#include "stages/melee/model_math.h"
#include "stages/melee/replay_scoring.h"
#include "stages/onnx/sequence_step_onnx.h"

namespace slipstream::melee {

namespace {

using onnx_export::Elem;
using onnx_export::kBatch;
using onnx_export::OnnxGraph;

// The stage's parameters by their name in the stage.
onnx_export::WeightOf weights_of(const std::map<std::string, Tensor>& weights,
                                 const std::string& stage) {
  return [&weights, stage](const std::string& name) -> const Tensor& {
    const auto it = weights.find(stage + "." + name);
    if (it == weights.end())
      throw std::runtime_error("the checkpoint has no parameter " + stage + "." + name);
    return it->second;
  };
}

const float* values(const onnx_export::WeightOf& w, const std::string& name, size_t n) {
  return onnx_export::weight_values(w, name, n);
}

const PlannedStage& only_stage(const GraphPlan& plan, const std::vector<std::string>& kinds) {
  for (const std::string& k : kinds)
    if (const int i = stage_of_kind(plan, k); i >= 0) return plan.stages[static_cast<size_t>(i)];
  std::string names;
  for (const std::string& k : kinds) names += (names.empty() ? "" : " or ") + k;
  throw std::runtime_error("the export needs the graph's " + names +
                           " stage (replays -> melee_embedding -> mamba | gru -> "
                           "controller_heads); this graph has none");
}

// The model the export writes is melee_embedding -> mamba | gru -> controller_heads, wired so:
// any other stage the heads' answers come from (a plugin's between the loader and the heads, a
// second core) would be left out of the ONNX graph, which would then answer other than the
// run's model, so it is refused by name. Stages the heads do not read from (an auxiliary loss's)
// change nothing the export writes.
void check_exportable(const GraphPlan& plan, const PlannedStage& es, const PlannedStage& cs,
                      const PlannedStage& hs) {
  auto index = [&](const PlannedStage& s) { return static_cast<int>(&s - plan.stages.data()); };
  std::vector<int> todo = {index(hs)};
  std::vector<bool> seen(plan.stages.size(), false);
  while (!todo.empty()) {
    const int k = todo.back();
    todo.pop_back();
    if (k < plan.head_end || seen[static_cast<size_t>(k)]) continue;  // the loader's own
    seen[static_cast<size_t>(k)] = true;
    const PlannedStage& s = plan.stages[static_cast<size_t>(k)];
    if (&s != &es && &s != &cs && &s != &hs && !s.schema->is_passthrough())
      throw std::runtime_error(
          "the ONNX export writes melee_embedding -> mamba | gru -> "
          "controller_heads; this graph's model also has stage '" +
          s.name + "' (" + s.schema->kind() +
          "), which the export cannot express, and leaving it out would "
          "give other answers than the run's model");
    todo.insert(todo.end(), s.upstream.begin(), s.upstream.end());
  }
  auto reads = [&](const PlannedStage& s, const PlannedStage& from) {
    return std::find(s.upstream.begin(), s.upstream.end(), index(from)) != s.upstream.end();
  };
  if (!reads(cs, es) || !reads(hs, cs))
    throw std::runtime_error(
        "the ONNX export writes melee_embedding -> mamba | gru -> "
        "controller_heads, each reading the one before; stages '" +
        es.name + "', '" + cs.name + "' and '" + hs.name + "' are wired otherwise");
}

struct Embedded {
  std::string x, prev_input;
};

// melee_embedding's forward (model_math.h embed_forward) for one frame of B streams, no mirror.
Embedded embedding(OnnxGraph& g, const EmbedLayout& L, const onnx_export::WeightOf& w) {
  const std::string numeric = "numeric", prev = "prev_controller";
  g.input(numeric, Elem::f32, {kBatch, kSlots, kNumericFeatures});
  g.input("action", Elem::i64, {kBatch, kSlots});
  g.input("character", Elem::i64, {kBatch, kSlots});
  g.input("stage", Elem::i64, {kBatch});
  g.input(prev, Elem::f32, {kBatch, kControllerFeatures});
  const std::string num =
      g.node("Mul", {numeric, g.weight("numeric_scale", {kNumericFeatures}, kNumericScale)});
  // A slot's embeddings only where the slot exists (slot_exists: numeric[kExists] > 0.5).
  const std::string exists = g.node(
      "Cast",
      {g.node("Greater", {g.slice(numeric, 2, kExists, kExists + 1), g.scalar("half", 0.5f)})},
      {OnnxGraph::attr("to", int64_t{1})});
  auto table = [&](const std::string& name, int64_t rows, int64_t dim, const std::string& ids) {
    const std::string t =
        g.weight(name, {rows, dim}, values(w, name + ".weight", size_t(rows * dim)));
    return g.node("Gather", {t, ids}, {OnnxGraph::attr("axis", int64_t{0})});
  };
  const std::string act =
      g.node("Mul", {table("action_table", kActionStates, L.action_dim, "action"), exists});
  const std::string chr =
      g.node("Mul", {table("character_table", kCharacters, L.character_dim, "character"), exists});
  const std::string slots =
      g.node("Reshape", {g.node("Concat", {num, act, chr}, {OnnxGraph::attr("axis", int64_t{2})}),
                         g.ints("slots_shape", {0, int64_t{kSlots} * L.slot_width()})});
  std::vector<std::string> parts = {slots, table("stage_table", kStages, L.stage_dim, "stage"),
                                    prev};
  std::vector<std::string> prev_parts = {prev};
  if (L.prev_classes) {
    // prev_head_class: stick_class / shoulder_class of each analog value, one-hot.
    std::vector<std::string> onehots;
    for (int h = 0; h < kStickHeads; ++h) {
      const std::string v = g.slice(prev, 1, kButtons + h, kButtons + h + 1);
      std::string cls;
      if (h == kShoulder) {
        cls = g.node("Mul", {g.node("Clip", {v, g.scalar("zero", 0), g.scalar("one", 1)}),
                             g.scalar("steps", kShoulderClasses - 1)});
      } else {
        const std::string c = g.node("Clip", {v, g.scalar("minus_one", -1), g.scalar("one", 1)});
        cls = g.node(
            "Mul", {g.node("Mul", {g.node("Add", {c, g.scalar("one", 1)}), g.scalar("half", 0.5f)}),
                    g.scalar("steps", kStickClasses - 1)});
      }
      std::vector<float> range(static_cast<size_t>(head_classes(h)));
      for (size_t k = 0; k < range.size(); ++k) range[k] = float(k);
      onehots.push_back(g.node(
          "Cast",
          {g.node("Equal",
                  {g.node("Round", {cls}), g.weight("classes", {int64_t(range.size())}, range)})},
          {OnnxGraph::attr("to", int64_t{1})}));
    }
    const std::string classes = g.node("Concat", onehots, {OnnxGraph::attr("axis", int64_t{1})});
    parts.push_back(classes);
    prev_parts.push_back(classes);
  }
  std::string x = g.node("Concat", parts, {OnnxGraph::attr("axis", int64_t{1})});
  if (L.width() > L.raw_width())
    x = g.node("Pad", {x, g.ints("pads", {0, 0, 0, L.width() - L.raw_width()})});
  const std::string p = prev_parts.size() == 1
                            ? prev
                            : g.node("Concat", prev_parts, {OnnxGraph::attr("axis", int64_t{1})});
  return {x, p};
}

// controller_heads' forward (heads_forward, heads_prev_forward): the 81 logits.
std::string heads(OnnxGraph& g, const PlannedStage& s, const onnx_export::WeightOf& w,
                  const std::string& x, int64_t H, const Embedded& e, int64_t P) {
  if (s.params.boolean("autoregressive"))
    throw std::runtime_error(
        "heads '" + s.name +
        "' are autoregressive: their in-order decode is not in the exported step (export a "
        "run trained with heads.autoregressive=false)");
  const int64_t hidden = s.params.integer("hidden");
  std::string in = x;
  int64_t In = H;
  if (hidden > 0) {
    in = g.silu(g.linear(x, "hidden", values(w, "hidden.weight", size_t(hidden * H)),
                         values(w, "hidden.bias", size_t(hidden)), hidden, H));
    In = hidden;
  }
  std::vector<float> Wo, bo;
  for (int h = 0; h < kHeads; ++h) {
    const size_t n = size_t(head_width(h));
    const float* wh = values(w, std::string(kHeadNames[h]) + ".weight", n * size_t(In));
    const float* bh = values(w, std::string(kHeadNames[h]) + ".bias", n);
    Wo.insert(Wo.end(), wh, wh + n * size_t(In));
    bo.insert(bo.end(), bh, bh + n);
  }
  std::string logits = g.linear(in, "heads", Wo.data(), bo.data(), kHeadsWidth, In);
  if (P > 0)
    logits = g.node("Add", {logits, g.linear(e.prev_input, "prev",
                                             values(w, "prev.weight", size_t(kHeadsWidth * P)),
                                             nullptr, kHeadsWidth, P)});
  return logits;
}

}  // namespace

PolicyOnnx build_policy_onnx(const GraphPlan& plan, const std::map<std::string, Tensor>& weights) {
  const PlannedStage& es = only_stage(plan, {"melee_embedding"});
  const PlannedStage& cs = only_stage(plan, {"mamba", "gru"});
  const PlannedStage& hs = only_stage(plan, {"controller_heads"});
  check_exportable(plan, es, cs, hs);
  PolicyOnnx out;
  out.core_kind = cs.schema->kind();
  out.graph = std::make_unique<OnnxGraph>("slipstream_policy_step");
  OnnxGraph& g = *out.graph;

  EmbedLayout L;
  L.action_dim = static_cast<int>(es.params.integer("action_dim"));
  L.character_dim = static_cast<int>(es.params.integer("character_dim"));
  L.stage_dim = static_cast<int>(es.params.integer("stage_dim"));
  L.prev_classes = es.params.boolean("prev_classes");
  const Embedded e = embedding(g, L, weights_of(weights, es.name));

  const auto cw = weights_of(weights, cs.name);
  std::string y;
  int64_t H = 0;
  if (out.core_kind == "mamba") {
    nn::MambaConfig c;
    c.din = L.width();
    c.d_model = static_cast<int>(cs.params.integer("d_model"));
    c.d_state = static_cast<int>(cs.params.integer("d_state"));
    c.d_conv = static_cast<int>(cs.params.integer("d_conv"));
    c.expand = static_cast<int>(cs.params.integer("expand"));
    c.dt_rank = static_cast<int>(cs.params.integer("dt_rank"));
    c.layers = static_cast<int>(cs.params.integer("layers"));
    c.eps = cs.params.number("eps");
    y = onnx_export::mamba_step(g, c, cw, e.x, cs.name);
    H = c.d_model;
  } else {
    nn::GruConfig c;
    c.din = L.width();
    c.hidden = static_cast<int>(cs.params.integer("hidden"));
    c.layers = static_cast<int>(cs.params.integer("layers"));
    y = onnx_export::gru_step(g, c, cw, e.x, cs.name);
    H = c.hidden;
  }
  const int64_t P = weights.count(hs.name + ".prev.weight") ? L.prev_input_width() : 0;
  const std::string logits = heads(g, hs, weights_of(weights, hs.name), y, H, e, P);
  g.output("logits", logits, Elem::f32, {kBatch, kHeadsWidth});
  for (int h = 0; h < kHeads; ++h) {
    const std::string part = g.slice(logits, 1, head_offset(h), head_offset(h) + head_width(h));
    g.output(kHeadNames[h],
             h == 0 ? g.node("Sigmoid", {part})
                    : g.node("Softmax", {part}, {OnnxGraph::attr("axis", int64_t{-1})}),
             Elem::f32, {kBatch, head_width(h)});
  }
  for (const std::string& name : g.input_names())
    if (name.starts_with(cs.name + ".")) out.state_inputs.push_back(name);
  g.check();
  return out;
}

}  // namespace slipstream::melee

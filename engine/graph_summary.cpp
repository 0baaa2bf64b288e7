#include "engine/graph_summary.h"

#include <cstdio>
#include <sstream>

#include "engine/runner.h"
#include "engine/stage.h"

namespace slipstream {

GraphSummary summarize_graph(Runner& runner) {
  Graph& g = runner.setup_only();
  const GraphPlan& plan = g.plan();
  const RunState& run = runner.state();
  GraphSummary s;
  s.graph_file = plan.config.graph_file;
  s.device = run.device.str();
  s.precision = run.precision == Precision::bf16 ? "bf16" : "fp32";
  s.micro_batches = plan.micro_batches;
  // The rows of the batches the section sees: the source side's first declared output.
  if (plan.head_end > 0) {
    const auto& last = plan.stages[static_cast<size_t>(plan.head_end - 1)];
    if (!last.output_slots.empty()) {
      const Shape& shape = plan.slots[static_cast<size_t>(last.output_slots[0])].shape;
      if (shape.rank() >= 1 && shape[0] > 0) s.samples_per_batch = shape[0];
    }
  }
  for (size_t k = 0; k < g.size(); ++k) {
    GraphSummary::Stage st;
    st.name = plan.stages[k].name;
    st.kind = plan.stages[k].schema->kind();
    st.in_section = plan.stages[k].in_section;
    for (const Parameter* p : g.stage(k).parameters()) {
      st.parameters += static_cast<uint64_t>(p->value.numel());
      ++st.tensors;
    }
    const Stage::Cost c = g.stage(k).cost();
    st.forward_flops = c.forward_flops;
    st.backward_flops = c.backward_flops;
    st.update_flops = c.update_flops;
    st.step_flops = static_cast<double>(s.micro_batches) * (c.forward_flops + c.backward_flops) +
                    c.update_flops;
    s.parameters += st.parameters;
    s.step_flops += st.step_flops;
    s.stages.push_back(std::move(st));
  }
  if (s.samples_per_batch > 0)
    s.sample_flops = s.step_flops / static_cast<double>(s.samples_per_batch * s.micro_batches);
  return s;
}

namespace {

// 1234567 -> "1,234,567".
std::string grouped(uint64_t n) {
  std::string d = std::to_string(n), out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return out;
}

// FLOPs with an SI prefix: "12.3 GFLOP"; "-" for none.
std::string flops(double f) {
  if (f <= 0) return "-";
  static const char* kPrefix[] = {"", "K", "M", "G", "T", "P"};
  int p = 0;
  while (f >= 1000 && p < 5) f /= 1000, ++p;
  char buf[32];
  std::snprintf(buf, sizeof buf,
                f < 10    ? "%.2f %sFLOP"
                : f < 100 ? "%.1f %sFLOP"
                          : "%.0f %sFLOP",
                f, kPrefix[p]);
  return buf;
}

}  // namespace

std::string format_graph_summary(const GraphSummary& s) {
  std::ostringstream o;
  o << s.graph_file << " on " << s.device << ", precision " << s.precision;
  if (s.samples_per_batch > 0) o << ", " << s.samples_per_batch << " samples per batch";
  if (s.micro_batches > 1) o << ", " << s.micro_batches << " batches per step";
  o << "\n\n";
  size_t wn = 5, wk = 4;
  for (const auto& st : s.stages)
    wn = std::max(wn, st.name.size()), wk = std::max(wk, st.kind.size());
  char line[512];
  const auto row = [&](const std::string& name, const std::string& kind, const std::string& params,
                       const std::string& fwd, const std::string& bwd, const std::string& step,
                       const std::string& share) {
    std::snprintf(line, sizeof line, "%-*s  %-*s  %13s  %12s  %12s  %12s  %6s\n",
                  static_cast<int>(wn), name.c_str(), static_cast<int>(wk), kind.c_str(),
                  params.c_str(), fwd.c_str(), bwd.c_str(), step.c_str(), share.c_str());
    o << line;
  };
  row("stage", "kind", "parameters", "forward", "backward", "per step", "share");
  for (const auto& st : s.stages) {
    char share[16] = "-";
    if (s.step_flops > 0 && st.step_flops > 0)
      std::snprintf(share, sizeof share, "%.1f%%", 100.0 * st.step_flops / s.step_flops);
    row(st.name, st.kind, st.parameters ? grouped(st.parameters) : "-", flops(st.forward_flops),
        flops(st.backward_flops), flops(st.step_flops), share);
  }
  char mib[32];
  std::snprintf(mib, sizeof mib, "%.1f", static_cast<double>(s.parameters) * 4 / (1 << 20));
  o << "\nparameters: " << grouped(s.parameters) << " (" << mib << " MiB in fp32)\n";
  o << "per optimizer step: " << flops(s.step_flops);
  if (s.sample_flops > 0) o << ", " << flops(s.sample_flops) << " per sample";
  o << "\nforward and backward: per batch; per step: " << s.micro_batches
    << " batch(es) forward and backward, and an optimizer's update. A multiply-add counts 2; "
       "GEMMs counted exactly, element-wise work estimated.\n";
  return o.str();
}

nlohmann::json graph_summary_json(const GraphSummary& s) {
  nlohmann::json j;
  j["graph_file"] = s.graph_file;
  j["device"] = s.device;
  j["precision"] = s.precision;
  j["samples_per_batch"] = s.samples_per_batch;
  j["batches_per_step"] = s.micro_batches;
  j["parameters"] = s.parameters;
  j["flops_per_step"] = s.step_flops;
  j["flops_per_sample"] = s.sample_flops;
  auto& stages = j["stages"] = nlohmann::json::array();
  for (const auto& st : s.stages)
    stages.push_back({{"name", st.name},
                      {"kind", st.kind},
                      {"in_section", st.in_section},
                      {"parameters", st.parameters},
                      {"parameter_tensors", st.tensors},
                      {"forward_flops", st.forward_flops},
                      {"backward_flops", st.backward_flops},
                      {"update_flops", st.update_flops},
                      {"flops_per_step", st.step_flops}});
  return j;
}

}  // namespace slipstream
